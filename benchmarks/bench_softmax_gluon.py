"""Issue 10: the TMA wide-row softmax forward (fused_layers/ops/softmax_gluon.py) beside the default fused forward,
torch.softmax and torch.compile, H200, 2^26 elements, widths 32K-256K, fraction of the 4.22 TB/s copy ceiling for one
read + one write; do_bench and CUDA-graph replay (the Gluon launch is Python: graph replay shows the kernel alone).
    python3 benchmarks/bench_softmax_gluon.py --out DIR [--configs "16,256,8,2,4,2;..."]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import triton

from fused_layers import fused_softmax
from fused_layers.ops import softmax_gluon as SG

COPY = 4.22e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--widths", default="32768,50304,65536,131072,262144")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--configs", default="")
    ap.add_argument("--elements", type=int, default=2**26)
    ap.add_argument("--ce", action="store_true", help="cross-entropy instead: 8,192 rows, loss + gradient")
    ap.add_argument("--bwd", action="store_true", help="the softmax backward instead (read y, dy; write dx)")
    ap.add_argument("--peers", default="torch,compile,fused", help="which peers to time beside the TMA kernels")
    args = ap.parse_args()
    if args.ce:
        return ce(args)
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";") if c] or [None]
    compiled = torch.compile(lambda t: torch.softmax(t, dim=-1))
    rows = []
    for dname in args.dtypes.split(","):
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dname]
        for n in (int(w) for w in args.widths.split(",")):
            m = max(1, args.elements // n)
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 4
            if args.bwd:
                from fused_layers.ops.softmax import softmax_backward

                y = torch.softmax(x.float(), dim=-1).to(dtype)
                dy = torch.randn_like(y)
                ref = torch._softmax_backward_data(dy.float(), y.float(), 1, torch.float32)
                nbytes = 3 * x.numel() * x.element_size()
                cands = {"torch": lambda: torch._softmax_backward_data(dy, y, 1, dtype),
                         "fused": lambda: softmax_backward(y, dy, 1)}
                for cfg in configs:
                    cands[f"tma{'' if cfg is None else list(cfg)}"] = (lambda c=cfg: SG.softmax_backward_tma(y, dy, c))
            else:
                ref = torch.softmax(x.float(), dim=-1)
                nbytes = 2 * x.numel() * x.element_size()
                cands = {"torch": lambda: torch.softmax(x, dim=-1), "compile": lambda: compiled(x),
                         "fused": lambda: fused_softmax(x, -1)}
                for cfg in configs:
                    cands[f"tma{'' if cfg is None else list(cfg)}"] = (lambda c=cfg: SG.softmax_forward_tma(x, c))
            line = {"dtype": dname, "rows": m, "n": n}
            peers = set(args.peers.split(","))
            cands = {k: v for k, v in cands.items() if k.startswith("tma") or k in peers}
            for name, fn in cands.items():
                try:
                    err = (fn().float() - ref).abs().max().item()
                    t = triton.testing.do_bench(fn, warmup=50, rep=200)
                    g = triton.testing.do_bench_cudagraph(fn, rep=200)
                    line[name] = {"ms": t, "graph_ms": g, "frac": nbytes / t / 1e-3 / COPY,
                                  "graph_frac": nbytes / g / 1e-3 / COPY, "max_err": err}
                except Exception as e:  # noqa: BLE001
                    line[name] = {"error": str(e)[-300:]}
            rows.append(line)
            print(dname, n, " | ".join(f"{k} {v['frac']:.3f}/{v['graph_frac']:.3f}{' WRONG' if v['max_err'] > 0.02 else ''}"
                                      if "frac" in v else f"{k} ERR {v['error'][-120:]}"
                                      for k, v in line.items() if isinstance(v, dict)), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "softmax_gluon_bwd.json" if args.bwd else "softmax_gluon.json"), "w") as f:
        json.dump(rows, f, indent=1)


def ce(args):
    """Issue 10's cross-entropy table: 8,192 rows of bf16 logits, loss + gradient (one read, one write)."""
    import torch.nn.functional as F

    from fused_layers import fused_cross_entropy

    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";") if c] or [None]
    rows = []
    for n in (int(w) for w in args.widths.split(",")):
        m = 8192
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
        t = torch.randint(0, n, (m,), device="cuda")
        xr = x.detach().requires_grad_()
        nbytes = 2 * x.numel() * x.element_size()

        def fused():
            xr.grad = None
            fused_cross_entropy(xr, t).backward()

        def float_ref():
            xr.grad = None
            F.cross_entropy(xr.float(), t).backward()

        cands = {"float": float_ref, "fused": fused}
        for cfg in configs:
            cands[f"tma{'' if cfg is None else list(cfg)}"] = (lambda c=cfg: SG.cross_entropy_tma(x, t, config=c))
        line = {"n": n, "rows": m}
        for name, fn in cands.items():
            try:
                t_ms = triton.testing.do_bench(fn, warmup=50, rep=200)
                g_ms = triton.testing.do_bench_cudagraph(fn, rep=200)
                line[name] = {"ms": t_ms, "graph_ms": g_ms, "frac": nbytes / t_ms / 1e-3 / COPY,
                              "graph_frac": nbytes / g_ms / 1e-3 / COPY}
            except Exception as e:  # noqa: BLE001
                line[name] = {"error": str(e)[-300:]}
        loss, grad = SG.cross_entropy_tma(x, t)
        xf = x.float().requires_grad_()
        ref = F.cross_entropy(xf, t)
        ref.backward()
        line["max_err"] = {"loss": abs(loss.float().item() - ref.item()), "grad": (grad.float() - xf.grad).abs().max().item()}
        rows.append(line)
        print("ce", n, " | ".join(f"{k} {v['frac']:.3f}/{v['graph_frac']:.3f}" if "frac" in v else f"{k} {v}"
                                  for k, v in line.items() if isinstance(v, dict)), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cross_entropy_gluon.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
