#!/usr/bin/env bash
# Session 23, call 12 (< 3 min, one H200).  Call 11: the CE default (the SMEM-pipelined persistent kernel) reads
# 0.28-0.29 of copy where the row stride is not a multiple of 16 elements (no 16-byte cp.async for rows 2-byte
# aligned).  The other forms there, to route such rows to the best: the stream (wide_mode 1, its pipelined and its
# register-prefetch form), the split kernel (2), the register persistent form (3, one stage).
#   run: OUT=$OUT bash benchmarks/gpu_session30_l.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
FORMS='{"stream": {"wide_mode": 1}, "stream, register prefetch": {"wide_mode": 1, "stages": 1}, "split": {"wide_mode": 2}, "persistent, registers": {"wide_mode": 3, "persist_stages": 1}, "stream 8K x 16": {"wide_mode": 1, "stages": 1, "block_n": 8192, "num_warps": 16}}' \
  timeout 170 python3 benchmarks/sweep_ce_hold.py 50257 30522 100277 32001 > $OUT/ce_odd.txt 2>&1
el "exit $?"; grep "C=" $OUT/ce_odd.txt; tail -2 $OUT/ce_odd.txt
