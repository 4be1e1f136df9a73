#!/usr/bin/env bash
# Session 7 of 2026-12-01, call 2 (nvidia-h200, < 10 min; .whl carried): bench_e2e at seq 1024 and 4096 with the C++
# fast path built before timing (call 1's e2e timed while it built on a background thread), then issue 12's s4096 sweeps.
#   run: OUT=$OUT bash benchmarks/gpu_session10_b.sh
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/bench_e2e.py --out $OUT --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 \
  > $OUT/e2e_1024.log 2>&1
el "e2e 1024 exit $?"; grep -E "^\| " $OUT/e2e_h200.md | head -6
timeout 150 python3 benchmarks/bench_e2e.py --out $OUT --tag _s4096 --seq-len 4096 --batch-size 4 --variants unfused_sdpa,compile_sdpa,fused,fused_compile \
  --rounds 5 --steps 8 > $OUT/e2e_4096.log 2>&1
el "e2e 4096 exit $?"; grep -E "^\| " $OUT/e2e_h200_s4096.md | head -6
mkdir -p $OUT/ab; OUT=$OUT/ab SWEEPS=s4096_eager,s4096_compile timeout 260 bash benchmarks/gpu_train_ab.sh > $OUT/train_ab_stdout.log 2>&1
el "train_ab s4096 exit $?"; grep -E "best fused|twin|table within" $OUT/ab/train_ab.md | head -12
