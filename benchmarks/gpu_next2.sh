#!/usr/bin/env bash
# Second device call of 2026-12-01 (nvidia-h200-x2, one GPU per lane, < 8 min wall):
#   lane 0: issue 12 acceptance again (benchmarks/gpu_train_ab.sh) after the fix of the recording hooks'
#           leftover graph breaks under torch.compile (fused_layers/ledger.py, Ledger.stop_recording);
#   lane 1: issue 13 variants: GPU tests (every failure listed), then the sweep with timings isolated from
#           the other workers' compile checks (benchmarks/gpu_attention_variants.sh).
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="bash benchmarks/gpu_next2.sh")
# On one GPU (x2 not lent), one lane per call: `bash benchmarks/gpu_next2.sh i12`, then `... i13`.
set -u
export PYTHONUNBUFFERED=1
W=/tmp/next2; rm -rf $W; mkdir -p $W/i12 $W/i13
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
LANES=${1:-i12,i13}
NG=$(nvidia-smi -L | wc -l); G1=$(( NG > 1 ? 1 : 0 ))
[[ $LANES == *i12* ]] && ( export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=12; OUT=$W/i12 bash benchmarks/gpu_train_ab.sh > $W/i12/lane.log 2>&1; el "lane0 done" ) &
[[ $LANES == *i13* ]] && ( export CUDA_VISIBLE_DEVICES=$G1; OUT=$W/i13 TESTS_LIMIT=170 TOTAL_LIMIT=400 WORKERS=12 bash benchmarks/gpu_attention_variants.sh > $W/i13/lane.log 2>&1; el "lane1 done" ) &
wait
tar czf $OUT/all.tgz -C $W .
[ -f $W/i12/train_ab.md ] && { grep -B2 -A60 "^## s1024_eager" $W/i12/train_ab.md | grep -v "^- note"; }
[ -f $W/i13/lane.log ] && { grep -E "exit|passed|failed|FAILED" $W/i13/lane.log | head -20; sed -n '/## fwd_tflops/,$p' $W/i13/attention_variants.md | cut -c1-400; }
