#!/usr/bin/env bash
# Session 19, call 8 (< 2 min, one H200).  Issue 9, LayerNorm 16K backward (0.79; ncu run26_g: issue-bound, 56.7 M
# instructions against RMSNorm's 41.9 M): fold_mean, the mean folded into the row sums (s1 += g x; c1 = rstd / N
# (sum(g x) - mean sum(g)), as aten's CUDA LayerNorm backward) and into xhat = x rstd - mean rstd (one FMA): sm_90 SASS
# 1176 -> 1112 a row loop.  1. its GPU tests (variants: against float64); 2. the 16K sweep beside the default.
#   run: OUT=$OUT bash benchmarks/gpu_session26_h.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 70 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider -k "variants and fold_mean" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -6
timeout 45 python3 benchmarks/bench_norm.py --out /tmp/g_ln --ops ln --dtypes bf16 --widths 16384 --sweep --sweep-op ln \
  --sweep-parts bwd --sweep-widths 16384 --sweep-dtypes bf16 --sweep-with bwd_gluon_fold_mean --sweep-budget 35 --budget 40 \
  --no-peers > $OUT/sweep_ln.log 2>&1
el "ln sweep exit $?"; grep '"part"' $OUT/sweep_ln.log | cut -c1-220
