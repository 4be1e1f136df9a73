"""Issue 13: the Gluon forward (fused_layers/ops/attention_gluon.py) beside the Triton forward, cuDNN and SDPA flash,
H200, bf16, H = 16, B * S = 16,384, TFLOP/s of the forward (4 B H S^2 D, halved when causal), do_bench medians after a
warm-up; correctness first (O and the base-2 LSE against float32, and the Triton backward fed the Gluon forward's O and
LSE against float32 gradients).
    python3 benchmarks/bench_attention_gluon.py --out DIR [--configs D:BM,BN,W,ST;...] [--seqlens 1024,4096,16384]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import torch.nn.functional as F


def reference(q, k, v, causal):
    qf, kf, vf = (t.float() for t in (q, k, v))
    s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse2 = torch.logsumexp(s, -1) / math.log(2.0)
    return torch.softmax(s, -1) @ vf, lse2


def triton_only(at):
    """Every Gluon variant off: the Triton kernels (the auto defaults would run Gluon on large calls)."""
    return at.config_override("attention", fwd_gluon=0, bwd_gluon_dkdv=0, bwd_gluon_dq=0)


def parse_configs(text):
    """'D:a,b,c;D:...' -> {D: [(a, b, c), ...]}"""
    out = {}
    for part in filter(None, text.split(";")):
        d, c = part.split(":")
        out.setdefault(int(d), []).append(tuple(int(x) for x in c.split(",")))
    return out


def check(ag, at, rows, D, S, causal, cfg, per_sm=0, ws=False):
    torch.manual_seed(S + D + int(causal))
    B, H = (4, 8) if per_sm else (2, 3)  # persistent: more query blocks than programs (several tiles a program)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if ws:
        out, lse = ag.attention_forward_gluon_ws(q, k, v, causal, config=cfg)
    else:
        out, lse = ag.attention_forward_gluon(q, k, v, causal, config=cfg, per_sm=per_sm)
    ref, ref_lse = reference(q, k, v, causal)
    err_o = (out.float() - ref).abs().max().item()
    err_l = (lse - ref_lse).abs().max().item()
    # the Triton backward on the Gluon forward's O and LSE, against float32 autograd
    qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)
    F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal).backward(do.float())
    with triton_only(at):
        dq, dk, dv = at.attention_backward(do, q, k, v, out, lse, None, None, None, S, S, causal, 1.0 / math.sqrt(D))
    err_g = max((a.float() - b.grad).abs().max().item() / max(1.0, b.grad.abs().max().item()) for a, b in ((dq, qr), (dk, kr), (dv, vr)))
    ok = err_o < 2e-2 and err_l < 1e-3 and err_g < 5e-2 and torch.isfinite(out).all().item()
    rows.append(dict(kind="check", D=D, S=S, causal=causal, cfg=("ws", cfg) if ws else cfg, per_sm=per_sm, err_o=err_o, err_lse=err_l, err_grad=err_g, ok=ok))
    print(json.dumps(rows[-1]), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--configs", default="", help="extra Gluon configs, e.g. '128:128,64,8,3;64:128,64,8,4'")
    ap.add_argument("--budget", type=float, default=400.0)
    ap.add_argument("--persistent", default="", help="programs an SM of the persistent grid to time beside, e.g. '1,2'")
    ap.add_argument("--ws", action="store_true", help="also the warp-specialized ping-pong candidate (attention_forward_gluon_ws)")
    ap.add_argument("--bwd", action="store_true", help="also the backward: the Gluon dK / dV candidate (bwd_gluon_dkdv) "
                    "beside the Triton backward and cuDNN's (fwd+bwd minus fwd), TFLOP/s of 2.5x the forward's FLOPs")
    ap.add_argument("--dkdv-configs", default="", help="extra dK / dV configs, e.g. '128:64,64,4,2;128:32,128,8,3'")
    ap.add_argument("--ws-configs", default="", help="extra ping-pong configs (BLOCK_N, STAGES, regs, producer regs), e.g. '64:64,4,232,40'")
    ap.add_argument("--fused-dq", action="store_true", help="--bwd: also the dK / dV kernel computing dQ by atomics "
                    "(bwd_gluon_fused_dq)")
    ap.add_argument("--dq-configs", default="", help="--bwd: also the Gluon dQ kernel after the Gluon dK / dV one, at DQ_CONFIGS and these")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    from triton.testing import do_bench
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from fused_layers.ops import attention as at
    from fused_layers.ops import attention_gluon as ag

    extra = parse_configs(args.configs)
    extra_ws = parse_configs(args.ws_configs)
    dims = [int(d) for d in args.dims.split(",")]
    seqlens = [int(s) for s in args.seqlens.split(",")]
    rows = []
    meta = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M"))
    import triton
    meta["triton"] = triton.__version__
    print(json.dumps(meta), flush=True)
    bad = set()
    for D in dims:
        for cfg in [ag.CONFIGS[D]] + extra.get(D, []):
            for S, causal in ((128, False), (384, True), (1024, True), (640, False))[int(os.environ.get("GLUON_CHECKS_FROM", "0")):]:
                try:
                    if not check(ag, at, rows, D, S, causal, cfg):
                        bad.add((D, cfg))
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(kind="check", D=D, S=S, causal=causal, cfg=cfg, error=repr(e)[:2000], ok=False))
                    print(json.dumps(rows[-1]), flush=True)
                    bad.add((D, cfg))
    for ps in [int(x) for x in filter(None, args.persistent.split(","))]:
        for D in dims:  # the persistent grid: few programs, several query blocks each (B2 H3 S1024: 96 blocks)
            for S, causal in ((1024, True), (640, False)):
                try:
                    if not check(ag, at, rows, D, S, causal, ag.CONFIGS[D], per_sm=ps):
                        bad.add((D, "p"))
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(kind="check", D=D, S=S, causal=causal, per_sm=ps, error=repr(e)[:2000], ok=False))
                    print(json.dumps(rows[-1]), flush=True)
                    bad.add((D, "p"))
    if args.ws:
        for D in dims:
            for cfg in [None] + extra_ws.get(D, []):
                for S, causal in ((128, False), (256, True), (1024, True), (768, False)):
                    if cfg is not None and S % cfg[0]:
                        continue
                    try:
                        persist = cfg[4] if cfg is not None and len(cfg) > 4 else 0  # (more tiles than programs)
                        if not check(ag, at, rows, D, S, causal, cfg, per_sm=persist, ws=True):
                            bad.add((D, "ws", cfg))
                    except Exception as e:  # noqa: BLE001
                        rows.append(dict(kind="check", D=D, S=S, causal=causal, cfg=("ws", cfg), error=repr(e)[:2000], ok=False))
                        print(json.dumps(rows[-1]), flush=True)
                        bad.add((D, "ws", cfg))
    if any(b[1] == "p" for b in bad):
        args.persistent = ""  # (not timed when wrong)
    print(f"[{time.time() - t0:.0f}s] checks done; failing configs: {sorted(bad, key=str)}", flush=True)

    def sdpa(backend):
        def f(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return f

    for S in seqlens:
        for D in dims:
            for causal in (False, True):
                if time.time() - t0 > args.budget:
                    break
                B, H = max(1, 16384 // S), 16
                q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
                fns = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION),
                       "triton": lambda q, k, v, c: at.attention_forward(q, k, v, None, None, None, S, S, c, 1.0 / math.sqrt(D))}
                # (the "triton" column runs with every Gluon variant off: see triton_only below)
                for cfg in [ag.CONFIGS[D]] + extra.get(D, []):
                    if (D, cfg) not in bad:
                        for ps in [0] + [int(x) for x in filter(None, args.persistent.split(","))]:
                            name = "gluon " + ",".join(map(str, cfg)) + (f" p{ps}" if ps else "")
                            fns[name] = (lambda cfg_, ps_: lambda q, k, v, c: ag.attention_forward_gluon(q, k, v, c, config=cfg_, per_sm=ps_))(cfg, ps)
                for cfg in ([None] + extra_ws.get(D, [])) if args.ws else []:
                    if (D, "ws", cfg) not in bad and (cfg is None or S % cfg[0] == 0):
                        name = "gluon ws" + ("" if cfg is None else " " + ",".join(map(str, cfg)))
                        fns[name] = (lambda cfg_: lambda q, k, v, c: ag.attention_forward_gluon_ws(q, k, v, c, config=cfg_))(cfg)
                res = dict(kind="time", D=D, S=S, B=B, causal=causal)
                with torch.no_grad(), triton_only(at):
                    for name, fn in fns.items():
                        try:
                            fn(q, k, v, causal)
                            torch.cuda.synchronize()
                            ms = do_bench(lambda: fn(q, k, v, causal), warmup=25, rep=100, return_mode="median")
                            res[name] = round(flops / ms / 1e9, 1)
                        except Exception as e:  # noqa: BLE001
                            res[name] = "x: " + repr(e)[:200]
                rows.append(res)
                print(json.dumps(res), flush=True)
    if args.bwd:
        backward_table(args, rows, t0)
    with open(os.path.join(args.out, "attention_gluon.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    times = [r for r in rows if r["kind"] == "time"]
    names = []
    for r in times:
        names += [n for n in r if n not in ("kind", "D", "S", "B", "causal") and n not in names]
    lines = [f"# Gluon attention forward (issue 13): {meta}", "",
             "TFLOP/s of the forward, bf16, H = 16, B * S = 16,384; do_bench medians. Ratio: best Gluon / cuDNN.", "",
             "| D | S | causal | " + " | ".join(names) + " | gluon / cudnn | gluon / triton |",
             "|---|---|---|" + "---|" * (len(names) + 2)]
    for r in times:
        g = [r[n] for n in names if n.startswith("gluon") and isinstance(r.get(n), float)]
        best = max(g) if g else None
        cud, tri = r.get("cudnn"), r.get("triton")
        cells = [str(r.get(n, "-")) for n in names]
        cells.append(f"{best / cud:.2f}" if best and isinstance(cud, float) else "-")
        cells.append(f"{best / tri:.2f}" if best and isinstance(tri, float) else "-")
        lines.append(f"| {r['D']} | {r['S']} | {int(r['causal'])} | " + " | ".join(cells) + " |")
    bwd = [r for r in rows if r["kind"] == "bwd"]
    if bwd:
        bnames = []
        for r in bwd:
            bnames += [n for n in r if n not in ("kind", "D", "S", "B", "causal") and not n.endswith(" err") and n not in bnames]
        lines += ["", "Backward, TFLOP/s (2.5x the forward's FLOPs; ours: attention_backward with the delta preprocess and "
                  "the dQ kernel; cuDNN: fwd+bwd minus fwd).", "",
                  "| D | S | causal | " + " | ".join(bnames) + " |", "|---|---|---|" + "---|" * len(bnames)]
        for r in bwd:
            lines.append(f"| {r['D']} | {r['S']} | {int(r['causal'])} | " + " | ".join(str(r.get(n, "-")) for n in bnames) + " |")
    with open(os.path.join(args.out, "attention_gluon.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def backward_table(args, rows, t0):
    """The backward, each variant timed alone on the same forward outputs (do_bench of attention_backward, which
    includes the delta preprocess): "triton" every kernel Triton's; "gluon dkdv C" the Gluon dK / dV kernel at config C
    and the Triton dQ kernel; "gluon dkdv+dq C" the Gluon dK / dV kernel (its default) and the Gluon dQ kernel at C.
    cuDNN's as do_bench(fwd+bwd) - do_bench(fwd).  Each Gluon variant is checked against the Triton backward first."""
    from triton.testing import do_bench
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from fused_layers.ops import attention as at
    from fused_layers.ops import attention_gluon as ag

    extra = parse_configs(args.dkdv_configs)
    extra_dq = parse_configs(args.dq_configs)
    dims = [int(d) for d in args.dims.split(",")]

    def rel_err(a, b):
        return (a.float() - b.float()).abs().max().item() / max(1.0, b.float().abs().max().item())

    for S in [int(x) for x in args.seqlens.split(",")]:
        for D in dims:
            for causal in (False, True):
                if time.time() - t0 > args.budget + 120:
                    return
                B, H = max(1, 16384 // S), 16
                q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                scale = 1.0 / math.sqrt(D)
                flops = 2.5 * 4.0 * B * H * S * S * D / (2 if causal else 1)
                bwd = lambda: at.attention_backward(do, q, k, v, out, lse, None, None, None, S, S, causal, scale)  # noqa: E731
                with triton_only(at):
                    out, lse = at.attention_forward(q, k, v, None, None, None, S, S, causal, scale)
                    ref = bwd()
                    res = dict(kind="bwd", D=D, S=S, B=B, causal=causal)
                    res["triton"] = round(flops / do_bench(bwd, warmup=25, rep=100, return_mode="median") / 1e9, 1)
                cands = [("gluon dkdv " + ",".join(map(str, c)), "DKDV_CONFIGS", c, 0) for c in [ag.DKDV_CONFIGS[D]] + extra.get(D, [])]
                if args.dq_configs or D in extra_dq:
                    cands += [("gluon dkdv+dq " + ",".join(map(str, c)), "DQ_CONFIGS", c, 1) for c in [ag.DQ_CONFIGS[D]] + extra_dq.get(D, [])]
                for name, table, cfg, with_dq in cands:
                    saved = getattr(ag, table)[D]
                    getattr(ag, table)[D] = cfg
                    try:
                        with at.config_override("attention", bwd_gluon_dkdv=1, bwd_gluon_dq=with_dq):
                            got = bwd()
                            err = max(rel_err(a, b) for a, b in zip(got, ref))
                            res[name + " err"] = err
                            if err > 5e-2 or not all(torch.isfinite(g).all().item() for g in got):
                                res[name] = "x: wrong"
                                continue
                            res[name] = round(flops / do_bench(bwd, warmup=25, rep=100, return_mode="median") / 1e9, 1)
                    except Exception as e:  # noqa: BLE001
                        res[name] = "x: " + repr(e)[:200]
                    finally:
                        getattr(ag, table)[D] = saved
                if args.fused_dq:  # the dK / dV kernel also computing dQ by atomics (bwd_gluon_fused_dq), no dQ kernel
                    name = "gluon fused dq"
                    try:
                        with at.config_override("attention", bwd_gluon_dkdv=1, bwd_gluon_fused_dq=1):
                            got = bwd()
                            err = max(rel_err(a, b) for a, b in zip(got, ref))
                            res[name + " err"] = err
                            if err > 5e-2 or not all(torch.isfinite(g).all().item() for g in got):
                                res[name] = "x: wrong"
                            else:
                                res[name] = round(flops / do_bench(bwd, warmup=25, rep=100, return_mode="median") / 1e9, 1)
                    except Exception as e:  # noqa: BLE001
                        res[name] = "x: " + repr(e)[:200]
                qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    f = lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)  # noqa: E731
                    fb = lambda: torch.autograd.grad(f(), (qg, kg, vg), do)  # noqa: E731
                    fb()
                    with torch.no_grad():
                        t_f = do_bench(f, warmup=25, rep=100, return_mode="median")
                    t_fb = do_bench(fb, warmup=25, rep=100, return_mode="median")
                res["cudnn"] = round(flops / (t_fb - t_f) / 1e9, 1)
                rows.append(res)
                print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
