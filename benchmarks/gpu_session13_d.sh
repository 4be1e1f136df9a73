#!/usr/bin/env bash
# Session 9 (2026-12-02), call 4, issue 10: the SMEM-pipelined persistent kernels (persist_stages; the wait a function
# call so that Triton pipelines the row loop: sm_90 offline 72 registers / 7 programs per SM at bf16 4K x 4 warps, against
# 128 / 4 for the register form).  GPU tests first (stop if any fails), then the softmax and CE sweeps.
#   run: OUT=$OUT bash benchmarks/gpu_session13_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -k "smem" -x -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -2 $OUT/tests.log
grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { el "tests failed: stop"; tail -40 $OUT/tests.log; exit 0; }
timeout 200 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only persist_smem > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
timeout 150 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only =stream_4k_w8_st4,persist_smem --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep SWEEP $OUT/ce.log
