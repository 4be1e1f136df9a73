"""Issue 13: can dQ be accumulated inside the dK / dV kernel with fp32 atomics on the H200?  Times the atomics alone:
a Triton kernel with the dK / dV kernel's grid (a program per BLOCK_N keys and head) that adds a [BLOCK_M, D] fp32
tile into dQ for every query block it visits (causal: from its diagonal), with nothing else to do, beside the default
backward (delta + Gluon dK / dV + Triton dQ) and cuDNN's backward (fwd+bwd minus fwd), do_bench medians, bf16, H16,
B x S = 16K.  If the atomics alone take most of cuDNN's backward time, a fused dQ by atomics cannot reach it.
    python3 benchmarks/diag_dq_atomics.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _dq_red_kernel(
    DQ,  # fp32 (B*H, S, D) contiguous: the dQ accumulator
    S,  # sequence length
    D: tl.constexpr,  # head dim
    BLOCK_M: tl.constexpr,  # query rows a step (one atomic tile)
    BLOCK_N: tl.constexpr,  # keys a program (the grid's first dim: S / BLOCK_N)
    CAUSAL: tl.constexpr,
):
    n0 = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    val = rows[:, None].to(tl.float32) * 1e-3 + cols[None, :].to(tl.float32) * 1e-6 + n0.to(tl.float32)
    base = DQ + bh * S * D
    lo = n0 if CAUSAL else 0  # causal: query blocks from this key block's diagonal on
    for m0 in range(lo, S, BLOCK_M):
        tl.atomic_add(base + (m0 + rows)[:, None] * D + cols[None, :], val, sem="relaxed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from triton.testing import do_bench
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from fused_layers.ops import attention as at

    rows = []
    for S in (1024, 4096, 16384):
        for D in (64, 128):
            for causal in (False, True):
                B, H = max(1, 16384 // S), 16
                q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                scale = 1.0 / math.sqrt(D)
                out, lse = at.attention_forward(q, k, v, None, None, None, S, S, causal, scale)
                ours = do_bench(lambda: at.attention_backward(do, q, k, v, out, lse, None, None, None, S, S, causal, scale),
                                warmup=25, rep=100, return_mode="median")

                def cudnn_fwd():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

                def cudnn_fb():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do)

                cud = (do_bench(cudnn_fb, warmup=25, rep=100, return_mode="median")
                       - do_bench(cudnn_fwd, warmup=25, rep=100, return_mode="median"))
                res = dict(S=S, D=D, causal=causal, B=B, ours_bwd_ms=round(ours, 4), cudnn_bwd_ms=round(cud, 4))
                dq = torch.zeros(B * H, S, D, device="cuda", dtype=torch.float32)
                for bm, bn in ((64, 64), (64, 128)):
                    fn = lambda: _dq_red_kernel[(S // bn, B * H)](dq, S, D=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal,  # noqa: E731
                                                                 num_warps=4)
                    fn()
                    torch.cuda.synchronize()
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    res[f"atomics {bm}x{bn} ms"] = round(ms, 4)
                    res[f"atomics {bm}x{bn} / cudnn bwd"] = round(ms / cud, 3)
                rows.append(res)
                print(json.dumps(res), flush=True)
    with open(os.path.join(args.out, "dq_atomics.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
