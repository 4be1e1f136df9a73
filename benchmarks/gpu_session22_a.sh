#!/usr/bin/env bash
# Session 15, call 2 (< 3 min, one H200): the Gluon GPU tests with the spies on the launchers the dispatch calls
# (call 1's 91 failures were the spies watching the public wrappers, which the dispatch no longer calls), GQA dK / dV
# on by default (bwd_gluon_gqa -1), and every attention GPU test at the defaults.
#   run: OUT=$OUT bash benchmarks/gpu_session22_a.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 100 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider -k "not persistent" > $OUT/gluon_gpu_tests.log 2>&1
el "gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|^E  " $OUT/gluon_gpu_tests.log | head -12; pack
timeout 100 python3 -m pytest tests/test_attention.py -q -m gpu -n 4 -p no:cacheprovider > $OUT/attention_gpu_tests.log 2>&1
el "attention GPU tests exit $?"; tail -1 $OUT/attention_gpu_tests.log; grep -E "^FAILED|^E  " $OUT/attention_gpu_tests.log | head -12; pack
rm -rf $OUT
