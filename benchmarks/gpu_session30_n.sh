#!/usr/bin/env bash
# Session 23, call 14 (< 4 min, one H200).  After the misaligned-row routing (softmax_config.MISALIGNED_PIECEWISE,
# cross_entropy_config.MISALIGNED_STREAM): the softmax and cross-entropy GPU suites and the TMA HOLD test at the new
# defaults; the defaults at 50,257 / 30,522 / 32,001 (CE fwd + bwd; softmax bf16 forward).
#   run: OUT=$OUT bash benchmarks/gpu_session30_n.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 110 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head
timeout 50 python3 -m pytest tests/test_softmax_gluon.py -m gpu -n 8 -q -p no:cacheprovider -k tma_hold_default > $OUT/tests_hold.log 2>&1
el "hold tests exit $?"; tail -1 $OUT/tests_hold.log
timeout 40 python3 benchmarks/sweep_ce_hold.py 50257 30522 32001 --default-only > $OUT/ce_odd.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce_odd.txt
SWEEP='{"50257": [], "32001": [], "100277": []}' timeout 40 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_odd.txt 2>&1
el "softmax exit $?"; grep -v Warn $OUT/sm_odd.txt | sed -E 's/ {20,}/ /'
