#!/usr/bin/env bash
# Session 17, call 2 (< 8 min, one H200).  Issue 13: the ping-pong forward on a persistent grid (one program an SM;
# the producer runs ahead across tiles, each tile's Q is fetched under the previous tile's epilogue, O leaves through
# a buffer of its own without a wait).  Call 1's counters: cuDNN's forward and backward run 132 CTAs (one an SM,
# persistent); ours one CTA a 128-row tile, 15.5 waves, SM busy 34 % against 44 % at D64 S1K causal.
#  1. GPU tests of the persistent ping-pong (bit-identical to one program a tile; many tiles a program; GQA).
#  2. bench_attention_gluon.py --ws with the persistent configs beside the defaults, cuDNN and flash.
#   run: OUT=$OUT bash benchmarks/gpu_session24_b.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 150 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider \
  -k "persistent or ping_pong" > $OUT/ws_tests.log 2>&1
el "ws tests exit $?"; tail -1 $OUT/ws_tests.log; grep -E "^FAILED|^E  " $OUT/ws_tests.log | head -8; pack
timeout 300 python3 benchmarks/bench_attention_gluon.py --out $OUT/ws --ws --budget 200 --seqlens 1024,4096,16384 \
  --ws-configs "64:128,2,232,40,1;128:128,2,232,40,1" > $OUT/ws.log 2>&1
el "ws bench exit $?"; grep -v '"kind": "check"' $OUT/ws.log | tail -22 | cut -c1-400; grep '"ok": false' $OUT/ws.log | cut -c1-300 | head -5; pack
rm -rf $OUT
