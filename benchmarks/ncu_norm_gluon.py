"""Norm backward launches under ncu, one profiled region each (benchmarks/gpu_session25_c.sh): bf16, 2^26 elements,
warmed up first, then one backward between cudaProfilerStart / Stop per case.
    ncu --profile-from-start off --kernel-name regex:_norm_bwd ... python3 benchmarks/ncu_norm_gluon.py
Cases (op, width, config_override of layer_norm): LayerNorm / RMSNorm 16K through the Gluon row backward and its
variants, and LayerNorm 16K through the default persistent kernel."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch

from fused_layers import FusedLayerNorm, FusedRMSNorm
from fused_layers.ops.layer_norm import config_override

CASES = [  # (session 18: the Gluon row backward, its dB-in-shared-memory variant, RMSNorm, the persistent kernel)
    ("ln", 16384, dict(bwd_gluon=1)),
    ("ln", 16384, dict(bwd_gluon=1, bwd_gluon_db_smem=1)),
    ("rms", 16384, dict(bwd_gluon=1)),
    ("ln", 16384, dict(bwd_gluon=0)),
]
if os.environ.get("NCU_CASES") == "session19":  # LayerNorm's smem_sums default beside the form without it, RMSNorm
    CASES = [("ln", 16384, dict(bwd_gluon=1)), ("ln", 16384, dict(bwd_gluon=1, bwd_gluon_smem_sums=0)),
             ("rms", 16384, dict(bwd_gluon=1))]
for op, n, cfg in CASES:
    mod = (FusedLayerNorm if op == "ln" else FusedRMSNorm)(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2**26 // n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    leaves = [x, *mod.parameters()]
    with config_override("layer_norm", **cfg):
        y = mod(x)
        for _ in range(3):
            torch.autograd.grad(y, leaves, dy, retain_graph=True)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.autograd.grad(y, leaves, dy, retain_graph=True)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(op, n, cfg, "profiled", flush=True)
