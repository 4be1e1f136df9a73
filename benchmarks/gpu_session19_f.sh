#!/usr/bin/env bash
# Session 13, last call, < 6 min: (1) issue 13: the Gluon forward's tile shapes (call e: one warpgroup of 64 query
# rows a CTA, several CTAs an SM, won at D64: 1.04-1.08x of the Triton forward; D128 still ran one CTA of 8 warps an
# SM), checks first; (2) issue 10: the softmax GPU tests at the new defaults (the bf16 backward above 64K now HOLD);
# (3) issue 9: do_bench of the LayerNorm backward with the C++ fast path loaded first.
#   run: OUT=$OUT bash benchmarks/gpu_session19_f.sh   (carry .whl)
set -u
FINAL=$OUT; mkdir -p $FINAL/r; OUT=$FINAL/r
source benchmarks/_gpu_env.sh
GLUON_CHECKS_FROM=2 timeout 170 python3 benchmarks/bench_attention_gluon.py --out $OUT --budget 120 \
  --configs "${GLUON_CONFIGS:-64:64,128,4,3;64:64,64,4,4;128:64,64,4,3;128:64,64,4,2;128:64,128,4,2}" > $OUT/gluon.log 2>&1
el "gluon exit $?"; grep -E "checks done|^\| " $OUT/gluon.log | head -30
timeout 90 python3 -m pytest tests/test_softmax.py -q -m gpu -n 8 -p no:cacheprovider -k "widths or wide or persist or hold" > $OUT/softmax_gpu_tests.log 2>&1
el "softmax GPU tests exit $?"; tail -1 $OUT/softmax_gpu_tests.log; grep -E "^FAILED" $OUT/softmax_gpu_tests.log | head
TIMING=eager timeout 70 python3 benchmarks/bench_norm.py --out /tmp/nd --ops ln,rms --dtypes bf16 --widths 768,4096,8192 --no-peers --budget 60 > $OUT/norm_dobench.log 2>&1
el "norm do_bench exit $?"; cp /tmp/nd/bench_norm.md $OUT/norm_dobench.md 2>/dev/null; grep -E "^\| |^## " /tmp/nd/bench_norm.md | head -40
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
