#!/usr/bin/env bash
# Session 20, call 9 (< 2 min, one H200).  Call 8's two compile-test failures: Inductor could not analyse the
# griddepcontrol instructions of the PDL kernels and took every argument for mutated.  Traced launches now take plain
# kernels (the plan's eager_kernel / eager_reduce are the PDL ones).  The compile tests, the PDL tests, the C++ node.
#   run: OUT=$OUT bash benchmarks/gpu_session27_i.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 110 python3 -m pytest tests/test_compile_gpu.py tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu \
  -n 8 -p no:cacheprovider -k "compile or inductor or reduce_overhead or programmatic or cpp_node or cuda_graph" \
  > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
