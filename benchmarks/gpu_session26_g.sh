#!/usr/bin/env bash
# Session 19, call 7 (< 3 min, one H200).  Issue 9, LayerNorm 16K backward at 0.79 (smem_sums): ncu of the default
# beside the form without smem_sums and RMSNorm (stall reasons, issue rate, instructions) for the next attempt.
#   run: OUT=$OUT bash benchmarks/gpu_session26_g.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
export NCU_CASES=session19
source benchmarks/_ncu_norm.sh; ncu_norm _norm_bwd_rows 120
