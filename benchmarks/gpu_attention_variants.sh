#!/usr/bin/env bash
# Issue 13, one device call (< 8 minutes wall): the attention variants on the GPU.  After the H200 sweep of
# 2026-12-01 (benchmarks/results/issue13/attention_variants.md) only bwd_tma is left (the TMA / warp-
# specialized / persistent forwards and the dQ-by-atomics backwards were slower and were removed); it is on
# by default where it won (Sk >= 4096 and (not causal or D <= 64), bf16 / fp16).
#   1. GPU run of tests/test_attention_variants.py (bwd_tma forced on against float64 on ragged shapes, GQA,
#      varlen, key-padding bias, dropout, float32; fallbacks; the auto rule) -- the interpreter cannot run
#      TMA hardware.
#   2. bench_attention.py --variants: every entry of VARIANTS (default, stages+1, bwd_tma forced on and
#      forced off) beside cuDNN SDPA, SDPA flash and FlexAttention, D 64/128, S 1K/4K/16K, causal and
#      not, each checked against SDPA flash before it is timed; a variant that fails to compile is
#      recorded and the sweep goes on.
# Results: $OUT/attention_variants.{json,md}, $OUT/variants_sweep.log, $OUT/variants_tests.log.
#   run: bash benchmarks/gpu_attention_variants.sh     (device tool, kind nvidia-h200, timeout 600)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attn_variants_out}
W=/tmp/attn_variants; mkdir -p $W $OUT
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 - <<'EOF'
import triton, triton.language as tl
from fused_layers.ops import attention as A
print("set_allocator:", hasattr(triton, "set_allocator"), "make_tensor_descriptor:", hasattr(tl, "make_tensor_descriptor"),
      "HAS_TMA_DESCRIPTORS:", A.HAS_TMA_DESCRIPTORS)
EOF

echo "=== variant tests on the GPU"
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
timeout ${TESTS_LIMIT:-200} python3 -m pytest tests/test_attention_variants.py -q -rf --tb=short $XDIST -p no:cacheprovider \
    > $OUT/variants_tests.log 2>&1
echo "exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/variants_tests.log | tail -25

echo "=== variant sweep (t=$(( $(date +%s) - T0 )) s)"
LEFT=$(( ${TOTAL_LIMIT:-450} - ($(date +%s) - T0) ))
DEADLINE=$(( LEFT - 25 ))
timeout $(( LEFT )) python3 benchmarks/bench_attention.py --out $W --variants --workers ${WORKERS:-14} \
    --dims 64,128 --variant-seqlens 1024,4096,16384 --flex-seqlens ${FLEX_SEQLENS:-1024,4096,16384} \
    --deadline $DEADLINE > $OUT/variants_sweep.log 2>&1
echo "exit $?"
cp $W/attention_variants.json $W/attention_variants.md $OUT/ 2>/dev/null
grep -v "^{" $OUT/variants_sweep.log | tail -80
echo "=== done in $(( $(date +%s) - T0 )) s"
