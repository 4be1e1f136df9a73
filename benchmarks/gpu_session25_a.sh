#!/usr/bin/env bash
# Session 18, call 1 (< 9 min, one H200; split it if the first start comes late).  Written at the end of session 17 (no device time left).  Issue 9: the Gluon
# row backward of the norms (fused_layers/ops/layer_norm_gluon.py; opt-in bwd_gluon): one 16-warp CTA an SM, a whole
# row of x and dy in shared memory by TMA (2-row ring), read twice from there, no exchange between programs.  sm_90
# scan: bf16 16K LayerNorm 128 registers with 9 spill stores, RMSNorm 103 with none.
#  1. its GPU tests (right answers against float64 for 1 / 131 / 600 rows, 4K-16K, bf16 / fp16 / fp32, fp32 weights,
#     two normalized dims; fallback; determinism);
#  2. the backward sweep with bwd_gluon=1 beside the default (graph replay), LayerNorm and RMSNorm, bf16 4K / 8K / 16K.
#   run: OUT=$OUT bash benchmarks/gpu_session25_a.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 120 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 6 -p no:cacheprovider -k "gluon" > $OUT/gluon_tests.log 2>&1
el "gluon norm tests exit $?"; tail -1 $OUT/gluon_tests.log; grep -E "^FAILED|^E  " $OUT/gluon_tests.log | head -8; pack
summ() { python3 -c "
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith('{') or '\"cfg\"' not in line or '\"part\"' not in line: continue
    r = json.loads(line); c = r['cfg']
    print(r['dtype'], r['n'], ' '.join(f'{k}={v}' for k, v in sorted(c.items())) or 'default', round(r.get('frac', 0), 3), r.get('error', '')[:100])
" $1; }
for op in ln rms; do
  timeout 90 python3 benchmarks/bench_norm.py --out /tmp/g_$op --ops $op --dtypes bf16 --widths 16384 --sweep --sweep-op $op \
    --sweep-parts bwd --sweep-widths 4096,8192,16384 --sweep-dtypes bf16 --sweep-with bwd_gluon --sweep-budget 85 --budget 88 \
    --no-peers > $OUT/gluon_sweep_$op.log 2>&1
  el "$op gluon sweep exit $?"; summ $OUT/gluon_sweep_$op.log | tee $OUT/gluon_sweep_$op.txt; pack
done
# 3. Issue 10: the TMA softmax forward holding rows in one 16-warp (or 8-warp) CTA an SM: 4 warps a scheduler where session
#    16's ncu found 2 (0.53 issued a cycle), the ring two rows deep at 32K (16 chunks, 144 KB), 1.8 rows at 50,304.
timeout 70 python3 benchmarks/bench_softmax_gluon.py --out $OUT/fwd16 --dtypes bf16 --widths 32768,50304 --peers fused \
  --configs "16,256,8,1,4,3,1,1,1;16,256,16,2,16,1,1,1,1;16,256,16,2,8,1,1,1,1;16,256,24,2,16,1,1,1,1" > $OUT/fwd16.log 2>&1
el "tma fwd exit $?"; cut -c1-700 $OUT/fwd16.log; pack
#    The cross-entropy with the same HOLD (new in session 17: the row kept in the ring between the passes where it fits;
#    sm_90: streamed form's SASS unchanged), after its GPU tests (HOLD configs added to test_gpu_cross_entropy).
timeout 60 python3 -m pytest tests/test_softmax_gluon.py -q -m gpu -n 6 -p no:cacheprovider -k "cross_entropy" > $OUT/ce_tests.log 2>&1
el "ce tests exit $?"; tail -1 $OUT/ce_tests.log; grep -E "^FAILED|^E  " $OUT/ce_tests.log | head -6
timeout 70 python3 benchmarks/bench_softmax_gluon.py --out $OUT/ce16 --ce --dtypes bf16 --widths 32000,50304 --peers fused \
  --configs "16,256,8,2,4,2,0,1,1;16,256,16,2,16,1,1,1,1;16,256,24,2,16,1,1,1,1;16,256,16,2,8,1,1,1,1" > $OUT/ce16.log 2>&1
el "tma ce exit $?"; cut -c1-700 $OUT/ce16.log; pack
rm -rf $OUT
