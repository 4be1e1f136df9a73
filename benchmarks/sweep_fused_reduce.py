"""Issue 9: the fused dW / dB reduce of the single-block norm backward (layer_norm._fused_reduce_tail) against the
separate reduce kernel, and its shape (who reduces, tile width, pipelining), by both of issue 9's measures: do_bench
of fwd+bwd minus fwd and CUDA-graph replay of the backward (bf16, 2^26 elements, fraction of the 4.22 TB/s copy).
Also the RMSNorm 1K tile that won session 20's sweep (4 rows, 4 warps, 4 programs an SM, 3 stages) on both norms.

    python3 benchmarks/sweep_fused_reduce.py [--widths 768,1024,4096,8192] > $OUT/sweep_fused_reduce.txt
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from triton.testing import do_bench

import _timing
from fused_layers import fused_layer_norm, fused_rms_norm
from fused_layers.ops import _cpp
from fused_layers.ops.layer_norm import config_override

COPY = 4220e9
TOTAL = 2**26
ap = argparse.ArgumentParser()
ap.add_argument("--widths", default="768,1024,4096,8192")
ap.add_argument("--ops", default="ln,rms")
args = ap.parse_args()
_cpp.extension(wait=True)

TILE_1K = dict(bwd_block_m=4, bwd_warps=4, bwd_progs_per_sm=4, bwd_stages=3, bwd_max_single=65536)
CANDS = [
    ("reduce_kernel", dict(bwd_fused_reduce=0)),
    ("fused_default", {}),
    ("fused_s132", dict(bwd_reduce_slices=132)),
    ("fused_n32", dict(bwd_reduce_n=32)),
    ("fused_st1", dict(bwd_reduce_stages=1)),
]


def measure(op, n, cfg):
    rows = TOTAL // n
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True) if op == "ln" else None
    dy = torch.randn_like(x)
    leaves = [t for t in (x, w, b) if t is not None]
    f = (lambda: fused_rms_norm(x, (n,), w)) if op == "rms" else (lambda: fused_layer_norm(x, (n,), w, b))
    with config_override("layer_norm", **cfg):
        for _ in range(3):
            torch.autograd.grad(f(), leaves, dy)
        fwd = do_bench(f, warmup=25, rep=100, return_mode="median")
        fb = do_bench(lambda: torch.autograd.grad(f(), leaves, dy), warmup=25, rep=100, return_mode="median")
        g = _timing.bench(lambda y: torch.autograd.grad(y, leaves, dy, retain_graph=True), setup=f, rep=60) \
            if _timing.MODE == "graph" else None
    nb = 3 * rows * n * 2
    d = fb - fwd
    return nb / (d * 1e-3) / COPY, (nb / (g * 1e-3) / COPY if g else float("nan"))


for op in args.ops.split(","):
    for n in map(int, args.widths.split(",")):
        cands = list(CANDS)
        if n == 1024:
            cands += [("tile1k_fused", TILE_1K), ("tile1k_reduce_kernel", dict(TILE_1K, bwd_fused_reduce=0))]
        for name, cfg in cands:
            try:
                a, g = measure(op, n, cfg)
                print(f"{op} {n} {name:22s} fwd+bwd-fwd {a:.3f}  graph bwd {g:.3f}", flush=True)
            except Exception as e:  # keep the other candidates
                print(f"{op} {n} {name} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
