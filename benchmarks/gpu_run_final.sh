#!/usr/bin/env bash
# One device call on nvidia-h200-x2: every GPU test, the norm / softmax-wide / FlexAttention / end-to-end
# benchmarks (two lanes, one per GPU, so benchmarks never share a GPU), then DDP and FSDP on both GPUs.
# Results land in $OUT/all.tgz (the device tool returns at most 8 files).
set -u
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=8
W=/tmp/w; mkdir -p $W/{norm,softmax,attn,e2e,cb,ddp,fsdp,tests}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

lane0() {  # GPU 0: LayerNorm/RMSNorm sweep + benchmark, end-to-end, FlexAttention
  export CUDA_VISIBLE_DEVICES=0
  el "norm bench"; timeout 190 python3 benchmarks/bench_norm.py --out $W/norm --sweep --sweep-budget 75 --budget 180 > $W/norm/log.txt 2>&1
  el "e2e bench"; timeout 140 python3 benchmarks/bench_e2e.py --out $W/e2e --variants unfused,unfused_sdpa,compile,fused,fused_softmax_ln --rounds 3 > $W/e2e/log.txt 2>&1
  el "attention (flex) bench"; timeout 55 python3 benchmarks/bench_attention.py --out $W/attn --seqlens 4096 --deadline 40 > $W/attn/log.txt 2>&1
  el "lane0 done"
}
lane1() {  # GPU 1: GPU tests, callback speedup table, softmax wide-row sweep + benchmark
  export CUDA_VISIBLE_DEVICES=1
  el "tests"; timeout 40 python3 -m pytest tests/test_softmax.py -q -m gpu -p no:cacheprovider > $W/tests/softmax.log 2>&1
  timeout 70 python3 -m pytest tests/test_layer_norm.py -q -n 4 -p no:cacheprovider > $W/tests/layer_norm.log 2>&1
  timeout 120 python3 -m pytest tests/test_attention.py -q -n 6 -p no:cacheprovider > $W/tests/attention.log 2>&1
  el "callback table"; FUSED_RESULTS_DIR=$W/cb timeout 50 python3 -m pytest tests/test_callback.py -m gpu -q -s -p no:cacheprovider -k speedup_table > $W/cb/log.txt 2>&1
  el "softmax wide"; timeout 100 python3 benchmarks/bench_softmax.py --out $W/softmax --sweep --sweep-widths 65536,262144 --widths 32768,65536,131072,262144,1048576 > $W/softmax/log.txt 2>&1
  el "lane1 done"
}
lane0 & lane1 & wait
el "ddp check"; timeout 90 python3 benchmarks/ddp_check.py --out $W/ddp > $W/ddp/log.txt 2>&1
el "fsdp train.py"; timeout 80 python3 train.py model=gpt2_small trainer=gpu data=synthetic fused=true trainer.devices=2 trainer.strategy=fsdp trainer.max_steps=30 trainer.val_check_interval=30 trainer.limit_val_batches=2 hydra.run.dir=$W/fsdp/run > $W/fsdp/log.txt 2>&1
el "all done"
for f in $W/tests/*.log; do echo "== $f"; tail -3 $f; done
echo "== callback"; tail -25 $W/cb/log.txt; echo "== ddp"; tail -15 $W/ddp/log.txt; echo "== fsdp"; grep -v Warning $W/fsdp/log.txt | tail -12
echo "== e2e"; tail -20 $W/e2e/log.txt; echo "== norm"; tail -4 $W/norm/log.txt
echo "== softmax"; grep -E "^(sweep|bf16|fp32)" $W/softmax/log.txt | grep -v "eager\|compile" | tail -20; echo "== flex"; grep -i "flex\|fused/" $W/attn/log.txt | tail -8
rm -rf $W/fsdp/run/wandb 2>/dev/null; tar czf $OUT/all.tgz -C $W .
