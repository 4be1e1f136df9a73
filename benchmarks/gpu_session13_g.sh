#!/usr/bin/env bash
# Session 9 call 7: a test of one hypothesis, the wait's lanes at least one per thread (no lane replicated across
# warps; reverted after this call: it made every SMEM case wrong, see RUNS).  The wrong-piece diagnosis at 3 stages first, the GPU
# tests of every persistent form at 3 stages, then the CE and softmax defaults against the SMEM form.
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 benchmarks/diag_persist_smem.py > $OUT/diag.log 2>&1; el "diag exit $?"; grep -v Warn $OUT/diag.log
timeout 100 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -k "persist" -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -3 $OUT/tests.log
timeout 60 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only =stream_4k_w8_st4,=persist_smem_4k_w4_st3 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "SWEEP|failed" $OUT/ce.log
