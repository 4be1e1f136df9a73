#!/usr/bin/env bash
# Session 25, call 3 (< 5 min, one H200).  Two cuts of the bf16 softmax forward's per-element instructions (ncu, call
# 2: the 64K forward issues 0.65 warps a cycle a scheduler, 0.66 warp instructions an element against the 16K single
# block's 0.60 at copy speed): KFMA (the K-domain exponent, one FFMA, no branch: loop 571 -> 510 SASS, 56 registers) and
# EVEN (no masks where every piece is a whole tile: 498, 64 registers; both: 460, 55).  GPU tests of the candidates (the
# 1e30 row runs here), then the forward sweep against the default in the same run.
#   run: OUT=$OUT bash benchmarks/gpu_session32_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_softmax.py -n 4 -q -p no:cacheprovider -k "fma_candidate" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|Mismatch|Greatest" $OUT/tests.log | head -20
F='[{"persist_kfma": true}, {"persist_even": true}, {"persist_kfma": true, "persist_even": true}]'
SWEEP="{\"32768\": $F, \"65536\": $F, \"131072\": $F, \"262144\": $F}" DTYPES=bfloat16,float32 \
  timeout 240 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
