#!/usr/bin/env bash
# Session 23, call 7 (< 8 min, one H200).  Issue 10: the cross-entropy's TMA HOLD default for 16-bit rows of at most
# 32,768 classes (cross_entropy_config.TMA_HOLD): its GPU tests (the new test_gpu_tma_hold_default, the TMA tests,
# the cross-entropy GPU suite at the new default), the default against the persistent kernel through
# fused_cross_entropy, and the cross-entropy table with its peers.
#   run: OUT=$OUT bash benchmarks/gpu_session30_g.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 200 python3 -m pytest tests/test_softmax_gluon.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests_gluon.log 2>&1
el "gluon tests exit $?"; tail -3 $OUT/tests_gluon.log; grep -E "^FAILED|Error" $OUT/tests_gluon.log | head -20
timeout 150 python3 -m pytest tests/test_cross_entropy.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests_ce.log 2>&1
el "CE tests exit $?"; tail -2 $OUT/tests_ce.log; grep -E "^FAILED" $OUT/tests_ce.log | head
timeout 100 python3 benchmarks/sweep_ce_hold.py > $OUT/ce_hold.txt 2>&1
el "sweep exit $?"; grep "C=" $OUT/ce_hold.txt
timeout 130 python3 benchmarks/bench_cross_entropy.py --out /tmp/cefull --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; cp /tmp/cefull/cross_entropy_h200.md $OUT/ 2>/dev/null; grep -E "^CE V" $OUT/ce_table.log
