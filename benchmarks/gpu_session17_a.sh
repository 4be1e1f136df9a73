#!/usr/bin/env bash
# Next session's first call (written in session 11, 2026-12-02; not yet run).  Issue 9 / 12: the graph break of the
# cuDNN probe is fixed (torch.compiler.assume_constant_result, commit "Fix: the cuDNN probe ..."): the compile GPU
# tests (the reduce-overhead test now also at head dim 64 with the probe's cache empty), then GPT-2 small with
# fused_compile FIRST in its process (run16_f: 50.8 ms step on 34.6 ms GPU, 0.67x compile_sdpa, 6 graph breaks at
# ops/attention.py), with the graph-break log; then issue 10's softmax SMEM+LEAN candidates beside the default.
#   run: OUT=$OUT bash benchmarks/gpu_session17_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 -c "from fused_layers.ops import _cpp; print('extension', _cpp.extension(wait=True) is not None)" > $OUT/build.log 2>&1
timeout 150 python3 -m pytest tests/test_compile_gpu.py tests/test_attention.py -q -m gpu -k "compile or cudnn" -p no:cacheprovider > $OUT/compile_tests.log 2>&1
el "compile GPU tests exit $?"; tail -2 $OUT/compile_tests.log; grep -E "^FAILED" $OUT/compile_tests.log | head
TORCH_LOGS="graph_breaks" timeout 200 python3 benchmarks/bench_e2e.py --out /tmp/e2e --variants fused_compile,compile_sdpa,fused,unfused_sdpa --rounds 3 --steps 8 --profile-steps 1 --tag _compile > $OUT/e2e_compile.log 2>&1
el "e2e exit $?"; cp /tmp/e2e/e2e_h200_compile.md $OUT/ 2>/dev/null; grep -E "^\| (fused|compile|unfused)" /tmp/e2e/e2e_h200_compile.md
echo "graph breaks: $(grep -c 'Graph break' $OUT/e2e_compile.log)"
timeout 120 python3 benchmarks/bench_cross_entropy.py --out /tmp/sm --softmax-only --sweep-only =persist_smem_4k_w4_st3,=persist_smem_4k_w4_st3_lean,=persist_smem_4k_w4_st4_lean,=persist_smem_8k_w8_st3_lean > $OUT/softmax_lean.log 2>&1
el "softmax lean sweep exit $?"; grep SOFTMAX $OUT/softmax_lean.log
# Issue 9: LayerNorm's packed-sums candidate of the persistent backward (bwd_persist_pack: one published word a
# piece instead of two; sm_90: 127 registers, one atomic instead of two): GPU tests, then the sweep beside the
# BWD_PERSIST defaults (LN 0.65 / 0.64 / 0.54 at 16K / 32K / 64K; RMSNorm, one word already, 0.72 / 0.74 / 0.63).
timeout 90 python3 -m pytest tests/test_layer_norm.py -q -m gpu -k "packed_sums" -p no:cacheprovider > $OUT/pack_tests.log 2>&1
el "pack GPU tests exit $?"; tail -1 $OUT/pack_tests.log
if grep -q " passed" $OUT/pack_tests.log && ! grep -q "failed" $OUT/pack_tests.log; then
  timeout 120 python3 benchmarks/bench_norm.py --out /tmp/pk --ops ln --dtypes bf16 --widths 16384 --sweep \
    --sweep-op ln --sweep-parts bwd --sweep-widths 16384,32768,65536 --budget 110 --sweep-budget 100 --sweep-dtypes bf16 \
    --sweep-with bwd_persist_pack,bwd_persist --no-peers > /tmp/pk.log 2>&1
  el "pack sweep exit $?"; grep -E '"part": "bwd"' /tmp/pk.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); c = r['cfg']; print(r['n'], c.get('bwd_persist', '-'), c.get('bwd_persist_block'), c.get('bwd_persist_warps'), c.get('bwd_persist_stages'), 'pack' if c.get('bwd_persist_pack') else '', round(r.get('frac', 0), 3))" | tee $OUT/pack_sweep.txt
fi
