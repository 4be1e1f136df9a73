"""Issue 13's 'show why': Nsight Compute counters of our attention kernels beside cuDNN's, same inputs.
Warm-up (Triton JIT, cuDNN plan) happens outside the profiled range; then, inside
torch.cuda.profiler.start()/stop(), one forward+backward of ours and one of cuDNN SDPA per case.
    ncu --clock-control none --profile-from-start off --section ... python benchmarks/diag_attention_ncu.py
Cases: D128 S4096 non-causal (ours/cuDNN fwd 0.75, bwd 0.81) and D64 S1024 causal (0.81 / 0.96), bf16, H16,
B*S = 16384 (the bench_attention table).  Other cases: ``python benchmarks/diag_attention_ncu.py 64,1024,1 128,1024,0``
(D,S,causal each)."""
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from fused_layers.ops.attention import fused_attention

from ncu_summary import CASES, parse_cases  # (the summary's defaults, so the two agree)

if len(sys.argv) > 1:
    CASES = parse_cases(sys.argv[1:])

def make(D, S):
    B = 16384 // S
    return [torch.randn(B, 16, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]

def ours(q, k, v, causal):
    o = fused_attention(q, k, v, is_causal=causal); o.backward(torch.randn_like(o))

def cudnn(q, k, v, causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal); o.backward(torch.randn_like(o))

inputs = {c: make(c[0], c[1]) for c in CASES}
for c, (q, k, v) in inputs.items():
    for _ in range(3):
        ours(q, k, v, c[2]); cudnn(q, k, v, c[2])
torch.cuda.synchronize()
torch.cuda.profiler.start()
for c, (q, k, v) in inputs.items():
    torch.cuda.nvtx.range_push(f"ours_D{c[0]}_S{c[1]}_c{int(c[2])}"); ours(q, k, v, c[2]); torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_push(f"cudnn_D{c[0]}_S{c[1]}_c{int(c[2])}"); cudnn(q, k, v, c[2]); torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("done")
