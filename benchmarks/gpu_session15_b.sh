#!/usr/bin/env bash
# Next session, second call (written in session 10, 2026-12-02; not yet run): issue 10's CE LAG candidate (row
# k - 1's loss and gradient after row k is published, its piece re-read from L2) beside the SMEM default; the
# attention dropout's 7-round Philox candidate (issue 11, queued since session 8); the CE GPU tests first.
#   run: OUT=$OUT bash benchmarks/gpu_session15_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 200 python3 -m pytest tests/test_cross_entropy.py -q -m gpu -p no:cacheprovider > $OUT/tests.log 2>&1
el "CE GPU tests exit $?"; tail -2 $OUT/tests.log
if grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log; then
  timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/ce --sweep --sweep-stop --skip-linear --skip-softmax --sweep-only \
    =persist_smem_4k_w4_st4,=persist_smem_4k_w4_st2_lag,=persist_smem_4k_w4_st3_lag,=persist_smem_4k_w4_st4_lag,=persist_smem_2k_w4_st3_lag \
    > $OUT/ce.log 2>&1
  el "CE lag sweep exit $?"; grep -E "SWEEP|failed" $OUT/ce.log
else
  el "CE tests failed: no sweep"; grep -E "^FAILED|Error" $OUT/tests.log | head
fi
timeout 200 python3 benchmarks/bench_attention_dropout.py --out /tmp/drop > $OUT/dropout.log 2>&1
el "dropout exit $?"; cp /tmp/drop/*.md $OUT/ 2>/dev/null; tail -30 $OUT/dropout.log
