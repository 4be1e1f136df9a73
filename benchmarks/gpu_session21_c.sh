#!/usr/bin/env bash
# Session 14, call 5 (< 7 min, one H200), issue 13 / 9: the Gluon kernels read sequence-major q / k / v in place
# (what models pass) and launch through ops/_library.Kernel (bound once; descriptors reused):
#  1. every Gluon GPU test (new: the sequence-major layouts, packed projections);
#  2. the Gluon path's host cost per call, with a cProfile of it;
#  3. the step: bench_e2e.py GPT-2 small at seq 4096 (B4) and 1024 (B16), defaults against the Gluon kernels off;
#  4. the table (bench_attention.py) at the defaults.
#   run: OUT=$OUT bash benchmarks/gpu_session21_c.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
timeout 150 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider > $OUT/gluon_gpu_tests.log 2>&1
el "gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|^E  " $OUT/gluon_gpu_tests.log | head -12
timeout 100 python3 benchmarks/host_gluon.py --out $OUT/host --profile > $OUT/host.log 2>&1
el "host exit $?"; grep -E " us, " $OUT/host.log; grep -A 32 "==== profile" $OUT/host.log | cut -c1-160 | head -34
for s in 4096:4 1024:16; do
  L=${s%:*}; B=${s#*:}
  timeout 60 python3 benchmarks/bench_e2e.py --out $OUT/e2e --variants unfused_sdpa,fused --seq-len $L --batch-size $B \
    --rounds 3 --profile-steps 0 --tag _s${L}_auto > $OUT/e2e_${L}_auto.log 2>&1
  el "e2e $L auto exit $?"; grep -E "^\| " $OUT/e2e_${L}_auto.log | head -6
  FUSED_LAYERS_ATTENTION_VARIANTS=fwd_gluon=0,bwd_gluon_dkdv=0 timeout 50 python3 benchmarks/bench_e2e.py --out $OUT/e2e \
    --variants fused --seq-len $L --batch-size $B --rounds 3 --profile-steps 0 --tag _s${L}_triton > $OUT/e2e_${L}_triton.log 2>&1
  el "e2e $L triton exit $?"; grep -E "^\| fused" $OUT/e2e_${L}_triton.log | head -4
done
timeout 130 python3 benchmarks/bench_attention.py --out $OUT/table --seqlens 1024,4096,16384 --deadline 100 > $OUT/table.log 2>&1
el "table exit $?"; grep -E "^\| B|^\| GQA" $OUT/table/attention.md | cut -d'|' -f2-4,10-12
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
