"""Host cost of the norm backward paths at 16K (session 18: do_bench of LayerNorm / RMSNorm fwd+bwd at bf16 16K read
0.21 of copy through the Gluon row backward against 0.77 by graph replay, issue9/run25_d/table_eager.log).
    python3 benchmarks/diag_norm_host.py > $OUT/diag_norm_host.txt
Per config (layer_norm config_override): µs a call of 400 back-to-back fwd+bwd calls on 8 rows (GPU time negligible,
no sync in between), the same for the backward alone (autograd.grad on a retained graph), do_bench of fwd+bwd and fwd
at 2^26 elements (fwd+bwd minus fwd as a fraction of copy), then cProfile of the Gluon path's calls."""
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
from triton.testing import do_bench

from fused_layers import FusedLayerNorm, FusedRMSNorm
from fused_layers.ops import _cpp
from fused_layers.ops.layer_norm import config_override

_cpp.extension(wait=True)  # the C++ fast path loaded first (it builds on a background thread otherwise: see bench_norm)


def per_call_us(fn, reps=400):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


for op, N in (("ln", 16384), ("rms", 16384), ("ln", 8192)):
    mod = (FusedLayerNorm if op == "ln" else FusedRMSNorm)(N, device="cuda", dtype=torch.bfloat16)
    dd = int(os.environ.get("DEVICE_DESC", "0"))  # the Gluon backward with device-side descriptors (C++ path)
    for cfg in ((dict(bwd_gluon=0), dict(bwd_gluon=1, bwd_gluon_device_desc=dd)) if N == 16384 else (dict(bwd_gluon=0),)):
        with config_override("layer_norm", **cfg):
            x = torch.randn(8, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn_like(x)
            leaves = [x, *mod.parameters()]
            fb = per_call_us(lambda: torch.autograd.grad(mod(x), leaves, dy))
            y = mod(x)
            b = per_call_us(lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True))
            xb = torch.randn(2**26 // N, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dyb = torch.randn_like(xb)
            lb = [xb, *mod.parameters()]
            t_fb = do_bench(lambda: torch.autograd.grad(mod(xb), lb, dyb), warmup=25, rep=100, return_mode="median")
            t_f = do_bench(lambda: mod(xb), warmup=25, rep=100, return_mode="median")
            frac = 3 * xb.numel() * 2 / ((t_fb - t_f) * 1e-3) / 4220e9
            print(f"{op} {N} {cfg}: host fwd+bwd {fb:.1f} us, bwd alone {b:.1f} us; do_bench fwd+bwd {t_fb*1e3:.1f} us, "
                  f"fwd {t_f*1e3:.1f} us, fwd+bwd minus fwd {frac:.3f} of copy", flush=True)
            if cfg["bwd_gluon"] and op == "ln" and os.environ.get("PROFILE"):
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(200):
                    torch.autograd.grad(y, leaves, dy, retain_graph=True)
                torch.cuda.synchronize()
                pr.disable()
                pstats.Stats(pr).sort_stats("tottime").print_stats(18)
