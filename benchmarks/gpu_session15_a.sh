#!/usr/bin/env bash
# Next session's first call for issue 9's wide LayerNorm backward (written in session 10, 2026-12-02; not yet run):
# the one-read persistent backward (layer_norm_config.BWD_PERSIST, opt-in bwd_persist) -- GPU tests first, then the
# bf16 sweep of its candidates beside the two-pass default at 16K / 32K / 64K, by do_bench (TIMING=eager) and by
# CUDA-graph replay (a cooperative launch inside a captured graph is part of what this checks).  Adopt per width as
# BWD_PERSIST entries where it wins (the two-pass kernel: 0.46-0.48 of copy at 16K; the target is 0.85).
#   run: OUT=$OUT bash benchmarks/gpu_session15_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
timeout 120 python3 -m pytest tests/test_layer_norm.py -q -m gpu -k "persist or wide" -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -2 $OUT/tests.log
grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { el "tests failed: stop"; grep -E "^FAILED|Error" $OUT/tests.log | head; exit 0; }
for op in ln rms; do
  TIMING=eager timeout 150 python3 benchmarks/bench_norm.py --out $OUT/$op --ops $op --dtypes bf16 --widths 16384 --sweep \
    --sweep-op $op --sweep-parts bwd --sweep-widths 16384,32768,65536 --sweep-dtypes bf16 --sweep-with bwd_persist --no-peers \
    > $OUT/$op.log 2>&1
  el "$op sweep exit $?"; grep -E '"part": "bwd"' $OUT/$op.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); print(r['n'], r['cfg'], round(r.get('frac', 0), 3), r.get('error', '')[:80])"
done
