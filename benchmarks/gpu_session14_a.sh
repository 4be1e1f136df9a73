#!/usr/bin/env bash
# Next session's first call for issue 10 (written in session 9, 2026-12-02; not yet run): a clean sweep of the
# SMEM-pipelined persistent form (persist_stages; its wait fixed in session 9, call 8) against the defaults, to decide
# softmax_config._PERSIST_STAGES / _PERSIST and cross_entropy_config.PERSIST_STAGES / PERSIST / WIDE_MODE.  Session 9's
# call 8 timings were noisy (the default softmax backward read 0.30-0.56 against its usual 0.70-0.96): the GPU's clocks
# and a copy go first, and the default is in every table.
#   run: OUT=$OUT bash benchmarks/gpu_session14_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
timeout 120 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -k "persist" -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -2 $OUT/tests.log
grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { el "tests failed: stop"; exit 0; }
timeout 60 python3 benchmarks/diag_persist_smem.py > $OUT/diag.log 2>&1; el "diag exit $?"; grep -c "wrong 0 (0.00%) pieces 0 \[\] | bwd wrong 0" $OUT/diag.log
timeout 220 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only =persist_smem_4k_w4_st3,=persist_smem_4k_w4_st4,=persist_smem_2k_w4_st3,=persist_smem_4k_w8_st3,=persist_smem_8k_w8_st3 > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
timeout 150 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only =stream_4k_w8_st4,=persist_smem_4k_w4_st3,=persist_smem_4k_w4_st4,=persist_smem_2k_w4_st3,=persist_smem_4k_w8_st3,=persist_smem_8k_w8_st3 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "SWEEP|failed" $OUT/ce.log
