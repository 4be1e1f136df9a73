#!/usr/bin/env bash
# Session 4 of 2026-12-01, call 4 (nvidia-h200, < 9 min; .whl carried for the Liger peer): the adopted
# pipelined defaults on the GPU.
#   1. GPU tests of LayerNorm / RMSNorm and cross-entropy (-m gpu) with the new defaults;
#   2. bench_norm sweep of bwd_stages at the buckets not yet swept (bf16 2048 / 8192, fp32 1024 / 4096),
#      then the table at 768 / 1024 / 4096 bf16 beside eager / compile / Liger;
#   3. the cross-entropy table (bf16 default now 4K/w8, 4 stages) beside Liger / torch / compile.
#   run: OUT=$OUT bash benchmarks/gpu_session5.sh
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -m pytest tests/test_layer_norm.py tests/test_cross_entropy.py -m gpu -q -rf --tb=short -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -8
timeout 200 python3 benchmarks/bench_norm.py --out $OUT/norm --ops ln,rms --dtypes bf16 --sweep --sweep-widths 1024,2048,4096,8192 \
  --sweep-dtypes bf16,fp32 --widths 768,1024,4096 --sweep-budget 130 --budget 190 > $OUT/norm.log 2>&1
el "norm exit $?"; grep -E '"part": "bwd"' $OUT/norm.log | grep -v '"n": 4096' | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['dtype'], r['n'], r.get('cfg'), round(r.get('frac', 0), 3), r.get('error', '')[:80])" | tail -60
grep -E '"provider"' $OUT/norm.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['op'], r['n'], r['provider'], 'fwd', round(r['fwd_frac'], 3), 'bwd', round(r['bwd_frac'], 3), 'fb', round(r['fwdbwd_frac'], 3))"
timeout 120 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep -E "^\|" $OUT/ce.log | head -40
