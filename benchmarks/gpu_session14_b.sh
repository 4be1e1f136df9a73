#!/usr/bin/env bash
# Session 10, call 2 (issue 10): the SMEM-pipelined persistent form adopted as the default of 16-bit wide rows
# (softmax fwd/bwd 4K x 4 warps x 3 stages, CE 4K x 4 warps x 4 stages; from call 1, issue10/run14_sweep/).
# GPU tests of softmax + CE with the new defaults, then the committed CE table (peers, extra memory, linear CE)
# and the softmax defaults, then deeper CE candidates.
#   run: OUT=$OUT bash benchmarks/gpu_session14_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
timeout 200 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py -q -m gpu -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -2 $OUT/tests.log
grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { el "tests failed: stop"; grep -E "^FAILED|Error" $OUT/tests.log | head -20; exit 0; }
timeout 200 python3 benchmarks/bench_cross_entropy.py --out $OUT/table --skip-softmax > $OUT/table.log 2>&1
el "CE table exit $?"; grep -E "^\| [0-9]+ \| (fused|liger|compile|torch)" $OUT/table/cross_entropy_h200.md | head -40
timeout 60 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only =default > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
timeout 120 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only =persist_smem_4k_w4_st4,=persist_smem_4k_w4_st5,=persist_smem_4k_w4_st6,=persist_smem_8k_w4_st3,=persist_smem_8k_w4_st4 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce sweep exit $?"; grep -E "SWEEP|failed" $OUT/ce.log
