#!/usr/bin/env bash
# Session 11 (2026-12-02), second call.  Issue 10: why the bf16 wide softmax backward's fraction of copy moves
# between runs (0.90 / 0.85 at 64K / 128K in run14_defaults, 0.49 / 0.51 in run15_a: diag_softmax_bwd_spread.py);
# issue 9: the norm persistent backward under CUDA-graph replay (run15_a timed it with do_bench only); issue 10's
# CE LAG candidate (GPU tests for the persistent modes, then the sweep beside the SMEM default); issue 11's
# 7-round Philox dropout candidate.
#   run: OUT=$OUT bash benchmarks/gpu_session16_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/diag_softmax_bwd_spread.py --out /tmp/spread > $OUT/spread.log 2>&1
el "spread exit $?"; cat $OUT/spread.log | cut -c1-400
for op in ln rms; do
  timeout 100 python3 benchmarks/bench_norm.py --out /tmp/g$op --ops $op --dtypes bf16 --widths 16384 --sweep \
    --sweep-op $op --sweep-parts bwd --sweep-widths 16384,65536 --budget 90 --sweep-budget 80 --sweep-dtypes bf16 --sweep-with bwd_persist --no-peers \
    > /tmp/g$op.log 2>&1
  el "$op graph sweep exit $?"; grep -E '"part": "bwd"' /tmp/g$op.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); c = r['cfg']; print(r['n'], c.get('bwd_persist_block'), c.get('bwd_persist_warps'), c.get('bwd_persist_stages'), round(r.get('frac', 0), 3), r.get('error', '')[:80])" | tee $OUT/norm_graph_$op.txt
done
timeout 120 python3 -m pytest tests/test_cross_entropy.py -q -m gpu -k "persist or vocab_widths" -p no:cacheprovider > $OUT/ce_tests.log 2>&1
el "CE GPU tests exit $?"; tail -2 $OUT/ce_tests.log
if grep -q " passed" $OUT/ce_tests.log && ! grep -q "failed" $OUT/ce_tests.log; then
  timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/ce --sweep --sweep-stop --skip-linear --skip-softmax --sweep-only \
    =persist_smem_4k_w4_st4,=persist_smem_4k_w4_st2_lag,=persist_smem_4k_w4_st3_lag,=persist_smem_4k_w4_st4_lag,=persist_smem_2k_w4_st3_lag \
    > $OUT/ce.log 2>&1
  el "CE lag sweep exit $?"; grep -E "SWEEP|failed" $OUT/ce.log
else
  el "CE tests failed: no sweep"; grep -E "^FAILED|Error" $OUT/ce_tests.log | head
fi
timeout 150 python3 benchmarks/bench_attention_dropout.py --out /tmp/drop > $OUT/dropout.log 2>&1
el "dropout exit $?"; cp /tmp/drop/*.md $OUT/ 2>/dev/null; tail -12 $OUT/dropout.log | cut -c1-600
