#!/usr/bin/env bash
# Next device session (nvidia-h200, < 9 min): issue 13's evidence. Nsight Compute sections of one forward + backward
# of ours, cuDNN's and FlashAttention-2's attention (SDPA backends), S 4,096, D64 causal and D128 not causal:
# duration, achieved occupancy, SM / tensor-pipe throughput (SpeedOfLight, ComputeWorkloadAnalysis), stall
# reasons (WarpStateStats), registers and shared memory (LaunchStats). ncu reads counters on Firecracker
# machines only (KINDS.md); the first line says whether it is there.
#   run: OUT=$OUT bash benchmarks/gpu_session8_d.sh
set -u
source benchmarks/_gpu_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
el "ncu: ${NCU:-none}"; [ -n "$NCU" ] || exit 0
SECTIONS="--section SpeedOfLight --section Occupancy --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats"
for dc in 64:--causal 128:; do d=${dc%%:*}; causal=${dc#*:}; for impl in fused cudnn flash; do
  tag=${impl}_d${d}${causal:+_causal}
  timeout 75 $NCU --clock-control none --profile-from-start off $SECTIONS --csv --page details \
    python3 benchmarks/ncu_attention.py --impl $impl --d $d --s 4096 $causal > $OUT/ncu_attn_$tag.csv 2> $OUT/ncu_attn_$tag.err
  el "$tag exit $?"
  python3 - "$OUT/ncu_attn_$tag.csv" << 'PY'
import csv, sys
want = ("Duration", "Achieved Occupancy", "Compute (SM) Throughput", "Memory Throughput", "Registers Per Thread",
        "Executed Ipc Active", "Issue Slots Busy", "Theoretical Occupancy")
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]
    ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
    for r in rows[1:]:
        if r[mi] in want:
            print("   ", r[ki][:48], r[mi], r[vi])
PY
done; done
