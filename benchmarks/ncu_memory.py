"""Where the memory-bound kernels lose bandwidth: DRAM bytes against the minimum, L2 hit rate, occupancy.

Issues 9 and 10: the cross-entropy runs at 0.63-0.65 of copy, the wide softmax at 0.65-0.74 and the LayerNorm
backward at 0.70-0.85, and event timing cannot say why.  This driver runs one warmed-up call of each case
between cudaProfilerStart / Stop, so that Nsight Compute (``--profile-from-start off``) reads the hardware
counters of exactly those kernels.  The one question to answer first is whether the kernels read more bytes
from DRAM than the minimum.  A second pass over a row that misses L2 does that: DRAM read > 1.0x minimum.

    ncu --clock-control none --profile-from-start off --csv --metrics <list> \\
        python benchmarks/ncu_memory.py --case ce --width 131072      (benchmarks/gpu_session8_c.sh)

It prints the minimal bytes of the case (one read of each input, one write of each output) for comparison.
"""

from __future__ import annotations

import argparse

import torch

from fused_layers import fused_cross_entropy, fused_layer_norm, fused_softmax

CASES = ("ce", "softmax_fwd", "softmax_bwd", "ln_fwd", "ln_bwd")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=CASES, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--elems", type=int, default=1 << 26, help="rows x width (the benchmarks use 2^26)")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the script (TRITON_INTERPRET=1, tiny sizes)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--override", default="", help='config_override of the case\'s op, as JSON: \'{"wide_mode": 2}\'')
    args = ap.parse_args()
    if args.override:
        import json

        from fused_layers.ops._common import config_override

        op = {"ce": "cross_entropy", "softmax_fwd": "softmax", "softmax_bwd": "softmax"}.get(args.case, "layer_norm")
        ctx = config_override(op, **json.loads(args.override))  # kept referenced: active for the whole run
        ctx.__enter__()
    n = args.width
    m = max(1, args.elems // n)
    dev, dt = ("cpu", torch.float32) if args.smoke else ("cuda", getattr(torch, args.dtype))
    x = torch.randn(m, n, device=dev, dtype=dt)
    b = x.element_size()  # bytes per element
    if args.case == "ce":
        t = torch.randint(0, n, (m,), device=dev)
        xg = x.clone().requires_grad_()

        def run():
            fused_cross_entropy(xg, t).backward()

        minimal = m * n * b * 2  # read the logits once, write the gradient once
    elif args.case.startswith("softmax"):
        xg = x.clone().requires_grad_()
        y = fused_softmax(xg, -1)
        dy = torch.randn_like(y)
        if args.case == "softmax_fwd":
            def run():
                with torch.no_grad():
                    fused_softmax(x, -1)

            minimal = m * n * b * 2
        else:
            def run():
                torch.autograd.grad(y, xg, dy, retain_graph=True)

            minimal = m * n * b * 3  # read y and dy, write dx
    else:
        w, bias = torch.randn(n, device=dev, dtype=dt), torch.randn(n, device=dev, dtype=dt)
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, bias))
        y = fused_layer_norm(xg, (n,), wg, bg)
        dy = torch.randn_like(y)
        if args.case == "ln_fwd":
            def run():
                with torch.no_grad():
                    fused_layer_norm(x, (n,), w, bias)

            minimal = m * n * b * 2
        else:
            def run():
                torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True)

            minimal = m * n * b * 3  # read x and dy, write dx (the statistics and dW / dB are small)
    for _ in range(1 if args.smoke else 5):  # compile, autotune, bind
        run()
    if not args.smoke:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print(f"case {args.case} rows {m} width {n}: minimal DRAM bytes {minimal} ({minimal / 1e9:.3f} GB)")


if __name__ == "__main__":
    main()
