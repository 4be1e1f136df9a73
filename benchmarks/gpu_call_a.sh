#!/usr/bin/env bash
# One device call on nvidia-h200-x2, two lanes (one GPU each):
#   lane 0: issue 9 (GPU tests of every op + compile, host cost per call, end to end at seq 1024 and 4096)
#   lane 1: issue 11 (integration/dropout GPU tests, dropout cost, the HF/timm model table)
# Everything lands in $OUT/all.tgz (the tool returns at most 8 files).
set -u
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=8
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
W=/tmp/w; mkdir -p $W/i9 $W/i11
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
lane0() {
  export CUDA_VISIBLE_DEVICES=0
  el "lane0 tests"; timeout 150 python3 -m pytest tests/test_softmax.py tests/test_layer_norm.py tests/test_attention.py tests/test_compile_gpu.py tests/test_cross_entropy.py -q -m gpu -n 6 -p no:cacheprovider > $W/i9/gpu_tests.log 2>&1
  el "lane0 host"; timeout 100 python3 benchmarks/bench_host.py --out $W/i9 --rounds 5 > $W/i9/host_log.txt 2>&1
  el "lane0 e2e 1024"; timeout 170 python3 benchmarks/bench_e2e.py --out $W/i9 --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 > $W/i9/e2e_1024.log 2>&1
  el "lane0 e2e 4096"; timeout 150 python3 benchmarks/bench_e2e.py --out $W/i9 --tag _s4096 --seq-len 4096 --batch-size 4 --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 > $W/i9/e2e_4096.log 2>&1
  el "lane0 done"
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1
  OUT=$W/i11 bash benchmarks/gpu_models.sh > $W/i11/lane.log 2>&1
  el "lane1 done"
}
lane0 & lane1 & wait
tar czf $OUT/all.tgz -C $W .
tail -3 $W/i9/gpu_tests.log; grep -E "^FAILED" $W/i9/gpu_tests.log | head; cat $W/i9/host_h200.md
grep -hE "step / GPU|^\| (unfused|compile|fused)" $W/i9/e2e_*.log | head -20
tail -45 $W/i11/lane.log
