#!/usr/bin/env bash
# (Ran at commit 9aad3c2; persist_packed was reverted after this call.)
# Session 22, call 7 (< 5 min, one H200).  Issue 10, the bf16 softmax forward at 32K-256K (0.80 / 0.85, target 0.90):
# the persistent SMEM form with PACKED pieces (softmax persist_packed: the piece held as loaded, max in bf16, each pass
# converting again, as the single-block PACKED forward that reached 0.95 at 16K) and ptxas's register cap
# (persist_maxnreg).  sm_90 (Triton 3.6, /tmp/scan_packed.py): 4K x 4 warps 56 registers (9 programs an SM) -> 40
# with 80 bytes of stack (12); 16K x 16 warps 83 (1 an SM) -> 48 / 40 with 40 / 88 bytes of stack (2 / 3).
#  1. GPU tests of the form (4K and 16K pieces; bf16, fp16, fp32; 32K+1 .. 1M columns);
#  2. do_bench / graph at 32K-256K against the default.
#   run: OUT=$OUT bash benchmarks/gpu_session29_g.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 120 python3 -m pytest tests/test_softmax.py -q -m gpu -n 8 -p no:cacheprovider -k "gpu_wide_persistent and packed" \
  > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -10
P='{"persist_packed": 1}'
P4C='{"persist_packed": 1, "persist_maxnreg": 40}'
P16='{"persist_packed": 1, "persist_block": 16384, "persist_warps": 16, "persist_stages": 2, "persist_maxnreg": 40}'
P16B='{"persist_packed": 1, "persist_block": 16384, "persist_warps": 16, "persist_stages": 2, "persist_maxnreg": 48}'
P8='{"persist_packed": 1, "persist_block": 8192, "persist_warps": 8, "persist_stages": 2, "persist_maxnreg": 40}'
C='['"$P, $P4C, $P16, $P16B, $P8"']'
SWEEP='{"32768": '"$C"', "65536": '"$C"', "131072": '"$C"', "262144": ['"$P, $P4C, $P16"']}' \
  timeout 200 python3 benchmarks/sweep_softmax_packed.py > $OUT/sweep.txt 2>&1
el "sweep exit $?"; grep -v Warn $OUT/sweep.txt | sed -E 's/ {20,}/ /'
