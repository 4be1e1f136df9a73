#!/usr/bin/env bash
# Session 14, call 3 (< 8 min, one H200), issue 13:
#  1. every Gluon GPU test (the new dQ kernel, the auto defaults: ping-pong forward, Gluon dK / dV);
#  2. the Gluon bench: ping-pong shapes (--ws-configs), the backward with the Gluon dQ kernel (--dq-configs);
#  3. issue 9: the Gluon path's host cost per call (benchmarks/host_gluon.py), for GLUON_MIN_WORK.
#   run: OUT=$OUT bash benchmarks/gpu_session21_a.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
timeout 170 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider > $OUT/gluon_gpu_tests.log 2>&1
el "gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|Error" $OUT/gluon_gpu_tests.log | head
timeout 60 python3 benchmarks/host_gluon.py --out $OUT/host > $OUT/host.log 2>&1
el "host exit $?"; cat $OUT/host.log | tail -4
GLUON_CHECKS_FROM=3 timeout 260 python3 benchmarks/bench_attention_gluon.py --out $OUT/g --budget 110 --ws \
  --ws-configs "64:64,4,232,40;64:128,2,232,40;128:64,3,232,40;128:64,4,232,40" --bwd --dq-configs "64:64,128,4,2;128:64,64,4,3" \
  > $OUT/gluon.log 2>&1
el "gluon bench exit $?"; grep -E "checks done|^\| |^Backward" $OUT/gluon.log | head -50
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
