#!/usr/bin/env bash
# Next device session, call 2 (nvidia-h200, < 9 min; .whl optional): time the software-pipelined loops
# prepared on the CPU in session 3 of 2026-12-01. tl.range(num_stages) gives cp.async in the sm_90 SASS,
# where the launch option num_stages alone did nothing (benchmarks/scan_stream_stages.py,
# scan_norm_bwd_stages.py).
#   1. GPU tests of the pipelined cross-entropy loops;
#   2. LayerNorm / RMSNorm backward sweep at 1,024 / 4,096 (bwd_stages now pipelines the row loop);
#   3. cross-entropy sweep (stream_*_st3 / st4 beside the default stream config);
#   4. wide softmax sweep at 65,536 / 262,144 (stages=3/4 candidates).
# Adopt winners in layer_norm_config (bwd_stages), cross_entropy_config.STREAM_STAGES, softmax_config.WIDE_STAGES.
#   run: OUT=$OUT bash benchmarks/gpu_session4_b.sh
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 -m pytest tests/test_cross_entropy.py -m gpu -k "st3" -q -rf --tb=short -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -5
timeout 170 python3 benchmarks/bench_norm.py --out $OUT/norm --ops ln,rms --dtypes bf16 --sweep --sweep-widths 1024,4096 \
  --sweep-dtypes bf16 --widths 1024,4096 --sweep-budget 120 --budget 160 > $OUT/norm.log 2>&1
el "norm exit $?"; grep -iE "best|sweep" $OUT/norm.log | tail -12
timeout 170 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "^SWEEP|best" $OUT/ce.log | tail -30
timeout 110 python3 benchmarks/bench_softmax.py --out $OUT/softmax --dtypes bf16 --sweep --sweep-widths 65536,262144 \
  --widths 65536,262144 --no-peers > $OUT/softmax.log 2>&1
el "softmax exit $?"; grep -E "^sweep" $OUT/softmax.log | tail -6
