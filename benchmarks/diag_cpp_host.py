"""Issue 9 diagnosis: where the host time of the C++ fast path goes (LayerNorm and softmax, (8, 768) bf16).

``bench_host.py --cpp`` (session 5, call 2) measured the C++ autograd node at nearly the Python path's cost
(LayerNorm fwd+bwd 240 us against 244, aten 148).  This separates: the Python wrapper in front of the
extension, the C++ node's forward and backward, the autograd engine, and whether the GPU is the bound
(time to enqueue vs time to finish), and, with the extension's launches switched off (``set_dry_run``),
what everything but ``cuLaunchKernel`` costs.  It also prints torch.profiler's CPU-op table of each variant.

    FUSED_LAYERS_CPP=1 python benchmarks/diag_cpp_host.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("FUSED_LAYERS_CPP", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fused_layers import fused_layer_norm, fused_softmax  # noqa: E402
from fused_layers.ops import _cpp  # noqa: E402
from fused_layers.ops import layer_norm as ln_ops  # noqa: E402


def timed(fn, n):
    """(enqueue us, finish us) per call: the host loop alone, and until the GPU is done."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(8, 768, device=dev, dtype=dt)
    w, b = torch.randn(768, device=dev, dtype=dt), torch.randn(768, device=dev, dtype=dt)
    g = torch.randn_like(x)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    ext = _cpp.extension(wait=True)
    assert ext is not None, "the extension did not build"
    for _ in range(3):  # compile, bind, register
        fused_layer_norm(xg, (768,), wg, bg).backward(g)
        fused_layer_norm(x, (768,), w, b)
        fused_softmax(xg, -1).backward(g)
        fused_softmax(x, -1)
    plan = ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, 1, True, True, False, True, False)
    nid = plan.cpp.get((0, dt, dt, None))
    iplan = ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, 1, True, True, False, False, False)
    inid = iplan.cpp.get((0, dt, dt, None))
    print("norm plan ids: grad", nid, "infer", inid, "grad_fn", type(fused_layer_norm(xg, (768,), wg, bg).grad_fn).__name__)
    y = fused_softmax(xg, -1)
    print("softmax grad_fn", type(y.grad_fn).__name__)
    x1 = xg.detach().clone().requires_grad_()
    cases = {
        "aten LN fwd+bwd": lambda: F.layer_norm(xg, (768,), wg, bg).backward(g),
        "fused LN fwd+bwd (functional API, C++ on)": lambda: fused_layer_norm(xg, (768,), wg, bg).backward(g),
        "ext.norm_apply fwd+bwd (no wrapper)": lambda: ext.norm_apply(xg, wg, bg, 1e-5, nid).backward(g),
        "ext.norm_fast fwd+bwd (key lookup in C++)": lambda: ext.norm_fast(xg, (768,), wg, bg, 1e-5, False).backward(g),
        "ext.norm_fast infer": lambda: ext.norm_fast(x, (768,), w, b, 1e-5, False),
        "ext.softmax_fast fwd+bwd": lambda: ext.softmax_fast(xg, -1).backward(g),
        "ext.norm_apply fwd+bwd, x only requires grad": lambda: ext.norm_apply(x1, w, b, 1e-5, nid).backward(g),
        "aten LN fwd+bwd, x only requires grad": lambda: F.layer_norm(x1, (768,), w, b).backward(g),
        "ext.norm_apply fwd (graph built, no bwd)": lambda: ext.norm_apply(xg, wg, bg, 1e-5, nid),
        "aten LN fwd (graph built, no bwd)": lambda: F.layer_norm(xg, (768,), wg, bg),
        "fused LN fwd (graph built, no bwd)": lambda: fused_layer_norm(xg, (768,), wg, bg),
        "ext.norm_infer": lambda: ext.norm_infer(x, w, b, 1e-5, inid),
        "fused LN infer (wrapper)": lambda: fused_layer_norm(x, (768,), w, b),
        "aten LN infer": lambda: F.layer_norm(x, (768,), w, b),
        "x*1.0 backward (one aten node)": lambda: (x1 * 1.0).backward(g),
        "aten softmax fwd+bwd": lambda: torch.softmax(xg, -1).backward(g),
        "fused softmax fwd+bwd (cpp)": lambda: fused_softmax(xg, -1).backward(g),
        "torch.empty": lambda: torch.empty((8, 768), device=dev, dtype=dt),
    }
    def dry(fn):  # the same call with the extension's launches switched off: everything but cuLaunchKernel
        def run():
            ext.set_dry_run(True)
            try:
                fn()
            finally:
                ext.set_dry_run(False)

        return run

    cases["ext.norm_apply fwd+bwd, launches off (dry run)"] = dry(cases["ext.norm_apply fwd+bwd (no wrapper)"])
    cases["ext.norm_infer, launches off (dry run)"] = dry(cases["ext.norm_infer"])
    res = {k: [] for k in cases}
    for fn in cases.values():
        for _ in range(50):
            fn()
    for _ in range(args.rounds):
        for k, fn in cases.items():
            res[k].append(timed(fn, args.calls))
    lines = ["| case | enqueue us | finish us |", "|---|---|---|"]
    out = {}
    for k, v in res.items():
        e, f = statistics.median(a for a, _ in v), statistics.median(b for _, b in v)
        out[k] = (e, f)
        lines.append(f"| {k} | {e:.1f} | {f:.1f} |")
    print("\n".join(lines))
    from torch.profiler import ProfilerActivity, profile

    prof_txt = []
    for k in ("aten LN fwd+bwd", "ext.norm_apply fwd+bwd (no wrapper)", "fused softmax fwd+bwd (cpp)", "aten softmax fwd+bwd"):
        fn = cases[k]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(100):
                fn()
            torch.cuda.synchronize()
        t = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        prof_txt.append(f"## {k}\n{t}\n")
    with open(os.path.join(args.out, "diag_cpp_host.md"), "w") as f:
        f.write("\n".join(lines) + "\n\n" + "\n".join(prof_txt))
    with open(os.path.join(args.out, "diag_cpp_host.json"), "w") as f:
        json.dump(out, f, indent=1)
    print("\n".join(prof_txt))


if __name__ == "__main__":
    main()
