#!/usr/bin/env bash
# (Ran at commit df63f42; split_tail was reverted after call 2: bwd_gluon_split_tail no longer exists at HEAD.)
# Session 22, call 1 (< 6 min, one H200).  Issue 9, LayerNorm 16K (0.82 / 0.81, the one cell left).  split_tail
# (GluonVariant.split_tail, config bwd_gluon_split_tail; sm_90 compile: 128 registers as before): 4,096 rows over 132
# programs leave 4 programs a 32nd row while 128 SMs idle (~3.5 us of ~117); the row kernel now stores its partial
# rows after the full rounds, fences them and lets the reduce launch, so the reduce sums those 132 rows during the
# last round and the 4 tail rows after its wait.
#  1. GPU tests (Gluon variants incl. split_tail, determinism, CUDA graph + side stream, C++ node);
#  2. both measures at 16K: default, split_tail, split_tail with reduce shapes / evict_last partials;
#  3. the do_bench timeline with split_tail.
#   run: OUT=$OUT bash benchmarks/gpu_session29_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 170 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "gluon or cuda_graph or programmatic" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
TIMING=graph timeout 220 python3 benchmarks/sweep_norm_tiles.py --widths 16384 --cfgs '[{"bwd_gluon_split_tail": 1},
  {"bwd_gluon_split_tail": 1, "reduce_block_g": 32, "reduce_block_n": 128, "reduce_stages": 3},
  {"bwd_gluon_split_tail": 1, "reduce_block_g": 16, "reduce_block_n": 128, "reduce_stages": 4},
  {"bwd_gluon_split_tail": 1, "bwd_gluon_parts_evict": 1},
  {"bwd_gluon_split_tail": 1, "bwd_gluon_parts_evict": 1, "reduce_block_g": 32, "reduce_block_n": 128, "reduce_stages": 3},
  {"bwd_gluon_split_tail": 1}]' > $OUT/sweep16k.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep16k.txt | sed -E 's/ {20,}/ /'
NORM_CASES="ln:16384,rms:16384" NORM_CFG='{"bwd_gluon_split_tail": 1}' timeout 60 python3 benchmarks/diag_norm_timeline.py \
  > $OUT/timeline_split.txt 2>&1
el "timeline exit $?"; grep -v -i warn $OUT/timeline_split.txt | grep -v _warn_once
