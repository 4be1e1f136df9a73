#!/usr/bin/env bash
# Next device session, call 2, after gpu_session6_a.sh (nvidia-h200, < 9 min; no wheels): the C++ fast path of the eager norms, softmax and attention
# (FUSED_LAYERS_CPP=1, fused_layers/ops/_cpp.py + csrc/fastpath.cpp), prepared on the CPU, never run on a GPU:
#   1. the LayerNorm, softmax and attention GPU tests with the flag on (test_cpp_fastpath.py ran in gpu_session6_a.sh);
#   2. bench_host.py --cpp: LayerNorm / RMSNorm / softmax / attention host cost, Python and C++ paths beside aten
#      and SDPA (target <= 1.1x);
#   3. ViT-B/16 and GPT-2 (bench_models.py) with the flag on: host-bound steps where the LayerNorm swap lost.
# If it holds: default FUSED_LAYERS_CPP on where the extension builds.
#   run: OUT=$OUT bash benchmarks/gpu_session6_b.sh
set -u
source benchmarks/_gpu_env.sh
FUSED_LAYERS_CPP=1 timeout 150 python3 -m pytest tests/test_layer_norm.py tests/test_softmax.py tests/test_attention.py -m gpu -q -rf --tb=short -p no:cacheprovider -x \
  > $OUT/ln_tests_cpp.log 2>&1
el "LN gpu tests (cpp on) exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/ln_tests_cpp.log | tail -5
timeout 150 python3 benchmarks/bench_host.py --out $OUT/host_cpp --rounds 5 --cpp > $OUT/host_cpp.log 2>&1
el "host (cpp on) exit $?"; grep -E "^\| (layer_norm|rms_norm|softmax|attention)" $OUT/host_cpp.log
# ViT-B/16 and GPT-2 (host-bound steps, issue 11) with the C++ fast path on: does the LayerNorm swap now pay?
FUSED_LAYERS_CPP=1 timeout 150 python3 benchmarks/bench_models.py --out $OUT/models_cpp --models vit,gpt2 --timeout 65 \
  > $OUT/models_cpp.log 2>&1
el "models (cpp on) exit $?"; grep -E "^\| (vit|gpt2)" $OUT/models_cpp.log
