#!/usr/bin/env bash
# One device call: attention sweep + GPU tests + benchmark, softmax GPU tests + wide-row sweep + benchmark.
# Results land in $OUT/all.tgz (the device tool returns at most 8 files).
set -u
export PYTHONUNBUFFERED=1
W=/tmp/w; mkdir -p $W/attn $W/softmax
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/liger_kernel*.whl && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "=== attention sweep"; timeout 110 python3 benchmarks/bench_attention.py --out $W/attn --sweep --workers 14 > $W/attn/sweep.log 2>&1; tail -12 $W/attn/sweep.log
[ -f $W/attn/attn_table.json ] && export FUSED_LAYERS_ATTENTION_TABLE=$W/attn/attn_table.json
echo "=== attention tests"; timeout 75 python3 -m pytest tests/test_attention.py -q -x -n 8 -m "not slow" -p no:cacheprovider > $W/attn/tests.log 2>&1; tail -8 $W/attn/tests.log
echo "=== attention bench"; timeout 140 python3 benchmarks/bench_attention.py --out $W/attn --deadline 95 > $W/attn/bench.log 2>&1; tail -40 $W/attn/bench.log
unset FUSED_LAYERS_ATTENTION_TABLE
echo "=== softmax gpu tests"; timeout 50 python3 -m pytest tests/test_softmax.py -q -x -m gpu -p no:cacheprovider > $W/softmax/tests.log 2>&1; tail -4 $W/softmax/tests.log
echo "=== softmax bench"; timeout ${SOFTMAX_LIMIT:-190} python3 benchmarks/bench_softmax.py --out $W/softmax --sweep --sweep-widths 65536,262144 > $W/softmax/log.txt 2>&1; grep -v "^\[" $W/softmax/log.txt | grep -v -i "warn\|online softmax\|split the\|important use\|^$" | tail -70
tar czf $OUT/all.tgz -C $W .
