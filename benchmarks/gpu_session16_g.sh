#!/usr/bin/env bash
# Session 11, seventh call: after the fix of the graph break in the cuDNN probe (assume_constant_result), fused_compile
# first in its process again (run16_f: 50.8 ms step on 34.6 ms GPU, 0.67x compile_sdpa), with the graph-break log.
#   run: OUT=$OUT bash benchmarks/gpu_session16_g.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
TORCH_LOGS="graph_breaks" timeout 200 python3 benchmarks/bench_e2e.py --out /tmp/e2e --variants fused_compile,compile_sdpa --rounds 3 --steps 8 --profile-steps 1 --tag _compile > $OUT/e2e_compile.log 2>&1
el "e2e compile exit $?"; cp /tmp/e2e/e2e_h200_compile.md $OUT/ 2>/dev/null; grep -E "^\| (fused|compile)" /tmp/e2e/e2e_h200_compile.md
grep -c "Graph break" $OUT/e2e_compile.log; grep -E "Graph break .*in user code at" $OUT/e2e_compile.log | sed 's/.*\] //' | sort | uniq -c | head
