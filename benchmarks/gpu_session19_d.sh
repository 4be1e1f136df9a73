#!/usr/bin/env bash
# Session 13 (2026-12-03): issue 13's Gluon forward (fused_layers/ops/attention_gluon.py), first run on a GPU: the
# correctness checks (O, LSE, the Triton backward on its O / LSE), then the forward beside the Triton forward, cuDNN and
# SDPA flash at D64 / D128, S 1K / 4K / 16K, causal and not, with a few tile shapes. < 5 min.
#   run: OUT=$OUT bash benchmarks/gpu_session19_d.sh
set -u
source benchmarks/_gpu_env.sh
timeout 280 python3 benchmarks/bench_attention_gluon.py --out $OUT --budget 230 \
  --configs "${GLUON_CONFIGS:-128:128,64,8,3;64:128,64,8,4;64:64,128,4,3}" > $OUT/gluon.log 2>&1
el "gluon bench exit $?"; grep -E '"kind": "check"' $OUT/gluon.log | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l); print('check', r['D'], r['S'], int(r['causal']), r['cfg'], 'ok' if r['ok'] else 'FAIL', r.get('err_o'), r.get('err_lse'), r.get('err_grad'), r.get('error', '')[:600])"
grep -E "^\| |checks done|Error|error" $OUT/gluon.log | head -40
