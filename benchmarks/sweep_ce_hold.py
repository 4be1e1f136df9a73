"""Issue 10 (session 23): the cross-entropy's TMA HOLD default (cross_entropy_config.TMA_HOLD) against the persistent
kernel it replaced (wide_mode=3), through fused_cross_entropy forward + backward, 8,192 bf16 rows; do_bench (L2
flushed) and CUDA-graph replay, fraction of the 4.22 TB/s copy for one read of the logits and one write of the
gradient; the max loss / gradient error against F.cross_entropy on float32 logits beside each.

    python3 benchmarks/sweep_ce_hold.py [C ...] [--default-only] > $OUT/ce_hold.txt
    FORMS='{"stream": {"wide_mode": 1}}' python3 benchmarks/sweep_ce_hold.py 50257   # the default and these forms
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import torch.nn.functional as F

import _timing
from fused_layers import fused_cross_entropy
from fused_layers.ops._common import config_override

widths = [int(a) for a in sys.argv[1:] if not a.startswith("-")] or [16640, 24576, 32000, 32768, 50304]
DEFAULT_ONLY = "--default-only" in sys.argv  # the default alone (a sweep of vocabulary sizes)
for C in widths:
    x = (torch.randn(8192, C, device="cuda") * 3).to(torch.bfloat16)
    t = torch.randint(0, C, (8192,), device="cuda")
    t[::7] = -100
    xr = x.detach().requires_grad_()
    xf = x.float().requires_grad_()
    ref = F.cross_entropy(xf, t)
    ref.backward()
    nb = 2 * x.numel() * x.element_size()

    def step():  # a fresh leaf a call (a graph capture cannot reuse the eager calls' AccumulateGrad node)
        fused_cross_entropy(x.detach().requires_grad_(), t).backward()

    forms = (("persistent (wide_mode=3)", dict(wide_mode=3)), ("default", {}),
             ("persistent again", dict(wide_mode=3)), ("default again", {}))
    if os.environ.get("FORMS"):  # e.g. FORMS='{"stream": {"wide_mode": 1}}': the default, then these
        forms = (("default", {}),) + tuple(json.loads(os.environ["FORMS"]).items())
    for label, cfg in (forms[1:2] if DEFAULT_ONLY else forms):
        with config_override("cross_entropy", **cfg):
            xr.grad = None
            loss = fused_cross_entropy(xr, t)
            loss.backward()
            el = abs(loss.float().item() - ref.item())
            eg = (xr.grad.float() - xf.grad).abs().max().item()
            d, g = _timing.fractions_of_copy(step, nb)
        print(f"C={C:6d} {label:26s} do_bench {d:.3f}  graph {g:.3f}  |loss err| {el:.1e}  |grad err| {eg:.1e}",
              flush=True)
