#!/usr/bin/env bash
# Session 18, call 8 (< 3 min, one H200).  Issue 9: the Gluon row backward with device-side TMA descriptors and plain
# pointer arguments, registered with the C++ fast path (call 7: at 16K every norm call ran the Python autograd.Function,
# ~110 us of host a forward and ~260 us a backward, so do_bench read 0.14-0.22 of copy).
#  1. GPU tests: the C++ node over the Gluon backward, the norm Gluon / persistent tests (graph capture included);
#  2. host µs a call and do_bench fwd+bwd minus fwd (benchmarks/diag_norm_host.py); 3. the 16K graph-replay table.
#   run: OUT=$OUT bash benchmarks/gpu_session25_h.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 75 python3 -m pytest tests/test_cpp_fastpath.py tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "gluon or cpp_node_matches or persistent_backward_defaults or cuda_graph" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
timeout 60 python3 benchmarks/diag_norm_host.py > $OUT/diag_norm_host.txt 2>&1
el "host diag exit $?"; grep -E "host|Error" $OUT/diag_norm_host.txt | head
timeout 40 python3 benchmarks/bench_norm.py --out $OUT/table_graph --ops ln,rms --dtypes bf16 --widths 16384 --no-peers > $OUT/table_graph.log 2>&1
el "table exit $?"; grep '"provider"' $OUT/table_graph.log | cut -c1-400
