"""Issue 9: the host cost of the C++ fast path without a GPU, against aten's own LayerNorm on the CPU.

The extension's launches are switched off (``set_dry_run``), and a plan is registered with placeholder
kernels. Then ``ext.norm_apply`` runs everything but the launch on CPU tensors: argument conversion,
allocations, the hand-written autograd node and the engine. aten's ``F.layer_norm`` on the same tiny CPU
tensors does its real (small) compute. On the H200 host, the C++ path's LayerNorm fwd+bwd cost 40-90 us
more than aten's, and this finds where, on any machine: wall time here, instruction counts under
``valgrind --tool=callgrind`` (``--callgrind``).

    python benchmarks/diag_cpp_cpu.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fused_layers.ops import _cpp


def per_call_us(fn, n: int, rounds: int = 5) -> float:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--only", help="run one case n times (for callgrind)")
    args = ap.parse_args()
    _cpp.ENABLED = True
    ext = _cpp.extension(wait=True)
    assert ext is not None, "the extension did not build"
    ext.set_dry_run(True)
    n = 768
    fwd = ext.register_launch(0, -1, [1, 1, 1], 32, 0, "pppppf", [], 0, 0)
    bwd = ext.register_launch(0, -1, [1, 1, 1], 32, 0, "pppppp", [], 0, 0)
    red = ext.register_launch(0, -1, [1, 1, 1], 32, 0, "ppp", [], 0, 0)
    nid = ext.register_norm(fwd, bwd, red, 16, 2 * 2 * n, -1)
    x = torch.randn(8, n)
    w, b, g = torch.randn(n), torch.randn(n), torch.randn(8, n)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    x1 = x.clone().requires_grad_()
    # The whole call from Python: fused_layer_norm -> _cpp.fast_call -> norm_fast (a dry run takes CPU tensors)
    f32 = 6  # c10::ScalarType::Float
    ext.bind_norm([8, n, f32, f32, f32, -1, 2], nid)  # LayerNorm with its node
    ext.bind_norm([8, n, f32, f32, f32, -1, 0], nid)  # LayerNorm without autograd
    from fused_layers import FusedLayerNorm, fused_layer_norm

    ref_mod = torch.nn.LayerNorm(n)
    fused_mod = FusedLayerNorm(n)
    assert fused_layer_norm(xg, (n,), wg, bg).grad_fn.name() == "FusedNormBackward", "norm_fast did not answer"
    # softmax and attention, the whole call from Python, beside torch's (their small CPU compute included)
    from fused_layers import fused_attention, fused_softmax

    ext.bind_softmax([8, n, f32, -1, -1, -1, 2], ext.register_launch(0, -1, [1, 1, 1], 32, 0, "pp", [], 0, 0),
                     ext.register_launch(0, -1, [1, 1, 1], 32, 0, "ppp", [], 0, 0))
    q = torch.randn(1, 1, 128, 64, requires_grad=True)
    kk, vv = (torch.randn(1, 1, 128, 64, requires_grad=True) for _ in range(2))
    go = torch.randn_like(q)
    st = list(q.stride())
    aplan = ext.register_attention(*(ext.register_launch(0, -1, [1, 1, 1], 32, 0, kd, [], 0, 0)
                                     for kd in ("p" * 9 + "fff", "pppp", "p" * 13 + "ffff", "p" * 11 + "ffff")),
                                   st, [1, 1, 128], st, st, st)
    ext.bind_attention(q, kk, vv, True, 0.0, True, aplan, 1.0)
    assert fused_attention(q, kk, vv, is_causal=True).grad_fn.name() == "FusedAttentionBackward"
    cases = {
        "fused_softmax fwd+bwd (launches off)": lambda: fused_softmax(xg, -1).backward(g),
        "torch.softmax fwd+bwd (CPU compute included)": lambda: torch.softmax(xg, -1).backward(g),
        "fused_attention fwd+bwd, B1 H1 S128 D64 causal (launches off)":
            lambda: fused_attention(q, kk, vv, is_causal=True).backward(go),
        "SDPA fwd+bwd, same (CPU compute included)":
            lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True).backward(go),
        "functional API fwd+bwd (fused_layer_norm -> norm_fast, launches off)":
            lambda: fused_layer_norm(xg, (n,), wg, bg).backward(g),
        "functional API fwd, no grad": lambda: fused_layer_norm(x, (n,), w, b),
        "FusedLayerNorm module fwd+bwd (launches off)": lambda: fused_mod(xg).backward(g),
        "nn.LayerNorm module fwd+bwd (CPU compute included)": lambda: ref_mod(xg).backward(g),
        "aten LN fwd+bwd (CPU compute included)": lambda: F.layer_norm(xg, (n,), wg, bg).backward(g),
        "C++ node fwd+bwd (launches off)": lambda: ext.norm_apply(xg, wg, bg, 1e-5, nid).backward(g),
        "aten LN fwd, graph built": lambda: F.layer_norm(xg, (n,), wg, bg),
        "C++ node fwd, graph built (launches off)": lambda: ext.norm_apply(xg, wg, bg, 1e-5, nid),
        "aten LN fwd, no grad": lambda: F.layer_norm(x, (n,), w, b),
        "C++ infer (launches off)": lambda: ext.norm_infer(x, w, b, 1e-5, nid),
        "x * 1.0 then backward (one aten node)": lambda: (x1 * 1.0).backward(g),
        "torch.empty_like": lambda: torch.empty_like(x),
    }
    if args.only:
        fn = cases[args.only]
        for _ in range(args.calls):
            fn()
        return
    for fn in cases.values():
        for _ in range(200):
            fn()
    print(f"torch {torch.__version__}, {args.calls} calls x 5 rounds, median us per call")
    for k, fn in cases.items():
        print(f"| {k} | {per_call_us(fn, args.calls):.2f} |")


if __name__ == "__main__":
    main()
