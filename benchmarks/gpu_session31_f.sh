#!/usr/bin/env bash
# Session 24, call 6 (< 5 min, one H200).  Final code: the CE persistent row's store placed per form (aligned: in the
# store; VEC8: before dx).  CE defaults at aligned and misaligned vocabularies against session 23's routes
# (misaligned_vec8=False); the softmax forward at misaligned widths; the softmax / CE / library GPU tests.
#   run: OUT=$OUT bash benchmarks/gpu_session31_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 benchmarks/sweep_ce_hold.py 50304 128256 262144 --default-only > $OUT/ce_aligned.txt 2>&1
el "CE aligned exit $?"; grep "C=" $OUT/ce_aligned.txt
FORMS='{"session 23 route (stream)": {"misaligned_vec8": false}}' timeout 80 python3 benchmarks/sweep_ce_hold.py 50257 30522 32001 100277 > $OUT/ce_odd.txt 2>&1
el "CE odd exit $?"; grep "C=" $OUT/ce_odd.txt
SWEEP='{"50257": [{"misaligned_vec8": false}], "32001": [{"misaligned_vec8": false}], "100277": [{"misaligned_vec8": false}], "262143": [{"misaligned_vec8": false}]}' \
  timeout 80 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
FORMS='{"session 23 route": {"misaligned_vec8": false}}' timeout 60 python3 benchmarks/sweep_softmax_bwd_odd.py 50257 100277 262143 > $OUT/sm_bwd.txt 2>&1
el "softmax bwd exit $?"; cat $OUT/sm_bwd.txt
timeout 150 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py tests/test_library.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
