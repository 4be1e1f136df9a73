#!/usr/bin/env bash
# Session 8 of 2026-12-01, call 8 (nvidia-h200, the last ~7 min of device time): the persistent kernels with rows
# loaded DEPTH ahead (persist_depth 1-3: more bytes in flight per SM, the shortfall the sweeps point at: sm_90
# registers from benchmarks/_sm90.py give 32 KB in flight per SM at bf16 depth 1 against ~64 KB for fp32, whose
# kernels reach 0.89 / 0.97) and the CE with its targets a row ahead (128 registers, was 200): GPU tests, then sweeps.
#   run: OUT=$OUT bash benchmarks/gpu_session11_f.sh
# (DEPTH > 1 lost everywhere in this call, issue10/run10_depth/: removed after it; the persist_*_d2/_d3 configs are gone.)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_cross_entropy.py tests/test_softmax.py -q -m gpu -k "persist" -x -p no:cacheprovider > $OUT/tests.log 2>&1
el "persist GPU tests exit $?"; tail -2 $OUT/tests.log
grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { el "tests failed: stop"; exit 0; }
timeout 130 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only persist_4k_w4,persist_2k_w4_d,persist_4k_w8_d3,stream_4k_w8_st4 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "SWEEP" $OUT/ce.log
timeout 130 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only piecewise,persist_2k_w4_d3,persist_4k_w4_d3 > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
