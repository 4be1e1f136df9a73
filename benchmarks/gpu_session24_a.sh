#!/usr/bin/env bash
# Session 17, call 1 (< 7 min, one H200).  Written at the end of session 16 (no device time left).
#  1. Issue 13's "show why" at the current defaults (Gluon ping-pong / one-warpgroup forwards, Gluon dK / dV + Triton
#     dQ backward): Nsight Compute counters of ours and cuDNN on the cases still below cuDNN (D64 S1K causal and not,
#     D128 S1K causal, D64 S4K, D128 S16K causal for the backward): time, tensor-pipe (gmma) activity, SM busy,
#     achieved occupancy, registers / shared memory.  The earlier profile (issue13/ncu/) predates the Gluon kernels.
#  2. Issue 10: the TMA kernels' GPU tests (session 16's last edit, after its last call: HOLD 2 removed, the tail mask
#     in one helper for the forward and the CE; the sm_90 SASS lost the duplicated loop body, MUFU 115 -> 79 static), then
#     the TMA forward with the row held (HOLD 1, call 5's 0.77 / 0.82 at 32K) at three CTAs an SM (one output
#     buffer, or plain stores and none) against two.
#   run: OUT=$OUT bash benchmarks/gpu_session24_a.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
export NCU_CASES="64,1024,1 64,1024,0 128,1024,1 64,4096,0 128,16384,1"
NCU_LIMIT=300 OUT=$OUT bash benchmarks/gpu_attention_ncu.sh > $OUT/ncu.log 2>&1
el "ncu exit $?"; tail -12 $OUT/ncu.log; python3 benchmarks/ncu_summary.py $OUT/ncu_attention.csv > $OUT/ncu_attention.md 2>&1; head -40 $OUT/ncu_attention.md; pack
timeout 70 python3 -m pytest tests/test_softmax_gluon.py -q -m gpu -n 8 -p no:cacheprovider > $OUT/tma_tests.log 2>&1
el "tma tests exit $?"; tail -1 $OUT/tma_tests.log; grep -E "^FAILED|^E  " $OUT/tma_tests.log | head -8; pack
timeout 60 python3 benchmarks/bench_softmax_gluon.py --out $OUT/fwd --dtypes bf16 --widths 32768,50304 --peers fused \
  --configs "16,256,8,2,4,2,1,1,1;16,256,8,1,4,3,1,1,1;16,256,8,1,4,3,1,1,1,0;8,256,16,1,4,3,1,1,1" > $OUT/fwd.log 2>&1
el "fwd exit $?"; cut -c1-600 $OUT/fwd.log; pack
rm -rf $OUT
