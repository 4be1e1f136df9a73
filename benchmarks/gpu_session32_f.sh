#!/usr/bin/env bash
# Session 25, call 6 (< 7 min, one H200).  After the cleanup (the FMA / KFMA / EVEN / FIXUP candidates removed; the
# defaults' SASS checked unchanged offline) and the new width buckets (softmax bf16 forward 32K and CE 16-bit <= 64K
# columns: 2K pieces, 2-warp programs): the softmax / CE / library GPU tests, then the new defaults against the previous
# shape (4K x 4 warps) at aligned and VEC8 widths.
#   run: OUT=$OUT bash benchmarks/gpu_session32_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 240 python3 -m pytest tests/test_softmax.py tests/test_cross_entropy.py tests/test_library.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -1 $OUT/tests.log; grep -E "^FAILED" $OUT/tests.log | head -20
FORMS='{"previous 4K x 4 warps": {"persist_block": 4096, "persist_warps": 4, "persist_per_sm": 16}}' \
  timeout 90 python3 benchmarks/sweep_ce_hold.py 50304 50257 64000 > $OUT/ce.txt 2>&1
el "CE exit $?"; grep "C=" $OUT/ce.txt
F='[{"persist_block": 4096, "persist_warps": 4, "persist_per_sm": 16}]'
SWEEP="{\"32768\": $F, \"32001\": $F, \"24576\": $F}" DTYPES=bfloat16,float16 timeout 120 python3 benchmarks/sweep_softmax_packed.py > $OUT/sm_fwd.txt 2>&1
el "softmax fwd exit $?"; grep -v Warn $OUT/sm_fwd.txt | sed -E 's/ {20,}/ /'
