#!/usr/bin/env bash
# Session 11, sixth call: run16_e's fused_compile step was host-bound (45.5 ms step, 34.2 ms GPU; 0.74x compile_sdpa;
# session 10: 34.2 / 30.9, 0.994x).  fused_compile first and alone in its process, with Dynamo's recompile and
# graph-break logs, then compile_sdpa after it.
#   run: OUT=$OUT bash benchmarks/gpu_session16_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 -c "from fused_layers.ops import _cpp; print('extension', _cpp.extension(wait=True) is not None)" > $OUT/build.log 2>&1
TORCH_LOGS="recompiles,graph_breaks" timeout 200 python3 benchmarks/bench_e2e.py --out /tmp/e2e --variants fused_compile,compile_sdpa --rounds 3 --steps 8 --profile-steps 1 --tag _compile > $OUT/e2e_compile.log 2>&1
el "e2e compile exit $?"; cp /tmp/e2e/e2e_h200_compile.md $OUT/ 2>/dev/null; grep -E "^\| (fused|compile)" /tmp/e2e/e2e_h200_compile.md
grep -ciE "recompil" $OUT/e2e_compile.log; grep -iE "graph break|recompil" $OUT/e2e_compile.log | cut -c1-300 | sort | uniq -c | sort -rn | head -20
