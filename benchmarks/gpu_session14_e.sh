#!/usr/bin/env bash
# Session 10, call 6: is the eager fused GPT-2 step's host time (call 5: 43.2 ms step, 37.7 ms GPU, against 40.3 /
# 37.7 in session 7) the persistent CE?  The same bench with the CE forced back to the stream (wide_mode=1), then
# with the defaults, in two processes, C++ fast path built.
#   run: OUT=$OUT bash benchmarks/gpu_session14_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 60 python3 -c "from fused_layers.ops import _cpp; print('extension', _cpp.extension(wait=True) is not None)"
for arm in stream default; do
  timeout 110 python3 -c "
import runpy, sys; sys.path.insert(0, 'benchmarks')
from fused_layers.ops._common import config_override
if '$arm' == 'stream':
    ctx = config_override('cross_entropy', wide_mode=1); ctx.__enter__()  # kept alive for the run
sys.argv = ['bench_e2e.py', '--out', '$OUT/$arm', '--variants', 'unfused_sdpa,fused', '--rounds', '5', '--steps', '8', '--profile-steps', '2']
runpy.run_path('benchmarks/bench_e2e.py', run_name='__main__')
" > $OUT/$arm.log 2>&1
  el "$arm exit $?"; grep -E "^\| (fused|unfused)" $OUT/$arm/e2e_h200.md | head -3
done
