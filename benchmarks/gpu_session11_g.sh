#!/usr/bin/env bash
# Session 8 of 2026-12-01, call 9 (nvidia-h200, the last device minutes): after the non-persistent "coop" softmax
# kernels were removed and the persistent kernels' shared parts moved into ops/_rowsync.py (program_piece,
# load_piece, piece_ptrs, publish_max_sum, wait_row_max_sum; same sm_90 registers offline): their GPU tests.
#   run: OUT=$OUT bash benchmarks/gpu_session11_g.sh
set -u
source benchmarks/_gpu_env.sh
timeout 140 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -k "persist or widths or graph" -x -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -3 $OUT/tests.log
