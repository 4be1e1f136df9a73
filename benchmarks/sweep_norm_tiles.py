"""Issue 9: single-block norm backward tiles by both of issue 9's measures, do_bench of fwd+bwd minus fwd and
CUDA-graph replay of the backward (bf16, 2^26 elements, fraction of the 4.22 TB/s copy).  Session 20: the RMSNorm 1K
sweep found 4 rows x 4 warps x 4 programs an SM x 3 stages at 0.92 against 0.83, and it won LayerNorm 1K too; this
times its neighbours at the other widths against each width's default.  (Session 20's first form of this script
timed the fused dW / dB reduce, reverted: issue9/run27_b/sweep_fused_reduce.txt.)

    python3 benchmarks/sweep_norm_tiles.py [--widths 768,2048,4096,8192] > $OUT/sweep_norm_tiles.txt
"""
import argparse
import json
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
ap.add_argument("--widths", default="768,2048,4096,8192")
ap.add_argument("--ops", default="ln,rms")
ap.add_argument("--pdl", action="store_true", help="programmatic dependent launch (bwd_pdl 1 / 2) against the default "
                "instead of tiles")
ap.add_argument("--cfgs", default=None, help="a JSON list of config_override dicts to time between two defaults "
                "instead of tiles (session 21: the 16K reduce's shape and L2 hints)")
args = ap.parse_args()
_cpp.extension(wait=True)


def tile(bm, wp, per_sm, st, **extra):
    return dict(bwd_block_m=bm, bwd_warps=wp, bwd_progs_per_sm=per_sm, bwd_stages=st, bwd_max_single=65536, **extra)


CANDS = {  # (rows a tile, warps, programs an SM, stages) by width
    768: [tile(4, 4, 4, 3), tile(4, 4, 4, 4), tile(8, 4, 4, 3), tile(4, 4, 4, 3, bwd_pair_sum=1), tile(8, 8, 1, 4)],
    1024: [tile(8, 8, 1, 4), tile(4, 4, 4, 4), tile(8, 4, 4, 3), tile(4, 4, 4, 3, bwd_pair_sum=1)],
    2048: [tile(2, 4, 4, 3), tile(2, 4, 4, 4), tile(1, 4, 4, 3), tile(2, 8, 4, 3), tile(2, 4, 4, 3, bwd_pair_sum=1)],
    4096: [tile(1, 4, 4, 3), tile(1, 8, 4, 3), tile(1, 8, 2, 3), tile(1, 4, 4, 4), tile(1, 8, 4, 3, bwd_pair_sum=1)],
    8192: [tile(1, 8, 2, 3), tile(1, 8, 4, 3), tile(1, 16, 2, 3), tile(1, 8, 2, 4), tile(1, 8, 2, 3, bwd_pair_sum=1)],
}


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
        pdl = ([{}, dict(bwd_gluon_pdl=1), dict(bwd_gluon_pdl=2), {}] if n >= 16384 else  # the Gluon row backward
               [{}, dict(bwd_pdl=1), dict(bwd_pdl=2), {}])
        cands = [{}] + json.loads(args.cfgs) + [{}] if args.cfgs else pdl if args.pdl else [{}] + CANDS.get(n, [])
        for cfg in cands:
            if op == "rms" and cfg.get("bwd_pair_sum"):
                continue
            try:
                a, g = measure(op, n, cfg)
                print(f"{op} {n} {str(cfg or 'default'):110s} fwd+bwd-fwd {a:.3f}  graph bwd {g:.3f}", flush=True)
            except Exception as e:  # keep the other candidates
                print(f"{op} {n} {cfg} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
