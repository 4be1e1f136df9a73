#!/usr/bin/env bash
# Session 22, call 10 (< 3 min, one H200).  Issue 10, the float32 softmax forward at 128K-256K (0.79 / 0.84, target
# 0.90): session 10's do_bench sweep (issue10/run14_sweep/sm.log) had the SMEM-pipelined persistent form (4K x 4 warps,
# 3 stages) at 0.841 against the register form's 0.784 at 128K, and behind it at 32K / 64K / 256K; never adopted for
# float32.  Both measures now, per width, to decide a width-keyed entry.
#   run: OUT=$OUT bash benchmarks/gpu_session29_j.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
S3='{"persist_block": 4096, "persist_warps": 4, "persist_stages": 3}'
S4='{"persist_block": 4096, "persist_warps": 4, "persist_stages": 4}'
S2K='{"persist_block": 2048, "persist_warps": 4, "persist_stages": 3}'
S8K='{"persist_block": 8192, "persist_warps": 8, "persist_stages": 3}'
DTYPES=float32 SWEEP='{"65536": ['"$S3"'], "131072": ['"$S3, $S4, $S2K, $S8K"'], "262144": ['"$S3, $S8K"']}' \
  timeout 150 python3 benchmarks/sweep_softmax_packed.py > $OUT/sweep_fp32.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep_fp32.txt | sed -E 's/ {20,}/ /'
