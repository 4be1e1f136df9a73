#!/usr/bin/env bash
# Session 10, call 3: the eager bf16 softmax forward at 32K columns takes the persistent kernels
# (softmax_config.PERSIST_MAX_SINGLE_BLOCK); GPU tests of the softmax (with the C++ fast path: 150 s were not enough, its build takes ~75 s), the softmax defaults, and
# the GPT-2-small step (bench_e2e, seq 1024) with the new CE default (issues 9, 10, 12).
#   run: OUT=$OUT bash benchmarks/gpu_session14_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_softmax.py -q -m gpu -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -2 $OUT/tests.log
grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { el "tests failed: stop"; grep -E "^FAILED|Error" $OUT/tests.log | head -20; exit 0; }
timeout 60 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only =default > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
timeout 200 python3 benchmarks/bench_e2e.py --out $OUT --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 > $OUT/e2e_1024.log 2>&1
el "e2e exit $?"; cat $OUT/e2e_*.md 2>/dev/null | head -60
