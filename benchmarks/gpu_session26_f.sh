#!/usr/bin/env bash
# Session 19, call 6 (< 5 min, one H200).  Issue 9: the LayerNorm / RMSNorm table at 768-16K at this session's
# defaults (16K through the C++ fast path now), by do_bench (TIMING=eager; bench_norm now runs one fwd+bwd before
# timing, so no width is timed on the Python path of its first calls) and by graph replay.  fwd+bwd minus fwd (issue
# 9's do_bench measure) comes from the eager table's fwdbwd_ms - fwd_ms.
#   run: OUT=$OUT bash benchmarks/gpu_session26_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
for t in eager graph; do
  TIMING=$t timeout 120 python3 benchmarks/bench_norm.py --out $OUT/table_$t --ops ln,rms --dtypes bf16 \
    --widths 768,1024,2048,4096,8192,16384 --no-peers > $OUT/table_$t.log 2>&1
  el "table $t exit $?"
  python3 - $OUT/table_$t.log <<'PY' | tee $OUT/table_$t.txt
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith('{') or '"bwd_frac"' not in line: continue
    r = json.loads(line)
    fb = r['fwdbwd_ms'] - r['fwd_ms']
    x = r['rows'] * r['n'] * 2
    print(r['op'], r['n'], 'fwd', round(r['fwd_frac'], 3), 'bwd', round(r['bwd_frac'], 3),
          'fwd+bwd-fwd', round(3 * x / (fb * 1e-3) / 4220e9, 3))
PY
done
