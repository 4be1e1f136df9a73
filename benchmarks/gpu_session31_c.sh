#!/usr/bin/env bash
# Session 24, call 3 (< 9 min, one H200).  The VEC8 defaults (128-byte window, 16-byte fallback): the softmax and
# cross-entropy GPU suites, the C++ fast path / compile / integration / swap suites; then the tables at misaligned
# widths with the peers in the same run (CE: bench_cross_entropy --vocabs; softmax: bench_softmax --widths).
#   run: OUT=$OUT bash benchmarks/gpu_session31_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
timeout 150 python3 -m pytest tests/test_integrations.py tests/test_compile_gpu.py tests/test_cpp_fastpath.py tests/test_swap.py tests/test_softmax_gluon.py -m gpu -n 8 -q -p no:cacheprovider -k "not attention" > $OUT/tests_int.log 2>&1
el "integration tests exit $?"; tail -1 $OUT/tests_int.log; grep -E "^FAILED" $OUT/tests_int.log | head -20
timeout 130 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --vocabs 50257,30522,100277 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "CE table exit $?"; cat $OUT/ce/*.md 2>/dev/null | grep -E "^\|" | head -40
timeout 100 python3 benchmarks/bench_softmax.py --out $OUT/sm --dtypes bf16 --widths 50257,100277,262143 > $OUT/sm.log 2>&1
el "softmax table exit $?"; ls $OUT/sm; cat $OUT/sm/*.md 2>/dev/null | grep -E "^\|" | head -40
