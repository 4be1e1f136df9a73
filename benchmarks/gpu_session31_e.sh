#!/usr/bin/env bash
# Session 24, call 5 (< 4 min, one H200).  The cross-entropy's aligned persistent kernel with its gradient store back
# in place (SASS as at the session's start), and the VEC8 kernel with the same store: the CE defaults at the issue's
# aligned vocabularies and the misaligned ones, then the CE tests.
#   run: OUT=$OUT bash benchmarks/gpu_session31_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 benchmarks/sweep_ce_hold.py 50304 128256 262144 50257 30522 100277 --default-only > $OUT/ce.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce.txt
timeout 100 python3 -m pytest tests/test_cross_entropy.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
