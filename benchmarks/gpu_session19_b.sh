#!/usr/bin/env bash
# Next session's second call (written in session 12; not yet run), < 6 min: the tables the README still quotes from
# older sessions, at the session-12 defaults, peers in the same run.
#  1. the norm table (LayerNorm / RMSNorm bf16 768-64K: fused, eager, compile, Liger), CUDA-graph replay;
#  2. issue 10: the CE table with its graph-replay column (fixed in session 12: a fresh leaf for the capture).
#   run: OUT=$OUT bash benchmarks/gpu_session19_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 170 python3 benchmarks/bench_norm.py --out /tmp/nt --ops ln,rms --dtypes bf16 --widths 768,1024,2048,4096,8192,16384,65536 --budget 165 > $OUT/norm_table.log 2>&1
el "norm table exit $?"; cp /tmp/nt/bench_norm.md /tmp/nt/bench_norm.json $OUT/ 2>/dev/null; grep -E "^\| " /tmp/nt/bench_norm.md | head -30
timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/cefull --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; cp /tmp/cefull/cross_entropy_h200.md $OUT/ 2>/dev/null; grep -E "^CE V|no graph" $OUT/ce_table.log
