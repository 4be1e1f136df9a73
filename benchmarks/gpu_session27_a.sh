#!/usr/bin/env bash
# Session 20, call 1 (< 8 min, one H200).  Issue 9.
#  1. GPU tests of the Gluon / C++ norm paths: session 19's last refactor (layer_norm._gluon_take,
#     layer_norm_gluon.descriptor_layouts) never ran on a GPU;
#  2. the 768-16K table at the defaults by do_bench (TIMING=eager) and graph replay (LayerNorm 16K with fold_mean
#     has no do_bench figure yet);
#  3. the do_bench loop's GPU timeline (diag_norm_timeline.py): where fwd+bwd minus fwd loses to graph replay;
#  4. RMSNorm 1K backward sweep (graph replay 0.819 in run26_f, against 0.89 at 768 and 2K).
#   run: OUT=$OUT bash benchmarks/gpu_session27_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 130 python3 -m pytest tests/test_cpp_fastpath.py tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "gluon or cpp_node or cuda_graph or extension_builds or persistent_backward_defaults" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
OUT=$OUT timeout 200 bash benchmarks/gpu_session26_f.sh
timeout 90 python3 benchmarks/diag_norm_timeline.py > $OUT/diag_norm_timeline.txt 2>&1
el "timeline exit $?"; grep -E "^##|span|failed" $OUT/diag_norm_timeline.txt
timeout 100 python3 benchmarks/bench_norm.py --out $OUT/sweep_rms1k --sweep --sweep-op rms --sweep-widths 1024 \
  --sweep-dtypes bf16 --sweep-parts bwd --sweep-budget 80 --budget 85 --ops rms --dtypes bf16 --widths 1024 --no-peers \
  > $OUT/sweep_rms1k.log 2>&1
el "sweep exit $?"
python3 - $OUT/sweep_rms1k.log <<'PY' | tee $OUT/sweep_rms1k.txt
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{') and '"part"' in l and '"frac"' in l]
for r in sorted(rs, key=lambda r: -r['frac'])[:12]:
    print(round(r['frac'], 3), r['cfg'])
PY
