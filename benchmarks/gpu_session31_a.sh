#!/usr/bin/env bash
# Session 24, call 1 (< 8 min, one H200).  The VEC8 persistent forms (ops/_rowsync.py: 16-bit rows at any alignment
# read and written as whole 16-byte vectors): the softmax / cross-entropy GPU suites at the new defaults, then the
# defaults against session 23's routes (misaligned_vec8=False) at misaligned vocabulary widths, and aligned neighbours.
#   run: OUT=$OUT bash benchmarks/gpu_session31_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
FORMS='{"vec8 off (stream)": {"misaligned_vec8": false}, "persistent plain": {"misaligned_vec8": false, "wide_mode": 3}}' \
  timeout 100 python3 benchmarks/sweep_ce_hold.py 50257 30522 32001 100277 > $OUT/ce_vec8.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce_vec8.txt
timeout 30 python3 benchmarks/sweep_ce_hold.py 50304 --default-only > $OUT/ce_aligned.txt 2>&1
el "CE aligned exit $?"; grep "C=" $OUT/ce_aligned.txt
SWEEP='{"50257": [{"misaligned_vec8": false}], "32001": [{"misaligned_vec8": false}], "100277": [{"misaligned_vec8": false}], "262143": [{"misaligned_vec8": false}], "50304": []}' \
  timeout 90 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd_vec8.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd_vec8.txt | sed -E 's/ {20,}/ /'
FORMS='{"vec8 off": {"misaligned_vec8": false}}' timeout 80 python3 benchmarks/sweep_softmax_bwd_odd.py 50257 100277 262143 50304 > $OUT/sm_bwd_vec8.txt 2>&1
el "softmax bwd exit $?"; cat $OUT/sm_bwd_vec8.txt
