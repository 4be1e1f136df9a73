#!/usr/bin/env bash
# Next device session, call 2 (nvidia-h200, < 10 min, timeout_s 600): issue 12's bound, Inductor's own kernels in
# the compiled GPT-2 step and the most that faster kernels of the same bytes could save against the 2.8 ms a
# 1.1x step needs. Session 5 gave each sequence length 130 s and both timed out silently: TORCHINDUCTOR_PROFILE
# times every kernel with do_bench on every call, on top of the compile. 290 s each here.
#   run: OUT=$OUT bash benchmarks/gpu_session8_b.sh
set -u
source benchmarks/_gpu_env.sh
timeout 290 python3 benchmarks/diag_inductor_bandwidth.py --out $OUT --seq-len 1024 --batch-size 16 --gpu-ms 31.2 > $OUT/inductor_s1024.log 2>&1
el "inductor s1024 exit $?"; head -14 $OUT/inductor_bandwidth_s1024.md 2> /dev/null || tail -20 $OUT/inductor_s1024.log
timeout 290 python3 benchmarks/diag_inductor_bandwidth.py --out $OUT --seq-len 4096 --batch-size 4 --gpu-ms 38.9 > $OUT/inductor_s4096.log 2>&1
el "inductor s4096 exit $?"; head -14 $OUT/inductor_bandwidth_s4096.md 2> /dev/null || tail -20 $OUT/inductor_s4096.log
