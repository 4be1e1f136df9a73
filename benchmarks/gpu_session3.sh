#!/usr/bin/env bash
# 2026-12-01 session 3, one device call on nvidia-h200 (< 9 min):
#   1. GPU tests of the fix for torch.compile (Inductor) of the attention backward (USE_TMA was not passed;
#      wrap_triton wants every constexpr) and the dropout tests;
#   2. LayerNorm at timm ViT-B/16's shape (64 x 197 rows x 768, bf16), beside eager / compile / Liger:
#      policy=faster undid ViT's norms at 0.54x (run 1) and 0.84x (run 3) per layer;
#   3. benchmarks/gpu_attention_variants.sh (issue 13: bwd_tma auto default, variant GPU tests, the sweep).
# Results under $OUT: tests.log, norm_vit/, and gpu_attention_variants.sh's files.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
XDIST=""; python3 -c "import xdist" 2> /dev/null && XDIST="-n 4"
el "tests"
timeout 110 python3 -m pytest tests/test_attention.py tests/test_attention_dropout.py -m gpu -q -rf --tb=short $XDIST \
  -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -15
el "norm at ViT shape"
timeout 80 python3 benchmarks/bench_norm.py --out $OUT/norm_vit --ops ln --dtypes bf16 --widths 768,1024 \
  --total $((64 * 197 * 768)) > $OUT/norm_vit.log 2>&1
el "norm exit $?"; cat $OUT/norm_vit/*.md 2> /dev/null | head -40
left=$(( 520 - ($(date +%s) - T0) ))
el "attention variants, $left s"
OUT=$OUT TESTS_LIMIT=110 TOTAL_LIMIT=$left bash benchmarks/gpu_attention_variants.sh
el "done"
