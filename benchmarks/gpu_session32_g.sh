#!/usr/bin/env bash
# Session 25, call 7 (< 7 min, one H200).  The issue-10 tables at HEAD (after the width buckets of call 6), peers in the
# same run: the softmax defaults (32K-256K, bf16 and fp32), the CE at the four vocabularies and at misaligned
# ones (BERT 30,522, GPT-2 50,257, cl100k 100,277).
#   run: OUT=$OUT bash benchmarks/gpu_session32_g.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/sm --softmax-only --sweep-only =default > $OUT/softmax_defaults.log 2>&1
el "softmax defaults exit $?"; grep SOFTMAX $OUT/softmax_defaults.log
timeout 150 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce4 --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; grep -E "^CE V|no graph" $OUT/ce_table.log
timeout 120 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce_odd --vocabs 30522,50257,100277 --skip-linear --skip-softmax > $OUT/ce_odd.log 2>&1
el "CE odd exit $?"; grep -E "^CE V|no graph" $OUT/ce_odd.log
