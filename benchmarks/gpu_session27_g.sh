#!/usr/bin/env bash
# Session 20, call 7 (< 6 min, one H200).  Issue 9: programmatic dependent launch (bwd_pdl) now through the C++ fast
# path too (cuLaunchKernelEx with programmatic stream serialization for a launch_pdl kernel).  GPU tests (float64,
# bitwise against plain launches through Python and the C++ node, CUDA graph; the C++ node tests), then both measures,
# default / pdl 1 / pdl 2 / default again, LayerNorm and RMSNorm at 768-8K.
#   run: OUT=$OUT bash benchmarks/gpu_session27_g.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "programmatic or cpp_node or extension_builds" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
TIMING=graph timeout 200 python3 benchmarks/sweep_norm_tiles.py --pdl --widths 768,1024,2048,4096,8192 \
  > $OUT/sweep_pdl.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep_pdl.txt
