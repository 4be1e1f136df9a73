#!/usr/bin/env bash
# Session 10, call 5: the GPT-2-small step again with the C++ fast path built first (call 4's bench_e2e ran
# without it: its build had been cut off by a timeout), the new 16-bit wide-row defaults in place.
#   run: OUT=$OUT bash benchmarks/gpu_session14_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -c "from fused_layers.ops import _cpp; e = _cpp.extension(wait=True); print('extension', e is not None)" > $OUT/build.log 2>&1
el "build exit $?"; tail -2 $OUT/build.log
timeout 200 python3 benchmarks/bench_e2e.py --out $OUT --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 --profile-steps 2 > $OUT/e2e_1024.log 2>&1
el "e2e exit $?"; grep -E "^\| " $OUT/e2e_h200.md | head -6
