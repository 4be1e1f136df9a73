#!/usr/bin/env bash
# Session 23, call 3 (< 4 min, one H200).  Issue 10, the cluster softmax forward: where its loss comes from.  The
# single-block form in this harness (K = 1), the no-exchange diagnostic launched as clusters, the exchange form; the
# 16-bit row held as loaded, capped at 40 registers (benchmarks/build_cluster_cubins.py's CONFIGS -> .cubins).
#   run: OUT=$OUT bash benchmarks/gpu_session30_c.sh   (carry .whl, .cubins)
set -u
source benchmarks/_gpu_env.sh
timeout 220 python3 benchmarks/bench_softmax_cluster.py .cubins > $OUT/cluster.txt 2>&1
el "cluster exit $?"; grep -c " ok " $OUT/cluster.txt; grep "BAD\|checks:\|Error\|error" $OUT/cluster.txt | head; grep "do_bench\|failed" $OUT/cluster.txt
