#!/usr/bin/env bash
# Session 21, call 4 (< 5 min, one H200).  Issue 10, the bf16 softmax forward (0.80 / 0.84 at 32K by do_bench /
# graph, target 0.90): the PACKED single-block forward (sm_90 compile: 32K x 16 warps at 64 registers with the cap,
# two programs an SM, against one), opt-in.  1. its GPU tests; 2. forward sweep at 16K / 32K / 64K against the
# defaults, both measures.
#   run: OUT=$OUT bash benchmarks/gpu_session28_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_softmax.py -q -m gpu -n 4 -p no:cacheprovider -k "packed or gpu_widths" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
timeout 200 python3 benchmarks/sweep_softmax_packed.py > $OUT/sweep_softmax_packed.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep_softmax_packed.txt | sed -E 's/ {20,}/ /'
