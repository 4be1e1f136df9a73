#!/usr/bin/env bash
# Session 21, call 3 (< 4 min, one H200).  Issue 9, LayerNorm 16K.  Call 2 (issue9/run28_b): the reduce reads its
# partials from L2 in place (warm 7.2 us = in situ 6.8-7.1, cold 12.6) at only 2.4 TB/s; the best shapes warm 5.2 us
# (32 x 128, 3 stages); the partials stored evict_last: graph LN 0.828 / RMS 0.911 against 0.816 / 0.889.  (Its do_bench
# column read 0.11-0.25: a defaulted constexpr (EVICT_FIRST) kept the reduce off the bound launch and the C++ path;
# fixed.)  1. more reduce shapes alone, warm and cold; 2. both measures at 16K: parts_evict with the best shapes.
#   run: OUT=$OUT bash benchmarks/gpu_session28_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
REDUCE_SHAPES='[[32,128,3,4],[32,128,4,4],[32,128,2,4],[32,128,3,8],[64,128,2,8],[16,256,4,4],[16,256,3,8],[32,64,3,4],
  [64,64,3,4],[16,128,4,4],[64,32,3,4],[128,16,1,4],[256,16,1,4],[256,32,1,8],[128,32,2,4],[32,256,2,8]]' \
  timeout 100 python3 benchmarks/diag_norm_reduce.py > $OUT/diag_norm_reduce.txt 2>&1
el "reduce exit $?"; grep -v Warn $OUT/diag_norm_reduce.txt | sed -E 's/ {20,}/ /'
TIMING=graph timeout 200 python3 benchmarks/sweep_norm_tiles.py --widths 16384 --cfgs '[{"bwd_gluon_parts_evict": 1},
  {"bwd_gluon_parts_evict": 1, "reduce_block_g": 32, "reduce_block_n": 128, "reduce_stages": 3},
  {"bwd_gluon_parts_evict": 1, "reduce_block_g": 256, "reduce_block_n": 16, "reduce_stages": 1},
  {"bwd_gluon_parts_evict": 1, "reduce_block_g": 16, "reduce_block_n": 256, "reduce_stages": 4},
  {"bwd_gluon_parts_evict": 1, "reduce_block_g": 32, "reduce_block_n": 64, "reduce_stages": 3},
  {"bwd_gluon_parts_evict": 1}]' > $OUT/sweep16k.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep16k.txt | sed -E 's/ {20,}/ /'
