#!/usr/bin/env bash
# Session 16, call 4 (< 4 min, one H200): issue 10's TMA softmax forward, HOLD = 2 (three passes over the row held in
# the ring: the max on the bf16 values as loaded, the sum with no rescaling, then y: ~16 instructions a value in the
# sm_90 SASS against ~18 for the online form of call 3), and split rows with HOLD at 64K / 256K so that each segment
# stays in its ring (one read, no L2 re-read).  Call 3 (run23_c): HOLD 1 at 32K 0.76 / 0.80 against the default's
# 0.81 / 0.83; streamed 64K 0.61-0.63, 256K 0.57-0.58 (ncu: 0.53 issued warps a scheduler, DRAM 62%).
#   run: OUT=$OUT bash benchmarks/gpu_session23_d.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 70 python3 -m pytest tests/test_softmax_gluon.py -q -m gpu -n 8 -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -8; pack
timeout 45 python3 benchmarks/bench_softmax_gluon.py --out $OUT/fwd32 --dtypes bf16 --widths 32768 --peers fused \
  --configs "16,256,8,2,4,2,1,1,1;16,256,8,2,4,2,2,1,1;32,256,4,2,4,2,2,1,1;32,256,4,2,8,2,2,1,1;16,256,8,2,8,2,2,1,1" > $OUT/fwd32.log 2>&1
el "fwd32 exit $?"; cut -c1-700 $OUT/fwd32.log; pack
timeout 80 python3 benchmarks/bench_softmax_gluon.py --out $OUT/fwdw --dtypes bf16 --widths 65536,131072,262144 --peers fused \
  --configs "16,256,8,2,4,2,1,2,1;16,256,8,2,4,2,2,2,1;16,256,8,2,4,2,2,4,1;16,256,8,2,4,2,2,8,1;32,256,4,2,4,2,2,8,1" > $OUT/fwdw.log 2>&1
el "fwdw exit $?"; cut -c1-700 $OUT/fwdw.log; pack
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
if [ -n "$NCU" ]; then
  timeout 40 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --csv --page details \
    python3 benchmarks/ncu_softmax_gluon.py --width 32768 --config 16,256,8,2,4,2,2,1,1 > $OUT/ncu_fwd.csv 2> $OUT/ncu_fwd.err
  el "ncu exit $?"; grep "_softmax_fwd_tma" $OUT/ncu_fwd.csv | grep -E "Issued Warp|DRAM Throughput|Warp Cycles Per Issued|Duration" | cut -d, -f13-16; pack
fi
rm -rf $OUT
