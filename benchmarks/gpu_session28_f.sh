#!/usr/bin/env bash
# Session 21, call 6 (< 4 min, one H200).  Issue 10, the bf16 softmax forward at 32K-128K: the persistent SMEM form
# with bigger pieces and more warps a program (16K x 16 warps, as the packed 16K winner's shape; 8K x 8 / 16), against
# the default 4K x 4 warps x 3 stages; and the PACKED 16K forward in fp16 (timed in bf16 only so far).
#   run: OUT=$OUT bash benchmarks/gpu_session28_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
P='{"persist_block": 16384, "persist_warps": 16, "persist_per_sm": 4'
Q='{"persist_block": 8192, "persist_warps": 8, "persist_per_sm": 8'
R='{"persist_block": 8192, "persist_warps": 16, "persist_per_sm": 4'
C="[$P, \"persist_stages\": 2}, $P, \"persist_stages\": 3}, $Q, \"persist_stages\": 2}, $Q, \"persist_stages\": 3}, $R, \"persist_stages\": 3}]"
SWEEP="{\"32768\": $C, \"65536\": $C, \"131072\": $C}" timeout 170 python3 benchmarks/sweep_softmax_packed.py > $OUT/sweep_persist.txt 2>&1
el "persist sweep exit $?"; grep -v -i warn $OUT/sweep_persist.txt | sed -E 's/ {20,}/ /'
SWEEP='{"16384": [{"packed": 0}]}' FP16=1 timeout 60 python3 benchmarks/sweep_softmax_packed.py > $OUT/sweep_fp16.txt 2>&1
el "fp16 exit $?"; grep -v -i warn $OUT/sweep_fp16.txt | sed -E 's/ {20,}/ /'
