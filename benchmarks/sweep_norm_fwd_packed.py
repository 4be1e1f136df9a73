"""Session 21 candidate: the norms' PACKED single-block forward (x held in bf16, converted at each pass; ptxas's
register cap), config_override fwd_packed / fwd_maxnreg, against the default forward, bf16, 2^26 elements: do_bench
and graph replay of the forward, fraction of copy (read x, write y), and the max abs error against F.layer_norm /
F.rms_norm in float32.

    python3 benchmarks/sweep_norm_fwd_packed.py > $OUT/sweep_norm_fwd_packed.txt
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import torch.nn.functional as F

import _timing
from fused_layers import fused_layer_norm, fused_rms_norm
from fused_layers.ops import _cpp
from fused_layers.ops.layer_norm import config_override

TOTAL = 2**26
_cpp.extension(wait=True)
CANDS = [dict(fwd_packed=1), dict(fwd_packed=1, fwd_maxnreg=40), dict(fwd_packed=1, fwd_maxnreg=48)]
for op in ("rms", "ln"):
    for n in (8192, 16384):
        x = torch.randn(TOTAL // n, n, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        if op == "ln":
            f = lambda: fused_layer_norm(x, (n,), w, b)  # noqa: E731
            ref = F.layer_norm(x.float(), (n,), w.float(), b.float())
        else:
            f = lambda: fused_rms_norm(x, (n,), w)  # noqa: E731
            ref = F.rms_norm(x.float(), (n,), w.float(), eps=torch.finfo(torch.bfloat16).eps)
        nb = 2 * x.numel() * 2
        for cfg in [{}] + CANDS + [{}]:
            try:
                with config_override("layer_norm", **cfg):
                    err = (f().float() - ref).abs().max().item()
                    d, g = _timing.fractions_of_copy(f, nb)
                print(f"{op} {n} {str(cfg or 'default'):50s} do_bench {d:.3f}  graph {g:.3f}  err {err:.2e}", flush=True)
            except Exception as e:  # keep the other candidates
                print(f"{op} {n} {cfg} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
