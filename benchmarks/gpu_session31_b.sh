#!/usr/bin/env bash
# Session 24, call 2 (< 5 min, one H200).  VEC8 after trimming its per-row work (int32 masks, shifts, edge columns
# carried a row ahead): the VEC8 GPU tests, then the default (16-byte window) against a 128-byte window
# (vec_window=64) and session 23's routes (misaligned_vec8=False), CE / softmax forward / backward.
#   run: OUT=$OUT bash benchmarks/gpu_session31_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -m gpu -n 8 -q -p no:cacheprovider -k "vec8 or misaligned or hold" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
FORMS='{"win64": {"vec_window": 64}, "vec8 off (stream)": {"misaligned_vec8": false}}' \
  timeout 100 python3 benchmarks/sweep_ce_hold.py 50257 30522 100277 > $OUT/ce_vec8.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce_vec8.txt
SWEEP='{"50257": [{"vec_window": 64}, {"misaligned_vec8": false}], "100277": [{"vec_window": 64}], "50304": []}' \
  timeout 90 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd_vec8.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd_vec8.txt | sed -E 's/ {20,}/ /'
FORMS='{"win64": {"vec_window": 64}}' timeout 80 python3 benchmarks/sweep_softmax_bwd_odd.py 50257 100277 > $OUT/sm_bwd_vec8.txt 2>&1
el "softmax bwd exit $?"; cat $OUT/sm_bwd_vec8.txt
