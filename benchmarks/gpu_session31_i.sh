#!/usr/bin/env bash
# Session 24, call 9 (< 3 min, one H200).  After the VEC8 loops moved into shared helpers (same row-loop SASS): the VEC8,
# misaligned and library GPU tests, and the CE / softmax defaults at 50,257.
#   run: OUT=$OUT bash benchmarks/gpu_session31_i.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py tests/test_library.py -m gpu -n 8 -q -p no:cacheprovider -k "vec8 or misaligned or linear or library or special" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
timeout 40 python3 benchmarks/sweep_ce_hold.py 50257 100277 --default-only > $OUT/ce.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce.txt
SWEEP='{"50257": [], "100277": []}' timeout 40 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
