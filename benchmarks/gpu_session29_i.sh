#!/usr/bin/env bash
# Session 22, call 9 (< 4 min, one H200).  Issue 9's torch.compile deliverable at HEAD before resolving it: the compile
# GPU tests (reduce-overhead CUDA graphs, every fused module, no graph break / recompile), the C++ fast-path tests,
# and the callback / swap / integration GPU tests.
#   run: OUT=$OUT bash benchmarks/gpu_session29_i.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 220 python3 -m pytest tests/test_compile_gpu.py tests/test_cpp_fastpath.py tests/test_swap.py tests/test_callback.py \
  -q -m gpu -n 8 -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
