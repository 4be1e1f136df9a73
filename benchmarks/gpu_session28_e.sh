#!/usr/bin/env bash
# Session 21, call 5 (< 8 min, one H200).  Checks and tables at this session's defaults: the Gluon 16K norm backward a
# programmatic dependent (pdl=2), the PACKED 16K softmax forward.  1. GPU tests of the softmax, the C++ fast path and
# the norms' Gluon / graph / PDL / reduce cases; 2. the softmax table at 8K-32K bf16 with its peers; 3. the norm
# table at 768-16K by do_bench and graph replay (gpu_session26_f.sh).
#   run: OUT=$OUT bash benchmarks/gpu_session28_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 200 python3 -m pytest tests/test_softmax.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider > $OUT/tests_sm.log 2>&1
el "softmax / cpp tests exit $?"; tail -1 $OUT/tests_sm.log; grep -E "^FAILED|^E  " $OUT/tests_sm.log | head -10
timeout 100 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "gluon or cuda_graph or programmatic or reduce or persistent" > $OUT/tests_ln.log 2>&1
el "norm tests exit $?"; tail -1 $OUT/tests_ln.log; grep -E "^FAILED|^E  " $OUT/tests_ln.log | head -10
timeout 150 python3 benchmarks/bench_softmax.py --out $OUT/softmax --dtypes bf16 --widths 8192,16384,32768 > $OUT/softmax.log 2>&1
el "softmax table exit $?"; ls $OUT/softmax; cat $OUT/softmax/*.md 2>/dev/null | head -40
OUT=$OUT bash benchmarks/gpu_session26_f.sh
