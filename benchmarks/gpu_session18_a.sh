#!/usr/bin/env bash
# Session 12 (2026-12-03), first call: issue 9 / 12 with the cuDNN-probe graph-break fix on the GPU.
#  1. the C++ extension built; the compile GPU tests (reduce-overhead at head dim 64 with the probe's cache empty);
#  2. GPT-2 small s1024 B16: fused_compile FIRST in its process (run16_f: 0.67x compile_sdpa with the break),
#     then compile_sdpa, fused, unfused_sdpa, with Dynamo's graph-break / recompile log;
#  3. s4096 B4: fused_compile, compile_sdpa (the 0.93x);
#  4. issue 12: train.py's compiled s1024 sweep (the A/B inside the callback) if time is left.
#   run: OUT=$OUT bash benchmarks/gpu_session18_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT   # packed into one tarball at the end (the device returns at most 8 files)
timeout 70 python3 -c "from fused_layers.ops import _cpp; print('extension', _cpp.extension(wait=True) is not None)" > $OUT/build.log 2>&1
el "build exit $?"; tail -1 $OUT/build.log
timeout 120 python3 -m pytest tests/test_compile_gpu.py tests/test_attention.py -q -m gpu -k "compile or cudnn" -p no:cacheprovider > $OUT/compile_tests.log 2>&1
el "compile GPU tests exit $?"; tail -2 $OUT/compile_tests.log; grep -E "^FAILED" $OUT/compile_tests.log | head
TORCH_LOGS="graph_breaks,recompiles" timeout 170 python3 benchmarks/bench_e2e.py --out /tmp/e2e --variants fused_compile,compile_sdpa,fused,unfused_sdpa --rounds 3 --steps 8 --profile-steps 1 --tag _s1024 > $OUT/e2e_s1024.log 2>&1
el "e2e s1024 exit $?"; cp /tmp/e2e/e2e_h200_s1024.md /tmp/e2e/e2e_h200_s1024.json $OUT/ 2>/dev/null; grep -E "^\| (fused|compile|unfused)" /tmp/e2e/e2e_h200_s1024.md
echo "graph breaks s1024: $(grep -c 'Graph break' $OUT/e2e_s1024.log), recompiles: $(grep -ci 'recompil' $OUT/e2e_s1024.log)"
TORCH_LOGS="graph_breaks" timeout 120 python3 benchmarks/bench_e2e.py --out /tmp/e2e --seq-len 4096 --batch-size 4 --variants fused_compile,compile_sdpa --rounds 3 --steps 8 --profile-steps 1 --tag _s4096_compile > $OUT/e2e_s4096_compile.log 2>&1
el "e2e s4096 compile exit $?"; cp /tmp/e2e/e2e_h200_s4096_compile.md $OUT/ 2>/dev/null; grep -E "^\| (fused|compile)" /tmp/e2e/e2e_h200_s4096_compile.md
echo "graph breaks s4096: $(grep -c 'Graph break' $OUT/e2e_s4096_compile.log)"
left=$(( 570 - ($(date +%s) - T0) ))
el "left for train_ab: $left s"
if [ $left -gt 200 ]; then
  mkdir -p $OUT/ab; S1024_COMPILE_LIMIT=$(( left - 40 )) OUT=$OUT/ab SWEEPS=s1024_compile bash benchmarks/gpu_train_ab.sh > /dev/null 2>&1
  el "train_ab s1024_compile done"; grep -E "fused|twin|best" $OUT/ab/train_ab.md 2>/dev/null | tail -12
fi
tar czf $FINAL/results.tgz -C $FINAL r && rm -rf $FINAL/r
