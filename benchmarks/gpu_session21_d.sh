#!/usr/bin/env bash
# Session 14, call 6 (< 6 min, one H200; not run: no device time left): the Gluon path's host cost after caching supported() and launching the
# backward kernels without re-validation: Gluon GPU tests, host cost per call, the table at S 1K / 4K.
#   run: OUT=$OUT bash benchmarks/gpu_session21_d.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 80 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider -k "not persistent" > $OUT/gluon_gpu_tests.log 2>&1
el "gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|^E  " $OUT/gluon_gpu_tests.log | head -12; pack
timeout 80 python3 benchmarks/host_gluon.py --out $OUT/host > $OUT/host.log 2>&1
el "host exit $?"; grep -E " us, " $OUT/host.log; pack
timeout 90 python3 benchmarks/bench_attention.py --out $OUT/table --seqlens 1024,4096 --deadline 60 > $OUT/table.log 2>&1
el "table exit $?"; grep -E "^\| B|^\| GQA" $OUT/table/attention.md | cut -d'|' -f2-4,10-12; pack
# the opt-in GQA dK / dV (bwd_gluon_gqa=1) on the table's GQA case (its GPU tests ran above)
FUSED_LAYERS_ATTENTION_VARIANTS=bwd_gluon_gqa=1 timeout 70 python3 benchmarks/bench_attention.py --out $OUT/table_gqa \
  --seqlens 4096 --dims 128 --deadline 40 > $OUT/table_gqa.log 2>&1
el "GQA table exit $?"; grep -E "^\| GQA|^\| B4" $OUT/table_gqa/attention.md | cut -d'|' -f2-4,10-12; pack
rm -rf $OUT
