#!/usr/bin/env bash
# Next session (written in session 13, not yet run), < 3 min: issue 9's 128K HOLD (RMSNorm 4096 x 8 0.708 against
# 0.578 in one run, session 13) with its GPU test (HOLD at 4096 x 8 pieces), to adopt per norm.
#   run: OUT=$OUT bash benchmarks/gpu_session20_b.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
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
