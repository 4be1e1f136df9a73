"""Why the bf16 wide-row softmax backward's fraction of copy differs between runs (issue 10).

The persistent SMEM-form backward at 64K / 128K measured 0.90 / 0.85 of copy in one session
(issue10/run14_defaults) and 0.49 / 0.51 in the next (issue10/run15_a), same code, same config; the forward
and the fp32 kernels agreed across runs.  This measures, in one process, with fresh tensors each round:
  - the spread of the backward over rounds (do_bench, L2 flushed; and CUDA-graph replay),
  - the compiled kernel's registers, shared memory and driver occupancy, and the row groups launched,
  - the per-SM program cap (4 / 8 / 12 / 16) and the LAG candidate beside the default,
  - the backward launched directly (softmax_backward) against through autograd.
Prints one JSON line per measurement; writes them to --out/spread.jsonl.

    python3 benchmarks/diag_softmax_bwd_spread.py --out /tmp/spread
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--widths", default="65536,131072")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from triton.testing import do_bench

    from fused_layers import fused_softmax
    from fused_layers.ops import _rowsync
    from fused_layers.ops import softmax as sm
    from fused_layers.ops._common import config_override

    src = torch.empty(2**30, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 2 / do_bench(lambda: dst.copy_(src), rep=100) / 1e6
    src = dst = None
    out = open(os.path.join(args.out, "spread.jsonl"), "w")

    def emit(**r):
        print(json.dumps(r), flush=True)
        out.write(json.dumps(r) + "\n")

    emit(copy_gbs=copy, device=torch.cuda.get_device_name(), sms=torch.cuda.get_device_properties(0).multi_processor_count)
    variants = {"default": {}, "per_sm4": dict(persist_per_sm=4), "per_sm8": dict(persist_per_sm=8),
                "per_sm12": dict(persist_per_sm=12), "lag_st3": dict(persist_lag=True)}
    for n in [int(w) for w in args.widths.split(",")]:
        m = 2**26 // n
        for name, cfg in variants.items():
            with config_override("softmax", **cfg):
                eager, direct, graph = [], [], []
                for r in range(args.rounds):
                    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16).requires_grad_()
                    dy = torch.randn_like(x)
                    y = fused_softmax(x, -1)
                    yd = y.detach()
                    ref = torch.softmax(x.detach().float(), -1)
                    dx = sm.softmax_backward(yd, dy, 1)
                    dref = ref * (dy.float() - (ref * dy.float()).sum(-1, keepdim=True))
                    err = (dx.float() - dref).abs().max().item()
                    eager.append(do_bench(lambda: torch.autograd.grad(y, x, dy, retain_graph=True), rep=60))
                    direct.append(do_bench(lambda: sm.softmax_backward(yd, dy, 1), rep=60))
                    if r < 2:
                        graph.append(_timing.bench(lambda: sm.softmax_backward(yd, dy, 1), rep=60))
                nb = 3 * m * n * 2
                plan = next((p for k, p in sm._PLANS.items() if k[0] == torch.Size([m, n]) and len(k[1]) == 2
                             and k[4] and p.persist is not None), None)
                info = {}
                if plan is not None and plan.kernel:
                    k = plan.kernel[0]
                    compiled = next(iter(k._compiled.values()), None)
                    info = dict(groups=plan.groups, splits=plan.splits)
                    if compiled is not None:
                        info.update(regs=getattr(compiled, "n_regs", None), shared=compiled.metadata.shared,
                                    occupancy=_rowsync.programs_per_sm(compiled, x.device))
                emit(n=n, variant=name, max_err=err, **info,
                     autograd_frac=[round(nb / t / 1e6 / copy, 3) for t in eager],
                     direct_frac=[round(nb / t / 1e6 / copy, 3) for t in direct],
                     graph_frac=[round(nb / t / 1e6 / copy, 3) for t in graph],
                     direct_median=round(nb / statistics.median(direct) / 1e6 / copy, 3))
                x = dy = y = yd = None
                torch.cuda.empty_cache()
    out.close()


if __name__ == "__main__":
    main()
