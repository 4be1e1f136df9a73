#!/usr/bin/env bash
# Session 17, call 5 (< 6 min, one H200).  Issue 13, the backward: dQ inside the Gluon dK / dV kernel (bwd_gluon_fused_dq:
# dS^T through shared memory, dQ_i = dS_i K by wgmma, added into a zeroed fp32 buffer by atomics; 5 matmul passes as
# cuDNN's instead of 7).  Offline sm_90: D64 194-206 registers, no spills, 16 REDG (v2) a step; D128 21-30 spill stores.
#  1. its GPU tests (and GQA / sequence-major);
#  2. the atomics alone (diag_dq_atomics.py) beside our backward and cuDNN's;
#  3. bench_attention_gluon.py --bwd --fused-dq: the backward table with the fused form beside the default and cuDNN.
#   run: OUT=$OUT bash benchmarks/gpu_session24_e.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 120 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider -k "fused_dq" > $OUT/fused_tests.log 2>&1
el "fused dq tests exit $?"; tail -1 $OUT/fused_tests.log; grep -E "^FAILED|^E  " $OUT/fused_tests.log | head -8; pack
GLUON_CHECKS_FROM=4 timeout 220 python3 benchmarks/bench_attention_gluon.py --out $OUT/bwd --bwd --fused-dq --budget 30 \
  --seqlens 1024,4096,16384 > $OUT/bwd.log 2>&1
el "bwd bench exit $?"; grep -A 20 "^Backward" $OUT/bwd.log | grep -E "^\| (D|64|128) " | sed -E 's/ \| [0-9.e-]+ \|/ |/g'; pack
timeout 100 python3 benchmarks/diag_dq_atomics.py --out $OUT/atomics > $OUT/atomics.log 2>&1
el "atomics exit $?"; cut -c1-330 $OUT/atomics.log; pack
rm -rf $OUT
