#!/usr/bin/env bash
# Next session's third call (written in session 11, 2026-12-02; not yet run): issue 9's packed LayerNorm backward
# and its no-exchange diagnostic, the persistent backward in a CUDA graph; issue 10's CE table with graph replay.
#   run: OUT=$OUT bash benchmarks/gpu_session17_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
# Issue 9: LayerNorm's packed-sums candidate of the persistent backward (bwd_persist_pack: one published word a
# piece instead of two; sm_90: 127 registers, one atomic instead of two): GPU tests, then the sweep beside the
# BWD_PERSIST defaults (LN 0.65 / 0.64 / 0.54 at 16K / 32K / 64K; RMSNorm, one word already, 0.72 / 0.74 / 0.63).
timeout 90 python3 -m pytest tests/test_layer_norm.py -q -m gpu -k "packed_sums or cuda_graph" -p no:cacheprovider > $OUT/pack_tests.log 2>&1
el "pack GPU tests exit $?"; tail -1 $OUT/pack_tests.log
if grep -q " passed" $OUT/pack_tests.log && ! grep -q "failed" $OUT/pack_tests.log; then
  timeout 120 python3 benchmarks/bench_norm.py --out /tmp/pk --ops ln --dtypes bf16 --widths 16384 --sweep \
    --sweep-op ln --sweep-parts bwd --sweep-widths 16384,32768,65536 --budget 110 --sweep-budget 100 --sweep-dtypes bf16 \
    --sweep-with bwd_persist_pack,bwd_persist_diag_nosync --no-peers > /tmp/pk.log 2>&1
  el "pack sweep exit $?"; grep -E '"part": "bwd"' /tmp/pk.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); c = r['cfg']; print(r['n'], c.get('bwd_persist', '-'), c.get('bwd_persist_block'), c.get('bwd_persist_warps'), c.get('bwd_persist_stages'), 'pack' if c.get('bwd_persist_pack') else ('DIAG-nosync' if c.get('bwd_persist_diag_nosync') else ''), round(r.get('frac', 0), 3))" | tee $OUT/pack_sweep.txt
fi
# Issue 10: the CE table with the graph-replay column (kernel-level fraction of copy beside the eager step), peers
# in the same run.
timeout 200 python3 benchmarks/bench_cross_entropy.py --out /tmp/cefull --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; cp /tmp/cefull/cross_entropy_h200.md $OUT/ 2>/dev/null; grep -E "^CE V" $OUT/ce_table.log
