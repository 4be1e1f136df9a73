#!/usr/bin/env bash
# Session 24, call 8 (< 3 min, one H200).  HF GPT-2 small (vocab 50,257), every kind swapped: the cross-entropy kernels'
# CUDA time per step and the step time, VEC8 against session 23's stream route.
#   run: OUT=$OUT bash benchmarks/gpu_session31_h.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/profile_gpt2_vec8.py --steps 10 --rounds 5 > $OUT/gpt2_vec8.txt 2>&1
el "gpt2 exit $?"; grep -E "first losses|CE kernels|step " $OUT/gpt2_vec8.txt; tail -3 $OUT/gpt2_vec8.txt
