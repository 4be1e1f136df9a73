#!/usr/bin/env bash
# Session 17, call 6 (< 4 min, one H200): every Gluon attention GPU test at HEAD (the dK / dV kernel's new DQ argument,
# the persistent forward's defaults), then issue 9's end-to-end check at HEAD (GPT-2 small, seq 1024 x 16: eager and
# compiled, fused against SDPA; step / GPU from the profiler).
#   run: OUT=$OUT bash benchmarks/gpu_session24_f.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 110 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 6 -p no:cacheprovider > $OUT/gluon_gpu_tests.log 2>&1
el "gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|^E  " $OUT/gluon_gpu_tests.log | head -8; pack
timeout 140 python3 benchmarks/bench_e2e.py --out $OUT/e2e --variants fused_compile,compile_sdpa,unfused_sdpa,fused --rounds 3 \
  --steps 8 --profile-steps 3 --tag _s1024 > $OUT/e2e.log 2>&1
el "e2e exit $?"; grep -E "^\| " $OUT/e2e/*.md | head -8; pack
rm -rf $OUT
