#!/usr/bin/env bash
# Session 23, call 13 (< 2 min, one H200).  The wide softmax forward at widths not a multiple of 16 (bf16): the default
# (the SMEM-pipelined persistent form) against the piece-wise kernels (wide_mode 0) and the register persistent form.
#   run: OUT=$OUT bash benchmarks/gpu_session30_m.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
SWEEP='{"50257": [{"wide_mode": 0}, {"wide_mode": 2, "persist_stages": 1}], "32001": [{"wide_mode": 0}, {"wide_mode": 2, "persist_stages": 1}], "100277": [{"wide_mode": 0}]}' \
  timeout 100 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_odd.txt 2>&1
el "exit $?"; grep -v Warn $OUT/sm_odd.txt | sed -E 's/ {20,}/ /'
