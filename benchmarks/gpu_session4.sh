#!/usr/bin/env bash
# Next device session, call 1 (nvidia-h200, < 9 min; no wheels needed): the variants prepared on the CPU in
# session 3 of 2026-12-01, and the host profile of issue 9.
#   1. GPU tests of fwd_lazy_rescale and bwd_dq_reduce (TMA reduce-add: the interpreter ran fp32 atomics);
#   2. bench_attention.py --variants --only fwd_lazy_rescale,bwd_dq_reduce (beside cuDNN / flash / Flex);
#   3. bench_host.py --profile: cProfile of the fused fwd+bwd on the GPU host, then the host table.
# Results under $OUT: tests.log, attention_variants.{json,md}, sweep.log, host_profile.log, host_h200.{json,md}.
# Call 2 (carry .whl): OUT=$OUT SWEEPS=s4096_compile bash benchmarks/gpu_train_ab.sh (the 3% re-check).
#   run: OUT=$OUT bash benchmarks/gpu_session4.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 120 python3 -m pytest tests/test_attention_variants.py -k "lazy or dq_reduce or fold" -q -rf --tb=short \
  -p no:cacheprovider > $OUT/tests.log 2>&1
el "variant tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -10
mkdir -p /tmp/v
timeout 200 python3 benchmarks/bench_attention.py --out /tmp/v --variants --workers 8 --dims 64,128 \
  --variant-seqlens 1024,4096,16384 --flex-seqlens 1024,4096,16384 --only fwd_lazy_rescale,bwd_dq_reduce \
  --deadline 185 > $OUT/sweep.log 2>&1
el "sweep exit $?"; cp /tmp/v/attention_variants.* $OUT/ 2> /dev/null
grep -A16 "## fwd_tflops" $OUT/sweep.log; grep -A16 "## bwd_tflops" $OUT/sweep.log; grep -A5 "## Failures" $OUT/sweep.log
timeout 150 python3 benchmarks/bench_host.py --out $OUT --rounds 5 --profile --breakdown > $OUT/host_profile.log 2>&1
el "host exit $?"; tail -22 $OUT/host_profile.log
