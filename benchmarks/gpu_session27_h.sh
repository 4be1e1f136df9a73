#!/usr/bin/env bash
# Session 20, call 8 (< 6 min, one H200).  Issue 9 at the final defaults (bwd_pdl=2: the single-block backward's row
# kernel and reduce launched as programmatic dependents, also by the C++ node): every norm GPU test and the compile
# tests of the norms, then the 768-16K table by do_bench and graph replay (gpu_session26_f.sh).
#   run: OUT=$OUT bash benchmarks/gpu_session27_h.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 170 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py tests/test_compile_gpu.py -q -m gpu \
  -n 8 -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
sleep 5
OUT=$OUT timeout 120 bash benchmarks/gpu_session26_f.sh
