#!/usr/bin/env bash
# Next session's first call (written in session 13, not yet run), < 7 min on one H200:
#  1. issue 13: every Gluon GPU test (the fwd_gluon path through fused_attention, the persistent grid, the ping-pong,
#     the dK / dV kernel: none has run yet);
#  2. issue 13: the Gluon forward beside Triton / cuDNN / flash with the persistent grid (1 and 2 programs an SM) and the
#     warp-specialized ping-pong candidate (attention_forward_gluon_ws) -- the grid aimed
#     at D64 S1K causal (190-308 TFLOP/s against cuDNN's 314);
#  3. issue 13: the backward's Gluon dK / dV candidate (bwd_gluon_dkdv) beside the Triton backward and cuDNN's (--bwd).
# (the norm part moved to gpu_session20_b.sh)
#   run: OUT=$OUT bash benchmarks/gpu_session20_a.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider -k "not warp_specialized" > $OUT/gluon_gpu_tests.log 2>&1
el "gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|Error" $OUT/gluon_gpu_tests.log | head
GLUON_CHECKS_FROM=2 timeout 240 python3 benchmarks/bench_attention_gluon.py --out $OUT/main --budget 100 --persistent 1,2 --bwd \
  --dkdv-configs "128:64,64,4,2;128:32,128,8,3" > $OUT/gluon.log 2>&1
el "gluon bench exit $?"; grep -E "checks done|^\| |^Backward" $OUT/gluon.log | head -50
# the ping-pong apart (a deadlock there must not cost the rest): its tests, then its timing
timeout 60 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider -k "warp_specialized" > $OUT/ws_gpu_tests.log 2>&1
el "ping-pong GPU tests exit $?"; tail -1 $OUT/ws_gpu_tests.log
if grep -q " passed" $OUT/ws_gpu_tests.log && ! grep -q "failed" $OUT/ws_gpu_tests.log; then
  GLUON_CHECKS_FROM=4 timeout 90 python3 benchmarks/bench_attention_gluon.py --out $OUT/ws --budget 70 --ws > $OUT/gluon_ws.log 2>&1
  el "ping-pong bench exit $?"; grep -E "checks done|^\| " $OUT/gluon_ws.log | head -20
fi
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
