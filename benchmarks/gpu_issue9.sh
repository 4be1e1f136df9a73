#!/usr/bin/env bash
# Issue 9, one device call on nvidia-h200. MODE=quick: GPU tests of every op + compile (triton_op,
# CUDA graphs) and the host cost per call. MODE=full adds the end-to-end proof (GPT-2 small at seq 1024
# B16 and seq 4096 B4; step ms, GPU kernel ms, tokens/s, peak memory). Results under $OUT.
set -u
MODE=${MODE:-quick}
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=8
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
el "tests"
timeout 200 python3 -m pytest tests/test_softmax.py tests/test_layer_norm.py tests/test_attention.py tests/test_compile_gpu.py -q -m gpu -n 6 -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
el "host bench (alone: host timings)"; timeout 150 python3 benchmarks/bench_host.py --out $OUT --rounds 5 > $OUT/host_log.txt 2>&1
if [ "$MODE" = full ]; then
  el "e2e 1024"; timeout 200 python3 benchmarks/bench_e2e.py --out $OUT --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 > $OUT/e2e_1024.log 2>&1
  el "e2e 4096"; timeout 200 python3 benchmarks/bench_e2e.py --out $OUT --tag _s4096 --seq-len 4096 --batch-size 4 --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 > $OUT/e2e_4096.log 2>&1
fi
el "done"
tail -4 $OUT/gpu_tests.log; grep -E "FAILED|Error" $OUT/gpu_tests.log | head -20; cat $OUT/host_*.md
[ "$MODE" = full ] && grep -E "^\||step / GPU|FAILED" $OUT/e2e_*.log | head -40
true
