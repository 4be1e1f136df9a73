#!/usr/bin/env bash
# Session 9 (2026-12-02), call 2: where the wide-row kernels lose bandwidth, from hardware counters (ncu sections +
# DRAM bytes / L2 hit rate; benchmarks/ncu_memory.py).  Call 1 showed L2 hints change nothing for the CE stream
# (0.64) and the piece-wise softmax, and the bf16 persistent softmax (one read) is no faster than the piece-wise
# one (two reads), while the single-block bf16 softmax reaches 0.92-0.96 at 8K-16K: compare the three.
#   run: OUT=$OUT bash benchmarks/gpu_session13_b.sh   -> $OUT/ncu/<case>.csv, $OUT/ncu.log
set -u
source benchmarks/_gpu_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
el "ncu: ${NCU:-none}"; [ -n "$NCU" ] || exit 0
mkdir -p $OUT/ncu
MET=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_bytes.sum
i=0
while read -r name case width dtype over; do
  [ -z "$name" ] && continue
  i=$((i+1))
  timeout 45 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --metrics $MET --csv --page details \
    python3 benchmarks/ncu_memory.py --case $case --width $width --dtype $dtype --override "$over" > $OUT/ncu/$name.csv 2> $OUT/ncu/$name.err
  el "$name exit $?"; grep -h "minimal" $OUT/ncu/$name.csv | head -1
done << 'CASES'
sm_fwd_bf16_16k_single softmax_fwd 16384 bfloat16 {}
sm_fwd_bf16_64k_piecewise softmax_fwd 65536 bfloat16 {}
sm_fwd_bf16_64k_persist softmax_fwd 65536 bfloat16 {"wide_mode":2}
sm_fwd_fp32_64k_persist softmax_fwd 65536 float32 {}
ce_bf16_50k_stream ce 50304 bfloat16 {}
ce_bf16_262k_stream ce 262144 bfloat16 {}
ce_bf16_50k_persist ce 50304 bfloat16 {"wide_mode":3}
ln_bwd_bf16_16k ln_bwd 16384 bfloat16 {}
CASES
tar czf $OUT/ncu.tgz -C $OUT ncu && rm -rf $OUT/ncu
