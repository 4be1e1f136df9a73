#!/usr/bin/env bash
# Session 19, call 2 (< 5 min, one H200).  Issue 9: call 1 (issue9/run26_a) found the C++ node never ran over the
# device-descriptor Gluon backward with a weight: _cpp_register looked its Gluon launch up on the traced
# (persist_ok=False) backward plan, whose dW / dB reduce Kernel the Python path never compiles: register_all waited
# for it forever.  Fixed (the eager plan's Gluon launch).  Here:
#  1. the GPU tests again (C++ node over the Gluon backward, variants, graph / side-stream);
#  2. host µs a call and do_bench at 16K with device_desc=1 (now through the C++ node);
#  3. the 16K sweeps (graph replay) twice each, for the spread: device_desc, smem_sums and both beside the default.
#   run: OUT=$OUT bash benchmarks/gpu_session26_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_cpp_fastpath.py tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "gluon or cpp_node_matches or persistent_backward_defaults or cuda_graph" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
DEVICE_DESC=1 timeout 60 python3 benchmarks/diag_norm_host.py > $OUT/diag_norm_host_dd1.txt 2>&1
el "host diag device_desc=1 exit $?"; grep -E "host|Error" $OUT/diag_norm_host_dd1.txt | head
for rep in 1 2; do
  for op in ln rms; do
    timeout 50 python3 benchmarks/bench_norm.py --out /tmp/g_$op --ops $op --dtypes bf16 --widths 16384 --sweep --sweep-op $op \
      --sweep-parts bwd --sweep-widths 16384 --sweep-dtypes bf16 --sweep-with bwd_gluon_device_desc,bwd_gluon_smem_sums \
      --sweep-budget 40 --budget 45 --no-peers > $OUT/sweep_${op}_$rep.log 2>&1
    el "$op sweep $rep exit $?"; grep '"part"' $OUT/sweep_${op}_$rep.log | cut -c1-300
  done
done
