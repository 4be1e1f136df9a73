#!/usr/bin/env bash
# Session 23, call 5 (< 2 min, one H200).  Issue 10: the TMA cross-entropy with the row held in the ring (HOLD),
# three 4- or 8-warp CTAs an SM, never timed (session 19 timed one 8- or 16-warp CTA an SM: 0.45-0.52 at 32,000).
# At 32,000 bf16 classes the row (64,000 bytes) fits the 8 x 8 KB ring.
#   run: OUT=$OUT bash benchmarks/gpu_session30_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 benchmarks/bench_softmax_gluon.py --out $OUT/ce --ce --widths 32000,32768 \
  --configs "16,256,8,1,4,3,1,1,1;16,256,8,1,8,3,1,1,1;16,256,8,1,8,2,1,1,1;16,256,8,1,4,2,1,1,1" > $OUT/ce.log 2>&1
el "exit $?"; grep -v Warn $OUT/ce.log | tail -4
