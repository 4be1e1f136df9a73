#!/usr/bin/env bash
# Session 25, calls 9-10 (< 3 min, one H200; call 10 after the script waits for the C++ fast path).  HF GPT-2 small (vocab 50,257: the VEC8 cross-entropy), every kind swapped:
# the CE kernels' CUDA time per step and the step time, the new default (2K pieces x 2 warps for <= 64K columns,
# cross_entropy_config.PERSIST_BY_WIDTH) against the previous 4K x 4 warps, interleaved in one process.
#   run: OUT=$OUT bash benchmarks/gpu_session32_i.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
ARMS='{"previous 4K x 4 warps": {"persist_block": 4096, "persist_warps": 4, "persist_per_sm": 16}}' \
  timeout 150 python3 benchmarks/profile_gpt2_vec8.py --steps 10 --rounds 7 > $OUT/gpt2.txt 2>&1
el "gpt2 exit $?"; grep -E "first losses|CE kernels|step " $OUT/gpt2.txt; tail -3 $OUT/gpt2.txt
