#!/usr/bin/env bash
# 2026-12-01 session 3, last device call (< 250 s): the new defaults (forward fwd_fold_scale, 8-bit dropout
# masks with the rounded-p scale) on the GPU.
#   1. GPU tests: attention, dropout, the fold-scale variant tests;
#   2. the attention table (default beside cuDNN / flash / Flex, D64/128, S1K/4K/16K);
#   3. the dropout cost (p = 0.1) with the 8-bit default.
# Results under $OUT: tests.log, attention_variants.{json,md}, sweep.log, dropout_h200.{json,md}.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
XDIST=""; python3 -c "import xdist" 2> /dev/null && XDIST="-n 4"
timeout 60 python3 -m pytest tests/test_attention.py tests/test_attention_dropout.py -m gpu \
  -q -rf --tb=short $XDIST -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -8
timeout 30 python3 -m pytest tests/test_attention_variants.py -k fold -q -rf --tb=short -p no:cacheprovider > $OUT/tests_fold.log 2>&1
el "fold tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests_fold.log | tail -5
mkdir -p /tmp/v
timeout 95 python3 benchmarks/bench_attention.py --out /tmp/v --variants --workers 8 --dims 64,128 --variant-seqlens 1024,4096,16384 \
  --flex-seqlens 1024,4096,16384 --only none --deadline 85 > $OUT/sweep.log 2>&1
el "sweep exit $?"; cp /tmp/v/attention_variants.* $OUT/ 2> /dev/null; grep -A16 "## fwd_tflops" $OUT/sweep.log; grep -A16 "## bwd_tflops" $OUT/sweep.log
timeout 55 python3 benchmarks/bench_attention_dropout.py --out $OUT > $OUT/dropout.log 2>&1
el "dropout exit $?"; cat $OUT/dropout_*.md 2> /dev/null | head -20
