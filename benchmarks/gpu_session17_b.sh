#!/usr/bin/env bash
# Next session's second call (written in session 11, 2026-12-02; not yet run): issue 10's softmax SMEM candidates
# and diagnostic, the CE SMEM+LEAN candidates (GPU tests, then the sweep beside the 4K x 4 warps x 4 stages default:
# 0.67-0.73 of copy).
#   run: OUT=$OUT bash benchmarks/gpu_session17_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
# Issue 10: the softmax SMEM-form candidates beside the default: LEAN, PAIR, and the no-exchange diagnostic
# (diag_nosync_*: wrong output by design; against the default capped at its 7 programs an SM, *_ps7, it is what the
# publish + wait costs).
timeout 90 python3 -m pytest tests/test_softmax.py -q -m gpu -k "wide_persistent and (smem_lean or smem_pair)" -p no:cacheprovider > $OUT/sm_tests.log 2>&1
el "softmax GPU tests exit $?"; tail -1 $OUT/sm_tests.log; grep -E "^FAILED" $OUT/sm_tests.log | head -5
timeout 170 python3 benchmarks/bench_cross_entropy.py --out /tmp/sm --softmax-only --sweep-only =persist_smem_4k_w4_st3,=persist_smem_4k_w4_st3_lean,=persist_smem_4k_w4_st4_lean,=persist_smem_8k_w8_st3_lean,=diag_nosync_smem_4k_w4_st3,=persist_smem_4k_w4_st3_ps7,=persist_smem_4k_w8_st3_pair,=persist_smem_2k_w4_st3_pair > $OUT/softmax_lean.log 2>&1
el "softmax lean sweep exit $?"; grep SOFTMAX $OUT/softmax_lean.log
timeout 120 python3 -m pytest tests/test_cross_entropy.py -q -m gpu -k "persist_smem_lean or vocab_widths" -p no:cacheprovider > $OUT/ce_tests.log 2>&1
el "CE GPU tests exit $?"; tail -1 $OUT/ce_tests.log
if grep -q " passed" $OUT/ce_tests.log && ! grep -q "failed" $OUT/ce_tests.log; then
  timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/ce --sweep --sweep-stop --skip-linear --skip-softmax --sweep-only \
    =persist_smem_4k_w4_st4,=persist_smem_4k_w4_st3_lean,=persist_smem_4k_w4_st4_lean,=persist_smem_8k_w8_st3_lean > $OUT/ce.log 2>&1
  el "CE lean sweep exit $?"; grep -E "SWEEP|failed" $OUT/ce.log
fi
