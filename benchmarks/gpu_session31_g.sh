#!/usr/bin/env bash
# Session 24, call 7 (< 3 min, one H200).  Rows 16-element aligned but off 128-byte lines (OPT's 50,272; 32,016): the
# plain persistent default against VEC8 on a 128-byte window (misaligned_grain=64), CE / softmax forward / backward.
#   run: OUT=$OUT bash benchmarks/gpu_session31_g.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
FORMS='{"VEC8 (grain 64)": {"misaligned_grain": 64}}' timeout 50 python3 benchmarks/sweep_ce_hold.py 50272 32016 > $OUT/ce.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce.txt
SWEEP='{"50272": [{"misaligned_grain": 64}], "32016": [{"misaligned_grain": 64}]}' timeout 50 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
FORMS='{"VEC8 (grain 64)": {"misaligned_grain": 64}}' timeout 40 python3 benchmarks/sweep_softmax_bwd_odd.py 50272 > $OUT/sm_bwd.txt 2>&1
el "softmax bwd exit $?"; cat $OUT/sm_bwd.txt
