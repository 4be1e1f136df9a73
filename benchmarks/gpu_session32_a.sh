#!/usr/bin/env bash
# Session 25, call 1 (< 6 min, one H200).  The FMA candidates written at the end of session 24 (CPU-tested only):
# config_override("softmax" / "cross_entropy", persist_fma=True), every exponent one FFMA x log2 e - fl(m log2 e) where
# |m log2 e| < 2^7.  Their GPU tests first (the 1e30 row runs on CUDA here), then the softmax forward and the CE against
# the defaults in the same run.
#   run: OUT=$OUT bash benchmarks/gpu_session32_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -n 8 -q -p no:cacheprovider -k "fma" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
F='[{"persist_fma": true}]'
SWEEP="{\"32768\": $F, \"65536\": $F, \"131072\": $F, \"262144\": $F}" DTYPES=bfloat16,float32 \
  timeout 150 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
FORMS='{"fma": {"persist_fma": true}}' timeout 90 python3 benchmarks/sweep_ce_hold.py 32000 50304 128256 262144 > $OUT/ce.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce.txt
