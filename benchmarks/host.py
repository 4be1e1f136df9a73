"""host: what an eager call costs the CPU that issues it, fused against PyTorch's own op (and Liger).

    python -m benchmarks host

Tiny inputs, so that the GPU's work is negligible and the host is what is measured: (8, 768) bf16 for the
norms and softmax, (8, 1,000) and (8, 50,304) bf16 logits for the cross-entropy, B1 H1 S128 D64 bf16 for
attention (against ``F.scaled_dot_product_attention``); the rest of a decoder layer, each against the PyTorch code
a model runs for it: RoPE on B1 S128 q 8 / k 2 heads of D64 (HF's ``apply_rotary_pos_emb``), residual add + RMSNorm
on (8, 768), the gated MLP's activation and down projection (``linear(silu(gate) * up, W)``, 8 x 2,048 -> 768) and
the plain MLP's (``linear(gelu(h), W, b)``, 8 x 3,072 -> 768). ``fwd`` is a call with no input requiring grad;
``fwd+bwd`` is ``op(x).backward(g)`` with the inputs requiring grad. After a warm-up (the library's eager
C++ fast path built and each shape registered), ``--calls`` calls back to back, then one synchronize: the
wall time over the calls is the host cost per call. ``--rounds`` rounds, implementations interleaved in
each; ``host_us`` is the median over rounds with its min-max, ``vs_torch`` the median over rounds of the
in-round ratio to PyTorch's op.
"""

from __future__ import annotations

import statistics
import time

from . import utils


def add_arguments(p) -> None:
    p.add_argument("--calls", type=int, default=1000, help="back-to-back calls per measurement")
    p.add_argument("--rounds", type=int, default=11)


def cases(dev: str, smoke: bool) -> dict:
    """{(op, pass, shape): {impl: callable}}."""
    import torch
    import torch.nn.functional as F

    from fused_layers import fused_attention, fused_cross_entropy, fused_layer_norm, fused_rms_norm, fused_softmax

    dt = torch.float32 if smoke else torch.bfloat16
    x, w, b = (torch.randn(*s, device=dev, dtype=dt) for s in ((8, 768), (768,), (768,)))
    g = torch.randn(8, 768, device=dev, dtype=dt)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    q = torch.randn(1, 1, 128, 64, device=dev, dtype=dt)
    go = torch.randn_like(q)
    qg, kg, vg = (q.clone().requires_grad_() for _ in range(3))
    vocabs = (1000,) if smoke else (1000, 50304)
    logits = {v: torch.randn(8, v, device=dev, dtype=dt) for v in vocabs}
    logits_g = {v: t.clone().requires_grad_() for v, t in logits.items()}
    target = {v: torch.randint(0, v, (8,), device=dev) for v in vocabs}
    out = {
        ("layer_norm", "fwd", "8x768"): {"torch": lambda: F.layer_norm(x, (768,), w, b),
                                         "fused": lambda: fused_layer_norm(x, (768,), w, b)},
        ("layer_norm", "fwd+bwd", "8x768"): {"torch": lambda: F.layer_norm(xg, (768,), wg, bg).backward(g),
                                             "fused": lambda: fused_layer_norm(xg, (768,), wg, bg).backward(g)},
        ("rms_norm", "fwd", "8x768"): {"torch": lambda: F.rms_norm(x, (768,), w, 1e-6),
                                       "fused": lambda: fused_rms_norm(x, (768,), w, 1e-6)},
        ("rms_norm", "fwd+bwd", "8x768"): {"torch": lambda: F.rms_norm(xg, (768,), wg, 1e-6).backward(g),
                                           "fused": lambda: fused_rms_norm(xg, (768,), wg, 1e-6).backward(g)},
        ("softmax", "fwd", "8x768"): {"torch": lambda: torch.softmax(x, -1), "fused": lambda: fused_softmax(x, -1)},
        ("softmax", "fwd+bwd", "8x768"): {"torch": lambda: torch.softmax(xg, -1).backward(g),
                                          "fused": lambda: fused_softmax(xg, -1).backward(g)},
        ("attention", "fwd", "B1 H1 S128 D64 causal"): {
            "torch": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
            "fused": lambda: fused_attention(q, q, q, is_causal=True, backend="triton")},
        ("attention", "fwd+bwd", "B1 H1 S128 D64 causal"): {
            "torch": lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(go),
            "fused": lambda: fused_attention(qg, kg, vg, is_causal=True, backend="triton").backward(go)},
    }
    out.update({case: impls for case, (_, impls) in decoder_cases(dev, dt, smoke).items()})
    for v in vocabs:
        out[("cross_entropy", "fwd", f"8x{v}")] = {"torch": lambda v=v: F.cross_entropy(logits[v], target[v]),
                                                  "fused": lambda v=v: fused_cross_entropy(logits[v], target[v])}
        out[("cross_entropy", "fwd+bwd", f"8x{v}")] = {
            "torch": lambda v=v: F.cross_entropy(logits_g[v], target[v]).backward(),
            "fused": lambda v=v: fused_cross_entropy(logits_g[v], target[v]).backward()}
    if not smoke:
        _add_liger(out, x, w, b, g, xg, wg, bg)
    return out


