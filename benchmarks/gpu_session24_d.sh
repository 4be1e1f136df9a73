#!/usr/bin/env bash
# Session 17, call 4 (< 4 min, one H200).  Issue 13: the persistent ping-pong's ring, now that its producer runs ahead
# across tiles (deeper rings can hold the next tile's first blocks): D64 128-key x 3 stages and 64-key x 4 stages, D128
# 64-key x 4 stages (128 x 3 does not fit: 256 KB), beside the defaults, at S 1K / 4K.
#   run: OUT=$OUT bash benchmarks/gpu_session24_d.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
GLUON_CHECKS_FROM=4 timeout 200 python3 benchmarks/bench_attention_gluon.py --out $OUT/ws --ws --budget 150 --seqlens 1024,4096 \
  --ws-configs "64:128,2,232,40,1;64:128,3,232,40,1;64:64,4,232,40,1;128:128,2,232,40,1;128:64,4,232,40,1" > $OUT/ws.log 2>&1
el "ws bench exit $?"; grep '"ok": false' $OUT/ws.log | cut -c1-300 | head -5; grep -E "^\| (D|64|128) " $OUT/ws.log; pack
rm -rf $OUT
