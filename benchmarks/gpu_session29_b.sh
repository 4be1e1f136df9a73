#!/usr/bin/env bash
# (Ran at commit df63f42; split_tail was reverted after call 2: bwd_gluon_split_tail no longer exists at HEAD.)
# Session 22, call 2 (< 5 min, one H200).  Issue 9, LayerNorm 16K.  Call 1 (issue9/run29_a): split_tail's first form
# (the flush inside the row loop) slowed the row kernel (LN 114.9 us against 110.4; sm_90 stack 8 -> 16 bytes) and its
# reduce (1,024 programs, more than one wave) did most of its work after the wait: no gain.  Now the full rounds and
# the tail row are two loops over one row body (sm_90: no spills, the default's binary unchanged), and the reduce
# shapes of one wave (128-256 programs) are swept with it.
#   run: OUT=$OUT bash benchmarks/gpu_session29_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "split_tail or deterministic or cuda_graph" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
TIMING=graph timeout 260 python3 benchmarks/sweep_norm_tiles.py --widths 16384 --cfgs '[
  {"bwd_gluon_split_tail": 1, "reduce_block_g": 32, "reduce_block_n": 128, "reduce_stages": 3},
  {"bwd_gluon_split_tail": 1, "reduce_block_g": 16, "reduce_block_n": 128, "reduce_stages": 4},
  {"bwd_gluon_split_tail": 1, "reduce_block_g": 64, "reduce_block_n": 64, "reduce_stages": 2},
  {"bwd_gluon_split_tail": 1, "reduce_block_g": 32, "reduce_block_n": 64, "reduce_stages": 3},
  {"bwd_gluon_split_tail": 1, "bwd_gluon_parts_evict": 1, "reduce_block_g": 32, "reduce_block_n": 128, "reduce_stages": 3},
  {"bwd_gluon_split_tail": 1, "bwd_gluon_parts_evict": 1, "reduce_block_g": 32, "reduce_block_n": 64, "reduce_stages": 3},
  {"bwd_gluon_split_tail": 1}]' > $OUT/sweep16k.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep16k.txt | sed -E 's/ {20,}/ /'
NORM_CASES="ln:16384,rms:16384" NORM_CFG='{"bwd_gluon_split_tail": 1, "reduce_block_g": 32, "reduce_block_n": 128, "reduce_stages": 3}' \
  timeout 60 python3 benchmarks/diag_norm_timeline.py > $OUT/timeline_split.txt 2>&1
el "timeline exit $?"; grep -v -i warn $OUT/timeline_split.txt | grep -v _warn_once | grep -v "iter "
