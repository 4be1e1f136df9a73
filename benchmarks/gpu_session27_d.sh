#!/usr/bin/env bash
# Session 20, call 4 (< 5 min, one H200).  Issue 9: the 768-16K table at this session's final defaults (1K tile 4 x 4 x
# 4 x 3 for both norms, RMSNorm 768 on the previous 1K tile), do_bench twice (call 3's do_bench read RMSNorm 2K / 8K at
# 0.55 where graph replay read 0.89-0.91: is that run-to-run noise?) and graph replay once; GPU clocks around it; the
# norm GPU tests of the widths and the C++ node.
#   run: OUT=$OUT bash benchmarks/gpu_session27_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv > $OUT/clocks.txt 2>&1
timeout 100 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "widths or cpp_node or bitwise or cuda_graph" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
for r in 1 2; do
  mkdir -p $OUT/r$r; OUT=$OUT/r$r timeout 130 bash benchmarks/gpu_session26_f.sh
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> $OUT/clocks.txt 2>&1
done
