"""Attention benchmark: fused_attention against SDPA (flash, cuDNN, memory-efficient) and FlexAttention.

    python benchmarks/bench_attention.py --out benchmarks/results            # table (GPU)
    python benchmarks/bench_attention.py --out /tmp/x --sweep                # config sweep -> attn_table.json

TFLOP/s: forward 4 * B * H * Sq * Sk * D (halved when causal), backward 2.5x forward, forward+backward
3.5x forward, over do_bench medians. The backward is timed alone (``out.backward(dout,
retain_graph=True)``). Peak memory: the peak allocated during forward+backward beyond the inputs, in MiB.
bf16, H = 16, head dims 64 and 128, S from 1,024 to 16,384 with B * S = 16,384 tokens, causal and not,
plus a GQA case (Hq 32, Hkv 8) and a varlen case (packed sequences against padded SDPA / a FlexAttention
document mask). FlexAttention is compiled (static shapes) once per shape, so it is measured on the
sequence lengths given by --flex-seqlens only.

--static-scan (no GPU needed) compiles the default configs for sm_90 and records registers, spill
stack bytes, shared memory, and HGMMA / LDGSTS counts in the SASS (attention_static_scan.json).

--sweep times each candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) of each kernel (forward, dK/dV,
dQ) at B=4, H=16, S=4096, D in {64, 128}, causal and not; candidates compile in parallel worker
processes and are timed one worker at a time (a file lock), and the fastest per (kernel, D, causal) are
written to attn_table.json, the format FUSED_LAYERS_ATTENTION_TABLE reads.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _sm90

TOKENS = 16384
H = 16

def _sweep_candidates():
    from fused_layers.ops.attention import _TUNE

    extra = {
        "fwd": [(128, 64, 4, 4), (64, 128, 4, 3), (128, 128, 8, 2), (128, 32, 4, 3)],
        "dkdv": [(64, 128, 8, 2), (32, 128, 4, 3), (32, 64, 8, 2), (16, 128, 8, 2)],
        "dq": [(128, 64, 8, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 32, 8, 3)],
    }
    out = {}
    for kind in ("fwd", "dkdv", "dq"):
        seen = []
        for c in _TUNE[kind][64] + _TUNE[kind][128] + extra[kind]:
            if c not in seen:
                seen.append(c)
        out[kind] = seen
    return out


def _compile_sm90(fn, cx: dict, cfg, dtype: str = "bf16", fp32_ptrs=("LSE", "DELTA", "KB", "DQA"), head_dim: int = 0) -> dict:
    """AOT-compile Triton kernel ``fn`` for sm_90 (no GPU needed) with constexprs ``cx`` and launch config
    ``cfg`` = (BLOCK_M, BLOCK_N, num_warps, num_stages); returns registers, spill stack bytes, shared
    memory, global scratch, and instruction counts of the SASS (cuobjdump): HGMMA (wgmma), LDGSTS
    (cp.async), UTMALDG / UTMASTG (TMA copies), RED / ATOM (atomics), USETMAXREG (register reallocation
    between warp groups: what warp specialization emits)."""
    import inspect

    from _sm90 import compile_sm90, signature

    cx = dict(cx, BLOCK_M=cfg[0], BLOCK_N=cfg[1])
    for p in fn.params:  # defaulted constexprs not given: their defaults
        if p.is_constexpr and p.name not in cx and p.default is not inspect.Parameter.empty:
            cx[p.name] = p.default
    types = {n: f"*{dtype}" for n in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")}
    types.update({n: "*fp32" for n in fp32_ptrs}, CU_Q="*i32", CU_K="*i32", SEED="*i64")
    types.update({n: "fp32" for n in ("qk_scale", "sm_scale", "dropout_p", "dropout_scale")})
    names = fn.arg_names
    ones = [n for n in names if n.startswith("s") and n.endswith("d") and len(n) <= 5]  # unit head-dim strides
    # What Triton's runtime specialization gives for these values (divisible by 16).
    divisible = [n for n in names if n.startswith("s") or n in ("SQ", "SK") or (n == "HEAD_DIM" and head_dim % 16 == 0)]
    row = {}
    try:
        r = compile_sm90(fn, *signature(fn, cx, types, ones, divisible), num_warps=cfg[2], num_stages=cfg[3])
        ops = r.pop("ops")
        row.update(r, hgmma=ops["HGMMA"], ldgsts=ops["LDGSTS"], utmaldg=ops["UTMALDG"], utmastg=ops["UTMASTG"],
                   red=ops["REDG"] + ops["RED"], atom=ops["ATOMG"] + ops["ATOM"], setmaxreg=ops["USETMAXREG"],
                   utmaredg=ops["UTMAREDG"],
                   tma_ops={o: n for o, n in ops.items() if o.startswith("UTMA") or o.startswith("UBLKRED")})
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


def static_scan(out_dir: str) -> None:
    """Compile the default configs for sm_90 on this (GPU-less) machine and report registers, spills and
    whether the SASS uses wgmma (HGMMA) and cp.async (LDGSTS): a check that needs no GPU."""
    import triton

    from fused_layers.ops import attention as A

    kernels = {"fwd": A._attn_fwd_kernel, "dkdv": A._attn_bwd_dkdv_kernel, "dq": A._attn_bwd_dq_kernel}
    rows = []
    for kind, fn in kernels.items():
        for D in [int(d) for d in os.environ.get("SCAN_DIMS", "64,128,80,256").split(",")]:
            bd = max(16, triton.next_power_of_2(D))
            for causal in (False, True):
                cfg = A._TUNE[kind][64 if bd <= 64 else 128 if bd <= 128 else 256][0]
                cx = dict(VARLEN=False, CAUSAL=causal, HAS_KB=False, BLOCK_D=bd, EVEN_D=D == bd, INPUT_PRECISION="tf32")
                row = dict(kernel=kind, D=D, causal=causal, config=cfg)
                row.update(_compile_sm90(fn, cx, cfg, head_dim=D))
                print(row, flush=True)
                rows.append(row)
    with open(os.path.join(out_dir, "attention_static_scan.json"), "w") as f:
        json.dump(dict(triton=triton.__version__, target="sm_90", rows=rows), f, indent=1)


# Variants of the attention kernels (issue 13), as (name, kernel kind, overrides of attention_config): what
# --static-scan-variants compiles and --variants times.  Overrides are config_override("attention", ...)
# values; "+1 stage" rows deepen the software pipeline of the table's config by one stage.  The H200 sweep
# of 2026-12-01 (benchmarks/results/issue13/attention_variants.md) removed the TMA / warp-specialized /
# persistent forwards and the dQ-by-atomics backwards (slower everywhere); bwd_tma won where Sk >= 4096
# and (not causal or D <= 64) and is on by default there (attention_config._bwd_tma_auto), so "default"
# bwd runs it in those cases: "bwd_tma" forces it on, "bwd_default_no_tma" off, to compare both everywhere.
VARIANTS = [
    ("default", "fwd", {}),
    ("fwd_stages+1", "fwd", {"fwd_num_stages": "+1"}),
    ("default", "bwd", {}),
    ("bwd_stages+1", "bwd", {"dkdv_num_stages": "+1", "dq_num_stages": "+1"}),
    # Q / dO tiles of the dK/dV kernel through TMA descriptors (then the usual dQ kernel).
    ("bwd_tma", "bwd", {"bwd_tma": 1}),
    ("bwd_default_no_tma", "bwd", {"bwd_tma": 0}),
    # The softmax scale folded into exp2's FMA and the row max (attention_config variant fwd_fold_scale).
    ("fwd_fold_scale", "fwd", {"fwd_fold_scale": 1}),
    # Wider key tiles in the forward (the table has BLOCK_N = 64 everywhere), with and without the fold.
    ("fwd_n128", "fwd", {"fwd_block_n": 128}),
    ("fwd_fold+n128", "fwd", {"fwd_fold_scale": 1, "fwd_block_n": 128}),
    # dQ accumulated by TMA reduce-add inside the dK/dV kernel; no dQ kernel (attention_config bwd_dq_reduce).
    ("bwd_dq_reduce", "bwd", {"bwd_dq_reduce": 1}),
]


def resolve_overrides(ov: dict, D: int, causal: bool) -> dict:
    """``"+1"`` stage overrides made concrete against the table config of (D bucket, causal)."""
    from fused_layers.ops.attention_config import _config

    out = {}
    bd = max(16, 1 << (D - 1).bit_length())
    for key, val in ov.items():
        if val == "+1":
            kind = key.split("_")[0]
            out[key] = _config(kind, bd, causal, torch.bfloat16)["num_stages"] + 1
        else:
            out[key] = val
    return out


def scan_markdown(doc: dict) -> str:
    """A table of an attention_static_scan_variants.json."""
    lines = [f"# sm_90 static scan of the attention variants (Triton {doc['triton']}, {doc.get('dtype', 'bf16')})", "",
             "AOT compile for sm_90 on a machine without a GPU; counts are SASS instructions (cuobjdump). regs / "
             "stack = registers and spill stack bytes a thread; smem = shared memory bytes; warps = total warps; "
             "UTMALDG / UTMASTG = TMA loads / stores; REDG / ATOMG = atomics (descriptor set-up adds a few "
             "ATOMG); USETMAXREG = register reallocation between warp groups.", "",
             "| variant | kernel | D | causal | flags | config (BM, BN, warps, stages) | regs | stack | smem | warps | "
             "HGMMA | LDGSTS | UTMALDG | UTMASTG | REDG | ATOMG | USETMAXREG | error |",
             "|" + "---|" * 18]
    for r in doc["rows"]:
        flags = ",".join(k for k, v in (r.get("flags") or {}).items() if v) or ""
        cells = [r["variant"], r["kernel"], str(r["D"]), str(int(r["causal"])), flags, str(tuple(r["config"]))]
        cells += [str(r.get(k, "")) if r.get(k) is not None else "" for k in
                  ("regs", "stack_bytes", "shared_bytes", "total_warps", "hgmma", "ldgsts", "utmaldg", "utmastg", "red",
                   "atom", "setmaxreg")]
        cells.append((r.get("error") or "")[:80].replace("|", "/").replace("\n", " "))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def static_scan_variants(out_dir: str) -> None:
    """AOT-compile every variant of VARIANTS for sm_90 (bf16, the table's configs) with this machine's
    Triton; rows: registers, spills, shared memory, HGMMA / UTMALDG / RED / USETMAXREG counts.  bwd_tma at
    auto (the default) is resolved with its rule for a max seqlen_k of SCAN_SEQLEN_K (default 4096)."""
    import triton

    from fused_layers.ops import attention as A
    from fused_layers.ops._common import config_override
    from fused_layers.ops.attention_config import _bwd_tma_auto, _config, _variant

    dims = [int(d) for d in os.environ.get("SCAN_DIMS", "64,128").split(",")]
    extra = os.environ.get("SCAN_EXTRA", "1") == "1"  # also bias / dropout / varlen / D=80 / D=256 for bwd_tma
    seqlen_k = int(os.environ.get("SCAN_SEQLEN_K", "4096"))
    rows = []

    def emit(row):
        print({k: v for k, v in row.items()}, flush=True)
        rows.append(row)
        with open(os.path.join(out_dir, "attention_static_scan_variants.json"), "w") as f:
            json.dump(dict(triton=triton.__version__, target="sm_90", dtype="bf16", rows=rows), f, indent=1)

    only = [x for x in os.environ.get("SCAN_ONLY", "").split(",") if x]  # VARIANTS names (default: all)
    cases = [(name, kind, ov, D, causal, {}) for name, kind, ov in VARIANTS for D in dims for causal in (False, True)
             if not only or name in only]
    if extra:
        for flags in ({"HAS_KB": True}, {"HAS_DROPOUT": True}, {"VARLEN": True}):
            cases.append(("bwd_tma", "bwd", {"bwd_tma": 1}, 128, True, flags))
        cases.append(("bwd_tma", "bwd", {"bwd_tma": 1}, 80, True, {}))
        cases.append(("bwd_tma", "bwd", {"bwd_tma": 1}, 256, True, {}))
    for name, kind, ov, D, causal, flags in cases:
        bd = max(16, triton.next_power_of_2(D))
        ov = resolve_overrides(ov, D, causal)
        base = dict(VARLEN=False, CAUSAL=causal, HAS_KB=False, BLOCK_D=bd, EVEN_D=D == bd, INPUT_PRECISION="tf32",
                    HAS_DROPOUT=False)
        base.update(flags)
        with config_override("attention", **ov):
            if kind == "fwd":
                cfg = tuple(_config("fwd", bd, causal, torch.bfloat16)[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
                fwd_cx = dict(base, FOLD_SCALE=not base["HAS_KB"] and _variant("fwd_fold_scale") == 1)
                kern = [("fwd", A._attn_fwd_kernel, fwd_cx, cfg)]
            else:
                cd = tuple(_config("dkdv", bd, causal, torch.bfloat16)[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
                cq = tuple(_config("dq", bd, causal, torch.bfloat16)[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
                knob = _variant("bwd_tma")
                tma = bool(knob) if knob >= 0 else _bwd_tma_auto(torch.bfloat16, seqlen_k, causal, bd,
                                                                  A.HAS_TMA_DESCRIPTORS, interpret=False)
                kern = [("dkdv_tma", A._attn_bwd_dkdv_kernel, dict(base, USE_TMA=True, DQ_REDUCE=0), cd) if tma
                        else ("dkdv", A._attn_bwd_dkdv_kernel, dict(base, USE_TMA=False, DQ_REDUCE=0), cd),
                        ("dq", A._attn_bwd_dq_kernel, base, cq)]
                if _variant("bwd_dq_reduce") == 1:  # dK, dV and dQ (TMA reduce-add) in one kernel, no dQ kernel
                    kern = [("dkdv_dqr" + ("_tma" if tma else ""), A._attn_bwd_dkdv_kernel,
                             dict(base, USE_TMA=tma, DQ_REDUCE=2), cd)]
        for kname, fn, cx, cfg in kern:
            t0 = time.time()
            row = dict(variant=name, kernel=kname, D=D, causal=causal, config=list(cfg), flags=flags)
            row.update(_compile_sm90(fn, cx, cfg, head_dim=D))
            row["compile_s"] = round(time.time() - t0, 1)
            emit(row)
    with open(os.path.join(out_dir, "attention_static_scan_variants.md"), "w") as f:
        f.write(scan_markdown(dict(triton=triton.__version__, dtype="bf16", rows=rows)))


def bench(fn, grad_to_none=None):
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


# ----------------------------------------------------------------------------------------------
# Sweep
# ----------------------------------------------------------------------------------------------
def _sweep_worker(tasks, lock_path, out_path):
    from fused_layers.ops import attention as A
    from fused_layers.ops._common import config_override

    torch.manual_seed(0)
    results = []
    inputs = {}

    def get(D):
        if D not in inputs:
            q, k, v = (torch.randn(4, H, 4096, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            inputs[D] = (q, k, v, torch.randn_like(q))
        return inputs[D]

    def runner(kind, D, causal, cfg):
        q, k, v, do = get(D)
        m, n, w, s = cfg
        ov = {f"{kind}_block_m": m, f"{kind}_block_n": n, f"{kind}_num_warps": w, f"{kind}_num_stages": s}
        if kind != "fwd":
            # The pointer-load dK/dV kernel the table was tuned for (S=4096 would otherwise pick bwd_tma's
            # kernel where its auto rule is on; both read the same "dkdv" entries).
            ov["bwd_tma"] = 0
        if kind == "fwd":
            def f():
                with config_override("attention", **ov):
                    return A.attention_forward(q, k, v, None, None, None, 4096, 4096, causal, D**-0.5)
            return f
        with config_override("attention", **ov):
            out, lse = A.attention_forward(q, k, v, None, None, None, 4096, 4096, causal, D**-0.5)

        def b():
            with config_override("attention", **ov):
                return A.attention_backward(do, q, k, v, out, lse, None, None, None, 4096, 4096, causal, D**-0.5)
        return b

    compiled = []
    for t in tasks:  # compile (in parallel with the other workers)
        try:
            fn = runner(*t)
            fn()
            torch.cuda.synchronize()
            compiled.append((t, fn))
        except Exception as e:  # noqa: BLE001  (out of shared memory, ...)
            results.append({"task": t, "ms": None, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    with open(lock_path, "w") as lock:  # time one worker at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        for t, fn in compiled:
            try:
                results.append({"task": t, "ms": bench(fn)})
            except Exception as e:  # noqa: BLE001
                results.append({"task": t, "ms": None, "error": str(e)[:200]})
        fcntl.flock(lock, fcntl.LOCK_UN)
    with open(out_path, "w") as f:
        json.dump(results, f)


def sweep(out_dir: str, workers: int) -> dict:
    import multiprocessing as mp

    tasks = [(kind, D, causal, cfg) for kind, cfgs in _sweep_candidates().items() for D in (64, 128) for causal in (False, True) for cfg in cfgs]
    ctx = mp.get_context("spawn")
    lock_path = "/tmp/attn_sweep.lock"
    procs, paths = [], []
    for w in range(workers):
        path = f"/tmp/attn_sweep_{w}.json"
        p = ctx.Process(target=_sweep_worker, args=(tasks[w::workers], lock_path, path))
        p.start()
        procs.append(p)
        paths.append(path)
    for p in procs:
        p.join()
    results = []
    for path in paths:
        if os.path.exists(path):
            results += json.load(open(path))
            os.remove(path)
    table, report = {}, {}
    for r in results:
        kind, D, causal, cfg = r["task"]
        key = f"{kind},{D},{int(causal)}"
        report.setdefault(key, []).append((tuple(cfg), r["ms"], r.get("error")))
    for key, rows in report.items():
        ok = sorted([x for x in rows if x[1] is not None], key=lambda x: x[1])
        if ok:
            table[key] = list(ok[0][0])
        print(f"{key}: " + ", ".join(f"{c}={'%.3f' % ms if ms else 'ERR'}" for c, ms, _ in sorted(rows, key=lambda x: x[1] or 1e9)))
    with open(os.path.join(out_dir, "attn_table.json"), "w") as f:
        json.dump(table, f, indent=1)
    with open(os.path.join(out_dir, "attn_sweep.json"), "w") as f:
        json.dump({k: [(list(c), ms, e) for c, ms, e in v] for k, v in report.items()}, f, indent=1)
    return table


# ----------------------------------------------------------------------------------------------
# Variant sweep (issue 13): every entry of VARIANTS beside cuDNN, SDPA flash and Flex, one run
# ----------------------------------------------------------------------------------------------
def _variant_cases(dims, seqlens):
    return [(D, S, causal) for D in dims for S in seqlens for causal in (False, True)]


def _variants_worker(groups, cases, lock_path, out_path, flex_seqlens, dry=False, n_workers=1, barrier_s=300.0):
    """Run task groups: ("peers", None, None) or (variant name, kind, overrides).  Phase 1: every case is
    compiled and checked against SDPA (workers in parallel).  Phase 2, after every worker has finished
    phase 1 (a file barrier): the timings, one worker at a time under the lock, so no other process's
    compile checks run on the GPU while one is timed (the first sweep timed while other workers checked:
    the same kernel read 265 and 391 TFLOP/s).  Results are written after every task, so a crash loses
    only the rest."""
    import traceback

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    from fused_layers import fused_attention
    from fused_layers.ops import _library
    from fused_layers.ops import attention as A
    from fused_layers.ops._common import config_override

    results, pending = [], []
    dev = "cpu" if dry else "cuda"
    tokens = 64 if dry else TOKENS  # --dry-run: the Triton interpreter on tiny shapes (plumbing check)
    if dry:
        global bench

        def bench(fn, grad_to_none=None):  # noqa: F811
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3

    def sync():
        if not dry:
            torch.cuda.synchronize()

    def save():
        with open(out_path, "w") as f:
            json.dump(results, f)

    refs = {}

    def case_inputs(D, S, causal, with_ref=True):
        key = (D, S, causal)
        if key not in refs:
            refs.clear()
            g = torch.Generator(device=dev).manual_seed(1000 * D + S)
            B = tokens // S
            q, k, v, do = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(4))
            if not with_ref:
                refs[key] = (q, k, v, do, None)
                return refs[key]
            qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
            with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
            o.backward(do)
            refs[key] = (q, k, v, do, (o.detach(), qr.grad, kr.grad, vr.grad))
        return refs[key]

    launched = []
    kernel_call = _library.Kernel.__call__

    def spy(self, *args):
        kernel_call(self, *args)
        launched.append(self.fn.__name__ + ("(USE_TMA)" if self.meta.get("USE_TMA") else ""))

    def check(fn, q, k, v, do, ref, causal):
        """Max abs error of out and max relative error of dq, dk, dv against SDPA flash (bf16); records
        which Triton kernels ran (a variant that failed its first launch falls back to the defaults)."""
        qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
        launched.clear()
        _library.Kernel.__call__ = spy
        try:
            out = fn(qa, ka, va, causal, False)
            out.backward(do)
            sync()
        finally:
            _library.Kernel.__call__ = kernel_call
        errs = {}
        for name, g, r in zip(("out", "dq", "dk", "dv"), (out, qa.grad, ka.grad, va.grad), ref):
            d, r = g.float() - r.float(), r.float()
            errs[name + "_max"] = d.abs().max().item()  # max abs error
            errs[name + "_rel"] = (d.norm() / r.norm().clamp_min(1e-12)).item()  # relative Frobenius error
        # bf16 against bf16: both sides round P and dS; the relative norm error of a correct kernel is
        # ~1e-3..5e-3 (the default's row gives the baseline), a wrong one's is O(1).
        ok = all(errs[n + "_rel"] <= 2e-2 for n in ("out", "dq", "dk", "dv")) and all(e == e for e in errs.values())
        return errs, ok

    def fused(q, k, v, causal, gqa):
        return fused_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    for name, kind, ov in groups:
        for D, S, causal in cases:
            if name.startswith("flex") and S not in flex_seqlens:
                continue
            if name.startswith("flex_d") and int(name[6:]) != D:
                continue
            row = dict(variant=name, kind=kind, D=D, S=S, B=tokens // S, H=H, causal=causal)
            t0 = time.time()
            try:
                q, k, v, do, ref = case_inputs(D, S, causal)
                if name == "sdpa":
                    fns = {"cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION), "flash": _sdpa(SDPBackend.FLASH_ATTENTION)}
                elif name.startswith("flex"):
                    fns = {"flex": _flex(causal, S)}
                else:
                    fns = {name: fused}
                for pname, fn in fns.items():
                    r = dict(row, variant=pname)
                    try:
                        ctx = config_override("attention", **resolve_overrides(ov, D, causal)) if ov is not None else _nullctx()
                        with ctx:
                            nfail = len(A._VARIANT_FAILURES)
                            errs, ok = check(fn, q, k, v, do, ref, causal)  # compiles (outside the lock)
                            r.update(errors=errs, check_ok=ok, compile_check_s=round(time.time() - t0, 1),
                                     kernels=sorted(set(launched)))
                            if len(A._VARIANT_FAILURES) > nfail:  # fell back to the default kernels
                                r["variant_failures"] = A._VARIANT_FAILURES[nfail:]
                                ok = False
                            if ok:
                                pending.append((r, fn, ov, kind, D, S, causal))  # timed in phase 2
                            elif "variant_failures" in r:
                                r["error"] = "variant failed to launch (default kernels ran): " + r["variant_failures"][0]
                            else:
                                r["error"] = "output check against SDPA flash failed"
                    except Exception as e:  # noqa: BLE001  (compile failure on this Triton, out of resources)
                        r["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                        r["traceback"] = traceback.format_exc()[-1500:]
                    r["wall_s"] = round(time.time() - t0, 1)
                    print({kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in r.items() if kk != "traceback"},
                          flush=True)
                    results.append(r)
                    save()
            except Exception as e:  # noqa: BLE001
                results.append(dict(row, error=f"{type(e).__name__}: {str(e)[:400]}"))
                save()
    save()

    # phase 2: wait for every worker's checks, then time one worker at a time
    open(f"{lock_path}.done{os.getpid()}", "w").close()
    t_wait = time.time()
    while len(glob.glob(f"{lock_path}.done*")) < n_workers and time.time() - t_wait < barrier_s:
        time.sleep(0.2)
    for r, fn, ov, kind, D, S, causal in sorted(pending, key=lambda p: (p[4], p[5], p[6])):
        try:
            q, k, v, do, _ = case_inputs(D, S, causal, with_ref=False)
            ctx = config_override("attention", **resolve_overrides(ov, D, causal)) if ov is not None else _nullctx()
            with ctx, open(lock_path, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    t_f, t_b = _measure_parts(fn, q, k, v, do, causal, kind)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
            fl = _flops_fwd(tokens // S, H, S, S, D, causal)
            if t_f is not None:
                r.update(fwd_ms=t_f, fwd_tflops=fl / t_f / 1e9)
            if t_b is not None:
                r.update(bwd_ms=t_b, bwd_tflops=2.5 * fl / t_b / 1e9)
        except Exception as e:  # noqa: BLE001
            r["error"] = f"timing: {type(e).__name__}: {str(e)[:400]}"
        print({kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in r.items() if kk != "traceback"}, flush=True)
        save()


def _measure_parts(fn, q, k, v, do, causal, kind):
    """(fwd ms or None, bwd ms or None): the forward for kinds fwd / both / peer, the backward
    (``out.backward(do, retain_graph=True)``, as ``measure``) for kinds bwd / both / peer."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    t_f = t_b = None
    if kind != "bwd":
        with torch.no_grad():
            t_f = bench(lambda: fn(q, k, v, causal, False))
    if kind != "fwd":
        out = fn(q, k, v, causal, False)
        t_b = bench(lambda: out.backward(do, retain_graph=True), grad_to_none=[q, k, v])
    return t_f, t_b


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def variants_markdown(rows, meta) -> str:
    cases = []
    for r in rows:
        c = (r["D"], r["S"], r["causal"])
        if c not in cases:
            cases.append(c)
    cases.sort()
    names = []
    for r in rows:
        if r["variant"] not in names:
            names.append(r["variant"])
    peers = [n for n in ("cudnn", "flash", "flex") if n in names]
    order: dict[str, int] = {}
    for i, (name, _, _) in enumerate(VARIANTS):
        order.setdefault(name, i)
    ours = sorted((n for n in names if n not in peers), key=lambda n: (order.get(n, len(order)), n))
    out = [f"# Attention variants (issue 13): {meta}", "",
           "TFLOP/s forward / backward, bf16, H=16, B*S=16384 (fwd 4*B*H*S*S*D, halved when causal; bwd 2.5x fwd). "
           "'x' = failed (see the JSON), '-' = not run / not timed: fwd variants time the forward only (their "
           "backward is the default's), bwd variants the backward only.", ""]
    by = {(r["variant"], r["D"], r["S"], r["causal"]): r for r in rows}
    for metric in ("fwd_tflops", "bwd_tflops"):
        out += [f"## {metric}", "", "| D | S | causal | " + " | ".join(peers + ours) + " | best ours / cudnn |",
                "|" + "---|" * (len(peers) + len(ours) + 4)]
        for D, S, causal in cases:
            cells, best = [], None
            for n in peers + ours:
                r = by.get((n, D, S, causal))
                if r is None or (metric not in r and "error" not in r):
                    cells.append("-")  # not run, or not this variant's half (fwd variants: no bwd timing)
                elif metric not in r:
                    cells.append("x")
                else:
                    cells.append(f"{r[metric]:.0f}")
                    if n in ours and (best is None or r[metric] > best[1]):
                        best = (n, r[metric])
            c = by.get(("cudnn", D, S, causal))
            ratio = f"{best[1] / c[metric]:.2f} ({best[0]})" if best and c and metric in c else "-"
            out.append(f"| {D} | {S} | {int(causal)} | " + " | ".join(cells) + f" | {ratio} |")
        out.append("")
    errs = [r for r in rows if "error" in r]
    if errs:
        out += ["## Failures", ""]
        seen = set()
        for r in errs:
            key = (r["variant"], r["error"][:120])
            if key not in seen:
                seen.add(key)
                out.append(f"- {r['variant']} (D{r['D']} S{r['S']} causal={int(r['causal'])}): {r['error'][:300]}")
    return "\n".join(out) + "\n"


def variants_sweep(out_dir: str, dims, seqlens, flex_seqlens, workers: int, deadline: float, dry: bool = False,
                   only: tuple = ()) -> None:
    """--variants: every entry of VARIANTS (plus cuDNN / flash / Flex) on every case, in worker processes;
    writes attention_variants.json and attention_variants.md under out_dir, also when stopped by the deadline."""
    import multiprocessing as mp

    import triton

    from fused_layers.ops import attention as A

    t0 = time.time()
    cases = _variant_cases(dims, seqlens)
    groups = [("sdpa", "peer", None)] + [(f"flex_d{D}", "peer", None) for D in dims if flex_seqlens]
    # One "default" group (kind "both": its row times forward and backward); fwd variants time the forward
    # only, bwd variants the backward only (the other half is the default's).
    groups += [(name, "both" if name == "default" else kind, ov) for name, kind, ov in VARIANTS
               if not (name == "default" and kind == "bwd") and (not only or name == "default" or name in only)]
    meta = dict(torch=torch.__version__, triton=triton.__version__, gpu="dry run (interpreter)" if dry else torch.cuda.get_device_name(),
                sms=0 if dry else torch.cuda.get_device_properties(0).multi_processor_count,
                has_tma_descriptors=A.HAS_TMA_DESCRIPTORS)
    print(meta, flush=True)
    ctx = mp.get_context("spawn")
    lock_path = os.path.join(out_dir, ".variants.lock")
    for f in glob.glob(f"{lock_path}.done*"):
        os.remove(f)
    # Flex groups (slow torch.compile per shape) get a worker each; the other groups share the rest.
    solo = [g for g in groups if g[0].startswith("flex")]
    rest = [g for g in groups if not g[0].startswith("flex")]
    nr = max(1, min(workers - len(solo), len(rest)))
    assignment = [[g] for g in solo] + [rest[i::nr] for i in range(nr)]
    procs, paths = [], []
    for w, grp in enumerate(assignment):
        path = os.path.join(out_dir, f".variants_{w}.json")
        if os.path.exists(path):
            os.remove(path)
        p = ctx.Process(target=_variants_worker, args=(grp, cases, lock_path, path, set(flex_seqlens), dry, len(assignment),
                                                       max(30.0, deadline - 60)))
        p.start()
        procs.append((p, grp))
        paths.append(path)
    for p, _ in procs:
        p.join(min(max(1.0, deadline - (time.time() - t0)), 1e6))
    rows, lost = [], []
    for (p, grp), path in zip(procs, paths):
        if p.is_alive():
            p.kill()
            lost.append(f"worker {[g[0] for g in grp]} killed at the deadline")
        elif p.exitcode != 0:
            lost.append(f"worker {[g[0] for g in grp]} died with exit code {p.exitcode} (a crash in a compile?)")
        if os.path.exists(path):
            try:
                rows += json.load(open(path))
            except json.JSONDecodeError:
                lost.append(f"{path}: unreadable")
            os.remove(path)
    meta["lost"] = lost
    meta["wall_s"] = round(time.time() - t0, 1)
    with open(os.path.join(out_dir, "attention_variants.json"), "w") as f:
        json.dump(dict(meta=meta, variants=[[n, k, ov] for n, k, ov in VARIANTS], rows=rows), f, indent=1)
    md = variants_markdown(rows, {k: v for k, v in meta.items() if k != "lost"})
    if lost:
        md += "\n## Lost\n\n" + "\n".join(f"- {x}" for x in lost) + "\n"
    with open(os.path.join(out_dir, "attention_variants.md"), "w") as f:
        f.write(md)
    print(md)


# ----------------------------------------------------------------------------------------------
# Benchmark
# ----------------------------------------------------------------------------------------------
def _flops_fwd(B, Hq, Sq, Sk, D, causal):
    f = 4.0 * B * Hq * Sq * Sk * D
    return f / 2 if causal else f


def _sdpa(backend):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def f(q, k, v, causal, gqa):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return f


_flex_compiled = None


def _flex(causal, S):
    global _flex_compiled
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _flex_compiled is None:
        # The benchmark times backward with retain_graph=True, which donated buffers forbid.
        torch._functorch.config.donated_buffer = False
        # One graph per (shape, causal) case: more than Dynamo's default of 8 recompiles (the first sweep
        # hit it and fell back to the unfused flex_attention, 5-18 TFLOP/s).
        import torch._dynamo.config as dc

        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
            if hasattr(dc, name):
                setattr(dc, name, max(getattr(dc, name), 256))
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, S, S, device="cuda") if causal else None

    def f(q, k, v, causal_, gqa):
        return _flex_compiled(q, k, v, block_mask=bm, enable_gqa=gqa)

    return f


