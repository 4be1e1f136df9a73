#!/usr/bin/env bash
# Session 15, call 4 (< 2 min, one H200): why the TMA softmax forward ran at 0.18-0.37 of copy (call 3): one (SUB, BOX)
# box a chunk (FLAT, rank-3 descriptors over (M, N / BOX, BOX)) against SUB (1, BOX) boxes, and plain stores of y against TMA stores (store_wait per chunk).
#   run: OUT=$OUT bash benchmarks/gpu_session22_c.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 60 python3 -m pytest tests/test_softmax_gluon.py -q -m gpu -n 8 -p no:cacheprovider -k configs > $OUT/tests.log 2>&1
el "config tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -8; pack
timeout 90 python3 benchmarks/bench_softmax_gluon.py --out $OUT/diag --dtypes bf16 --widths 32768,50304,262144 --peers fused \
  --configs "16,256,8,2,4,2;16,256,8,2,4,2,0,1,1;16,256,8,2,4,2,0,1,0,0;16,256,8,2,4,2,0,1,1,0;8,256,8,2,4,3,0,1,1;32,128,8,2,4,2,0,1,1" > $OUT/diag.log 2>&1
el "diag exit $?"; cat $OUT/diag.log | cut -c1-600; pack
rm -rf $OUT
