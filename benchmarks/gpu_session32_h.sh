#!/usr/bin/env bash
# Session 25, call 8 (< 7 min, one H200).  Call 7 again with bench_cross_entropy.py waiting for the C++ fast path
# (call 7 timed its first cases while it built: do_bench outliers).  The issue-10 tables at HEAD, peers in the
# same run: the softmax defaults (32K-256K, bf16 and fp32), the CE at the four vocabularies and at misaligned
# ones (BERT 30,522, GPT-2 50,257, cl100k 100,277).
#   run: OUT=$OUT bash benchmarks/gpu_session32_h.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/sm --softmax-only --sweep-only =default > $OUT/softmax_defaults.log 2>&1
el "softmax defaults exit $?"; grep SOFTMAX $OUT/softmax_defaults.log
timeout 150 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce4 --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; grep -E "^CE V|no graph" $OUT/ce_table.log
timeout 120 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce_odd --vocabs 30522,50257,100277 --skip-linear --skip-softmax > $OUT/ce_odd.log 2>&1
el "CE odd exit $?"; grep -E "^CE V|no graph" $OUT/ce_odd.log
