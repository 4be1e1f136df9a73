#!/usr/bin/env bash
# Session 20, call 5 (< 4 min, one H200).  Issue 9, LayerNorm / RMSNorm 16K: the dW / dB reduce after the Gluon row
# backward takes 7.1 us of ~119 (run27_a timeline: 132 partial rows x 16K x 2 floats); its shape was swept only on the
# narrower widths and the persistent 16K path.  Sweep of the reduce shapes (bench_norm's reduce_* candidates) at 16K
# for both norms, CUDA-graph replay of the backward.
#   run: OUT=$OUT bash benchmarks/gpu_session27_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
for op in ln rms; do
  timeout 100 python3 benchmarks/bench_norm.py --out $OUT/red_$op --sweep --sweep-op $op --sweep-widths 16384 \
    --sweep-dtypes bf16 --sweep-parts bwd --sweep-with reduce_block_n --sweep-budget 90 --budget 95 --ops $op \
    --dtypes bf16 --widths 16384 --no-peers > $OUT/red_$op.log 2>&1
  el "$op exit $?"
  python3 - $OUT/red_$op.log <<'PY' | tee $OUT/red_$op.txt
import json, sys
for l in open(sys.argv[1]):
    if l.startswith('{') and '"part"' in l and '"frac"' in l:
        r = json.loads(l); print(round(r['frac'], 3), r['cfg'])
PY
done
