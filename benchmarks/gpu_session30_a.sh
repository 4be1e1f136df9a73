#!/usr/bin/env bash
# Session 23, call 1 (< 7 min, one H200).  (1) Session 22's pending GPU tests: the float32 128K softmax forward's new
# routing (SMEM persistent form).  (2) Issue 10: the cluster softmax forward (ops/softmax_cluster.py), cubins built
# here with Triton 3.9 (benchmarks/build_cluster_cubins.py -> .cubins), checked and timed against the default.
#   run: OUT=$OUT bash benchmarks/gpu_session30_a.sh   (carry .whl, .cubins)
set -u
source benchmarks/_gpu_env.sh
timeout 200 python3 -m pytest tests/test_softmax.py -m gpu -n 8 -q -k "gpu_wide_persistent or widths" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -3 $OUT/tests.log
timeout 300 python3 benchmarks/bench_softmax_cluster.py .cubins > $OUT/cluster.txt 2>&1
el "cluster exit $?"; grep -v "^bf16_\|^fp32_\|^fp16_" $OUT/cluster.txt | head -5; grep -c " ok " $OUT/cluster.txt; grep "BAD\|checks:" $OUT/cluster.txt | head; grep "do_bench\|failed" $OUT/cluster.txt
