#!/usr/bin/env bash
# Session 19, call 1 (< 4 min, one H200).  Issue 9: the Gluon row backward with device-side TMA descriptors
# (bwd_gluon_device_desc=1, written after session 18's last call): its launch takes pointers and ints only, so the C++
# fast path registers it (layer_norm._gluon_cpp_spec) and a 16K norm call leaves the Python autograd.Function (session
# 18 call 7: 110 us of host a forward, 260 us a backward; do_bench fwd+bwd minus fwd 0.14-0.22 of copy).
#  1. GPU tests: the C++ node over it, its variants, the graph / side-stream test on every 16K path;
#  2. host µs a call and do_bench at 16K (diag_norm_host.py) with device_desc on and off;
#  3. the sweep at 16K (graph replay): device_desc and smem_sums (the row sums through one buffer, one barrier a row:
#     LayerNorm 16K row loop 11 -> 7 barriers, no spills, +4 % instructions) beside the default.
#   run: OUT=$OUT bash benchmarks/gpu_session26_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 90 python3 -m pytest tests/test_cpp_fastpath.py tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "gluon or cpp_node_matches or persistent_backward_defaults or cuda_graph" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
for dd in 0 1; do
  DEVICE_DESC=$dd timeout 60 python3 benchmarks/diag_norm_host.py > $OUT/diag_norm_host_dd$dd.txt 2>&1
  el "host diag device_desc=$dd exit $?"; grep -E "host|Error" $OUT/diag_norm_host_dd$dd.txt | head
done
for op in ln rms; do
  timeout 50 python3 benchmarks/bench_norm.py --out /tmp/g_$op --ops $op --dtypes bf16 --widths 16384 --sweep --sweep-op $op \
    --sweep-parts bwd --sweep-widths 16384 --sweep-dtypes bf16 --sweep-with bwd_gluon_device_desc,bwd_gluon_smem_sums --sweep-budget 35 \
    --budget 45 --no-peers > $OUT/sweep_$op.log 2>&1
  el "$op sweep exit $?"; grep '"part"' $OUT/sweep_$op.log | cut -c1-300
done
