#!/usr/bin/env bash
# Session 9 (2026-12-02), call 3, issue 10: the bandwidth model from call 2's counters (throughput follows the bytes in
# flight per SM; the CE stream re-reads 77% of pass 2 from DRAM at 50K).  Deeper pipelines / bigger chunks with fewer
# resident programs for the CE stream; bigger pipelined pieces for the piece-wise softmax.
#   run: OUT=$OUT bash benchmarks/gpu_session13_c.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 200 python3 benchmarks/bench_cross_entropy.py --out $OUT/ce --sweep --sweep-stop --sweep-only =stream_4k_w8_st4,=stream_8k_w16_st4,=stream_8k_w16_st6,=stream_16k_w16_st4,=stream_16k_w32_st4,=stream_4k_w8_st8,=stream_8k_w8_st4 --skip-linear --skip-softmax > $OUT/ce.log 2>&1
el "ce exit $?"; grep SWEEP $OUT/ce.log
timeout 220 python3 benchmarks/bench_cross_entropy.py --out $OUT/sm --softmax-only --sweep-only =piecewise,pwst > $OUT/sm.log 2>&1
el "softmax exit $?"; grep SOFTMAX $OUT/sm.log
