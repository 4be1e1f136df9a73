#!/usr/bin/env bash
# Issue 9, one device call on nvidia-h200: GPU tests of every op + compile (triton_op, CUDA graphs),
# host cost per call (bench_host.py, with a cProfile of each fused fwd+bwd). Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=8
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
el "host bench"; timeout 150 python3 benchmarks/bench_host.py --out $OUT --profile --rounds 5 > $OUT/host_log.txt 2>&1
el "tests"
timeout 240 python3 -m pytest tests/test_softmax.py tests/test_layer_norm.py tests/test_attention.py tests/test_compile_gpu.py -q -m gpu -n 6 -p no:cacheprovider -x > $OUT/gpu_tests.log 2>&1
el "done"
tail -5 $OUT/gpu_tests.log; grep -E "^\| |^====|tottime|^ +[0-9]+ +[0-9.]+ " $OUT/host_log.txt | head -90
