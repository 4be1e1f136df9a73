#!/usr/bin/env bash
# One device call (< 5 min on an H200): cross-entropy GPU tests, the 300-step loss curves of the demo LM
# (fused vs unfused), then the benchmark with its config sweep (killed at 170 s it still writes what it measured).
#   OUT=/tmp/out bash benchmarks/gpu_cross_entropy.sh      (writes 7 files to $OUT)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ce_out}; mkdir -p "$OUT"
source benchmarks/_gpu_env.sh  # Liger-Kernel (optional peer) from the carried wheel, when present
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 8"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "=== GPU tests: cross-entropy (vocabulary widths, every wide-row kernel, torch.compile triton_op, linear CE), opt-in coop wide softmax"
timeout 120 python3 -m pytest tests/test_cross_entropy.py tests/test_softmax.py::test_gpu_wide_coop_opt_in -q -m gpu $XDIST -p no:cacheprovider > "$OUT/ce_gpu_tests.log" 2>&1
echo "rc=$?"; tail -15 "$OUT/ce_gpu_tests.log"
echo "=== cross-entropy semantics tests on CUDA tensors (every non-slow CPU test, real kernels)"
timeout 60 python3 -m pytest tests/test_cross_entropy.py -q -m "not slow and not gpu" $XDIST -p no:cacheprovider > "$OUT/ce_tests_cuda.log" 2>&1
echo "rc=$?"; tail -8 "$OUT/ce_tests_cuda.log"
echo "=== loss curves: demo LM (4L d512 seq512 b8 V50304), 300 steps bf16 autocast, unfused / fused / fp32-head"
timeout 80 python3 benchmarks/ce_loss_curve.py --out "$OUT" > "$OUT/ce_loss_curve.log" 2>&1
echo "rc=$?"; tail -16 "$OUT/ce_loss_curve.log"
echo "=== benchmark (CE config sweep, CE vs peers, linear CE, opt-in coop wide softmax; json + md)"
timeout 170 python3 benchmarks/bench_cross_entropy.py --out "$OUT" --sweep > "$OUT/ce_bench.log" 2>&1
echo "rc=$?"; grep -v "^\[" "$OUT/ce_bench.log" | grep -v "^SWEEP\|^CE \|^LINEAR\|^SOFTMAX" | tail -75
