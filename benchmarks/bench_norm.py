"""LayerNorm / RMSNorm benchmark: fused-layers against PyTorch eager, torch.compile and Liger-Kernel.

    python benchmarks/bench_norm.py --out benchmarks/results                # full table (GPU)
    python benchmarks/bench_norm.py --out /tmp/x --sweep --budget 250       # config sweep first

GB/s counts the fewest bytes: forward reads x and writes y; backward reads x and dy and writes dx
(parameters, their gradients and the saved statistics are small and not counted); forward+backward is
the sum.  "frac" is GB/s over the 4.22 TB/s device-to-device copy ceiling measured on the H200 (the
copy is re-measured in the same run and reported).  Each tensor holds about 2^26 elements
(rows = 2^26 // width); timings are ``triton.testing.do_bench`` medians after warm-up.  Forward is
timed with autograd recording (the training forward, which saves statistics); backward is
``torch.autograd.grad(y, [x, w, b], dy, retain_graph=True)``; parameters are in the input's dtype.

With ``--sweep``, a few candidate configs per width bucket are timed for our kernels first (written to
``sweep.json``), and the benchmark then runs ours with the best candidate at the swept widths (the
config table in ``fused_layers/ops/layer_norm.py`` is then set from these numbers).
A ``--budget`` in seconds stops the run cleanly (what was measured is written after every case).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import _timing  # noqa: E402  (CUDA-graph replay medians)

COPY_CEILING_GBS = 4220.0  # H200 device-to-device copy, read+write, measured 2026-11-30
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
WIDTHS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
T0 = time.time()


def elapsed() -> float:
    return time.time() - T0


def bench(fn, grad_to_none=None, rep=40, setup=None):
    """CUDA-graph replay medians (benchmarks/_timing.py); TIMING=eager for do_bench."""
    return _timing.bench(fn, grad_to_none=grad_to_none, rep=rep, setup=setup)


def measure_copy(nbytes: int = 2**30) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    # Timed eagerly: inside a CUDA graph a device-to-device copy becomes a memcpy node served by the
    # copy engines (about 2.77 TB/s on the H200), not the SM copy kernel that sets the 4.22 TB/s ceiling.
    from triton.testing import do_bench

    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * nbytes / ms / 1e6  # GB/s


def providers(op: str, peers: bool):
    """Forward functions f(x, w, b) by provider; backward is timed through each one's autograd."""
    import torch.nn.functional as F

    from fused_layers import fused_layer_norm, fused_rms_norm

    try:
        torch._dynamo.config.cache_size_limit = 256
        torch._dynamo.config.recompile_limit = 256
    except Exception:  # noqa: BLE001
        pass
    eps = 1e-5 if op == "ln" else 1e-6
    if op == "ln":
        eager = lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps)  # noqa: E731
        out = {"fused": lambda x, w, b: fused_layer_norm(x, (x.shape[-1],), w, b, eps)}
    else:
        eager = lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, eps)  # noqa: E731
        out = {"fused": lambda x, w, b: fused_rms_norm(x, (x.shape[-1],), w, eps)}
    if not peers:
        return out
    out["eager"] = eager
    out["compile"] = torch.compile(eager, dynamic=False)
    try:
        if op == "ln":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            out["liger"] = lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, eps)
        else:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            out["liger"] = lambda x, w, b: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)
    except Exception as e:  # noqa: BLE001
        print(f"[liger-kernel not available: {e}]")
    return out


