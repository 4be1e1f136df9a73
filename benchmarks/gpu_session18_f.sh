#!/usr/bin/env bash
# Session 12 (2026-12-03), last call: the HOLD candidate of the persistent norm backward (publish row k, wait for row
# k - 1, write it from registers: the wait off the critical path; the no-exchange diagnostic ran 0.87-0.88 where the
# default runs 0.64-0.65): GPU tests (HOLD, the persistent defaults with the new reduce / PACK defaults), then the
# sweep at bf16 16K / 32K / 64K beside the default and the diagnostic (graph replay), LN and RMS (OPS="ln rms").
#   run: OUT=$OUT bash benchmarks/gpu_session18_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider -k "persistent" > $OUT/hold_gpu_tests.log 2>&1
el "GPU tests exit $?"; tail -1 $OUT/hold_gpu_tests.log; grep -E "^FAILED" $OUT/hold_gpu_tests.log | head
summ() { python3 -c "
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith('{') or '\"cfg\"' not in line or '\"part\"' not in line: continue
    r = json.loads(line); c = r['cfg']
    print(r['dtype'], r['n'], ' '.join(f'{k[12:]}={v}' for k, v in sorted(c.items()) if k.startswith('bwd_persist')) or 'default', round(r.get('frac', 0), 3), r.get('error', '')[:100])
" $1; }
for op in ${OPS:-ln rms}; do
  timeout 85 python3 benchmarks/bench_norm.py --out /tmp/h_$op --ops $op --dtypes bf16 --widths 16384 --sweep --sweep-op $op --sweep-parts bwd \
    --sweep-widths 16384,32768,65536 --sweep-dtypes bf16 --sweep-with bwd_persist_hold,bwd_persist_diag_nosync --sweep-budget 80 --budget 82 --no-peers > $OUT/hold_sweep_$op.log 2>&1
  el "$op hold sweep exit $?"; summ $OUT/hold_sweep_$op.log | tee $OUT/hold_sweep_$op.txt
done
