#!/usr/bin/env bash
# (Ran at commit 58e96b8; split_bars was reverted after this call: bwd_gluon_split_bars no longer exists at HEAD.)
# Session 22, call 8 (< 5 min, one H200).  Issue 9, LayerNorm 16K.  g_smem (call 3) showed the Gluon row loop paying
# for its CTA barriers more than for its instructions.  The sm_90 SASS of the default form has 5 BAR.SYNC a row where
# the kernel asks for 2: Triton's barrier pass puts one between an mbarrier's arming and the TMA copy that uses it, and
# one between the two copies (x, dy) completing on the same mbarrier.  split_bars (GluonVariant.split_bars, config
# bwd_gluon_split_bars): an mbarrier a copy, both armed before step 4's barrier: 3 BAR.SYNC a row (sm_90, Triton 3.6).
#  1. GPU tests (variants incl. split_bars, determinism, CUDA graph + side stream, C++ node);
#  2. both measures at 16K, both norms; 3. the do_bench timeline with split_bars.
#   run: OUT=$OUT bash benchmarks/gpu_session29_h.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 130 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "split_bars or deterministic or cuda_graph" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
TIMING=graph timeout 150 python3 benchmarks/sweep_norm_tiles.py --widths 16384 --cfgs '[{"bwd_gluon_split_bars": 1},
  {"bwd_gluon_split_bars": 1, "bwd_gluon_parts_evict": 1}, {}, {"bwd_gluon_split_bars": 1}]' > $OUT/sweep16k.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep16k.txt | sed -E 's/ {20,}/ /'
NORM_CASES="ln:16384,rms:16384" NORM_CFG='{"bwd_gluon_split_bars": 1}' \
  timeout 50 python3 benchmarks/diag_norm_timeline.py > $OUT/timeline.txt 2>&1
el "timeline exit $?"; grep -v -i warn $OUT/timeline.txt | grep -v _warn_once | grep -v "iter "
