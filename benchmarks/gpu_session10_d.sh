#!/usr/bin/env bash
# Session 7 of 2026-12-01, call 4 (nvidia-h200, the last ~4 min of device time): the RMSNorm backward with the
# one-row accumulator variant (bwd_acc_rows; bwd_pair_sum is LayerNorm-only), bf16 768-8192, for a later adoption.
#   run: OUT=$OUT bash benchmarks/gpu_session10_d.sh
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/bench_norm.py --out $OUT --ops rms --dtypes bf16 --widths 768,1024,2048,4096,8192 --no-peers \
  --sweep --sweep-op rms --sweep-dtypes bf16 --sweep-parts bwd --sweep-widths 768,1024,2048,4096,8192 --sweep-with bwd_acc_rows \
  --sweep-budget 110 --budget 145 > $OUT/rms.log 2>&1
el "rms sweep exit $?"; python3 - $OUT/sweep.json << 'PY'
import json, sys
d = json.load(open(sys.argv[1]))
base = {r["n"]: r["frac"] for r in d["results"] if "ms" in r and not r["cfg"]}
for k, r in d["best"].items():
    print(k, "best", round(r["frac"], 3), "default", round(base.get(r["n"], 0), 3), r["cfg"])
PY