def make_inputs(op, dtype, n, total):
    m = max(1, total // n)
    x = torch.randn(m, n, device="cuda", dtype=dtype).requires_grad_(True)
    w = torch.randn(n, device="cuda", dtype=dtype).requires_grad_(True)
    b = torch.randn(n, device="cuda", dtype=dtype).requires_grad_(True) if op == "ln" else None
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    return x, w, b, dy


def run_case(fwd, x, w, b, dy, parts=("fwd", "bwd", "fwdbwd")):
    leaves = [t for t in (x, w, b) if t is not None]
    # One fwd+bwd first, as a training step's first call: the fused ops compile their backward there and from the
    # next call run as one C++ call (ops/_cpp.py).  Without it, TIMING=eager timed the forwards and the backward of
    # the first forward on the Python path (session 19: LayerNorm 16K bwd 0.43 of copy against 0.78 after it).
    torch.autograd.grad(fwd(x, w, b), leaves, dy)
    out = {}
    if "fwd" in parts:
        out["fwd"] = bench(lambda: fwd(x, w, b))
    if "bwd" in parts:
        out["bwd"] = bench(lambda y: torch.autograd.grad(y, leaves, dy, retain_graph=True), setup=lambda: fwd(x, w, b))
    if "fwdbwd" in parts:
        out["fwdbwd"] = bench(lambda: torch.autograd.grad(fwd(x, w, b), leaves, dy))
    return out


def gbs(ms: float, nbytes: int) -> float:
    return nbytes / ms / 1e6


def byte_counts(x) -> dict:
    e = x.numel() * x.element_size()
    return {"fwd": 2 * e, "bwd": 3 * e, "fwdbwd": 5 * e}


# --------------------------------------------------------------------------------------------------
# Config sweep (ours only)
# --------------------------------------------------------------------------------------------------
def _unique(cands):
    """Candidates in order, each config once."""
    return [dict(t) for t in dict.fromkeys(tuple(sorted(c.items())) for c in cands)]


def fwd_candidates(n: int, elem: int):
    from fused_layers.ops.layer_norm_config import _warps_for

    c = []
    n = 1 << (n - 1).bit_length()  # the kernels' tile width (BLOCK_M must be a power of two too)
    if n <= 1024:
        for tile in (2048, 4096, 8192):
            bm = max(1, tile // n)
            c.append(dict(fwd_block_m=bm, fwd_warps=_warps_for(n, bm)))
        c.append(dict(fwd_block_m=max(1, 4096 // n), fwd_warps=2 * _warps_for(n, max(1, 4096 // n))))
        # one warp per row (a row's sums stay inside a warp: shuffles, no shared-memory round trip)
        c += [dict(fwd_block_m=bm, fwd_warps=bm) for bm in (2, 4, 8, 16) if bm * n >= 1024]
        # LayerNorm: the correction and the variance in one two-value reduction (layer_norm_config.FWD_FUSED_STATS)
        c += [dict(fwd_block_m=bm, fwd_warps=wp, fwd_fused_stats=1) for bm, wp in ((4, 4), (8, 8), (4, 8))
              if bm * n <= 8192]
    elif n <= 16384:
        for bm, wp in ((1, 4), (1, 8), (1, 16), (2, 8), (2, 16)):
            if n * bm <= 32768 and not (wp == 4 and n >= 16384):
                c.append(dict(fwd_block_m=bm, fwd_warps=wp, fwd_max_single=65536))
    else:
        c += [dict(fwd_max_single=65536, fwd_block_m=1, fwd_warps=wp) for wp in (16, 32)]
        c += [dict(fwd_max_single=1024, fwd_chunk=ch, fwd_warps=wp) for ch, wp in ((2048, 4), (4096, 8), (8192, 8), (8192, 16))]
        # the wide forward's chunk loops software-pipelined (fwd_stages)
        c += [dict(fwd_max_single=1024, fwd_chunk=ch, fwd_warps=wp, fwd_stages=st)
              for ch, wp, st in ((4096, 8, 3), (2048, 4, 4), (8192, 8, 3))]
    return _unique(c)


def bwd_candidates(n: int, elem: int):
    from fused_layers.ops.layer_norm_config import _warps_for

    c = []
    n = 1 << (n - 1).bit_length()  # the kernels' tile width (BLOCK_M must be a power of two too)
    if n <= 1024:
        for tile, per_sm in ((2048, 2), (4096, 2), (4096, 4), (8192, 1), (8192, 2)):
            bm = max(1, tile // n)
            c.append(dict(bwd_block_m=bm, bwd_warps=_warps_for(n, bm), bwd_progs_per_sm=per_sm, bwd_max_single=65536))
        # deeper / no software pipelining of the row loop, more programs of fewer warps
        for bm, wp, per_sm, st in ((4, 4, 2, 1), (4, 4, 2, 2), (4, 4, 2, 4), (8, 8, 1, 2), (8, 8, 1, 4), (2, 4, 4, 2), (4, 4, 4, 3),
                                   (8, 8, 2, 4), (16, 8, 1, 4), (8, 8, 1, 3)):
            c.append(dict(bwd_block_m=bm, bwd_warps=wp, bwd_progs_per_sm=per_sm, bwd_stages=st, bwd_max_single=65536))
        # one-row dW/dB accumulators (registers for more rows in flight) and LayerNorm's two row sums in one
        # reduction (bwd_acc_rows, bwd_pair_sum)
        for bm, wp, per_sm, st in ((4, 4, 2, 4), (8, 8, 1, 4), (8, 4, 2, 4), (8, 8, 2, 3), (16, 8, 1, 3), (4, 4, 4, 3)):
            for v in (dict(bwd_acc_rows=1), dict(bwd_pair_sum=1), dict(bwd_acc_rows=1, bwd_pair_sum=1)):
                c.append(dict(bwd_block_m=bm, bwd_warps=wp, bwd_progs_per_sm=per_sm, bwd_stages=st, bwd_max_single=65536, **v))
    elif n <= 8192:
        c.append(dict(bwd_gluon=1))  # the Gluon row backward (see below; from 4,096 columns)
        c += [dict(bwd_gluon=1, bwd_gluon_stages=st, bwd_gluon_db_smem=db) for st, db in ((2, 1), (3, 1), (4, 0))]
        c += [dict(bwd_gluon=1, bwd_gluon_w_f32=1), dict(bwd_gluon=1, bwd_gluon_warps=32)]
        for bm, wp, per_sm in ((1, 8, 2), (1, 8, 4), (1, 16, 1), (1, 16, 2), (2, 16, 2)):
            if n * bm <= 16384:
                c.append(dict(bwd_block_m=bm, bwd_warps=wp, bwd_progs_per_sm=per_sm, bwd_max_single=65536))
        for bm, wp, per_sm, st in ((1, 8, 2, 1), (1, 8, 2, 2), (1, 8, 2, 4), (1, 4, 4, 2), (1, 8, 1, 4), (1, 16, 1, 3), (1, 4, 4, 4)):
            c.append(dict(bwd_block_m=bm, bwd_warps=wp, bwd_progs_per_sm=per_sm, bwd_stages=st, bwd_max_single=65536))
        c.append(dict(bwd_max_single=1024, bwd_chunk=2048, bwd_warps=8, bwd_progs_per_sm=2))
        # LayerNorm's two row sums in one reduction (a row spans several warps here), and two-row tiles with
        # one-row accumulators
        for bm, wp, per_sm, st in ((1, 8, 2, 4), (1, 16, 1, 3), (1, 8, 1, 4), (1, 16, 2, 2), (1, 4, 4, 4)):
            c.append(dict(bwd_block_m=bm, bwd_warps=wp, bwd_progs_per_sm=per_sm, bwd_stages=st, bwd_max_single=65536,
                          bwd_pair_sum=1))
        for bm, wp, per_sm, st in ((2, 8, 2, 3), (2, 16, 1, 3)):
            if n * bm <= 16384:
                c.append(dict(bwd_block_m=bm, bwd_warps=wp, bwd_progs_per_sm=per_sm, bwd_stages=st, bwd_max_single=65536,
                              bwd_acc_rows=1, bwd_pair_sum=1))
    else:
        if n <= 32768:
            c += [dict(bwd_max_single=65536, bwd_block_m=1, bwd_warps=wp, bwd_progs_per_sm=1) for wp in (16, 32)]
        c += [
            dict(bwd_max_single=1024, bwd_chunk=ch, bwd_warps=wp, bwd_progs_per_sm=ps)
            for ch, wp, ps in ((1024, 4, 2), (2048, 8, 1), (2048, 8, 2), (4096, 8, 2), (4096, 16, 1))
        ]
        # the wide kernels' loops software-pipelined (bwd_stages: the row loop of pass 2, the chunk loop of pass 1)
        c += [
            dict(bwd_max_single=1024, bwd_chunk=ch, bwd_warps=wp, bwd_progs_per_sm=ps, bwd_stages=st)
            for ch, wp, ps, st in ((4096, 16, 1, 3), (2048, 8, 2, 3), (4096, 8, 2, 4), (2048, 8, 1, 4))
        ]
        # the one-read persistent backward (bwd_persist: a row's pieces held by co-resident programs exchanging their
        # partial row sums; eager calls; registers / shared memory by benchmarks/scan_norm_persist.py)
        c += [
            dict(bwd_max_single=1024, bwd_persist=1, bwd_persist_block=bl, bwd_persist_warps=wp, bwd_persist_per_sm=8,
                 bwd_persist_stages=st)
            for bl, wp, st in ((4096, 8, 3), (4096, 8, 4), (2048, 4, 3), (4096, 16, 3), (8192, 16, 3), (4096, 8, 1),
                               (2048, 4, 4), (2048, 8, 3))
        ]
        # LayerNorm's two partial sums in one published word (bwd_persist_pack; session 11, not yet timed)
        c += [dict(bwd_max_single=1024, bwd_persist=1, bwd_persist_block=bl, bwd_persist_warps=wp, bwd_persist_per_sm=8,
                   bwd_persist_stages=3, bwd_persist_pack=1) for bl, wp in ((2048, 4), (4096, 8))]
        # HOLD: publish row k, then wait for row k - 1 (published by every sibling an iteration ago) and write it
        # from its pieces held in registers (bwd_persist_hold; session 12, not yet timed; sm_90: 2K x 4 warps 128
        # registers as the default, 4K x 8 warps 166-172)
        c += [dict(bwd_max_single=1024, bwd_persist=1, bwd_persist_block=bl, bwd_persist_warps=wp, bwd_persist_per_sm=8,
                   bwd_persist_stages=st, bwd_persist_hold=1) for bl, wp, st in ((2048, 4, 3), (2048, 4, 2), (4096, 8, 3), (1024, 2, 3))]
        # DIAGNOSTIC, dx wrong by design: the 16K entry without the exchange between a row's pieces (what the
        # publish + wait costs; never a "best")
        c.append(dict(bwd_max_single=1024, bwd_persist=1, bwd_persist_block=2048, bwd_persist_warps=4, bwd_persist_per_sm=8,
                      bwd_persist_stages=3, bwd_persist_diag_nosync=1))
        c.append(dict(bwd_persist=0))  # the two-pass kernels, where a BWD_PERSIST entry makes the default persistent
        # the Gluon row backward (ops/layer_norm_gluon.py: a whole row in shared memory by TMA, one CTA an SM; session
        # 17; where it does not apply the call runs the default), and its session-18 variants: a 3-row ring, dB in
        # shared memory (with LayerNorm's two row sums in one reduction)
        c.append(dict(bwd_gluon=1))
        c += [dict(bwd_gluon=1, bwd_gluon_stages=st, bwd_gluon_db_smem=db) for st, db in ((2, 1), (3, 0))]
        # ... CTAs of 32 warps, the weight held as float32 in shared memory (one conversion, not one a read)
        c += [dict(bwd_gluon=1, bwd_gluon_warps=wp, bwd_gluon_w_f32=wf, bwd_gluon_db_smem=db)
              for wp, wf, db in ((16, 1, 0), (32, 0, 0), (32, 0, 1), (32, 1, 0))]
        c.append(dict(bwd_gluon=1, bwd_gluon_device_desc=1))  # device-side descriptors (the C++ fast path's form)
        c.append(dict(bwd_gluon=1, bwd_gluon_smem_sums=1))  # the row sums through one buffer, one barrier a row
        c.append(dict(bwd_gluon=1, bwd_gluon_device_desc=1, bwd_gluon_smem_sums=1))  # both
        # the mean folded into the row sums and xhat (LayerNorm: one op a value fewer a pass; session 19), on top of
        # the LayerNorm 16K default (smem_sums) and without it
        c += [dict(bwd_gluon=1, bwd_gluon_fold_mean=1), dict(bwd_gluon=1, bwd_gluon_fold_mean=1, bwd_gluon_smem_sums=0)]
    # the dW / dB reduce's shape (any width, beside the width's own entry): the pre-session-12 shape (one 256-column
    # strip a program: 3 programs at 768) and others around the default (16 x 128, 4 warps, 3 stages since session 12;
    # layer_norm_config._reduce_config)
    c += [dict(reduce_block_n=bn, reduce_block_g=bg, reduce_warps=wp, reduce_stages=st)
          for bn, bg, wp, st in ((256, 32, 4, 1), (8, 256, 4, 2), (16, 256, 8, 2), (16, 128, 4, 3), (32, 128, 8, 2),
                                 (32, 128, 8, 1), (64, 64, 8, 2))]
    return _unique(c)


def sweep(args, out_dir):
    from fused_layers.ops.layer_norm import config_override

    results = []
    best = {}
    path = os.path.join(out_dir, "sweep.json")
    for dname in args.sweep_dtypes.split(","):
        dtype = DTYPES[dname]
        for n in [int(v) for v in args.sweep_widths.split(",")]:
            if dname == "fp32" and n not in (1024, 4096, 16384, 65536):
                continue
            x, w, b, dy = make_inputs(args.sweep_op, dtype, n, args.total)
            nb = byte_counts(x)
            from fused_layers import fused_layer_norm, fused_rms_norm

            if args.sweep_op == "rms":
                f = lambda x, w, b: fused_rms_norm(x, (n,), w)  # noqa: E731
            else:
                f = lambda x, w, b: fused_layer_norm(x, (n,), w, b)  # noqa: E731
            parts = [(p, (fwd_candidates if p == "fwd" else bwd_candidates)(n, x.element_size()))
                     for p in args.sweep_parts.split(",")]
            if args.sweep_with:  # only the candidates that set one of these keys (new variants beside the default)
                keys = set(args.sweep_with.split(","))
                parts = [(p, [c for c in cands if keys & set(c)]) for p, cands in parts]
            for part, cands in parts:
                for cfg in [{}] + cands:
                    if elapsed() > args.sweep_budget:
                        break
                    try:
                        with config_override("layer_norm", **cfg):
                            ms = run_case(f, x, w, b, dy, parts=(part,))[part]
                        r = dict(dtype=dname, n=n, part=part, cfg=cfg, ms=ms, frac=gbs(ms, nb[part]) / COPY_CEILING_GBS)
                    except Exception as e:  # noqa: BLE001
                        r = dict(dtype=dname, n=n, part=part, cfg=cfg, error=repr(e)[:300])
                    results.append(r)
                    print(json.dumps(r), flush=True)
                    if "ms" in r and not any("diag" in k for k in cfg):  # (diagnostics are never a "best")
                        key = f"{dname}:{n}:{part}"
                        if key not in best or r["ms"] < best[key]["ms"]:
                            best[key] = r
            del x, w, b, dy
            with open(path, "w") as fh:
                json.dump({"results": results, "best": best}, fh, indent=1)
    return best


# --------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", default="ln,rms")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--total", type=int, default=2**26, help="elements per tensor")
    ap.add_argument("--sweep", action="store_true", help="sweep kernel configs for ours first")
    ap.add_argument("--sweep-widths", default="1024,4096,16384,32768,65536")
    ap.add_argument("--sweep-dtypes", default="bf16,fp32")
    ap.add_argument("--sweep-op", default="ln", choices=("ln", "rms"), help="the norm the sweep times")
    ap.add_argument("--sweep-parts", default="fwd,bwd", help="which parts the sweep times (fwd, bwd)")
    ap.add_argument("--sweep-with", default="", help="comma-separated config keys: sweep only candidates setting one")
    ap.add_argument("--sweep-budget", type=float, default=1e9, help="seconds from start when the sweep stops")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds from start when the benchmark stops")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from fused_layers.ops import _cpp
    from fused_layers.ops.layer_norm import config_override

    # The C++ fast path (the default eager path) loaded before anything is timed: in a fresh process it builds or loads
    # on a background thread, and calls timed meanwhile take the slower Python path and share the GIL with the load
    # (session 13: LayerNorm fwd+bwd at 768 timed 12-18 ms a call by do_bench, issue9/run19_a, run19_b).
    _cpp.extension(wait=True)
    meta = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, python=platform.python_version(),
        copy_ceiling_gbs=COPY_CEILING_GBS, copy_measured_gbs=measure_copy(), total=args.total,
        date=time.strftime("%Y-%m-%d %H:%M"),
    )
    import triton

    meta["triton"] = triton.__version__
    print(json.dumps(meta), flush=True)
    best = sweep(args, args.out) if args.sweep else {}
    results = []
    path = os.path.join(args.out, "bench_norm.json")
    for op in args.ops.split(","):
        provs = providers(op, not args.no_peers)
        for dname in args.dtypes.split(","):
            for n in [int(v) for v in args.widths.split(",")]:
                if elapsed() > args.budget:
                    print(f"[budget reached at {op} {dname} {n}]", flush=True)
                    break
                x, w, b, dy = make_inputs(op, DTYPES[dname], n, args.total)
                nb = byte_counts(x)
                for name, fn in provs.items():
                    if elapsed() > args.budget:
                        break
                    cfg = {}
                    if name == "fused":  # best swept config for this width (LayerNorm sweep; shared table)
                        for part in ("fwd", "bwd"):
                            cfg.update(best.get(f"{dname}:{n}:{part}", {}).get("cfg", {}))
                    try:
                        with config_override("layer_norm", **cfg):
                            t = run_case(fn, x, w, b, dy)
                        row = dict(op=op, dtype=dname, n=n, rows=x.shape[0], provider=name, cfg=cfg)
                        for part, ms in t.items():
                            row[f"{part}_ms"] = ms
                            row[f"{part}_gbs"] = gbs(ms, nb[part])
                            row[f"{part}_frac"] = row[f"{part}_gbs"] / COPY_CEILING_GBS
                    except Exception as e:  # noqa: BLE001
                        row = dict(op=op, dtype=dname, n=n, provider=name, error=repr(e)[:300])
                    results.append(row)
                    print(json.dumps(row), flush=True)
                del x, w, b, dy
                torch.cuda.empty_cache()
                with open(path, "w") as fh:
                    json.dump({"meta": meta, "results": results}, fh, indent=1)
    with open(path, "w") as fh:
        json.dump({"meta": meta, "results": results}, fh, indent=1)
    write_markdown(meta, results, os.path.join(args.out, "bench_norm.md"))
    plot(results, os.path.join(args.out, "bench_norm.png"))


def write_markdown(meta, results, path):
    lines = [
        "# LayerNorm / RMSNorm benchmark",
        "",
        f"{meta['device']}, torch {meta['torch']}, triton {meta.get('triton')}, {meta['date']}; about 2^26 elements "
        f"per tensor; copy ceiling {COPY_CEILING_GBS:.0f} GB/s (measured in this run: {meta['copy_measured_gbs']:.0f}).",
        "Cells: fraction of the copy ceiling (GB/s in parentheses). fwd = read x + write y; bwd = read x, dy + write dx.",
        "",
    ]
    provs = sorted({r["provider"] for r in results}, key=["fused", "eager", "compile", "liger"].index)
    for op in sorted({r["op"] for r in results}):
        for dname in ("bf16", "fp32"):
            rows = [r for r in results if r["op"] == op and r["dtype"] == dname]
            if not rows:
                continue
            for part in ("fwd", "bwd", "fwdbwd"):
                lines += [f"## {op} {dname} {part}", "", "| width | " + " | ".join(provs) + " |", "|---" * (len(provs) + 1) + "|"]
                for n in sorted({r["n"] for r in rows}):
                    cells = []
                    for p in provs:
                        r = next((r for r in rows if r["n"] == n and r["provider"] == p), None)
                        if r is None or f"{part}_frac" not in r:
                            cells.append("-" if r is None else "err")
                        else:
                            cells.append(f"{r[f'{part}_frac']:.2f} ({r[f'{part}_gbs']:.0f})")
                    lines.append(f"| {n} | " + " | ".join(cells) + " |")
                lines.append("")
    with open(path, "w") as fh:
        fh.write("\n".join(lines))


def plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return
    combos = sorted({(r["op"], r["dtype"]) for r in results})
    fig, axes = plt.subplots(len(combos), 3, figsize=(15, 3.5 * max(1, len(combos))), squeeze=False)
    for i, (op, dname) in enumerate(combos):
        for j, part in enumerate(("fwd", "bwd", "fwdbwd")):
            ax = axes[i][j]
            for p in ("fused", "eager", "compile", "liger"):
                rs = sorted([r for r in results if (r["op"], r["dtype"], r["provider"]) == (op, dname, p) and f"{part}_frac" in r], key=lambda r: r["n"])
                if rs:
                    ax.plot([r["n"] for r in rs], [r[f"{part}_frac"] for r in rs], marker="o", label=p)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{op} {dname} {part}")
            ax.set_xlabel("width")
            ax.set_ylabel("fraction of copy")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    main()
