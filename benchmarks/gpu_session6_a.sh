#!/usr/bin/env bash
# Next device session, call 1 (nvidia-h200, < 9 min; .whl carried: Liger / Hydra tests): every GPU test, first.
# Session 4 changed the launch path of every op on the CPU (Kernel: launch on the tensors' device, device in the
# bind key) and added the C++ fast path; neither has run on a GPU yet.
#   run: OUT=$OUT bash benchmarks/gpu_session6_a.sh
set -u
source benchmarks/_gpu_env.sh
if ls .whl/*.whl > /dev/null 2>&1; then  # hydra / omegaconf / wandb for the train tests
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
XDIST=""; python3 -c "import xdist" 2> /dev/null && XDIST="-n 8"
timeout 380 python3 -m pytest tests -m gpu -q $XDIST -rf --tb=short -p no:cacheprovider -W ignore > $OUT/gpu_tests.log 2>&1
el "gpu tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests.log | tail -15
timeout 150 python3 -m pytest tests/test_cpp_fastpath.py -q -rf --tb=short -p no:cacheprovider > $OUT/cpp_tests.log 2>&1
el "cpp tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/cpp_tests.log | tail -8
