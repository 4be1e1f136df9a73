"""Issue 9 / 13: the host cost per call of the Gluon attention path (Python launch: TensorDescriptor objects and
Gluon's JIT launch, the autograd Function; no C++ fast path) beside the default path (Triton kernels through the C++
fast path) and SDPA, measured as benchmarks/bench_host.py does: B1 H1 S128 D64 bf16 causal (GPU time negligible),
1,000 back-to-back calls, one sync, divided by 1,000; median of 3 rounds.  What GLUON_MIN_WORK is set from.
    python3 benchmarks/host_gluon.py --out DIR
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import torch.nn.functional as F

from bench_host import host_us  # noqa: E402
from fused_layers import fused_attention  # noqa: E402
from fused_layers.ops import _cpp  # noqa: E402
from fused_layers.ops import attention as A  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", action="store_true", help="also cProfile 300 Gluon fwd+bwd calls (top 25 by own time)")
    args = ap.parse_args()
    _cpp.extension(wait=True)
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    go = torch.randn_like(q)
    modes = {"default (Triton, C++ fast path)": dict(),
             "Gluon forward": dict(fwd_gluon=1, bwd_gluon_dkdv=0, bwd_gluon_dq=0),
             "Gluon forward + dK/dV + dQ": dict(fwd_gluon=1, bwd_gluon_dkdv=1, bwd_gluon_dq=1)}
    res = {}
    for name, ov in modes.items():
        with A.config_override("attention", **ov):
            fwd = lambda: fused_attention(q.detach(), k.detach(), v.detach(), is_causal=True)  # noqa: E731
            fb = lambda: fused_attention(q, k, v, is_causal=True).backward(go)  # noqa: E731
            for fn in (fwd, fb):
                for _ in range(50):
                    fn()
            res[name] = {"fwd": statistics.median(host_us(fwd, 1000) for _ in range(3)),
                         "fwd+bwd": statistics.median(host_us(fb, 1000) for _ in range(3))}
    if args.profile:
        import cProfile
        import pstats

        with A.config_override("attention", **modes["Gluon forward + dK/dV + dQ"]):
            fb = lambda: fused_attention(q, k, v, is_causal=True).backward(go)  # noqa: E731
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(300):
                fb()
            torch.cuda.synchronize()
            prof.disable()
        print("==== profile: Gluon fwd+bwd, 300 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    sd = lambda: F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)  # noqa: E731
    sdb = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)  # noqa: E731
    for fn in (sd, sdb):
        for _ in range(50):
            fn()
    res["SDPA"] = {"fwd": statistics.median(host_us(sd, 1000) for _ in range(3)),
                   "fwd+bwd": statistics.median(host_us(sdb, 1000) for _ in range(3))}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_gluon.json"), "w") as f:
        json.dump(res, f, indent=1)
    for name, r in res.items():
        print(f"{name}: fwd {r['fwd']:.1f} us, fwd+bwd {r['fwd+bwd']:.1f} us")


if __name__ == "__main__":
    main()
