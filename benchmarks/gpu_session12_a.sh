#!/usr/bin/env bash
# Next session's first call for issue 10 (written in session 8 of 2026-12-01, not yet run): the LEAN persistent
# softmax forward (the statistics pass's exponentials kept in fp32 for the output: one conversion and one exp2 per
# element; sm_90 offline: 912 SASS instructions a thread against 1,144 at bf16 4K x 4 warps,
# benchmarks/scan_persist_sass.py).  GPU tests first, then the wide softmax sweep beside the defaults.  Adopt LEAN
# (softmax_config) where it wins; for bf16 also flip WIDE_MODE[("fwd", 2)] to 2 if it beats piece-wise.  The CE's
# LEAN form (persist_lean for wide_mode 3) in the same call, against the stream.
#   run: OUT=$OUT bash benchmarks/gpu_session12_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 180 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -k "persist" -x -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -2 $OUT/tests.log
grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { el "tests failed: stop"; exit 0; }
timeout 200 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only piecewise,persist_4k_w4,persist_2k_w4,persist_4k_w8_lean > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
timeout 150 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only persist_4k_w4,persist_2k_w4_lean,stream_4k_w8_st4 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep SWEEP $OUT/ce.log
