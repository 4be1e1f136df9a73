#!/usr/bin/env bash
# Session 25, call 2 (< 5 min, one H200).  Nsight Compute of the wide-row defaults at HEAD (none was taken of the
# SMEM-pipelined persistent forms since they became the defaults): occupancy, issue rate, instructions, stall reasons
# and DRAM bytes of the bf16 softmax forward (the 16K single block that reaches copy speed, the 64K and 256K persistent
# default), the fp32 forward and the bf16 backward at 64K (both near target), and the CE at 50,304 (persistent) and
# 32,000 (TMA HOLD).  Summary: ncu_summary.txt (benchmarks/ncu_parse.py).
#   run: OUT=$OUT bash benchmarks/gpu_session32_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
el "ncu: ${NCU:-none}"; [ -n "$NCU" ] || exit 0
mkdir -p $OUT/ncu
MET="dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
while read -r name case width dtype over; do
  [ -z "$name" ] && continue
  timeout 60 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --metrics "$MET" --csv --page details \
    python3 benchmarks/ncu_memory.py --case $case --width $width --dtype $dtype --override "$over" > $OUT/ncu/$name.csv 2> $OUT/ncu/$name.err
  el "$name exit $?"; grep -h "minimal" $OUT/ncu/$name.csv | head -1
done << 'CASES'
a_sm_fwd_bf16_16k softmax_fwd 16384 bfloat16 {}
b_sm_fwd_bf16_64k softmax_fwd 65536 bfloat16 {}
c_sm_fwd_bf16_256k softmax_fwd 262144 bfloat16 {}
d_sm_fwd_fp32_64k softmax_fwd 65536 float32 {}
e_sm_bwd_bf16_64k softmax_bwd 65536 bfloat16 {}
f_ce_bf16_50k ce 50304 bfloat16 {}
g_ce_bf16_32k ce 32000 bfloat16 {}
CASES
python3 benchmarks/ncu_parse.py $OUT/ncu > $OUT/ncu_summary.txt 2>&1; cat $OUT/ncu_summary.txt | cut -c1-1500
tar czf $OUT/ncu.tgz -C $OUT ncu && rm -rf $OUT/ncu
