#!/usr/bin/env bash
# Session 9 call 6: the SMEM-pipelined persistent form at 2 stages (correct in all 16 configs of call 5, where 3+ stages
# gave wrong rows at 64+ pieces a row): GPU tests at 2 stages, the wrong-piece diagnosis on more configs, the sweeps.
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -k "smem" -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -3 $OUT/tests.log
timeout 60 python3 benchmarks/diag_persist_smem.py --more > $OUT/diag.log 2>&1; el "diag exit $?"; grep -v Warn $OUT/diag.log
timeout 150 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only =persist_smem_4k_w4_st2,=persist_smem_2k_w4_st2,=persist_smem_8k_w8_st2,=persist_smem_8k_w4_st2 > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
timeout 100 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only =stream_4k_w8_st4,=persist_smem_4k_w4_st2,=persist_smem_8k_w8_st2,=persist_smem_4k_w4_st3 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "SWEEP|failed" $OUT/ce.log
