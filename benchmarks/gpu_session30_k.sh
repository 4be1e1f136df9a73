#!/usr/bin/env bash
# Session 23, call 11 (< 3 min, one H200).  Call 10 saw the library's cross-entropy at 0.29 of copy at 32,008 classes
# (0.72 at 32,000): the default over real and ragged vocabulary sizes, fwd + bwd, 8,192 bf16 rows.
#   run: OUT=$OUT bash benchmarks/gpu_session30_k.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 170 python3 benchmarks/sweep_ce_hold.py 30522 32000 32001 32008 32064 32128 49152 50257 50304 65024 100277 128256 151936 256000 --default-only > $OUT/ce_widths.txt 2>&1
el "exit $?"; grep "C=" $OUT/ce_widths.txt; tail -2 $OUT/ce_widths.txt
