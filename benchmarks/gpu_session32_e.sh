#!/usr/bin/env bash
# Session 25, call 5 (< 5 min, one H200).  The CE's per-element target compare taken out of the row (persist_fixup:
# coef p stored everywhere, the target's element rewritten a row later, after the next row's block-reduction barriers;
# row loop 783 -> 731 SASS, 72 registers), and 2-warp 2K programs (call 4: +2.5% at 50,304, +3.5% softmax forward at
# 32K), each against the default in the same run; GPU tests of the fix-up first.
#   run: OUT=$OUT bash benchmarks/gpu_session32_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -m pytest tests/test_cross_entropy.py -n 8 -q -p no:cacheprovider -k "fixup" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|Mismatch|Greatest" $OUT/tests.log | head -20
FORMS='{"fixup": {"persist_fixup": true}, "2 warps 2K": {"persist_block": 2048, "persist_warps": 2, "persist_per_sm": 32}, "fixup, 2 warps 2K": {"persist_fixup": true, "persist_block": 2048, "persist_warps": 2, "persist_per_sm": 32}, "default again": {}}' \
  timeout 150 python3 benchmarks/sweep_ce_hold.py 50304 128256 262144 > $OUT/ce.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce.txt
F='[{"persist_block": 2048, "persist_warps": 2, "persist_per_sm": 32}]'
SWEEP="{\"32768\": $F, \"65536\": $F}" DTYPES=bfloat16 timeout 100 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
