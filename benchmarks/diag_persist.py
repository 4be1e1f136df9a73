"""What the persistent wide-row kernels bound on this GPU: pieces, programs per SM (from the driver), row
groups, registers, for the cross-entropy (bf16 logits, 8,192 rows) and the wide softmax (2^26 elements).

    python benchmarks/diag_persist.py            # GPU
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    from fused_layers import fused_cross_entropy, fused_softmax
    from fused_layers.ops import cross_entropy as ce
    from fused_layers.ops import softmax as sm
    from fused_layers.ops._common import config_override
    from fused_layers.ops._rowsync import programs_per_sm

    dev = "cuda"
    print("SMs", torch.cuda.get_device_properties(0).multi_processor_count)
    # Correctness first, row by row (which rows are wrong says which pipeline stage is): fp32 softmax forward.
    x = torch.randn(1024, 65536, device=dev)
    with config_override("softmax", wide_mode=2):
        sm._PLANS.clear()
        y = fused_softmax(x, -1)
        torch.cuda.synchronize()
        groups = [p.groups for p in sm._PLANS.values() if p.persist is not None]
    err = (y - torch.softmax(x, -1)).abs().amax(-1)
    bad = (err > 1e-6).nonzero().flatten().tolist()
    print(f"softmax fp32 1024 x 65536 persistent: groups {groups}, {len(bad)} bad rows {bad[:12]} max err {err.max().item():.2e}")
    for v in (32000, 50304, 128256, 262144):
        x = torch.randn(8192, v, device=dev, dtype=torch.bfloat16).requires_grad_()
        t = torch.randint(0, v, (8192,), device=dev)
        with config_override("cross_entropy", wide_mode=3):
            ce._PLANS.clear()
            loss = fused_cross_entropy(x, t)
            loss.backward()
            torch.cuda.synchronize()
            ref = torch.nn.functional.cross_entropy(x.detach().float(), t)
            for p in ce._PLANS.values():
                if p.persist is not None and p.kernel:
                    k = p.kernel[0]
                    comp = next(iter(k._compiled.values()), None)
                    per_sm = programs_per_sm(comp, x.device) if comp is not None else None
                    print(f"CE V={v}: splits {p.splits} piece {p.piece} groups {p.groups} programs {p.groups * p.splits} "
                          f"regs {getattr(comp, 'n_regs', None)} per_sm(driver) {per_sm} |loss err| {abs(loss.item() - ref.item()):.2e}")
    for dtype in (torch.bfloat16, torch.float32):
        for n in (65536, 262144):
            x = torch.randn(2**26 // n, n, device=dev, dtype=dtype).requires_grad_()
            with config_override("softmax", wide_mode=2):
                sm._PLANS.clear()
                y = fused_softmax(x, -1)
                y.backward(torch.randn_like(y))
                torch.cuda.synchronize()
                for p in sm._PLANS.values():
                    if p.persist is not None and p.kernel:
                        k = p.kernel[0]
                        comp = next(iter(k._compiled.values()), None)
                        print(f"softmax {dtype} N={n} {k.fn.__name__}: splits {p.splits} groups {p.groups} "
                              f"regs {getattr(comp, 'n_regs', None)}")


if __name__ == "__main__":
    main()
