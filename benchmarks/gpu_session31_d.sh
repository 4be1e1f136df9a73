#!/usr/bin/env bash
# Session 24, call 4 (< 9 min, one H200).  After the persistent launches name every constexpr (ops/_rowsync.
# with_constexpr_defaults: their direct fast path now binds; before, every eager call paid Triton's dispatch):
# the GPU suites of the ops with persistent kernels; the issue-10 softmax table (defaults, 32K-256K) and the CE
# table at the four vocabularies and at misaligned ones, peers in the same run.
#   run: OUT=$OUT bash benchmarks/gpu_session31_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 170 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py tests/test_library.py tests/test_layer_norm.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/sm --softmax-only --sweep-only =default > $OUT/softmax_defaults.log 2>&1
el "softmax defaults exit $?"; grep SOFTMAX $OUT/softmax_defaults.log
timeout 120 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce4 --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; grep -E "^CE V|no graph" $OUT/ce_table.log
timeout 100 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce_odd --vocabs 30522,50257,100277 --skip-linear --skip-softmax > $OUT/ce_odd.log 2>&1
el "CE odd exit $?"; grep -E "^CE V|no graph" $OUT/ce_odd.log
