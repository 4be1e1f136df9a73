#!/usr/bin/env bash
# Session 22, call 4 (< 8 min, one H200).  Issue 9's end-to-end and host-cost checks at HEAD (last re-measured in
# sessions 17 / 11; since then: PDL launches of the norm backward through the C++ path, the 1K tile, the Gluon 16K
# PDL form, the bf16 16K PACKED softmax forward).  GPT-2 small, seq 1,024 x 16 and 4,096 x 4, eager and compiled,
# fused against SDPA (fused_compile first in its process); then bench_host.py (1,000 calls, 5 rounds).
#   run: OUT=$OUT bash benchmarks/gpu_session29_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 170 python3 benchmarks/bench_e2e.py --out $OUT/e2e --variants fused_compile,compile_sdpa,unfused_sdpa,fused \
  --rounds 3 --steps 8 --profile-steps 3 --tag _s1024 > $OUT/e2e_s1024.log 2>&1
el "e2e s1024 exit $?"; grep -E "^\| " $OUT/e2e/*_s1024.md | head -8
timeout 170 python3 benchmarks/bench_e2e.py --out $OUT/e2e --variants fused_compile,compile_sdpa,unfused_sdpa,fused \
  --rounds 3 --steps 8 --profile-steps 3 --seq-len 4096 --batch-size 4 --tag _s4096 > $OUT/e2e_s4096.log 2>&1
el "e2e s4096 exit $?"; grep -E "^\| " $OUT/e2e/*_s4096.md | head -8
timeout 100 python3 benchmarks/bench_host.py --out $OUT/host --rounds 5 --calls 1000 > $OUT/host.log 2>&1
el "host exit $?"; grep -E "^\| " $OUT/host/*.md | head -20