def _rotate_half(x):
    import torch

    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def decoder_cases(dev: str, dt, smoke: bool) -> dict:
    """The decoder layer's ops that run on the library's Python path: {(op, pass, shape): (leaves, {impl:
    callable})}, each callable a forward and backward reaching the same leaves' gradients (Liger's peers on CUDA,
    where installed; ``smoke``: 16 positions and narrower MLPs, for the interpreter)."""
    import torch
    import torch.nn.functional as F

    from fused_layers import fused_activation_linear, fused_add_rms_norm, fused_gated_activation_linear, fused_rope

    def grad(*shape):
        return torch.randn(*shape, device=dev, dtype=dt, requires_grad=True)

    seq, n_gated, n_plain = (16, 256, 256) if smoke else (128, 2048, 3072)
    # q and k as an HF attention makes them: (B, S, H, D) projections viewed as (B, H, S, D)
    qs, ks = grad(1, seq, 8, 64), grad(1, seq, 2, 64)
    gq, gk = torch.randn(1, 8, seq, 64, device=dev, dtype=dt), torch.randn(1, 2, seq, 64, device=dev, dtype=dt)
    # cos and sin as HF's rotary embedding makes them: the angles' two halves equal (Liger's kernel reads one half)
    angles = torch.outer(torch.arange(seq, device=dev, dtype=torch.float32),
                         10000.0 ** (-torch.arange(0, 64, 2, device=dev, dtype=torch.float32) / 64))
    angles = torch.cat([angles, angles], dim=-1)[None]
    cos, sin = angles.cos().to(dt), angles.sin().to(dt)

    # Every implementation gets fresh q and k, as the projections make them in a model: Liger's kernel rotates them in
    # place (its forward writes the rotation over its inputs), which must not reach the leaves
    def rope_torch():  # HF's apply_rotary_pos_emb
        q, k, c, s_ = qs.clone().transpose(1, 2), ks.clone().transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1)
        torch.autograd.backward([q * c + _rotate_half(q) * s_, k * c + _rotate_half(k) * s_], [gq, gk])

    def rope_with(fn):
        return lambda: torch.autograd.backward(
            list(fn(qs.clone().transpose(1, 2), ks.clone().transpose(1, 2), cos, sin))[:2], [gq, gk])

    x, r, w = grad(8, 768), grad(8, 768), grad(768)
    gy = torch.randn(8, 768, device=dev, dtype=dt)

    def add_norm_torch():
        h = x + r
        torch.autograd.backward([h, F.rms_norm(h, (768,), w, 1e-6)], [gy, gy])

    gate, up, wd = grad(8, n_gated), grad(8, n_gated), grad(768, n_gated)
    hm, wp, bp = grad(8, n_plain), grad(768, n_plain), grad(768)
    rope = ("rope", "fwd+bwd", f"B1 S{seq} Hq8 Hk2 D64")
    add_norm = ("residual_rms_norm", "fwd+bwd", "8x768")
    gated = ("gated_linear", "fwd+bwd", f"8x{n_gated}->768")
    out = {
        rope: ([qs, ks], {"torch": rope_torch, "fused": rope_with(fused_rope)}),
        add_norm: ([x, r, w], {
            "torch": add_norm_torch,
            "fused": lambda: torch.autograd.backward(list(fused_add_rms_norm(x, r, w, 1e-6)), [gy, gy])}),
        gated: ([gate, up, wd], {
            "torch": lambda: F.linear(F.silu(gate) * up, wd).backward(gy),
            "fused": lambda: fused_gated_activation_linear(gate, up, wd, None, "silu").backward(gy)}),
        ("act_linear", "fwd+bwd", f"8x{n_plain}->768"): ([hm, wp, bp], {
            "torch": lambda: F.linear(F.gelu(hm), wp, bp).backward(gy),
            "fused": lambda: fused_activation_linear(hm, wp, bp, "gelu").backward(gy)}),
    }
    if dev != "cuda":
        return out
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception:  # noqa: BLE001 - Liger is optional
        return out
    # (Liger's SwiGLU is the activation alone: its MLP module calls the down projection after it)
    out[rope][1]["liger"] = rope_with(LigerRopeFunction.apply)
    out[add_norm][1]["liger"] = (
        lambda: torch.autograd.backward(list(LigerFusedAddRMSNormFunction.apply(x, r, w, 1e-6)), [gy, gy]))
    out[gated][1]["liger"] = lambda: F.linear(LigerSiLUMulFunction.apply(gate, up), wd).backward(gy)
    return out


