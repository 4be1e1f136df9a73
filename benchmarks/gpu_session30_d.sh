#!/usr/bin/env bash
# Session 23, call 4 (< 3 min, one H200).  Issue 10: the one point of the TMA HOLD family not yet timed -- three
# 8- or 16-warp CTAs an SM holding a 32K bf16 row each in their rings (session 16's ncu: too few warps issuing;
# session 17: three 4-warp CTAs 0.77; session 19: one 8- or 16-warp CTA an SM 0.55-0.62).
#   run: OUT=$OUT bash benchmarks/gpu_session30_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/bench_softmax_gluon.py --out $OUT/fwd --widths 32768 --dtypes bf16 --peers fused \
  --configs "16,256,8,1,4,3,1,1,1;16,256,8,1,8,3,1,1,1;16,256,8,1,16,3,1,1,1;16,256,8,1,8,2,1,1,1;16,256,8,2,16,2,1,1,1" > $OUT/fwd.log 2>&1
el "exit $?"; cat $OUT/fwd.log | grep -v Warn | tail -5
