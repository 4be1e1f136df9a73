#!/usr/bin/env bash
# Session 11 (2026-12-02), third call.  Issue 9: the persistent norm backward adopted at bf16 16K / 32K / 64K
# (layer_norm_config.BWD_PERSIST): GPU tests, then the sweep beside the two-pass kernels (bwd_persist=0) at
# 8K-128K under CUDA-graph replay.  Issue 10: the wide softmax table with the backward op timed directly and by
# graph replay (run16_b: through autograd.grad the timing is host-bound).  Issue 9: host cost with the CE rows.
#   run: OUT=$OUT bash benchmarks/gpu_session16_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_layer_norm.py -q -m gpu -k "persist or wide or widths" -p no:cacheprovider > $OUT/ln_tests.log 2>&1
el "LN GPU tests exit $?"; tail -1 $OUT/ln_tests.log
for spec in ln:8192,16384,32768,65536,131072 rms:32768,131072; do
  op=${spec%%:*}; ws=${spec#*:}
  timeout 130 python3 benchmarks/bench_norm.py --out /tmp/c$op --ops $op --dtypes bf16 --widths 16384 --sweep \
    --sweep-op $op --sweep-parts bwd --sweep-widths $ws --budget 120 --sweep-budget 110 --sweep-dtypes bf16 --sweep-with bwd_persist --no-peers \
    > /tmp/c$op.log 2>&1
  el "$op sweep exit $?"; grep -E '"part": "bwd"' /tmp/c$op.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); c = r['cfg']; print(r['n'], c.get('bwd_persist', '-'), c.get('bwd_persist_block'), c.get('bwd_persist_warps'), c.get('bwd_persist_stages'), round(r.get('frac', 0), 3), r.get('error', '')[:80])" | tee $OUT/norm_$op.txt
done
timeout 120 python3 benchmarks/bench_cross_entropy.py --out /tmp/sm --softmax-only --sweep-only =default > $OUT/softmax.log 2>&1
el "softmax table exit $?"; cp /tmp/sm/cross_entropy_h200.md $OUT/softmax_h200.md 2>/dev/null; grep SOFTMAX $OUT/softmax.log
timeout 150 python3 benchmarks/bench_host.py --out /tmp/host --rounds 3 --calls 1000 > $OUT/host.log 2>&1
el "host exit $?"; cp /tmp/host/*.md $OUT/ 2>/dev/null; tail -25 $OUT/host.log
