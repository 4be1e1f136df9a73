#!/usr/bin/env bash
# Session 13 (2026-12-03), second call, < 7 min on one H200: issue 9 with the session-13 defaults (BWD_PERSIST_HOLD:
# RMSNorm 16K-64K and LayerNorm 64K; LayerNorm's pair sum at 8K).
#  0. the C++ fast path built first (call 1's do_bench ran while it built in the background: its numbers are void);
#  1. every norm GPU test (the persistent defaults are now HOLD where the table says);
#  2. the norm table (LayerNorm / RMSNorm bf16 768-64K beside eager, compile, Liger; CUDA-graph replay);
#  3. do_bench of the LayerNorm backward at 768 / 4K / 8K (issue 9's second measure);
#  4. HOLD at 128K (not swept in call 1), LayerNorm and RMSNorm.
#   run: OUT=$OUT bash benchmarks/gpu_session19_b.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
timeout 150 python3 -c "from fused_layers.ops import _cpp; print('C++ fast path:', _cpp.extension(wait=True) is not None)" > $OUT/cpp_build.log 2>&1
el "C++ build exit $?"; tail -1 $OUT/cpp_build.log
timeout 110 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider > $OUT/norm_gpu_tests.log 2>&1
el "norm GPU tests exit $?"; tail -1 $OUT/norm_gpu_tests.log; grep -E "^FAILED" $OUT/norm_gpu_tests.log | head
timeout 150 python3 benchmarks/bench_norm.py --out /tmp/nt --ops ln,rms --dtypes bf16 --widths 768,1024,2048,4096,8192,16384,65536 --budget 145 > $OUT/norm_table.log 2>&1
el "norm table exit $?"; cp /tmp/nt/bench_norm.md /tmp/nt/bench_norm.json $OUT/ 2>/dev/null; grep -E "^\| |^## " /tmp/nt/bench_norm.md | head -60
TIMING=eager timeout 60 python3 benchmarks/bench_norm.py --out /tmp/nd --ops ln --dtypes bf16 --widths 768,4096,8192 --no-peers --budget 55 > $OUT/norm_dobench.log 2>&1
el "norm do_bench exit $?"; cp /tmp/nd/bench_norm.md $OUT/norm_dobench.md 2>/dev/null; grep -E "^\| |^## " /tmp/nd/bench_norm.md | head -20
for op in ln rms; do
  timeout 50 python3 benchmarks/bench_norm.py --out /tmp/h_$op --ops $op --dtypes bf16 --widths 131072 --sweep --sweep-op $op --sweep-parts bwd \
    --sweep-widths 131072 --sweep-dtypes bf16 --sweep-with bwd_persist_hold --sweep-budget 45 --budget 47 --no-peers > $OUT/hold128k_$op.log 2>&1
  el "$op 128K hold sweep exit $?"; grep -E '"part": "bwd"' $OUT/hold128k_$op.log | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l); print(r['n'], r['cfg'], round(r.get('frac', 0), 3), r.get('error', '')[:80])"
done
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
