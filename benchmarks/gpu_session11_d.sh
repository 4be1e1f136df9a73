#!/usr/bin/env bash
# Session 8 of 2026-12-01, call 5 (nvidia-h200): the opt-in persistent cross-entropy with the target's column compared
# in 32 bits (a 64-bit column vector live through the row loop was the suspect for its 190-222 registers): what it
# binds (registers, programs per SM), its GPU tests, the CE sweep of the persistent configs beside the stream.
#   run: OUT=$OUT bash benchmarks/gpu_session11_d.sh
set -u
source benchmarks/_gpu_env.sh
timeout 90 python3 benchmarks/diag_persist.py > $OUT/diag.log 2>&1; el "diag exit $?"; grep "CE V\|bad rows" $OUT/diag.log
timeout 120 python3 -m pytest tests/test_cross_entropy.py -q -m gpu -k "persist" -x -p no:cacheprovider > $OUT/tests.log 2>&1
el "CE persist GPU tests exit $?"; tail -2 $OUT/tests.log
timeout 200 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only persist_2k_w4,persist_4k_w4,persist_4k_w8,persist_8k_w8,stream_4k_w8_st4 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "SWEEP" $OUT/ce.log
