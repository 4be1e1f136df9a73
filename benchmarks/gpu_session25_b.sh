#!/usr/bin/env bash
# Session 18, call 2 (< 9 min, one H200).  Issue 9: the Gluon row backward's variants (session 18: a 3-row ring; dB
# accumulated in shared memory with LayerNorm's two row sums in one reduction, no spills; sm_90 scan
# issue9/norm_gluon_static_scan_sm90_triton36.txt) after call 1 found LayerNorm 16K 0.670 against the default's 0.651
# and RMSNorm 16K 0.862 against 0.786 (RMSNorm 16K now the Gluon by default: BWD_GLUON).
#  1. the norm GPU tests of the Gluon path and of the defaults (RMSNorm 16K now Gluon);
#  2. the variants' sweep beside the default, bf16 8K / 16K, graph replay, then do_bench (TIMING=eager);
#  3. tests/test_attention.py -m gpu (not run since the persistent ping-pong forward became a default, session 17).
#   run: OUT=$OUT bash benchmarks/gpu_session25_b.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 150 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 6 -p no:cacheprovider -k "gluon or persistent_backward_defaults" > $OUT/norm_tests.log 2>&1
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
for t in graph eager; do
  for op in ln rms; do
    w=8192,16384; [ $op = rms ] && w=16384
    TIMING=$t timeout 75 python3 benchmarks/bench_norm.py --out /tmp/g_${op}_$t --ops $op --dtypes bf16 --widths 16384 --sweep --sweep-op $op \
      --sweep-parts bwd --sweep-widths $w --sweep-dtypes bf16 --sweep-with bwd_gluon --sweep-budget 60 --budget 72 \
      --no-peers > $OUT/sweep_${op}_$t.log 2>&1
    el "$op $t sweep exit $?"; summ $OUT/sweep_${op}_$t.log | tee $OUT/sweep_${op}_$t.txt; pack
  done
done
timeout 200 python3 -m pytest tests/test_attention.py -q -m gpu -n 6 -p no:cacheprovider > $OUT/attention_gpu_tests.log 2>&1
el "attention tests exit $?"; tail -1 $OUT/attention_gpu_tests.log; grep -E "^FAILED|^E  " $OUT/attention_gpu_tests.log | head -8; pack
rm -rf $OUT
