#!/usr/bin/env bash
# Session 6 of 2026-12-01, call 2 (nvidia-h200, < 9 min, timeout_s 590; .whl carried): the C++ fast path is now the
# default (FUSED_LAYERS_CPP unset = on). Build it first (train.py would otherwise start on the Python path while
# it builds in the background), test the frozen-parameter backward, then issue 12's s1024 sweeps with it, and
# the host cost with paired ratios.
#   run: OUT=$OUT bash benchmarks/gpu_session9_a.sh
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -c "from fused_layers.ops import _cpp; print('ext', _cpp.extension(wait=True) is not None)" > $OUT/build.log 2>&1
el "build exit $?"; tail -3 $OUT/build.log
timeout 90 python3 -m pytest tests/test_cpp_fastpath.py -q -rf --tb=short -p no:cacheprovider -k "frozen or default or compiled_autograd or matches_float64" > $OUT/cpp_tests.log 2>&1
el "cpp tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/cpp_tests.log | head -20
OUT=$OUT SWEEPS=s1024_eager,s1024_compile timeout 300 bash benchmarks/gpu_train_ab.sh > $OUT/train_ab_stdout.log 2>&1
el "train_ab s1024 exit $?"; grep -E "best fused|vs best|twin|PASS|FAIL" $OUT/train_ab.md | head -20
timeout 90 python3 benchmarks/bench_host.py --out $OUT/host --rounds 9 --calls 1000 > $OUT/host.log 2>&1
el "host exit $?"; grep -E "^\| (layer_norm|rms_norm|softmax|attention)" $OUT/host.log
