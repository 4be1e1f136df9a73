#!/usr/bin/env bash
# One device call on nvidia-h200-x2, two lanes (one GPU each), < 9 min:
#   lane 0: issue 12 acceptance (benchmarks/gpu_train_ab.sh: train.py sweeps with the step-time A/B)
#   lane 1: GPU tests fixed since the last call (compile, integrations, dropout), issue 10
#           (benchmarks/gpu_cross_entropy.sh: CE tests, loss curves, benchmark), then the e2e at seq 1024
# Everything lands in $OUT/all.tgz.
set -u
export PYTHONUNBUFFERED=1
W=/tmp/wb; mkdir -p $W/i12 $W/i10 $W/t
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
lane0() { CUDA_VISIBLE_DEVICES=0 OUT=$W/i12 timeout 500 bash benchmarks/gpu_train_ab.sh > $W/i12/lane.log 2>&1; el "lane0 done"; }
lane1() {
  export CUDA_VISIBLE_DEVICES=1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site1 .whl/*.whl && export PYTHONPATH=/tmp/site1:${PYTHONPATH:-}
  el "lane1 tests"; timeout 110 python3 -m pytest tests/test_compile_gpu.py tests/test_integrations.py tests/test_layer_norm.py -q -m gpu -n 6 -p no:cacheprovider > $W/t/gpu_tests.log 2>&1
  el "lane1 ce"; OUT=$W/i10 timeout 300 bash benchmarks/gpu_cross_entropy.sh > $W/i10/lane.log 2>&1
  left=$(( 470 - ($(date +%s) - T0) ))
  if [ $left -gt 80 ]; then
    el "lane1 e2e"; timeout $left python3 benchmarks/bench_e2e.py --out $W/t --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 > $W/t/e2e_1024.log 2>&1
  fi
  el "lane1 done"
}
lane0 & lane1 & wait
tar czf $OUT/all.tgz -C $W .
tail -3 $W/t/gpu_tests.log; grep -E "^FAILED" $W/t/gpu_tests.log | head
grep -hE "step / GPU" $W/t/e2e_1024.log
tail -30 $W/i10/lane.log
tail -40 $W/i12/train_ab.md
