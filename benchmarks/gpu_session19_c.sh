#!/usr/bin/env bash
# Session 13, third call (written in session 12 as 19_b; its norm table moved to 19_b), < 5 min: the tables the README still quotes from
# older sessions, at the session-12 defaults, peers in the same run.
#  2. issue 10: the CE table with its graph-replay column (fixed in session 12: a fresh leaf for the capture);
#  3. issue 10: the softmax SMEM form's HOLD candidate (session 12; the no-exchange diagnostic says the exchange costs at
#     256K: fwd 0.76 against 0.67-0.70, bwd 0.86 against 0.75): GPU tests, then beside the default and the diagnostic.
#   run: OUT=$OUT bash benchmarks/gpu_session19_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 130 python3 benchmarks/bench_cross_entropy.py --out /tmp/cefull --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; cp /tmp/cefull/cross_entropy_h200.md $OUT/ 2>/dev/null; grep -E "^CE V|no graph" $OUT/ce_table.log
timeout 60 python3 -m pytest tests/test_softmax.py -q -m gpu -k "wide_persistent and smem_hold" -p no:cacheprovider > $OUT/sm_hold_tests.log 2>&1
el "softmax HOLD GPU tests exit $?"; tail -1 $OUT/sm_hold_tests.log
if grep -q " passed" $OUT/sm_hold_tests.log && ! grep -q "failed" $OUT/sm_hold_tests.log; then
  timeout 130 python3 benchmarks/bench_cross_entropy.py --out /tmp/smh --softmax-only --sweep-only =persist_smem_4k_w4_st3,=persist_smem_4k_w4_st3_hold,=persist_smem_4k_w8_st3_hold,=persist_smem_2k_w4_st3_hold,=diag_nosync_smem_4k_w4_st3 > $OUT/softmax_hold.log 2>&1
  el "softmax HOLD sweep exit $?"; grep SOFTMAX $OUT/softmax_hold.log
fi
