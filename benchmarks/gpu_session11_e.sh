#!/usr/bin/env bash
# Session 8 of 2026-12-01, call 6 (nvidia-h200): the softmax plan key now carries `persist_ok`; the C++ fast path
# must still bind the plans the Python path launches: its GPU tests, then the host cost per call (softmax included).
#   run: OUT=$OUT bash benchmarks/gpu_session11_e.sh
set -u
source benchmarks/_gpu_env.sh
timeout 300 python3 -m pytest tests/test_cpp_fastpath.py -q -m gpu -p no:cacheprovider > $OUT/cpp_tests.log 2>&1
el "C++ fast-path GPU tests exit $?"; tail -3 $OUT/cpp_tests.log
timeout 200 python3 benchmarks/bench_host.py --out $OUT/host --rounds 3 --calls 1000 > $OUT/host.log 2>&1
el "host exit $?"; tail -30 $OUT/host.log
