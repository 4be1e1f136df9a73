#!/usr/bin/env bash
# Next device session, call 3, after gpu_session6_a.sh and gpu_session6_b.sh (nvidia-h200, < 10 min: timeout_s 600; .whl carried):
#   1. issue 12's bound: Inductor's own kernels in the compiled GPT-2 step, fraction of copy each, and the
#      most that faster kernels for the same bytes could save (diag_inductor_bandwidth.py, seq 1,024 / 4,096);
#   2. LayerNorm / RMSNorm at 768 (GPT-2, ViT): forward 0.80 / backward 0.70 of copy in session 4, while
#      RMSNorm reached 0.98 / 0.90; sweep both parts at 768 (one-warp-per-row forward candidates) and adopt
#      a winner as an exact-width entry (2, 768, part) in layer_norm_config._TUNED;
#   3. the wide-row LayerNorm (fwd 0.52, bwd 0.39-0.46 of copy at 16K-64K) with its loops pipelined
#      (fwd_stages / bwd_stages candidates; sm_90 scan: 18-24 LDGSTS at 3-4 stages, no spills).
# Call 4 (carry .whl): FUSED_ORDER=true,false SWEEPS=s1024_compile,s4096_compile bash benchmarks/gpu_train_ab.sh
#   (is the 0.98-0.99x of compiled fused runs that kept unfused a second-job effect?).
#   run: OUT=$OUT bash benchmarks/gpu_session6.sh
set -u
source benchmarks/_gpu_env.sh
timeout 125 python3 benchmarks/diag_inductor_bandwidth.py --out $OUT --seq-len 1024 --batch-size 16 --gpu-ms 31.2 > $OUT/inductor_s1024.log 2>&1
el "inductor s1024 exit $?"; head -12 $OUT/inductor_bandwidth_s1024.md 2> /dev/null || tail -20 $OUT/inductor_s1024.log
timeout 125 python3 benchmarks/diag_inductor_bandwidth.py --out $OUT --seq-len 4096 --batch-size 4 --gpu-ms 38.9 > $OUT/inductor_s4096.log 2>&1
el "inductor s4096 exit $?"; head -12 $OUT/inductor_bandwidth_s4096.md 2> /dev/null || tail -20 $OUT/inductor_s4096.log
timeout 170 python3 benchmarks/bench_norm.py --out $OUT/norm --ops ln,rms --dtypes bf16 --sweep --sweep-widths 768 \
  --sweep-dtypes bf16 --widths 768 --sweep-budget 110 --budget 160 > $OUT/norm768.log 2>&1
el "norm 768 exit $?"; grep -E '"n": 768' $OUT/norm768.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    if 'part' in r: print(r['part'], r.get('cfg'), round(r.get('frac', 0), 3), r.get('error', '')[:60])
    else: print(r['op'], r['provider'], 'fwd', round(r['fwd_frac'], 3), 'bwd', round(r['bwd_frac'], 3))"
timeout 100 python3 benchmarks/bench_norm.py --out $OUT/norm_wide --ops ln --dtypes bf16 --sweep --sweep-widths 16384,65536 \
  --sweep-dtypes bf16 --widths 16384 --sweep-budget 70 --budget 90 > $OUT/norm_wide.log 2>&1
el "norm wide exit $?"; grep -E '"part": "(fwd|bwd)"' $OUT/norm_wide.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['n'], r['part'], r.get('cfg'), round(r.get('frac', 0), 3), r.get('error', '')[:60])"
