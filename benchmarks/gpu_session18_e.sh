#!/usr/bin/env bash
# Session 12 (2026-12-03), last call: issue 9's LayerNorm backward with the dW / dB reduce reshaped (column strips
# narrow enough for ~128 programs, pipelined; was 3 programs at 768) and LayerNorm's packed persistent backward as
# the default: GPU tests (norms, C++ fast path), then the bwd sweep of the reduce's shapes beside the default
# (graph replay at 768-16K bf16 and fp32 1K/4K; do_bench at 768/4096/8192), then GPT-2's eager step if time is left.
#   run: OUT=$OUT bash benchmarks/gpu_session18_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
timeout 70 python3 -c "from fused_layers.ops import _cpp; print('extension', _cpp.extension(wait=True) is not None)" > $OUT/build.log 2>&1
el "build exit $?"; tail -1 $OUT/build.log
timeout 110 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider -k "not attention and not softmax" > $OUT/norm_gpu_tests.log 2>&1
el "norm GPU tests exit $?"; tail -1 $OUT/norm_gpu_tests.log; grep -E "^FAILED" $OUT/norm_gpu_tests.log | head
summ() { python3 -c "
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith('{'): continue
    r = json.loads(line); c = r['cfg']
    print(r['dtype'], r['n'], r['part'], ' '.join(f'{k}={v}' for k, v in c.items() if k.startswith('reduce')) or 'default', round(r.get('frac', 0), 3), r.get('error', '')[:80])
" $1; }
timeout 150 python3 benchmarks/bench_norm.py --out /tmp/rs --ops ln --dtypes bf16 --widths 768 --sweep --sweep-op ln --sweep-parts bwd \
  --sweep-widths 768,1024,2048,4096,8192,16384 --sweep-dtypes bf16,fp32 --sweep-with reduce_block_n --sweep-budget 140 --budget 145 --no-peers > $OUT/reduce_sweep_graph.log 2>&1
el "reduce sweep (graph) exit $?"; summ $OUT/reduce_sweep_graph.log | tee $OUT/reduce_sweep_graph.txt
TIMING=eager timeout 70 python3 benchmarks/bench_norm.py --out /tmp/rs2 --ops ln --dtypes bf16 --widths 768 --sweep --sweep-op ln --sweep-parts bwd \
  --sweep-widths 768,4096,8192 --sweep-dtypes bf16 --sweep-with reduce_block_n --sweep-budget 60 --budget 65 --no-peers > $OUT/reduce_sweep_dobench.log 2>&1
el "reduce sweep (do_bench) exit $?"; summ $OUT/reduce_sweep_dobench.log | tee $OUT/reduce_sweep_dobench.txt
timeout 60 python3 benchmarks/bench_norm.py --out /tmp/rs3 --ops rms --dtypes bf16 --widths 768 --sweep --sweep-op rms --sweep-parts bwd \
  --sweep-widths 768,4096 --sweep-dtypes bf16 --sweep-with reduce_block_n --sweep-budget 55 --budget 58 --no-peers > $OUT/reduce_sweep_rms.log 2>&1
el "rms reduce sweep exit $?"; summ $OUT/reduce_sweep_rms.log | tee $OUT/reduce_sweep_rms.txt
left=$(( 440 - ($(date +%s) - T0) ))
el "left for e2e: $left s"
if [ $left -gt 90 ]; then
  timeout $(( left - 5 )) python3 benchmarks/bench_e2e.py --out /tmp/e2e --variants fused,unfused_sdpa --rounds 3 --steps 8 --profile-steps 1 --tag _s1024_eager > $OUT/e2e_eager.log 2>&1
  el "e2e exit $?"; cp /tmp/e2e/e2e_h200_s1024_eager.md $OUT/ 2>/dev/null; grep -E "^\| (fused|unfused)|_norm_" /tmp/e2e/e2e_h200_s1024_eager.md
fi
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
