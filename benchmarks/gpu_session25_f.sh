#!/usr/bin/env bash
# Session 18, call 6 (< 3 min, one H200).  Issue 9: call 5's host diagnostic did not wait for the C++ fast path (it
# builds on a background thread in a fresh process); again with the wait, 16K beside 8K, then the eager (do_bench)
# table at 8K / 16K for the record.
#   run: OUT=$OUT bash benchmarks/gpu_session25_f.sh   (carry .whl)
set -u
FINAL=$OUT; OUT=$FINAL/r; mkdir -p $OUT
source benchmarks/_gpu_env.sh
pack() { tar czf $FINAL/results.tgz -C $FINAL r; }
timeout 100 python3 benchmarks/diag_norm_host.py > $OUT/diag_norm_host.txt 2>&1
el "host diag exit $?"; grep -E "host|Error|error" $OUT/diag_norm_host.txt | head; grep -A22 "Ordered by" $OUT/diag_norm_host.txt | cut -c1-160; pack
TIMING=eager timeout 60 python3 benchmarks/bench_norm.py --out $OUT/table_eager --ops ln,rms --dtypes bf16 --widths 8192,16384 --no-peers > $OUT/table_eager.log 2>&1
el "table eager exit $?"; pack
rm -rf $OUT
