#!/usr/bin/env bash
# Next session's first call (written in session 12, 2026-12-03; not yet run), < 8 min on one H200: issue 9.
#  1. the HOLD candidate of the persistent norm backward (gpu_session18_f.sh: GPU tests, then the sweep at bf16 16K /
#     32K / 64K beside the default and the no-exchange diagnostic, LayerNorm and RMSNorm); adopt per width if it wins;
#  2. the LayerNorm backward at 8,192 (0.847 with the new reduce: the one narrow width short of 0.85): every candidate;
#  3. do_bench of the LayerNorm backward at 768 / 4096 / 8192 (issue 9's second measure).
#   run: OUT=$OUT bash benchmarks/gpu_session19_a.sh   (carry .whl)
set -u
FINAL=$OUT; mkdir -p $FINAL/r
OUT=$FINAL/r OPS="ln rms" bash benchmarks/gpu_session18_f.sh
source benchmarks/_gpu_env.sh
OUT=$FINAL/r
timeout 100 python3 benchmarks/bench_norm.py --out /tmp/s8 --ops ln --dtypes bf16 --widths 8192 --sweep --sweep-op ln --sweep-parts bwd \
  --sweep-widths 8192 --sweep-dtypes bf16 --sweep-budget 90 --budget 95 --no-peers > $OUT/sweep_8k.log 2>&1
el "8K sweep exit $?"; grep -E '"part": "bwd"' $OUT/sweep_8k.log | python3 -c "
import json, sys
rows = [json.loads(l) for l in sys.stdin]
for r in sorted(rows, key=lambda r: -r.get('frac', 0))[:8]: print(round(r.get('frac', 0), 3), r['cfg'])"
TIMING=eager timeout 60 python3 benchmarks/bench_norm.py --out /tmp/nd --ops ln --dtypes bf16 --widths 768,4096,8192 --no-peers --budget 55 > $OUT/norm_dobench.log 2>&1
el "norm do_bench exit $?"; cp /tmp/nd/bench_norm.md $OUT/norm_dobench.md 2>/dev/null; grep -E "^\| " /tmp/nd/bench_norm.md | head
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
