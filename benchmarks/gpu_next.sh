#!/usr/bin/env bash
# The device work left open on 2026-12-01 (benchmarks/results/RUNS_2026-12-01.md), as ONE call on
# nvidia-h200-x2, two lanes (one GPU each), < 9 min wall:
#   lane 0: issue 12 acceptance with the current policy=faster rule (benchmarks/gpu_train_ab.sh)
#   lane 1: issue 11 model table with the step-time A/B policy and the dropout cost (benchmarks/gpu_models.sh),
#           then the cross-entropy pass-1 / pass-2 breakdown (does pass 2's re-read hit L2? issue 10), then the
#           LayerNorm backward candidates with bwd_stages (issue 3/9 bwd target) and the norm table.
# Run from the repository root with the wheels of ../shared/gpu/wheels.sh carried:
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="bash benchmarks/gpu_next.sh")
# Everything lands in $OUT/all.tgz (lane folders i12/, i11/, ce/, norm/); the tails print the headline tables.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
W=/tmp/next; rm -rf $W; mkdir -p $W/i12 $W/i11 $W/norm $W/ce
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
lane0() {
  export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=8
  OUT=$W/i12 bash benchmarks/gpu_train_ab.sh > $W/i12/lane.log 2>&1
  el "lane0 done"
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_COMPILE_THREADS=8
  OUT=$W/i11 bash benchmarks/gpu_models.sh > $W/i11/lane.log 2>&1
  el "lane1 models done"
  timeout 45 python3 benchmarks/bench_cross_entropy.py --out $W/ce --passes-only > $W/ce.log 2>&1
  el "lane1 cross-entropy passes done"
  timeout 100 python3 benchmarks/bench_norm.py --out $W/norm --sweep --sweep-widths 1024,4096 --sweep-dtypes bf16,fp32 \
    --sweep-budget 60 --budget 95 --widths 1024,4096,16384 > $W/norm/norm.log 2>&1
  el "lane1 norm done"
}
lane0 & lane1 & wait
tar czf $OUT/all.tgz -C $W .
tail -60 $W/i12/lane.log
tail -45 $W/i11/lane.log
cat $W/ce/cross_entropy_h200.md 2>/dev/null | tail -8
tail -30 $W/norm/norm.log