def measure(fn, q, k, v, causal, gqa):
    """(fwd ms, bwd ms, peak MiB beyond the inputs) or raises."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal, gqa)
    do = torch.randn_like(out)
    out.backward(do)  # warm-up / compile the backward
    torch.cuda.synchronize()
    q.grad = k.grad = v.grad = None
    del out
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn(q, k, v, causal, gqa)
    out.backward(do)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    q.grad = k.grad = v.grad = None
    with torch.no_grad():
        t_f = bench(lambda: fn(q, k, v, causal, gqa))
    out = fn(q, k, v, causal, gqa)
    t_b = bench(lambda: out.backward(do, retain_graph=True), grad_to_none=[q, k, v])
    return t_f, t_b, peak


def run_case(name, B, Hq, Hkv, S, D, causal, provs, rows, flex_ok):
    from fused_layers import fused_attention

    gqa = Hq != Hkv
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
    fl = _flops_fwd(B, Hq, S, S, D, causal)
    fns = {"fused": lambda q, k, v, c, g: fused_attention(q, k, v, is_causal=c, enable_gqa=g)}
    fns.update(provs)
    if flex_ok:
        try:
            fns["flex"] = _flex(causal, S)
        except Exception as e:  # noqa: BLE001
            print(f"  flex unavailable: {e}")
    for pname, fn in fns.items():
        row = dict(case=name, B=B, Hq=Hq, Hkv=Hkv, S=S, D=D, causal=causal, provider=pname)
        try:
            t0 = time.time()
            t_f, t_b, peak = measure(fn, q, k, v, causal, gqa)
            row.update(fwd_ms=t_f, bwd_ms=t_b, peak_mib=peak, fwd_tflops=fl / t_f / 1e9, bwd_tflops=2.5 * fl / t_b / 1e9,
                       fwdbwd_tflops=3.5 * fl / (t_f + t_b) / 1e9, wall_s=time.time() - t0)
        except Exception as e:  # noqa: BLE001
            row.update(error=f"{type(e).__name__}: {str(e)[:160]}")
        rows.append(row)
        print("  ", {k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)


def run_varlen(rows, flex_ok):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fused_layers import fused_attention_varlen

    g = torch.Generator().manual_seed(0)
    lens = []
    while sum(lens) < TOKENS - 4096:
        lens.append(int(torch.randint(256, 4097, (1,), generator=g)))
    lens.append(TOKENS - sum(lens))
    D, causal, maxlen = 128, True, max(lens)
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = sum(_flops_fwd(1, H, L, L, D, causal) for L in lens)
    name = f"varlen {len(lens)} seqs (max {maxlen}) D128 causal"

    def fused(q_, k_, v_, c, gq):
        return fused_attention_varlen(q_, k_, v_, cu, cu, maxlen, maxlen, is_causal=True)

    B = len(lens)

    def padded(q_, k_, v_, c, gq):  # SDPA flash on a zero-padded (B, H, maxlen, D) batch
        def pad(t):
            out = t.new_zeros(B, maxlen, H, D)
            for i, L in enumerate(lens):
                out[i, :L] = t[int(cu[i]) : int(cu[i]) + L]
            return out.transpose(1, 2)

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(pad(q_), pad(k_), pad(v_), is_causal=True)
        return torch.cat([o[i, :, :L].transpose(0, 1) for i, L in enumerate(lens)])

    fns = {"fused": fused, "flash_padded": padded}
    if flex_ok:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            doc = torch.repeat_interleave(torch.arange(B, device="cuda"), torch.tensor(lens, device="cuda"))
            bm = create_block_mask(lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki), None, None, TOKENS, TOKENS, device="cuda")
            torch._functorch.config.donated_buffer = False  # backward is timed with retain_graph=True
            comp = torch.compile(flex_attention, dynamic=False)

            def flex(q_, k_, v_, c, gq):
                o = comp(q_.transpose(0, 1)[None], k_.transpose(0, 1)[None], v_.transpose(0, 1)[None], block_mask=bm)
                return o[0].transpose(0, 1)

            fns["flex_docmask"] = flex
        except Exception as e:  # noqa: BLE001
            print(f"  flex unavailable: {e}")
    for pname, fn in fns.items():
        row = dict(case=name, B=B, Hq=H, Hkv=H, S=maxlen, D=D, causal=causal, provider=pname)
        try:
            t_f, t_b, peak = measure(fn, q, k, v, causal, False)
            row.update(fwd_ms=t_f, bwd_ms=t_b, peak_mib=peak, fwd_tflops=fl / t_f / 1e9, bwd_tflops=2.5 * fl / t_b / 1e9,
                       fwdbwd_tflops=3.5 * fl / (t_f + t_b) / 1e9)
        except Exception as e:  # noqa: BLE001
            row.update(error=f"{type(e).__name__}: {str(e)[:160]}")
        rows.append(row)
        print("  ", {k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)


def markdown(rows) -> str:
    cases = []
    for r in rows:
        if r["case"] not in cases:
            cases.append(r["case"])
    provs = []
    for r in rows:
        if r["provider"] not in provs:
            provs.append(r["provider"])
    lines = [
        "TFLOP/s forward / backward (peak MiB of fwd+bwd beyond inputs), bf16. Ratios: fused over each peer.",
        "",
        "| case | " + " | ".join(provs) + " | fused/flash fwd, bwd | fused/flex fwd, bwd | fused/cudnn fwd |",
        "|" + "---|" * (len(provs) + 4),
    ]
    for c in cases:
        by = {r["provider"]: r for r in rows if r["case"] == c}
        cells = []
        for p in provs:
            r = by.get(p)
            if r is None:
                cells.append("")
            elif "error" in r:
                cells.append("n/a")
            else:
                cells.append(f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f} ({r['peak_mib']:.0f})")

        def ratio(p, key):
            a, b = by.get("fused"), by.get(p)
            if not a or not b or "error" in a or "error" in b:
                return "-"
            return f"{a[key] / b[key]:.2f}"

        flash = "flash" if "flash" in by else "flash_padded"
        flex = "flex" if "flex" in by else "flex_docmask"
        lines.append(
            f"| {c} | " + " | ".join(cells)
            + f" | {ratio(flash, 'fwd_tflops')}, {ratio(flash, 'bwd_tflops')} | {ratio(flex, 'fwd_tflops')}, {ratio(flex, 'bwd_tflops')}"
            + f" | {ratio('cudnn', 'fwd_tflops')} |"
        )
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--static-scan", action="store_true", help="no GPU needed: sm_90 registers/spills of the defaults")
    ap.add_argument("--static-scan-variants", action="store_true",
                    help="no GPU needed: sm_90 compile of every entry of VARIANTS (attention_static_scan_variants.json)")
    ap.add_argument("--variants", action="store_true",
                    help="GPU: every entry of VARIANTS (issue 13: default, stages+1, bwd_tma on / off) beside cuDNN, flash and Flex (attention_variants.*)")
    ap.add_argument("--variant-seqlens", default="1024,4096,16384")
    ap.add_argument("--only", default="", help="--variants: time only these VARIANTS names (and the default), comma-separated")
    ap.add_argument("--dry-run", action="store_true", help="--variants on the CPU interpreter, tiny shapes (no GPU)")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--seqlens", default="4096,1024,16384,2048,8192")
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--flex-seqlens", default="4096")
    ap.add_argument("--deadline", type=float, default=1e9, help="stop starting new cases after this many seconds")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.sweep:
        sweep(args.out, args.workers)
        return
    if args.static_scan:
        static_scan(args.out)
        return
    if args.static_scan_variants:
        static_scan_variants(args.out)
        return
    if args.variants:
        variants_sweep(args.out, [int(d) for d in args.dims.split(",")], [int(x) for x in args.variant_seqlens.split(",")],
                       [int(x) for x in args.flex_seqlens.split(",") if x], args.workers, args.deadline, args.dry_run,
                       tuple(x for x in args.only.split(",") if x))
        return
    from torch.nn.attention import SDPBackend

    torch.manual_seed(0)
    t0 = time.time()
    provs = {
        "flash": _sdpa(SDPBackend.FLASH_ATTENTION),
        "cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION),
        "efficient": _sdpa(SDPBackend.EFFICIENT_ATTENTION),
    }
    torch._dynamo.config.cache_size_limit = 256
    flex_s = {int(s) for s in args.flex_seqlens.split(",") if s}
    rows = []
    meta = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), python=platform.python_version())
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass

    def save():
        with open(os.path.join(args.out, "attention.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        with open(os.path.join(args.out, "attention.md"), "w") as f:
            f.write(f"# Attention benchmark ({meta})\n\n" + markdown(rows))

    cases = []
    for S in [int(s) for s in args.seqlens.split(",")]:
        for D in [int(d) for d in args.dims.split(",")]:
            for causal in (False, True):
                cases.append((f"B{TOKENS // S} H{H} S{S} D{D}{' causal' if causal else ''}", TOKENS // S, H, H, S, D, causal))
    cases.insert(4, ("GQA Hq32 Hkv8 B4 S4096 D128 causal", 4, 32, 8, 4096, 128, True))
    for i, (name, B, Hq, Hkv, S, D, causal) in enumerate(cases):
        if time.time() - t0 > args.deadline:
            print(f"deadline: skipping {name}")
            continue
        print(name, flush=True)
        run_case(name, B, Hq, Hkv, S, D, causal, provs, rows, S in flex_s)
        save()
        if i == 4 and time.time() - t0 < args.deadline:
            print("varlen", flush=True)
            run_varlen(rows, 4096 in flex_s)
            save()
    save()
    print(markdown(rows))


if __name__ == "__main__":
    main()
