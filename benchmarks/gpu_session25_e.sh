#!/usr/bin/env bash
# Session 18, call 5 (< 4 min, one H200).  Issue 9: why do_bench of the 16K norm backward through the Gluon row
# backward reads 0.21 of copy (graph replay 0.77-0.88, call 4): its host cost per call against the persistent path's
# (benchmarks/diag_norm_host.py), then the norm GPU tests with the persistent tests pinned to bwd_gluon=0 and the CUDA-
# graph / side-stream test run on both paths.
#   run: OUT=$OUT bash benchmarks/gpu_session25_e.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 90 python3 benchmarks/diag_norm_host.py > $OUT/diag_norm_host.txt 2>&1
el "host diag exit $?"; grep -E "host|Error|error" $OUT/diag_norm_host.txt | head; grep -A22 "Ordered by" $OUT/diag_norm_host.txt | cut -c1-160; pack
timeout 100 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 6 -p no:cacheprovider -k "gluon or persistent_backward" > $OUT/norm_tests.log 2>&1
el "norm tests exit $?"; tail -1 $OUT/norm_tests.log; grep -E "^FAILED|^E  " $OUT/norm_tests.log | head -8; pack
rm -rf $OUT
