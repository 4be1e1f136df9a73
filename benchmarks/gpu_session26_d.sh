#!/usr/bin/env bash
# Session 19, call 4 (< 7 min, one H200).  Issue 9: the C++ fast path over the host-descriptor Gluon backward passed
# its tests (call 3: 134 passed) and do_bench of fwd+bwd minus fwd at 16K reads LayerNorm 0.777 / RMSNorm 0.870.
# The eager table read 0.43 / 0.62 there: bench_norm timed before any backward had run, so every call took the Python
# path (fixed: one fwd+bwd first).  Here:
#  1. the 8K / 16K table at the defaults, do_bench (TIMING=eager) and graph replay;
#  2. the GPU tests of every op that goes through the C++ registration (register_all changed for all of them).
#   run: OUT=$OUT bash benchmarks/gpu_session26_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
for t in eager graph; do
  TIMING=$t timeout 60 python3 benchmarks/bench_norm.py --out $OUT/table_$t --ops ln,rms --dtypes bf16 --widths 8192,16384 --no-peers > $OUT/table_$t.log 2>&1
  el "table $t exit $?"; summ $OUT/table_$t.log | tee $OUT/table_$t.txt
done
timeout 330 python3 -m pytest tests/test_cpp_fastpath.py tests/test_layer_norm.py tests/test_softmax.py tests/test_cross_entropy.py \
  -q -m gpu -n 8 -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
