#!/usr/bin/env bash
# Next session's first call (written in session 13, not yet run), < 6 min on one H200:
#  1. issue 13: every Gluon GPU test (the fwd_gluon path through fused_attention, the persistent grid: not yet run);
#  2. issue 13: the Gluon forward beside Triton / cuDNN / flash with the persistent grid (1 and 2 programs an SM) and the
#     warp-specialized ping-pong candidate (attention_forward_gluon_ws) -- the grid aimed
#     at D64 S1K causal (190-308 TFLOP/s against cuDNN's 314);
#  3. issue 9: RMSNorm / LayerNorm 128K HOLD at 4096 x 8 (0.708 against 0.578 for RMSNorm in one run, session 13) with
#     its GPU test, to adopt.
#   run: OUT=$OUT bash benchmarks/gpu_session20_a.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider > $OUT/gluon_gpu_tests.log 2>&1
el "gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|Error" $OUT/gluon_gpu_tests.log | head
GLUON_CHECKS_FROM=2 timeout 150 python3 benchmarks/bench_attention_gluon.py --out $OUT --budget 120 --persistent 1,2 --ws > $OUT/gluon.log 2>&1
el "gluon bench exit $?"; grep -E "checks done|^\| " $OUT/gluon.log | head -30
timeout 60 python3 -m pytest tests/test_layer_norm.py -q -m gpu -p no:cacheprovider -k "persistent_backward_hold and 131072" > $OUT/hold_tests.log 2>&1
el "HOLD GPU tests exit $?"; tail -1 $OUT/hold_tests.log
for op in ln rms; do
  timeout 50 python3 benchmarks/bench_norm.py --out /tmp/h_$op --ops $op --dtypes bf16 --widths 131072 --sweep --sweep-op $op --sweep-parts bwd \
    --sweep-widths 131072 --sweep-dtypes bf16 --sweep-with bwd_persist_hold --sweep-budget 45 --budget 47 --no-peers > $OUT/hold128k_$op.log 2>&1
  el "$op 128K hold sweep exit $?"; grep -E '"part": "bwd"' $OUT/hold128k_$op.log | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l); print(r['n'], r['cfg'], round(r.get('frac', 0), 3), r.get('error', '')[:80])"
done
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
