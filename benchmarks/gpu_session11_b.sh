#!/usr/bin/env bash
# Session 8 of 2026-12-01, call 2-3 (nvidia-h200): the persistent wide-row kernels, now pipelined one row deep (publish row k, load k + 1, write k - 1; first row peeled, no branch in the loop), the CE kernel lean (class-index targets) (ops/_rowsync.py) for the
# cross-entropy (wide_mode 3) and the wide softmax (wide_mode 2): GPU tests first (timeouts: a kernel whose
# programs wait on each other must never hang a run), what they bound, then the sweeps against the defaults.
#   run: OUT=$OUT bash benchmarks/gpu_session11_b.sh   (carry .whl for Liger)
set -u
source benchmarks/_gpu_env.sh
timeout 90 python3 benchmarks/diag_persist.py > $OUT/diag.log 2>&1; el "diag exit $?"; cat $OUT/diag.log
grep -q " 0 bad rows" $OUT/diag.log || { el "wrong rows: stop"; exit 0; }
timeout 240 python3 -m pytest tests/test_cross_entropy.py tests/test_softmax.py -q -m gpu -k "persist or wide_row or vocab_widths or gpu_widths" -x -p no:cacheprovider > $OUT/tests.log 2>&1
el "persist GPU tests exit $?"; tail -3 $OUT/tests.log
timeout 300 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-only persist,stream_4k_w8_st4 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "SWEEP|CE V|winners" $OUT/ce.log
timeout 150 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
