#!/usr/bin/env bash
# Next session, call 1 (< 5 min, one H200).  Issue 9, LayerNorm 16K (0.79 / 0.81, the one cell left): programmatic
# dependent launch of the Gluon row backward and its reduce (GluonVariant.pdl, config bwd_gluon_pdl; written in
# session 20 after the device time ran out, sm_90 compile checked: +8 instructions, registers unchanged).
#  1. its GPU tests (the Gluon variants incl. pdl1 / pdl2 against float64, CUDA graph + side stream);
#  2. both measures at 16K, default / pdl 1 / pdl 2 / default (sweep_norm_tiles.py --pdl);
#  if pdl 2 wins by both: set pdl=2 in layer_norm_config.BWD_GLUON's entries and run the Gluon / C++ GPU tests again.
#   run: OUT=$OUT bash benchmarks/gpu_session28_a.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q -m gpu -n 8 -p no:cacheprovider \
  -k "gluon or cuda_graph or programmatic" > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
TIMING=graph timeout 150 python3 benchmarks/sweep_norm_tiles.py --pdl --widths 16384 > $OUT/sweep_pdl16k.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep_pdl16k.txt
