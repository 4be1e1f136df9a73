#!/usr/bin/env bash
# Session 21, call 2 (< 4 min, one H200).  Issue 9, LayerNorm 16K (0.82 / 0.82 with the Gluon PDL, run28_a): where
# the last 7 us go.  1. the dW / dB reduce alone, cold (L2 flushed) and warm (partials in L2), shapes and evict_first;
# 2. the do_bench timeline at 16K at the new default; 3. both measures at 16K with the partials stored evict_last /
# loaded evict_first / a one-iteration reduce shape; 4. the Gluon variants' GPU tests (their call record changed).
#   run: OUT=$OUT bash benchmarks/gpu_session28_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 benchmarks/diag_norm_reduce.py > $OUT/diag_norm_reduce.txt 2>&1
el "reduce exit $?"; grep -v Warn $OUT/diag_norm_reduce.txt
NORM_CASES=ln:16384,rms:16384 timeout 60 python3 benchmarks/diag_norm_timeline.py > $OUT/diag_norm_timeline.txt 2>&1
el "timeline exit $?"; grep -E "^##|medians|^   [0-9]|span" $OUT/diag_norm_timeline.txt
TIMING=graph timeout 150 python3 benchmarks/sweep_norm_tiles.py --widths 16384 --cfgs '[{"bwd_gluon_parts_evict": 1},
  {"reduce_evict_first": 1}, {"bwd_gluon_parts_evict": 1, "reduce_evict_first": 1},
  {"reduce_block_g": 256, "reduce_block_n": 16, "reduce_stages": 1}]' > $OUT/sweep16k.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep16k.txt
timeout 90 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider -k "variants or reduce" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
