#!/usr/bin/env bash
# Session 7 of 2026-12-01, call 3 (nvidia-h200, < 9 min; .whl carried): the adopted LayerNorm backward entries
# (bwd_acc_rows / bwd_pair_sum at 768, 2048, 4096) under the GPU tests, the norm table at the new defaults by both
# timings (CUDA-graph replay and do_bench), and bench_e2e at seq 1024 / 4096 with the C++ fast path built first
# (the stale-build-lock fix: call 2's benchmarks waited forever on a lock left by call 1's process).
#   run: OUT=$OUT bash benchmarks/gpu_session10_c.sh
set -u
source benchmarks/_gpu_env.sh
FINAL=$OUT; OUT=/tmp/w10c; mkdir -p $OUT  # at most 8 files come back: one archive at the end
trap 'tar czf $FINAL/results.tgz -C $OUT .' EXIT
XDIST=""; python3 -c "import xdist" 2> /dev/null && XDIST="-n 8"
timeout 90 python3 -m pytest tests/test_layer_norm.py tests/test_cpp_fastpath.py -q $XDIST -rf --tb=short -p no:cacheprovider -W ignore > $OUT/tests.log 2>&1
el "ln + cpp tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -8
timeout 70 python3 benchmarks/bench_norm.py --out $OUT/norm_graph --ops ln,rms --dtypes bf16 --widths 768,1024,2048,4096,8192,16384 > $OUT/norm_graph.log 2>&1
el "norm (graph replay) exit $?"; grep -E "^\| " $OUT/norm_graph/bench_norm.md | head -45
TIMING=eager timeout 70 python3 benchmarks/bench_norm.py --out $OUT/norm_dobench --ops ln --dtypes bf16 --widths 768,1024,2048,4096,8192,16384 > $OUT/norm_dobench.log 2>&1
el "norm (do_bench) exit $?"; grep -E "^\| " $OUT/norm_dobench/bench_norm.md | head -24
timeout 130 python3 benchmarks/bench_e2e.py --out $OUT --variants unfused_sdpa,compile_sdpa,fused,fused_compile --rounds 5 --steps 8 > $OUT/e2e_1024.log 2>&1
el "e2e 1024 exit $?"; grep -E "^\| " $OUT/e2e_h200.md | head -6
timeout 130 python3 benchmarks/bench_e2e.py --out $OUT --tag _s4096 --seq-len 4096 --batch-size 4 --variants unfused_sdpa,compile_sdpa,fused,fused_compile \
  --rounds 5 --steps 8 > $OUT/e2e_4096.log 2>&1
el "e2e 4096 exit $?"; grep -E "^\| " $OUT/e2e_h200_s4096.md | head -6
