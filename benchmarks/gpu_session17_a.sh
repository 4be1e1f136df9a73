#!/usr/bin/env bash
# Next session's first call (written in session 11, 2026-12-02; not yet run).  Issue 9 / 12: the graph break of the
# cuDNN probe is fixed (torch.compiler.assume_constant_result, commit "Fix: the cuDNN probe ..."): the compile GPU
# tests (the reduce-overhead test now also at head dim 64 with the probe's cache empty), then GPT-2 small with
# fused_compile FIRST in its process (run16_f: 50.8 ms step on 34.6 ms GPU, 0.67x compile_sdpa, 6 graph breaks at
# ops/attention.py), with the graph-break log.  (The softmax candidates moved to gpu_session17_b.sh.)
#   run: OUT=$OUT bash benchmarks/gpu_session17_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 -c "from fused_layers.ops import _cpp; print('extension', _cpp.extension(wait=True) is not None)" > $OUT/build.log 2>&1
timeout 150 python3 -m pytest tests/test_compile_gpu.py tests/test_attention.py -q -m gpu -k "compile or cudnn" -p no:cacheprovider > $OUT/compile_tests.log 2>&1
el "compile GPU tests exit $?"; tail -2 $OUT/compile_tests.log; grep -E "^FAILED" $OUT/compile_tests.log | head
TORCH_LOGS="graph_breaks" timeout 200 python3 benchmarks/bench_e2e.py --out /tmp/e2e --variants fused_compile,compile_sdpa,fused,unfused_sdpa --rounds 3 --steps 8 --profile-steps 1 --tag _compile > $OUT/e2e_compile.log 2>&1
el "e2e exit $?"; cp /tmp/e2e/e2e_h200_compile.md $OUT/ 2>/dev/null; grep -E "^\| (fused|compile|unfused)" /tmp/e2e/e2e_h200_compile.md
echo "graph breaks: $(grep -c 'Graph break' $OUT/e2e_compile.log)"
