#!/usr/bin/env bash
# Session 19, call 5 (< 4 min, one H200).  Issue 9, LayerNorm 16K backward (0.79 graph / 0.76 do_bench at the new
# default, smem_sums): every Gluon variant of the sweep (ring depth, dB in shared memory, float32 weight, 32 warps,
# device descriptors) now inherits smem_sums from the LayerNorm 16K entry, combinations never timed; then the 16K
# table by do_bench once more (spread of call 4's).
#   run: OUT=$OUT bash benchmarks/gpu_session26_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 benchmarks/bench_norm.py --out /tmp/g_ln --ops ln --dtypes bf16 --widths 16384 --sweep --sweep-op ln \
  --sweep-parts bwd --sweep-widths 16384 --sweep-dtypes bf16 --sweep-with bwd_gluon --sweep-budget 85 --budget 95 \
  --no-peers > $OUT/sweep_ln.log 2>&1
el "ln sweep exit $?"; grep '"part"' $OUT/sweep_ln.log | cut -c1-260
TIMING=eager timeout 50 python3 benchmarks/bench_norm.py --out $OUT/table_eager --ops ln,rms --dtypes bf16 --widths 16384 --no-peers > $OUT/table_eager.log 2>&1
el "table eager exit $?"; grep '"bwd_frac"' $OUT/table_eager.log | cut -c1-300
