#!/usr/bin/env bash
# Session 18, call 3 (< 6 min, one H200).  Issue 9, LayerNorm 16K backward (Gluon row backward 0.666-0.687 of copy
# against RMSNorm's 0.847-0.864 in call 2, graph replay): two fewer instructions a value (rstd applied to the row
# sums; dx in two FMAs; sm_90 SASS 1192 -> 1136 at bf16 16K LayerNorm), then why the rest: ncu of the LayerNorm /
# RMSNorm Gluon backward and the persistent default (stall reasons, issue rate, DRAM throughput).
#  1. the Gluon norm GPU tests; 2. the sweep at 16K (graph replay); 3. ncu (benchmarks/ncu_norm_gluon.py).
#   run: OUT=$OUT bash benchmarks/gpu_session25_c.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 120 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 6 -p no:cacheprovider -k "gluon or persistent_backward_defaults" > $OUT/norm_tests.log 2>&1
el "norm tests exit $?"; tail -1 $OUT/norm_tests.log; grep -E "^FAILED|^E  " $OUT/norm_tests.log | head -8; pack
summ() { python3 -c "
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith('{') or '\"cfg\"' not in line: continue
    r = json.loads(line); c = r['cfg']
    if 'part' in r:
        print(r['dtype'], r['n'], ' '.join(f'{k}={v}' for k, v in sorted(c.items())) or 'default', round(r.get('frac', 0), 3), r.get('error', '')[:100])
    elif 'bwd_frac' in r:
        print('TABLE', r['op'], r['dtype'], r['n'], c, 'fwd', round(r['fwd_frac'], 3), 'bwd', round(r['bwd_frac'], 3))
" $1; }
for op in ln rms; do
  timeout 60 python3 benchmarks/bench_norm.py --out /tmp/g_$op --ops $op --dtypes bf16 --widths 16384 --sweep --sweep-op $op \
    --sweep-parts bwd --sweep-widths 16384 --sweep-dtypes bf16 --sweep-with bwd_gluon --sweep-budget 45 --budget 55 \
    --no-peers > $OUT/sweep_$op.log 2>&1
  el "$op sweep exit $?"; summ $OUT/sweep_$op.log | tee $OUT/sweep_$op.txt; pack
done
source benchmarks/_ncu_norm.sh; ncu_norm _norm_bwd 150
pack
rm -rf $OUT
