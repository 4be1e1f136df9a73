#!/usr/bin/env bash
# Session 23, call 6 (< 3 min, one H200).  Issue 10: the TMA cross-entropy with the row held (HOLD) won at 32,000 /
# 32,768 in call 5 (graph 0.808 / 0.803 against the default's 0.720 / 0.736).  Here: again, with plain stores of the
# gradient (no output buffer: a 10th entry 0), 4 KB chunks; and at 50,304 (100,608-byte rows) two CTAs an SM with 13 x
# 8 KB or 25 x 4 KB rings and plain stores; 65,536 / 128,256 streamed for reference.
#   run: OUT=$OUT bash benchmarks/gpu_session30_f.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 80 python3 benchmarks/bench_softmax_gluon.py --out $OUT/ce32 --ce --widths 32000 \
  --configs "16,256,8,1,4,3,1,1,1;16,256,8,1,4,3,1,1,1,0;8,256,16,1,4,3,1,1,1;16,256,8,1,4,2,1,1,1,0" > $OUT/ce32.log 2>&1
el "exit $?"; grep -v Warn $OUT/ce32.log | tail -2
timeout 100 python3 benchmarks/bench_softmax_gluon.py --out $OUT/ce50 --ce --widths 50304 \
  --configs "16,256,13,1,4,2,1,1,1,0;16,256,13,1,8,2,1,1,1,0;8,256,25,1,4,2,1,1,1,0;16,256,13,1,4,2,1,1,1" > $OUT/ce50.log 2>&1
el "exit $?"; grep -v Warn $OUT/ce50.log | tail -2
