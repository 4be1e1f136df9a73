#!/usr/bin/env bash
# Session 22, call 5 (< 6 min, one H200).  Call 4 (issue9/run29_d) read LayerNorm fwd+bwd through the C++ path at 1.14x
# PyTorch's host cost (RMSNorm 0.90; session 11: 1.00 / 0.95) with PyTorch's own rounds spread 113-172 us, and fused +
# compile at 0.996x compiled SDPA at seq 1,024 (session 17: 1.021x).  Both again, with more rounds.
#   run: OUT=$OUT bash benchmarks/gpu_session29_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/bench_host.py --out $OUT/host --rounds 11 --calls 1000 > $OUT/host.log 2>&1
el "host exit $?"; grep -E "^\| (layer|rms|softmax|attention)" $OUT/host.log | head -20
timeout 200 python3 benchmarks/bench_e2e.py --out $OUT/e2e --variants fused_compile,compile_sdpa,fused,unfused_sdpa \
  --rounds 5 --steps 8 --profile-steps 3 --tag _s1024 > $OUT/e2e_s1024.log 2>&1
el "e2e s1024 exit $?"; grep -E "^\| " $OUT/e2e/*_s1024.md | head -8
