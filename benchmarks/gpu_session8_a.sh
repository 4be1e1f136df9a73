#!/usr/bin/env bash
# Next device session, call 1 (nvidia-h200, < 9 min, timeout_s 580; .whl carried): the C++ fast path as session 5
# left it, never run on a GPU in this form: attention_fast (SDPA's call in one C++ call), clear_fast on config
# overrides, tangents read from the autograd metadata.
#   1. tests/test_cpp_fastpath.py, then EVERY GPU test with FUSED_LAYERS_CPP=1 (the fast paths under the whole suite);
#   2. bench_host.py --cpp (host cost, Python and C++ paths beside aten / SDPA; target <= 1.1x) and diag_cpp_host.py;
#   3. ViT-B/16, GPT-2 and Llama steps with the flag on.
# If 1 is green and 2 / 3 do not lose: FUSED_LAYERS_CPP defaults on where the extension builds (ops/_cpp.py).
#   run: OUT=$OUT bash benchmarks/gpu_session8_a.sh
set -u
source benchmarks/_gpu_env.sh
if ls .whl/*.whl > /dev/null 2>&1; then  # hydra / omegaconf / wandb for the train tests
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
timeout 120 python3 -m pytest tests/test_cpp_fastpath.py -q -rf --tb=short -p no:cacheprovider > $OUT/cpp_tests.log 2>&1
el "cpp tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/cpp_tests.log | head -30
XDIST=""; python3 -c "import xdist" 2> /dev/null && XDIST="-n 8"
FUSED_LAYERS_CPP=1 timeout 200 python3 -m pytest tests -m gpu -q $XDIST -rf --tb=short -p no:cacheprovider -W ignore > $OUT/gpu_tests_cpp_on.log 2>&1
el "all gpu tests (cpp on) exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests_cpp_on.log | tail -15
timeout 80 python3 benchmarks/bench_host.py --out $OUT/host_cpp --rounds 5 --cpp > $OUT/host_cpp.log 2>&1
el "host (cpp on) exit $?"; grep -E "^\| (layer_norm|rms_norm|softmax|attention)" $OUT/host_cpp.log
FUSED_LAYERS_CPP=1 timeout 70 python3 benchmarks/diag_cpp_host.py --out $OUT --rounds 3 --calls 1000 > $OUT/diag_cpp_host.log 2>&1
el "diag cpp host exit $?"; grep -E "^\|" $OUT/diag_cpp_host.log | head -22
FUSED_LAYERS_CPP=1 timeout 150 python3 benchmarks/bench_models.py --out $OUT/models_cpp --models vit,gpt2,llama --timeout 45 \
  > $OUT/models_cpp.log 2>&1
el "models (cpp on) exit $?"; grep -E "^\| (vit|gpt2|llama)" $OUT/models_cpp.log
