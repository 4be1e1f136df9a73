"""Host cost per call: fused-layers against PyTorch's own op and Liger-Kernel (GPU).

    python benchmarks/bench_host.py --out benchmarks/results           # writes host_<gpu>.json / .md

Method (issue 9): tiny inputs, so that GPU time is negligible and the CPU that issues the work is what is
measured: (8, 768) bf16 for the norms and softmax, B1 H1 S128 D64 bf16 for attention, (8, 1000) and (8, 50304)
bf16 logits for the cross-entropy (against ``F.cross_entropy`` on the same bf16 logits).  After a warm-up,
N back-to-back calls with no synchronization in between, then one ``torch.cuda.synchronize()``; the
wall time divided by N is the host cost per call.  "fwd" is a call with no input requiring grad (no
autograd graph); "fwd+bwd" is ``y = op(x); y.backward(g)`` with x (and the parameters) requiring grad.
Each figure is the median of ``--rounds`` rounds, providers interleaved within a round, so a slow phase
of the machine hits all of them alike.  The ratio column is fused / PyTorch (target <= 1.1).

Also measured for reference: a bare Triton JIT launch of a trivial kernel, the same kernel through
``fused_layers.ops._library.Kernel`` (the bound launch every op uses), and ``torch.empty``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from fused_layers import fused_attention, fused_cross_entropy, fused_layer_norm, fused_rms_norm, fused_softmax  # noqa: E402
from fused_layers.ops._library import Kernel  # noqa: E402


@triton.jit
def _trivial_kernel(X, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(X + offs, tl.load(X + offs, mask=offs < N, other=0.0) + 1.0, mask=offs < N)


def host_us(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def liger_providers():
    out = {}
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        out["layer_norm"] = lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, 1e-5)
    except Exception as e:  # noqa: BLE001
        print("liger layer_norm unavailable:", type(e).__name__, e)
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        out["rms_norm"] = lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6)
    except Exception as e:  # noqa: BLE001
        print("liger rms_norm unavailable:", type(e).__name__, e)
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        out["softmax"] = lambda x: LigerSoftmaxFunction.apply(x)
    except Exception as e:  # noqa: BLE001
        print("liger softmax unavailable:", type(e).__name__, e)
    return out


def cases(cpp: bool = False):
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(8, 768, device=dev, dtype=dt)
    w = torch.randn(768, device=dev, dtype=dt)
    b = torch.randn(768, device=dev, dtype=dt)
    g = torch.randn(8, 768, device=dev, dtype=dt)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    q = torch.randn(1, 1, 128, 64, device=dev, dtype=dt)
    go = torch.randn_like(q)
    qg, kg, vg = (q.clone().requires_grad_() for _ in range(3))
    # cross-entropy: (8, 1000) (single-block rows) and (8, 50304) (GPT-2's vocabulary: the wide rows' persistent
    # kernel, as each chunk of the demo's linear cross-entropy takes it)
    ce_in = {v: torch.randn(8, v, device=dev, dtype=dt) for v in (1000, 50304)}
    ce_g = {v: t.clone().requires_grad_() for v, t in ce_in.items()}
    ce_t = {v: torch.randint(0, v, (8,), device=dev) for v in ce_in}
    liger = liger_providers()

    def fb(f):
        return lambda: f().backward(g)

    def fba(f):
        return lambda: f().backward(go)

    table = {
        "layer_norm": {
            "fwd": {"pytorch": lambda: F.layer_norm(x, (768,), w, b), "fused": lambda: fused_layer_norm(x, (768,), w, b)},
            "fwd+bwd": {"pytorch": fb(lambda: F.layer_norm(xg, (768,), wg, bg)),
                        "fused": fb(lambda: fused_layer_norm(xg, (768,), wg, bg))},
        },
        "rms_norm": {
            "fwd": {"pytorch": lambda: F.rms_norm(x, (768,), w, 1e-6), "fused": lambda: fused_rms_norm(x, (768,), w, 1e-6)},
            "fwd+bwd": {"pytorch": fb(lambda: F.rms_norm(xg, (768,), wg, 1e-6)),
                        "fused": fb(lambda: fused_rms_norm(xg, (768,), wg, 1e-6))},
        },
        "softmax": {
            "fwd": {"pytorch": lambda: torch.softmax(x, -1), "fused": lambda: fused_softmax(x, -1)},
            "fwd+bwd": {"pytorch": fb(lambda: torch.softmax(xg, -1)), "fused": fb(lambda: fused_softmax(xg, -1))},
        },
        **{f"cross_entropy_{v}": {
            "fwd": {"pytorch": lambda v=v: F.cross_entropy(ce_in[v], ce_t[v]),
                    "fused": lambda v=v: fused_cross_entropy(ce_in[v], ce_t[v])},
            "fwd+bwd": {"pytorch": lambda v=v: F.cross_entropy(ce_g[v], ce_t[v]).backward(),
                        "fused": lambda v=v: fused_cross_entropy(ce_g[v], ce_t[v]).backward()},
        } for v in ce_in},
        "attention": {
            "fwd": {"pytorch": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
                    "fused": lambda: fused_attention(q, q, q, is_causal=True)},
            "fwd+bwd": {"pytorch": fba(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)),
                        "fused": fba(lambda: fused_attention(qg, kg, vg, is_causal=True))},
        },
    }
    from fused_layers.ops import _cpp

    _cpp.ENABLED = False  # the "fused" column is the Python path (FUSED_LAYERS_CPP=0)
    if cpp:  # the same fused calls through the C++ fast path (fused_layers/ops/_cpp.py), side by side

        _cpp.ENABLED = True
        _cpp.extension(wait=True)  # built (or loaded from torch's cache) before anything is timed
        _cpp.ENABLED = False  # the "fused" column stays the Python path (FUSED_LAYERS_CPP=1 or not)

        def with_cpp(fn):
            def run():
                _cpp.ENABLED = True
                try:
                    return fn()
                finally:
                    _cpp.ENABLED = False

            return run

        for op in ("layer_norm", "rms_norm", "softmax", "attention"):
            for part in table[op].values():
                part["fused_cpp"] = with_cpp(part["fused"])
    if "layer_norm" in liger:
        f = liger["layer_norm"]
        table["layer_norm"]["fwd"]["liger"] = lambda f=f: f(x, w, b)
        table["layer_norm"]["fwd+bwd"]["liger"] = fb(lambda f=f: f(xg, wg, bg))
    if "rms_norm" in liger:
        f = liger["rms_norm"]
        table["rms_norm"]["fwd"]["liger"] = lambda f=f: f(x, w)
        table["rms_norm"]["fwd+bwd"]["liger"] = fb(lambda f=f: f(xg, wg))
    if "softmax" in liger:
        f = liger["softmax"]
        table["softmax"]["fwd"]["liger"] = lambda f=f: f(x)
        table["softmax"]["fwd+bwd"]["liger"] = fb(lambda f=f: f(xg))
    buf = torch.randn(1024, device=dev)
    bound = Kernel(_trivial_kernel, (1,), BLOCK=1024, num_warps=4)
    table["reference"] = {
        "launch": {
            "triton_jit": lambda: _trivial_kernel[(1,)](buf, 1000, BLOCK=1024, num_warps=4),
            "bound_kernel": lambda: bound(buf, 1000),
            "torch_empty": lambda: torch.empty((8, 768), device=dev, dtype=dt),
            "torch_add_": lambda: buf.add_(1.0),
        }
    }
    return table


def breakdown(calls: int, rounds: int) -> dict[str, float]:
    """Where LayerNorm fwd+bwd's host time goes (us per call, median of ``rounds``), ours against PyTorch's
    pieces: the launchers alone, the autograd / Python path with every Triton launch stubbed out, the
    allocations and launches it makes, and PyTorch's native forward and backward called without autograd."""
    from fused_layers.ops import _library
    from fused_layers.ops.layer_norm import norm_backward, norm_forward

    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(8, 768, device=dev, dtype=dt)
    w, b = torch.randn(768, device=dev, dtype=dt), torch.randn(768, device=dev, dtype=dt)
    g = torch.randn_like(x)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    y, stats = norm_forward(x, w, b, 1, 1e-5, False)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, (768,), w, b, 1e-5)
    cases = {
        "ours: fwd launcher (norm_forward: 2 allocations, 1 launch)": lambda: norm_forward(x, w, b, 1, 1e-5, False),
        "ours: bwd launcher (norm_backward: 4 allocations, 2 launches)": lambda: norm_backward(g, x, w, b, stats, 1, False),
        "ours: fwd+bwd, every Triton launch stubbed (autograd + Python + allocations)":
            lambda: fused_layer_norm(xg, (768,), wg, bg).backward(g),
        "ours: fwd+bwd (as in the table)": lambda: fused_layer_norm(xg, (768,), wg, bg).backward(g),
        "pytorch: aten.native_layer_norm (no autograd)": lambda: torch.ops.aten.native_layer_norm(x, (768,), w, b, 1e-5),
        "pytorch: aten.native_layer_norm_backward (no autograd)":
            lambda: torch.ops.aten.native_layer_norm_backward(g, x, (768,), mean, rstd, w, b, [True, True, True]),
        "pytorch: fwd+bwd (as in the table)": lambda: F.layer_norm(xg, (768,), wg, bg).backward(g),
        "torch.empty (8, 768) bf16": lambda: torch.empty((8, 768), device=dev, dtype=dt),
        "autograd: y = x * 1.0; y.backward(g) (one C++ node)": lambda: (xg * 1.0).backward(g),
    }
    stub = "ours: fwd+bwd, every Triton launch stubbed (autograd + Python + allocations)"
    real_call = _library.Kernel.__call__
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        for _ in range(20):
            fn()
    for _ in range(rounds):
        for name, fn in cases.items():
            if name == stub:
                _library.Kernel.__call__ = lambda self, *a: None
            try:
                samples[name].append(host_us(fn, calls))
            finally:
                _library.Kernel.__call__ = real_call
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="cProfile each fused fwd+bwd (top functions by own time)")
    ap.add_argument("--breakdown", action="store_true", help="also: where LayerNorm fwd+bwd's host time goes")
    ap.add_argument("--cpp", action=argparse.BooleanOptionalAction, default=True,
                    help="the fused calls through the C++ fast path (the default path, fused_layers/ops/_cpp.py) beside the "
                         "Python path (--no-cpp: the Python path only)")
    args = ap.parse_args()
    table = cases(cpp=args.cpp)
    if args.profile:
        import cProfile
        import pstats

        for op in ("layer_norm", "softmax", "attention"):
            fn = table[op]["fwd+bwd"]["fused"]
            for _ in range(50):
                fn()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                fn()
            prof.disable()
            print(f"==== profile: {op} fwd+bwd, 2000 calls")
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    for op in table.values():  # warm-up: compiles, plans, allocator
        for part in op.values():
            for fn in part.values():
                for _ in range(50):
                    fn()
    torch.cuda.synchronize()
    samples = {op: {p: {k: [] for k in part} for p, part in parts.items()} for op, parts in table.items()}
    for _ in range(args.rounds):
        for op, parts in table.items():
            for p, part in parts.items():
                for k, fn in part.items():
                    samples[op][p][k].append(host_us(fn, args.calls))
    res = {op: {p: {k: statistics.median(v) for k, v in part.items()} for p, part in parts.items()}
           for op, parts in samples.items()}
    spread = {op: {p: {k: (min(v), max(v)) for k, v in part.items()} for p, part in parts.items()}
              for op, parts in samples.items()}
    # Paired ratios: each round times every provider back to back, so the median of the per-round ratios is
    # steadier than the ratio of medians when this host's speed drifts between rounds (20-30% on the H200 host).
    paired = {op: {p: {k: statistics.median(a / b for a, b in zip(v, part["pytorch"])) for k, v in part.items()
                       if k != "pytorch"} for p, part in parts.items() if "pytorch" in part}
              for op, parts in samples.items() if op != "reference"}
    name = torch.cuda.get_device_name().replace(" ", "_")
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                calls=args.calls, rounds=args.rounds, command="python " + " ".join(sys.argv))
    os.makedirs(args.out, exist_ok=True)
    pieces = breakdown(args.calls, args.rounds) if args.breakdown else None
    with open(os.path.join(args.out, "host_h200.json" if "H200" in name else f"host_{name}.json"), "w") as f:
        json.dump(dict(meta=meta, median_us=res, min_max_us=spread, paired_ratio=paired, breakdown_us=pieces), f, indent=1)
    lines = [f"# Host cost per call (us), {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}", "",
             f"`{meta['command']}`: {args.calls} back-to-back calls then one sync, median of {args.rounds} rounds; `/ PyTorch`: the median over rounds of the ratio within a round."
             + (" `fused C++`: the same calls through the C++ fast path (fused_layers/ops/_cpp.py)." if args.cpp else ""),
             "", "| op | part | PyTorch | fused, Python path | / PyTorch | fused C++ (default) | / PyTorch | Liger |",
             "|---|---|---|---|---|---|---|---|"]
    for op, parts in res.items():
        if op == "reference":
            continue
        for p, r in parts.items():
            lig = f"{r['liger']:.1f}" if "liger" in r else "-"
            pr = paired[op][p]
            cxx = f"{r['fused_cpp']:.1f} | {pr['fused_cpp']:.2f}" if "fused_cpp" in r else "- | -"
            lines.append(f"| {op} | {p} | {r['pytorch']:.1f} | {r['fused']:.1f} | {pr['fused']:.2f} | {cxx} | {lig} |")
    lines += ["", "| reference | us |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in res["reference"]["launch"].items()]
    if pieces:
        lines += ["", "Where LayerNorm fwd+bwd's host time goes ((8, 768) bf16, us per call, median of rounds):", "",
                  "| piece | us |", "|---|---|"]
        lines += [f"| {k} | {v:.1f} |" for k, v in pieces.items()]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "host_h200.md" if "H200" in name else f"host_{name}.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
