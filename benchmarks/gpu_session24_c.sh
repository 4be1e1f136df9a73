#!/usr/bin/env bash
# Session 17, call 3 (< 7 min, one H200).  Issue 13 at the new defaults: the persistent ping-pong forward now runs the
# short rows (attention_gluon.FWD_PERSIST_MAX_S: D64 to S 4K, D128 non-causal S 1K; call 2, issue13/run24_b/).
#  1. every Gluon attention GPU test (the default dispatch's spies now also watch the persistent form);
#  2. the table at the defaults (bench_attention.py, cuDNN / Flex / flash beside);
#  3. the Gluon bench's forward again at S 1K / 4K (a second run of call 2's decision, persistent beside the others).
#   run: OUT=$OUT bash benchmarks/gpu_session24_c.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 170 python3 -m pytest tests/test_attention_gluon.py -q -m gpu -n 4 -p no:cacheprovider > $OUT/gluon_gpu_tests.log 2>&1
el "gluon GPU tests exit $?"; tail -1 $OUT/gluon_gpu_tests.log; grep -E "^FAILED|^E  " $OUT/gluon_gpu_tests.log | head -12; pack
timeout 130 python3 benchmarks/bench_attention.py --out $OUT/table --seqlens 1024,4096,16384 --deadline 100 > $OUT/table.log 2>&1
el "table exit $?"; grep -E "^\| B|^\| GQA" $OUT/table/attention.md | cut -d'|' -f2-4,10-12; pack
GLUON_CHECKS_FROM=4 timeout 90 python3 benchmarks/bench_attention_gluon.py --out $OUT/ws --ws --budget 60 --seqlens 1024,4096 \
  --ws-configs "64:128,2,232,40,1;128:128,2,232,40,1" > $OUT/ws.log 2>&1
el "ws bench exit $?"; grep -E "^\| (64|128) " $OUT/ws.log; pack
rm -rf $OUT
