#!/usr/bin/env bash
# Session 20, call 3 (< 9 min, one H200).  Issue 9, after the fused dW / dB reduce was reverted (call 2: slower by
# both measures) and the 1K backward tile moved to 4 rows x 4 warps x 4 programs an SM x 3 stages (both norms):
#  1. the norm GPU tests (test_layer_norm, test_cpp_fastpath);
#  2. the 768-16K table at the defaults, do_bench and graph replay (gpu_session26_f.sh);
#  3. backward tiles around the 1K winner at 768 / 2K / 4K / 8K, both measures (sweep_norm_tiles.py).
#   run: OUT=$OUT bash benchmarks/gpu_session27_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 170 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider \
  > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
OUT=$OUT timeout 130 bash benchmarks/gpu_session26_f.sh
TIMING=graph timeout 230 python3 benchmarks/sweep_norm_tiles.py > $OUT/sweep_norm_tiles.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep_norm_tiles.txt
