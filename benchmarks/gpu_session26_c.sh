#!/usr/bin/env bash
# Session 19, call 3 (< 5 min, one H200).  Issue 9: the C++ fast path now launches the host-descriptor Gluon row
# backward itself (fastpath.cpp parameter kind 'T': it encodes each TMA descriptor at the launch with
# cuTensorMapEncodeTiled, as Triton's launcher does), so the default form (graph replay: RMSNorm 0.873 against
# device_desc's 0.81) leaves the Python path too.  LayerNorm 16K's default is now smem_sums (0.795 against 0.770).
#  1. GPU tests: the C++ node over both descriptor forms, the Gluon variants, graph / side-stream;
#  2. host µs and do_bench at 16K (default form through C++);
#  3. the 8K / 16K table at the defaults by do_bench (TIMING=eager) and by graph replay.
#   run: OUT=$OUT bash benchmarks/gpu_session26_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 130 python3 -m pytest tests/test_cpp_fastpath.py tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "gluon or cpp_node or cuda_graph or extension_builds or persistent_backward_defaults" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
DEVICE_DESC=0 timeout 60 python3 benchmarks/diag_norm_host.py > $OUT/diag_norm_host_dd0.txt 2>&1
el "host diag exit $?"; grep -E "host|Error" $OUT/diag_norm_host_dd0.txt | head
for t in eager graph; do
  TIMING=$t timeout 60 python3 benchmarks/bench_norm.py --out $OUT/table_$t --ops ln,rms --dtypes bf16 --widths 8192,16384 --no-peers > $OUT/table_$t.log 2>&1
  el "table $t exit $?"; summ $OUT/table_$t.log | tee $OUT/table_$t.txt
done
