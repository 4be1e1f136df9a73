"""Issue 13's evidence: where our attention kernels lose to cuDNN on Hopper, from hardware counters.

Issue 13 asks, where Triton cannot reach cuDNN, for the kernel's measured numbers: achieved occupancy, tensor
core (wgmma) utilisation and where the time goes.  This driver runs one warmed-up forward + backward of one
implementation between cudaProfilerStart / Stop, so that Nsight Compute (``--profile-from-start off``)
profiles exactly those kernels; ``benchmarks/gpu_session8_d.sh`` runs it for ours, cuDNN's and FlashAttention-2's
SDPA backends at D64 / D128, S 4,096, causal and not, with ncu's SpeedOfLight, Occupancy,
ComputeWorkloadAnalysis, WarpStateStats and LaunchStats sections.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python benchmarks/ncu_attention.py --impl fused --d 64 --s 4096 --causal
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fused_layers import fused_attention

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=["fused", *BACKENDS], required=True)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=65536, help="B x S, as in bench_attention.py")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the script (fused only, tiny sizes)")
    args = ap.parse_args()
    dev, dt = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    b = max(1, args.tokens // args.s)
    q, k, v = (torch.randn(b, args.heads, args.s, args.d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)

    def run():
        if args.impl == "fused":
            out = fused_attention(q, k, v, is_causal=args.causal)
        else:
            with sdpa_kernel([BACKENDS[args.impl]]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        torch.autograd.grad(out, (q, k, v), do)

    for _ in range(1 if args.smoke else 5):  # compile, autotune, bind
        run()
    if not args.smoke:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    flops = 4 * b * args.heads * args.s * args.s * args.d * (0.5 if args.causal else 1.0)
    print(f"impl {args.impl} B{b} H{args.heads} S{args.s} D{args.d} causal={args.causal}: forward "
          f"{flops / 1e12:.3f} TFLOP, backward {2.5 * flops / 1e12:.3f} TFLOP")


if __name__ == "__main__":
    main()
