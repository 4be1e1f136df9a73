#!/usr/bin/env bash
# Session 22, call 6 (< 3 min, one H200).  Issue 9, LayerNorm 16K: the Gluon form's existing knobs at today's default
# (smem_sums + fold_mean + pdl 2), not timed together since session 19: a 3-row ring, the weight held as float32.
#   run: OUT=$OUT bash benchmarks/gpu_session29_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
TIMING=graph timeout 200 python3 benchmarks/sweep_norm_tiles.py --widths 16384 --ops ln --cfgs '[{"bwd_gluon_stages": 3},
  {"bwd_gluon_w_f32": 1}, {"bwd_gluon_stages": 3, "bwd_gluon_parts_evict": 1}, {}, {"bwd_gluon_stages": 3}]' \
  > $OUT/sweep16k.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep16k.txt | sed -E 's/ {20,}/ /'
