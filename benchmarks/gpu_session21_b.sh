#!/usr/bin/env bash
# Session 14, call 4 (< 9.5 min, one H200), issue 13 with the new defaults (the ping-pong forward, the Gluon dK / dV):
#  1. the default-dispatch GPU tests and every attention GPU test (the defaults changed);
#  2. issue 9: the Gluon path's host cost per call (benchmarks/host_gluon.py);
#  3. the table: bench_attention.py (cuDNN, Flex, SDPA flash, ours) at S 1K / 4K / 16K;
#  4. the step: bench_e2e.py GPT-2 small at seq 4096 (B4) and 1024 (B16), fused with the defaults and with the Gluon
#     kernels off (FUSED_LAYERS_ATTENTION_VARIANTS), beside unfused SDPA.
#   run: OUT=$OUT bash benchmarks/gpu_session21_b.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider -k "default_dispatch or auto" > $OUT/dispatch_tests.log 2>&1
el "dispatch tests exit $?"; tail -1 $OUT/dispatch_tests.log; grep -E "^FAILED" $OUT/dispatch_tests.log | head
timeout 150 python3 -m pytest tests/test_attention.py -q -m gpu -n 4 -p no:cacheprovider -x > $OUT/attention_gpu_tests.log 2>&1
el "attention GPU tests exit $?"; tail -1 $OUT/attention_gpu_tests.log; grep -E "^FAILED" $OUT/attention_gpu_tests.log | head
timeout 100 python3 benchmarks/host_gluon.py --out $OUT/host > $OUT/host.log 2>&1
el "host exit $?"; tail -4 $OUT/host.log
timeout 170 python3 benchmarks/bench_attention.py --out $OUT/table --seqlens 1024,4096,16384 --deadline 140 > $OUT/table.log 2>&1
el "table exit $?"; ls $OUT/table
for s in 4096:4 1024:16; do
  L=${s%:*}; B=${s#*:}
  timeout 60 python3 benchmarks/bench_e2e.py --out $OUT/e2e --variants unfused_sdpa,fused --seq-len $L --batch-size $B \
    --rounds 3 --profile-steps 0 --tag _s${L}_auto > $OUT/e2e_${L}_auto.log 2>&1
  el "e2e $L auto exit $?"; grep -E "^\| " $OUT/e2e_${L}_auto.log | head -6
  FUSED_LAYERS_ATTENTION_VARIANTS=fwd_gluon=0,bwd_gluon_dkdv=0 timeout 50 python3 benchmarks/bench_e2e.py --out $OUT/e2e \
    --variants fused --seq-len $L --batch-size $B --rounds 3 --profile-steps 0 --tag _s${L}_triton > $OUT/e2e_${L}_triton.log 2>&1
  el "e2e $L triton exit $?"; grep -E "^\| " $OUT/e2e_${L}_triton.log | head -4
done
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
