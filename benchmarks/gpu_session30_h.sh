#!/usr/bin/env bash
# Session 23, call 8 (< 3 min, one H200).  Call 7's two fixes: the new GPU test with class weights in the logits'
# dtype (the op requires it; call 7's failures were the test's), and the sweep with a fresh leaf a graph-captured call.
#   run: OUT=$OUT bash benchmarks/gpu_session30_h.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_softmax_gluon.py -m gpu -n 8 -q -p no:cacheprovider -k "tma_hold_default or cross_entropy or public_ops" > $OUT/tests_gluon.log 2>&1
el "gluon tests exit $?"; tail -2 $OUT/tests_gluon.log; grep -E "^FAILED|^E  " $OUT/tests_gluon.log | head -20
timeout 120 python3 benchmarks/sweep_ce_hold.py > $OUT/ce_hold.txt 2>&1
el "sweep exit $?"; grep "C=" $OUT/ce_hold.txt; tail -3 $OUT/ce_hold.txt
