#!/usr/bin/env bash
# Session 9 of 2026-12 (2026-12-02), call 1, issue 10: L2 hints and a capped grid for the two-pass kernels, and
# session 8's LEAN persistent candidates.  GPU tests of the new forms first (stop if any fails), then the wide
# softmax sweep (piece-wise with hints, LEAN persistent) and the cross-entropy sweep (stream with hints / row loop).
#   run: OUT=$OUT bash benchmarks/gpu_session13_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
timeout 200 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -k "persist or l2" -x -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -2 $OUT/tests.log
grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { el "tests failed: stop"; exit 0; }
timeout 170 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only stream_4k_w8_st4,stream_8k_w16_st3_rp,stream_2k_w4_st4_rp,persist_2k_w4_lean --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep SWEEP $OUT/ce.log
timeout 200 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only piecewise,persist_4k_w4_lean,persist_4k_w8_lean > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
