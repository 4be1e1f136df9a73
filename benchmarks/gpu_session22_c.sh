#!/usr/bin/env bash
# Session 15, call 4 (< 90 s, one H200; the bench's WRONG flag is the correctness check: max error > 0.02): why the TMA softmax forward ran at 0.18-0.37 of copy (call 3): one (SUB, BOX)
# box a chunk (FLAT, rank-3 descriptors over (M, N / BOX, BOX)) against SUB (1, BOX) boxes, and plain stores of y against TMA stores (store_wait per chunk).
#   run: OUT=$OUT bash benchmarks/gpu_session22_c.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 75 python3 benchmarks/bench_softmax_gluon.py --out $OUT/diag --dtypes bf16 --widths 32768,50304 --peers fused \
  --configs "16,256,8,2,4,2,0,1,1;16,256,8,2,4,2,0,1,0,0;16,256,8,2,4,2,0,1,1,0;32,128,8,2,4,2,0,1,1" > $OUT/diag.log 2>&1
el "diag exit $?"; cat $OUT/diag.log | cut -c1-600; pack
rm -rf $OUT
