#!/usr/bin/env bash
# (Ran at commit 9f2cd24; g_smem was reverted after this call: bwd_gluon_g_smem no longer exists at HEAD.)
# Session 22, call 3 (< 5 min, one H200).  Issue 9, LayerNorm 16K (0.82 / 0.81).  split_tail lost (calls 1-2, reverted):
# the row kernel itself has to get faster, and it is instruction-bound.  g_smem (GluonVariant.g_smem, config
# bwd_gluon_g_smem): pass 1 stores g = w dy (float32) in shared memory, pass 2 reads it instead of the weight (no
# weight load, conversion or multiply there).  sm_90 (Triton 3.6): LayerNorm 1120 -> 1040 SASS, 8 -> 0 bytes of
# stack, 3 more barriers; 224 KB of shared memory.
#   run: OUT=$OUT bash benchmarks/gpu_session29_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "variants and g_smem" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
TIMING=graph timeout 200 python3 benchmarks/sweep_norm_tiles.py --widths 16384 --cfgs '[{"bwd_gluon_g_smem": 1},
  {"bwd_gluon_g_smem": 1, "bwd_gluon_parts_evict": 1}, {}, {"bwd_gluon_g_smem": 1}]' > $OUT/sweep16k.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep16k.txt | sed -E 's/ {20,}/ /'
NORM_CASES="ln:16384,rms:16384" NORM_CFG='{"bwd_gluon_g_smem": 1}' \
  timeout 60 python3 benchmarks/diag_norm_timeline.py > $OUT/timeline.txt 2>&1
el "timeline exit $?"; grep -v -i warn $OUT/timeline.txt | grep -v _warn_once | grep -v "iter "
