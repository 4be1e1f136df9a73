"""GPU timeline of issue 9's do_bench measure (fwd+bwd minus fwd) for the norms: where the backward's time goes.

do_bench of fwd+bwd reads 0.83-0.85 of copy at 768-8K where graph replay of the backward reads 0.86-0.90
(issue9/run26_f).  This runs the do_bench loop (L2 flush by ``cache.zero_()``, then one fwd+bwd) under
torch.profiler and prints, per iteration, every kernel after the flush with its duration and the idle gap before it,
then the medians: the row backward alone, the dW / dB reduce, the gaps, and the fraction of copy each gives
(3 x 2^26 x 2 bytes for the backward).

    python3 benchmarks/diag_norm_timeline.py > $OUT/diag_norm_timeline.txt
"""
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
from torch.profiler import ProfilerActivity, profile

from fused_layers import FusedLayerNorm, FusedRMSNorm
from fused_layers.ops import _cpp
from fused_layers.ops.layer_norm import config_override

COPY = 4220e9
TOTAL = 2**26
_cpp.extension(wait=True)
cache = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")  # as triton.testing.do_bench


def kernels(prof):
    path = os.path.join(tempfile.mkdtemp(), "t.json")
    prof.export_chrome_trace(path)
    ev = json.load(open(path))["traceEvents"]
    ks = [e for e in ev if e.get("cat") == "kernel"]
    ks.sort(key=lambda e: e["ts"])
    return [(e["name"], float(e["ts"]), float(e["dur"])) for e in ks]


def case(op, n):
    rows = TOTAL // n
    mod = (FusedLayerNorm if op == "ln" else FusedRMSNorm)(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    leaves = [x, *mod.parameters()]

    def step():
        cache.zero_()
        torch.autograd.grad(mod(x), leaves, dy)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(8):
            step()
        torch.cuda.synchronize()
    ks = kernels(prof)
    # split into iterations at each flush kernel (the fill of `cache`)
    iters, cur = [], None
    for k in ks:
        if "fill" in k[0].lower() or "zero" in k[0].lower():
            if cur:
                iters.append(cur)
            cur = []
        elif cur is not None:
            cur.append(k)
    if cur:
        iters.append(cur)
    print(f"\n## {op} {n} ({rows} rows, bf16)")
    per = {}
    bwd_spans, gaps_all = [], []
    for i, it in enumerate(iters):
        prev_end = None
        line = []
        for j, (name, ts, dur) in enumerate(it):
            gap = 0.0 if prev_end is None else ts - prev_end
            prev_end = ts + dur
            per.setdefault(j, []).append((name, dur, gap))
            line.append(f"{name[:38]} {dur:.1f}us gap {gap:.1f}")
        if i < 2:
            print("  iter", i, " | ".join(line))
        if len(it) >= 2:
            fwd_end = it[0][1] + it[0][2]
            bwd_spans.append(it[-1][1] + it[-1][2] - fwd_end)
    print("  kernel medians (position: name, us, gap before):")
    for j, v in per.items():
        print(f"   {j}: {v[0][0][:70]}  {statistics.median(d for _, d, _ in v):.1f} us  gap {statistics.median(g for _, _, g in v):.1f}")
    nbytes = 3 * TOTAL * 2
    if bwd_spans:
        span = statistics.median(bwd_spans)
        row = statistics.median(d for _, d, _ in per[1]) if 1 in per else float("nan")
        print(f"  bwd span (end of fwd kernel -> end of last kernel) {span:.1f} us = {nbytes / span / 1e-6 / COPY:.3f} of copy;"
              f" row kernel alone {row:.1f} us = {nbytes / row / 1e-6 / COPY:.3f}")


# NORM_CASES="ln:16384,rms:16384" picks cases (default: both norms at 768 / 1K / 4K / 8K / 16K)
CASES = ([(c.split(":")[0], int(c.split(":")[1])) for c in os.environ["NORM_CASES"].split(",")]
         if os.environ.get("NORM_CASES") else [(op, n) for op in ("ln", "rms") for n in (768, 1024, 4096, 8192, 16384)])
# NORM_CFG='{"bwd_gluon_parts_evict": 1}': a layer_norm config_override for every case (session 22)
CFG = json.loads(os.environ.get("NORM_CFG") or "{}")
for op, n in CASES:
    try:
        with config_override("layer_norm", **CFG):
            case(op, n)
    except Exception as e:  # keep the other cases
        print(f"## {op} {n} failed: {type(e).__name__}: {e}")
