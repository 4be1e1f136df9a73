#!/usr/bin/env bash
# (Its sweep script, benchmarks/sweep_fused_reduce.py, and the fused reduce itself are in commit 035e402; reverted after
# this call: slower by both measures. The script is now benchmarks/sweep_norm_tiles.py.)
# Session 20, call 2 (< 9 min, one H200).  Issue 9: dW / dB reduced inside the single-block backward (the last
# programs to finish sum the partial rows: layer_norm._fused_reduce_tail), no reduce launch.
#  1. GPU tests: the fused reduce (float64, retained graph, counter, slices 1 / 7 / 132, CUDA graph + side stream),
#     the C++ node, every norm width;
#  2. sweep of its shape against the reduce kernel, both measures (sweep_fused_reduce.py);
#  3. the 768-16K table at the defaults (gpu_session26_f.sh), as far as the time allows.
#   run: OUT=$OUT bash benchmarks/gpu_session27_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 170 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider \
  -x -k "fused_reduce or cuda_graph or cpp or widths or bitwise or autocast or variant or frozen or fast_call" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
TIMING=graph timeout 250 python3 benchmarks/sweep_fused_reduce.py > $OUT/sweep_fused_reduce.txt 2>&1
el "sweep exit $?"; cat $OUT/sweep_fused_reduce.txt | grep -v Warn
OUT=$OUT timeout 150 bash benchmarks/gpu_session26_f.sh
