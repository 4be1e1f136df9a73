#!/usr/bin/env bash
# Session 23, call 10 (< 2 min, one H200).  Issue 10: the CE TMA HOLD default covers C % 256 == 0 (FLAT boxes) only.
# Here the (1, 256) box form at widths that are not multiples of 256 but of 8, as TMA needs (32,064 Phi-3, 32,008, 30,528), against
# the library default (the persistent kernel there), through the kernel directly.
#   run: OUT=$OUT bash benchmarks/gpu_session30_j.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 benchmarks/bench_softmax_gluon.py --out $OUT/ce --ce --widths 32064,32008,30528 \
  --configs "16,256,8,1,4,3,1,1,1;16,256,8,1,4,3,1,1,0" > $OUT/ce.log 2>&1
el "exit $?"; grep -v Warn $OUT/ce.log | tail -3
