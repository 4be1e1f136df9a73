#!/usr/bin/env bash
# Session 25, call 4 (< 5 min, one H200).  Call 3 cut the bf16 forward's row loop by 10-20% of its instructions (KFMA,
# EVEN) for +0-1%: the loop is not issue-bound.  What the SMEM form's CTA shape does instead: 1- and 2-warp programs
# (warp-level reductions, no block barriers; up to 32 an SM), against 4K x 4 warps (the default), 8K x 8 and 16K x 16
# (the single block's shape); the softmax forward (bf16, 32K-256K) and the CE (50,304, 128,256).
#   run: OUT=$OUT bash benchmarks/gpu_session32_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
F='[{"persist_block": 1024, "persist_warps": 1, "persist_per_sm": 32}, {"persist_block": 2048, "persist_warps": 2, "persist_per_sm": 32}, {"persist_block": 2048, "persist_warps": 2, "persist_per_sm": 16}, {"persist_block": 8192, "persist_warps": 8}, {"persist_block": 16384, "persist_warps": 16}]'
SWEEP="{\"32768\": $F, \"65536\": $F, \"131072\": $F, \"262144\": $F}" DTYPES=bfloat16 \
  timeout 240 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
FORMS='{"1 warp 1K": {"persist_block": 1024, "persist_warps": 1, "persist_per_sm": 32}, "2 warps 2K": {"persist_block": 2048, "persist_warps": 2, "persist_per_sm": 32}}' \
  timeout 120 python3 benchmarks/sweep_ce_hold.py 50304 128256 > $OUT/ce.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce.txt
