#!/usr/bin/env bash
# Session 23, call 2 (< 8 min, one H200).  Issue 10 at HEAD, the tables its closing note quotes, peers in the same run:
# (1) the wide softmax defaults, both directions, do_bench of the op and graph replay (bench_cross_entropy.py
# --softmax-only); (2) the wide softmax against torch.softmax, torch.compile and Liger (bench_softmax.py, 32K-256K);
# (3) the cross-entropy table against F.cross_entropy(x.float()), bf16 F.cross_entropy, torch.compile and Liger.
#   run: OUT=$OUT bash benchmarks/gpu_session30_b.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/sm --softmax-only --sweep-only =default > $OUT/softmax_defaults.log 2>&1
el "softmax defaults exit $?"; grep SOFTMAX $OUT/softmax_defaults.log
timeout 200 python3 benchmarks/bench_softmax.py --out /tmp/smp --widths 32768,65536,131072,262144 > $OUT/softmax_peers.log 2>&1
el "softmax peers exit $?"; cp /tmp/smp/*.md $OUT/ 2>/dev/null; ls /tmp/smp
timeout 150 python3 benchmarks/bench_cross_entropy.py --out /tmp/cefull --skip-linear --skip-softmax > $OUT/ce_table.log 2>&1
el "CE table exit $?"; cp /tmp/cefull/cross_entropy_h200.md $OUT/ 2>/dev/null; grep -E "^CE V|no graph" $OUT/ce_table.log
