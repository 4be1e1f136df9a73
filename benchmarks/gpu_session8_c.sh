#!/usr/bin/env bash
# Next device session, call 3 (nvidia-h200, < 8 min): hardware counters of the memory-bound kernels that stay below
# their targets (issue 10: cross-entropy 0.63-0.65 of copy, wide softmax 0.65-0.74; issue 9: LayerNorm backward).
# Does a second pass over a row go to DRAM (read bytes > minimal)? Occupancy, L2 hit rate, DRAM throughput.
# ncu reads counters on Firecracker machines only (device README, KINDS.md); first line checks that.
#   run: OUT=$OUT bash benchmarks/gpu_session8_c.sh
set -u
source benchmarks/_gpu_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
el "ncu: ${NCU:-none}"; [ -n "$NCU" ] || exit 0
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size
for spec in ce:32000 ce:131072 softmax_fwd:65536 softmax_fwd:262144 softmax_bwd:65536 softmax_bwd:262144 ln_bwd:768 ln_bwd:4096 ln_bwd:16384; do
  c=${spec%%:*}; w=${spec##*:}
  timeout 60 $NCU --clock-control none --profile-from-start off --csv --metrics $METRICS \
    python3 benchmarks/ncu_memory.py --case $c --width $w > $OUT/ncu_${c}_${w}.csv 2> $OUT/ncu_${c}_${w}.err
  el "$c $w exit $?"; grep -E "minimal|ERR" $OUT/ncu_${c}_${w}.csv | head -3
  python3 - "$OUT/ncu_${c}_${w}.csv" << 'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]
    ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
    for r in rows[1:]:
        print("   ", r[ki][:40], r[mi], r[vi])
PY
done
