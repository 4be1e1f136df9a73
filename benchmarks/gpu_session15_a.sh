#!/usr/bin/env bash
# Next session's first call: issue 9's wide LayerNorm backward, then issue 10's softmax LAG candidate (written in session 10, 2026-12-02; not yet run):
# the one-read persistent backward (layer_norm_config.BWD_PERSIST, opt-in bwd_persist) -- GPU tests first, then the
# bf16 sweep of its candidates beside the two-pass default at 16K / 64K, by do_bench (TIMING=eager) and by
# CUDA-graph replay (a cooperative launch inside a captured graph is part of what this checks).  Adopt per width as
# BWD_PERSIST entries where it wins (the two-pass kernel: 0.46-0.48 of copy at 16K; the target is 0.85).
#   run: OUT=$OUT bash benchmarks/gpu_session15_a.sh   (carry .whl; 8 files come back: the logs and the two sweep JSONs)
set -u
source benchmarks/_gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
timeout 120 python3 -m pytest tests/test_layer_norm.py -q -m gpu -k "persist or wide or widths" -p no:cacheprovider > $OUT/tests.log 2>&1
el "GPU tests exit $?"; tail -2 $OUT/tests.log
LN_OK=1; grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log || { LN_OK=0; el "norm tests failed: no norm sweep"; grep -E "^FAILED|Error" $OUT/tests.log | head; }
for op in ln rms; do
  [ $LN_OK = 1 ] || break
  TIMING=eager timeout 120 python3 benchmarks/bench_norm.py --out /tmp/$op --ops $op --dtypes bf16 --widths 16384 --sweep \
    --sweep-op $op --sweep-parts bwd --sweep-widths 16384,65536 --budget 110 --sweep-budget 90 --sweep-dtypes bf16 --sweep-with bwd_persist --no-peers \
    > $OUT/$op.log 2>&1
  el "$op sweep exit $?"; cp /tmp/$op/sweep.json $OUT/${op}_sweep.json 2>/dev/null; grep -E '"part": "bwd"' $OUT/$op.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); print(r['n'], r['cfg'], round(r.get('frac', 0), 3), r.get('error', '')[:80])"
done
# Issue 10: the softmax SMEM form's LAG candidate (row k - 1 written after row k is published, re-read from L2;
# sm_90: bf16 4K x 4 warps x 3 stages 64 / 48 registers fwd / bwd, 32 / 64 KB shared memory) beside the default.
timeout 60 python3 -m pytest tests/test_softmax.py -q -m gpu -k "wide_persistent and smem_lag" -p no:cacheprovider > $OUT/sm_tests.log 2>&1
el "softmax lag GPU tests exit $?"; tail -1 $OUT/sm_tests.log
grep -q " passed" $OUT/sm_tests.log && ! grep -q "failed" $OUT/sm_tests.log || { el "lag tests failed: no sweep"; grep -E "^FAILED|Error" $OUT/sm_tests.log | head; exit 0; }
timeout 120 python3 benchmarks/bench_cross_entropy.py --out /tmp/smlag --softmax-only --sweep-only \
  =persist_smem_4k_w4_st3,=persist_smem_4k_w4_st2_lag,=persist_smem_4k_w4_st3_lag,=persist_smem_4k_w4_st4_lag,=persist_smem_2k_w4_st3_lag \
  > $OUT/smlag.log 2>&1
el "softmax lag sweep exit $?"; grep SOFTMAX $OUT/smlag.log
