#!/usr/bin/env bash
# Issue 11, one device call on nvidia-h200 (< 9 min): GPU tests of the integrations and of attention
# dropout, the dropout cost of the kernels, then the acceptance table (HF GPT-2 small, Llama GQA 8 x d1024,
# Qwen2-style, timm ViT-B/16; unfused / fused / policy=faster / Liger).  Results under $OUT:
# gpu_tests.log, dropout_<gpu>.{json,md}, models_<gpu>.{json,md}, models.log.
set -u
export PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then  # liger-kernel (and hydra/wandb) from the carried wheels, if any
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton, transformers, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'timm', timm.__version__)"
XDIST=""; python3 -c "import xdist" 2> /dev/null && XDIST="-n 6"
el "gpu tests"
timeout 100 python3 -m pytest tests/test_integrations.py tests/test_attention_dropout.py tests/test_attention.py tests/test_layer_norm.py -m gpu -q $XDIST -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
tail -6 $OUT/gpu_tests.log
el "dropout cost"
timeout 150 python3 benchmarks/bench_attention_dropout.py --out $OUT > /dev/null 2>&1; cat $OUT/dropout_*.md 2> /dev/null
el "models"
timeout 225 python3 benchmarks/bench_models.py --out $OUT --timeout 58 > $OUT/models.log 2>&1
grep -v "^\[" $OUT/models.log | tail -40
el "done"
