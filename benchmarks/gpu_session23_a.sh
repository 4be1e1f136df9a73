#!/usr/bin/env bash
# Session 16, call 1 (< 4 min, one H200): issue 10's TMA kernels with FLAT boxes, one (1, SUB, BOX) box a chunk over
# rank-3 (M, N / BOX, BOX) descriptors (sm_90 scan: 10 TMA loads and 44 barriers in the forward's SASS against 160 and
# 194 with (1, 256) boxes; issue10/softmax_gluon_static_scan_sm90_triton36.txt).  GPU tests of the configs, CE and
# backward; then forward (with plain stores as a diagnostic), CE and backward against the defaults.
#   run: OUT=$OUT bash benchmarks/gpu_session23_a.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 70 python3 -m pytest tests/test_softmax_gluon.py -q -m gpu -n 8 -p no:cacheprovider -k "configs or cross_entropy or backward" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -8; pack
timeout 60 python3 benchmarks/bench_softmax_gluon.py --out $OUT/fwd --dtypes bf16 --widths 32768,50304,262144 --peers fused \
  --configs "16,256,8,2,4,2,0,1,1;16,256,8,2,4,2,0,1,1,0;32,128,8,2,4,2,0,1,1;16,256,8,2,4,3,0,1,1;16,256,8,2,4,2,1,4,1" > $OUT/fwd.log 2>&1
el "fwd exit $?"; cut -c1-500 $OUT/fwd.log; pack
timeout 50 python3 benchmarks/bench_softmax_gluon.py --out $OUT/ce --ce --widths 32000,128256 \
  --configs "16,256,8,2,4,2,0,1,1;16,256,8,2,4,3,0,1,1" > $OUT/ce.log 2>&1
el "ce exit $?"; cut -c1-500 $OUT/ce.log; pack
timeout 50 python3 benchmarks/bench_softmax_gluon.py --out $OUT/bwd --bwd --dtypes bf16 --widths 32768,262144 --peers fused \
  --configs "16,256,4,2,4,2,0,1,1;16,256,4,2,4,3,0,1,1" > $OUT/bwd.log 2>&1
el "bwd exit $?"; cut -c1-500 $OUT/bwd.log; pack
rm -rf $OUT
