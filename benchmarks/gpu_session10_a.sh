#!/usr/bin/env bash
# Session 7 of 2026-12-01, call 1 (nvidia-h200, < 10 min, timeout_s 595; .whl carried): issue 9.
#   1. the LayerNorm tests on the GPU, with the new single-block backward variants (bwd_acc_rows, bwd_pair_sum);
#   2. the LayerNorm backward sweep, bf16, 768-8192, with those candidates (target >= 0.85 of copy), then the
#      LayerNorm table with the best swept configs beside eager / compile / Liger;
#   3. bench_e2e at seq 1024 with the C++ fast path on by default (issue 9's end-to-end proof).
#   run: OUT=$OUT bash benchmarks/gpu_session10_a.sh
set -u
source benchmarks/_gpu_env.sh
XDIST=""; python3 -c "import xdist" 2> /dev/null && XDIST="-n 8"
timeout 100 python3 -m pytest tests/test_layer_norm.py -q $XDIST -rf --tb=short -p no:cacheprovider -W ignore > $OUT/ln_tests.log 2>&1
el "ln tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/ln_tests.log | tail -8
timeout 300 python3 benchmarks/bench_norm.py --out $OUT/norm --ops ln --dtypes bf16 --widths 768,1024,2048,4096,8192 \
  --sweep --sweep-dtypes bf16 --sweep-parts bwd --sweep-widths 768,1024,2048,4096,8192 --sweep-with bwd_acc_rows,bwd_pair_sum --sweep-budget 230 --budget 290 \
  > $OUT/norm.log 2>&1
el "norm sweep exit $?"; python3 - $OUT/norm/sweep.json << 'PY'
import json, sys
d = json.load(open(sys.argv[1]))
base = {}
for r in d["results"]:
    if "ms" in r and not r["cfg"]:
        base[r["n"]] = r["frac"]
for k, r in d["best"].items():
    print(k, "best", round(r["frac"], 3), "default", round(base.get(r["n"], 0), 3), r["cfg"])
PY
grep -E "^\| " $OUT/norm/bench_norm.md | head -30
timeout 175 python3 benchmarks/bench_e2e.py --out $OUT --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 \
  > $OUT/e2e_1024.log 2>&1
el "e2e 1024 exit $?"; grep -E "^\| " $OUT/e2e_*.md | head -8
