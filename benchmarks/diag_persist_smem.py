"""Which pieces the SMEM-pipelined persistent softmax gets wrong on the GPU (session 9, call 4: fp32 262,144 columns,
4K x 4 warps, 3 stages gave 0.8% wrong elements, all in whole 4K pieces?).  For each config: wrong elements, wrong
(row, piece) pairs and the first few, against torch.softmax in float32; forward and backward.

    python benchmarks/diag_persist_smem.py
"""
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from fused_layers import fused_softmax  # noqa: E402
from fused_layers.ops import softmax as sm  # noqa: E402
from fused_layers.ops._common import config_override  # noqa: E402

torch.manual_seed(0)
CASES = list(itertools.product((torch.float32, torch.bfloat16), (65536, 262144), ((4096, 4), (2048, 4)), (2, 3)))
if "--more" in sys.argv:  # call 6: is it the 64+ pieces a row, or the width?  And 2 stages at 1M columns
    CASES = [(torch.float32, 131072, (4096, 4), 3), (torch.float32, 131072, (2048, 4), 3), (torch.float32, 262144, (8192, 8), 3),
             (torch.float32, 262144, (4096, 4), 4), (torch.bfloat16, 262144, (4096, 4), 2), (torch.float32, 1048576, (4096, 4), 2),
             (torch.bfloat16, 1048576, (4096, 4), 2), (torch.float32, 1048576, (8192, 8), 2), (torch.bfloat16, 524288, (2048, 4), 2)]
for dtype, n, (block, warps), st in CASES:
    m = max(1, min(512, 2**24 // n))
    x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
    ref = torch.softmax(x.float(), -1)
    dy = torch.randn_like(x)
    gref = ref * (dy.float() - (ref * dy.float()).sum(-1, keepdim=True))
    with config_override("softmax", wide_mode=2, persist_block=block, persist_warps=warps, persist_stages=st, persist_per_sm=16):
        sm._PLANS.clear()
        out = []
        for name, y, r in (("fwd", None, ref), ("bwd", None, gref)):
            if name == "fwd":
                y = fused_softmax(x, -1)
            else:
                xg = x.clone().requires_grad_()
                y = torch.autograd.grad(fused_softmax(xg, -1), xg, dy)[0]
            torch.cuda.synchronize()
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            bad = (y.float() - r).abs() > tol * (1 + r.abs()) * (1 if name == "fwd" else 10)
            nb = int(bad.sum())
            plan = [p for p in sm._PLANS.values() if p.persist is not None]
            groups = plan[0].groups if plan else None
            piece = plan[0].ints[-1] if plan else block
            pairs = torch.nonzero(bad.view(m, -1, piece).any(-1)).tolist() if nb else []
            out.append(f"{name} wrong {nb} ({100 * nb / bad.numel():.2f}%) pieces {len(pairs)} {pairs[:6]}")
    print(f"{str(dtype)[6:]:>8} N={n:>6} {block}x{warps} st{st} groups {groups}: " + " | ".join(out), flush=True)
