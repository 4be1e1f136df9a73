"""torch.profiler of the norm fwd+bwd host path at 16K against 8K (session 18: a fwd+bwd call of 8 rows costs ~675 us
of host at 16K, persistent or Gluon backward, against ~177 us at 8K; diag_norm_host.py).  CPU self time by op / CUDA
runtime call, 50 calls a case after warm-up.   python3 benchmarks/diag_norm_host_prof.py > $OUT/diag_norm_host_prof.txt"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
from torch.profiler import ProfilerActivity, profile

from fused_layers import FusedLayerNorm
from fused_layers.ops import _cpp
from fused_layers.ops.layer_norm import config_override

_cpp.extension(wait=True)
for n, cfg in ((16384, dict(bwd_gluon=0)), (16384, dict(bwd_gluon=1)), (8192, dict(bwd_gluon=0))):
    mod = FusedLayerNorm(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    leaves = [x, *mod.parameters()]
    with config_override("layer_norm", **cfg):
        for _ in range(30):
            torch.autograd.grad(mod(x), leaves, dy)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                torch.autograd.grad(mod(x), leaves, dy)
            torch.cuda.synchronize()
    print(f"\n## {n} {cfg}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
