#!/usr/bin/env bash
# Next session's first call (written in session 12, 2026-12-03; not yet run), < 8 min on one H200:
#  1. issue 9: the HOLD candidate of the persistent norm backward (gpu_session18_f.sh: GPU tests, then the sweep at
#     bf16 16K / 32K / 64K beside the default and the no-exchange diagnostic, LayerNorm and RMSNorm);
#  2. issue 9: the norm table at the session-12 defaults (dW / dB reduce in 16-column strips, packed sums), peers in
#     the same run (eager, compile, Liger), graph replay, then do_bench at 768 / 4096 / 8192;
#  3. issue 10: the CE table with its graph-replay column (fixed in session 12: a fresh leaf for the capture).
#   run: OUT=$OUT bash benchmarks/gpu_session19_a.sh   (carry .whl)
set -u
FINAL=$OUT; mkdir -p $FINAL/r
OUT=$FINAL/r OPS="ln rms" bash benchmarks/gpu_session18_f.sh
source benchmarks/_gpu_env.sh
OUT=$FINAL/r
timeout 150 python3 benchmarks/bench_norm.py --out /tmp/nt --ops ln,rms --dtypes bf16 --widths 768,1024,2048,4096,8192,16384,65536 --budget 145 > $OUT/norm_table.log 2>&1
el "norm table exit $?"; cp /tmp/nt/bench_norm.md /tmp/nt/bench_norm.json $OUT/ 2>/dev/null; grep -E "^\| " /tmp/nt/bench_norm.md | head -30
TIMING=eager timeout 60 python3 benchmarks/bench_norm.py --out /tmp/nd --ops ln --dtypes bf16 --widths 768,4096,8192 --no-peers --budget 55 > $OUT/norm_dobench.log 2>&1
el "norm do_bench exit $?"; cp /tmp/nd/bench_norm.md $OUT/norm_dobench.md 2>/dev/null
timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/cefull --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; cp /tmp/cefull/cross_entropy_h200.md $OUT/ 2>/dev/null; grep -E "^CE V|no graph" $OUT/ce_table.log
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
