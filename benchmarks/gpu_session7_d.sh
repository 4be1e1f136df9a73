#!/usr/bin/env bash
# Session 5, call 4 (nvidia-h200, < 8 min): the C++ fast path rebuilt on hand-written autograd nodes (as aten's
# generated ones) and a one-call lookup from the functional API (norm_fast / softmax_fast):
# its GPU tests, the norm / softmax GPU tests with it on, where the host time goes now, bench_host --cpp, and
# ViT / GPT-2 steps with it on.
#   run: OUT=$OUT bash benchmarks/gpu_session7_d.sh
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_cpp_fastpath.py -q -rf --tb=short -p no:cacheprovider > $OUT/cpp_tests.log 2>&1
el "cpp tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/cpp_tests.log | head -30
FUSED_LAYERS_CPP=1 timeout 100 python3 -m pytest tests/test_layer_norm.py tests/test_softmax.py -m gpu -q -rf --tb=short -p no:cacheprovider \
  > $OUT/norm_tests_cpp.log 2>&1
el "norm/softmax gpu tests (cpp on) exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/norm_tests_cpp.log | tail -8
FUSED_LAYERS_CPP=1 timeout 90 python3 benchmarks/diag_cpp_host.py --out $OUT > $OUT/diag_cpp_host.log 2>&1
el "diag cpp host exit $?"; grep -E "^\||plan ids|grad_fn" $OUT/diag_cpp_host.log | head -24
timeout 100 python3 benchmarks/bench_host.py --out $OUT/host_cpp --rounds 5 --cpp > $OUT/host_cpp.log 2>&1
el "host (cpp on) exit $?"; grep -E "^\| (layer_norm|rms_norm|softmax|attention)" $OUT/host_cpp.log
FUSED_LAYERS_CPP=1 timeout 130 python3 benchmarks/bench_models.py --out $OUT/models_cpp --models vit,gpt2 --timeout 60 \
  > $OUT/models_cpp.log 2>&1
el "models (cpp on) exit $?"; grep -E "^\| (vit|gpt2)" $OUT/models_cpp.log
