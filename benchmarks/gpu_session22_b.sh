#!/usr/bin/env bash
# Session 15, call 3 (< 8 min, one H200): issue 10's TMA wide-row softmax forward and cross-entropy (ops/softmax_gluon.py): GPU tests, then sweeps beside
# the default fused kernels, torch.softmax and torch.compile; last, call 2's Gluon attention GPU tests (spies fixed, GQA dK / dV on
# by default).
#   run: OUT=$OUT bash benchmarks/gpu_session22_b.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 90 python3 -m pytest tests/test_softmax_gluon.py -q -m gpu -n 8 -p no:cacheprovider > $OUT/softmax_gluon_tests.log 2>&1
el "softmax gluon GPU tests exit $?"; tail -1 $OUT/softmax_gluon_tests.log; grep -E "^FAILED|^E  " $OUT/softmax_gluon_tests.log | head -12; pack
timeout 120 python3 benchmarks/bench_softmax_gluon.py --out $OUT/bf16 --dtypes bf16 \
  --configs "16,256,8,2,4,2;8,256,8,2,4,3;16,256,16,2,4,1;16,256,8,2,4,2,1;16,256,16,2,4,1,1;16,256,8,2,4,2,0,4;16,256,8,2,4,2,1,8;16,256,8,2,4,2,1,4" > $OUT/bf16.log 2>&1
el "bf16 sweep exit $?"; cat $OUT/bf16.log | cut -c1-400; pack
timeout 60 python3 benchmarks/bench_softmax_gluon.py --out $OUT/fp32 --dtypes fp32 --widths 32768,65536,262144 \
  --configs "8,256,8,2,4,2;4,256,8,2,4,3;8,256,8,2,4,2,1,8" > $OUT/fp32.log 2>&1
el "fp32 sweep exit $?"; cat $OUT/fp32.log | cut -c1-400; pack
timeout 60 python3 benchmarks/bench_softmax_gluon.py --out $OUT/ce --ce --widths 32000,50304,128256,262144 \
  --configs "16,256,8,2,4,2;8,256,8,2,4,3;16,256,16,2,4,1" > $OUT/ce.log 2>&1
el "CE exit $?"; cat $OUT/ce.log | cut -c1-400; pack
timeout 60 python3 benchmarks/bench_softmax_gluon.py --out $OUT/bwd --bwd --dtypes bf16 --widths 32768,65536,131072,262144 \
  --configs "16,256,4,2,4,2;8,256,4,2,4,3;16,256,6,2,4,1" > $OUT/bwd.log 2>&1
el "bwd exit $?"; cat $OUT/bwd.log | cut -c1-400; pack
timeout 100 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 8 -p no:cacheprovider -k "not persistent" > $OUT/gluon_gpu_tests.log 2>&1
el "attention gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|^E  " $OUT/gluon_gpu_tests.log | head -12; pack
rm -rf $OUT
