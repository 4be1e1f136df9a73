#!/usr/bin/env bash
# Session 5, call 3 (nvidia-h200, < 8 min): where the C++ fast path's host time goes (diag_cpp_host.py), then the
# 768-wide and wide-row norm sweeps (what session 4 prepared as gpu_session6.sh, run here).
#   run: OUT=$OUT bash benchmarks/gpu_session7_c.sh
set -u
source benchmarks/_gpu_env.sh
FUSED_LAYERS_CPP=1 timeout 120 python3 benchmarks/diag_cpp_host.py --out $OUT > $OUT/diag_cpp_host.log 2>&1
el "diag cpp host exit $?"; grep -E "^\||plan ids|grad_fn" $OUT/diag_cpp_host.log | head -24
timeout 170 python3 benchmarks/bench_norm.py --out $OUT/norm --ops ln,rms --dtypes bf16 --sweep --sweep-widths 768 \
  --sweep-dtypes bf16 --widths 768 --sweep-budget 110 --budget 160 > $OUT/norm768.log 2>&1
el "norm 768 exit $?"; grep -E '"n": 768' $OUT/norm768.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    if 'part' in r: print(r['part'], r.get('cfg'), round(r.get('frac', 0), 3), r.get('error', '')[:60])
    else: print(r['op'], r['provider'], 'fwd', round(r['fwd_frac'], 3), 'bwd', round(r['bwd_frac'], 3))"
timeout 100 python3 benchmarks/bench_norm.py --out $OUT/norm_wide --ops ln --dtypes bf16 --sweep --sweep-widths 16384,65536 \
  --sweep-dtypes bf16 --widths 16384 --sweep-budget 70 --budget 90 > $OUT/norm_wide.log 2>&1
el "norm wide exit $?"; grep -E '"part": "(fwd|bwd)"' $OUT/norm_wide.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['n'], r['part'], r.get('cfg'), round(r.get('frac', 0), 3), r.get('error', '')[:60])"
