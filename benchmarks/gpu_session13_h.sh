#!/usr/bin/env bash
# Session 9 call 8: the called waits poll 32 words at a time (_rowsync.WAIT_CHUNK: no shared memory in the callee; the
# wrong rows needed 64+ lanes, where the callee's block reduction uses shared memory).  Diagnosis at 3 stages, the SMEM
# GPU tests at 3 stages, then the CE and bf16 softmax at 4K x 4 warps x 3 stages against the defaults.
set -u
source benchmarks/_gpu_env.sh
timeout 45 python3 benchmarks/diag_persist_smem.py > $OUT/diag.log 2>&1; el "diag exit $?"; grep -v Warn $OUT/diag.log
timeout 60 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -k "smem" -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -3 $OUT/tests.log
timeout 45 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only =stream_4k_w8_st4,=persist_smem_4k_w4_st3 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "SWEEP|failed" $OUT/ce.log
timeout 60 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only =persist_smem_4k_w4_st3 > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
