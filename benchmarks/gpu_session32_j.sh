#!/usr/bin/env bash
# Session 25, call 11 (< 3 min, one H200).  What the bf16 forward could reach with a free exchange: the no-exchange
# diagnostic (persist_diag_nosync: each piece normalized by its own statistics, WRONG OUTPUT by design; the same loads,
# math and stores) at the default shape (4K x 4 warps) and at 2K x 2 warps (call 4: +3.5% at 32K, losing from 128K on,
# where a row has 64-128 pieces to wait for), 32K-256K, beside the defaults.  If even no exchange stays short of 0.90,
# the target is past this kernel family.
#   run: OUT=$OUT bash benchmarks/gpu_session32_j.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
F='[{"persist_diag_nosync": true, "persist_block": 4096, "persist_warps": 4, "persist_per_sm": 16}, {"persist_block": 2048, "persist_warps": 2, "persist_per_sm": 32}, {"persist_diag_nosync": true, "persist_block": 2048, "persist_warps": 2, "persist_per_sm": 32}]'
SWEEP="{\"32768\": $F, \"65536\": $F, \"131072\": $F, \"262144\": $F}" DTYPES=bfloat16 \
  timeout 200 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
