#!/usr/bin/env bash
# Session 20, call 6 (< 5 min, one H200).  Issue 9: programmatic dependent launch of the single-block backward's
# kernels (bwd_pdl=1: the dW / dB reduce launches as a dependent of the row kernel and waits on the device; 2: the row
# kernel too).  GPU tests (float64, bitwise against plain launches, CUDA graph), then graph replay of the backward,
# default / pdl 1 / pdl 2 / default again, LayerNorm and RMSNorm at 768-8K.
#   run: OUT=$OUT bash benchmarks/gpu_session27_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_layer_norm.py -q -m gpu -n 8 -p no:cacheprovider -k "programmatic" \
  > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
TIMING=graph timeout 150 python3 benchmarks/sweep_norm_tiles.py --pdl --widths 768,1024,2048,4096,8192 \
  > $OUT/sweep_pdl.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep_pdl.txt
