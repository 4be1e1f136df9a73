#!/usr/bin/env bash
# Session 8 of 2026-12-01, call 4 (nvidia-h200): float32 wide softmax rows persistent by default
# (softmax_config.WIDE_MODE): every softmax / cross-entropy / compile GPU test, then the wide softmax table at the
# defaults beside the piece-wise kernels.
#   run: OUT=$OUT bash benchmarks/gpu_session11_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 330 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py tests/test_compile_gpu.py -q -m gpu -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -4 $OUT/tests.log
timeout 150 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only piecewise > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