def _add_liger(out: dict, x, w, b, g, xg, wg, bg) -> None:
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
    except Exception:  # noqa: BLE001 - Liger is optional
        return
    out[("layer_norm", "fwd", "8x768")]["liger"] = lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5)
    out[("layer_norm", "fwd+bwd", "8x768")]["liger"] = (
        lambda: LigerLayerNormFunction.apply(xg, wg, bg, 1e-5).backward(g))
    out[("rms_norm", "fwd", "8x768")]["liger"] = lambda: LigerRMSNormFunction.apply(x, w, 1e-6)
    out[("rms_norm", "fwd+bwd", "8x768")]["liger"] = lambda: LigerRMSNormFunction.apply(xg, wg, 1e-6).backward(g)
    out[("softmax", "fwd", "8x768")]["liger"] = lambda: LigerSoftmaxFunction.apply(x)
    out[("softmax", "fwd+bwd", "8x768")]["liger"] = lambda: LigerSoftmaxFunction.apply(xg).backward(g)


def host_us(fn, calls: int, cuda: bool) -> float:
    import torch

    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def run(args) -> int:
    utils.require_cuda("host", args.smoke)
    cuda = not args.smoke
    env = utils.environment()
    table = cases("cpu" if args.smoke else "cuda", args.smoke)
    calls = 2 if args.smoke else args.calls
    rounds = 2 if args.smoke else args.rounds
    for impls in table.values():  # warm-up: JIT, plans, the C++ fast path's build and registration
        for fn in impls.values():
            for _ in range(3):
                fn()
    utils.wait_for_fast_path()
    for impls in table.values():
        for fn in impls.values():
            host_us(fn, 20 if cuda else 1, cuda)
    rows = []
    for (op, pass_, shape), impls in table.items():
        per: dict[str, list[float]] = {n: [] for n in impls}
        for _ in range(rounds):
            for n, fn in impls.items():
                per[n].append(host_us(fn, calls, cuda))
        for n, ts in per.items():
            med, lo, hi = utils.median_lo_hi(ts)
            ratio = statistics.median(t / p for t, p in zip(ts, per["torch"]))
            rows.append(dict(env, op=op, **{"pass": pass_}, dtype="fp32" if args.smoke else "bf16", shape=shape,
                             impl=n, host_us=med, host_us_lo=lo, host_us_hi=hi, vs_torch=ratio, calls=calls,
                             rounds=rounds, note="smoke (CPU)" if args.smoke else ""))
            print(f"  {op:>14} {pass_:>7} {shape:>22} {n:>6}: {med:8.1f} us [{lo:.1f}-{hi:.1f}]  {ratio:.2f}x torch",
                  flush=True)
    utils.write_results(args, "host", rows)
    return 0
