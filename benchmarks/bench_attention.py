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
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

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


def static_scan(out_dir: str) -> None:
    """Compile the default configs for sm_90 on this (GPU-less) machine and report registers, spills and
    whether the SASS uses wgmma (HGMMA) and cp.async (LDGSTS): a check that needs no GPU."""
    import re
    import subprocess

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fused_layers.ops import attention as A

    kernels = {"fwd": A._attn_fwd_kernel, "dkdv": A._attn_bwd_dkdv_kernel, "dq": A._attn_bwd_dq_kernel}
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    rows = []
    for kind, fn in kernels.items():
        for D in [int(d) for d in os.environ.get("SCAN_DIMS", "64,128,80,256").split(",")]:
            bd = max(16, triton.next_power_of_2(D))
            for causal in (False, True):
                cfg = A._TUNE[kind][64 if bd <= 64 else 128 if bd <= 128 else 256][0]
                cx = dict(VARLEN=False, CAUSAL=causal, HAS_KB=False, BLOCK_D=bd, EVEN_D=D == bd, INPUT_PRECISION="tf32",
                          BLOCK_M=cfg[0], BLOCK_N=cfg[1])
                sig, attrs = {}, {}
                for i, n in enumerate(fn.arg_names):
                    if n in cx:
                        sig[n] = "constexpr"
                    elif n.startswith("s") and n.endswith("d") and len(n) <= 5:  # unit head-dim strides
                        sig[n], cx[n] = "constexpr", 1
                    elif n in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV"):
                        sig[n], attrs[(i,)] = "*bf16", [["tt.divisibility", 16]]
                    elif n in ("LSE", "DELTA", "KB"):
                        sig[n], attrs[(i,)] = "*fp32", [["tt.divisibility", 16]]
                    elif n in ("CU_Q", "CU_K"):
                        sig[n] = "*i32"
                    elif n in ("qk_scale", "sm_scale"):
                        sig[n] = "fp32"
                    else:
                        sig[n] = "i32"
                        # What Triton's runtime specialization gives for these values (divisible by 16).
                        if n.startswith("s") or n in ("SQ", "SK") or (n == "HEAD_DIM" and D % 16 == 0):
                            attrs[(i,)] = [["tt.divisibility", 16]]
                row = dict(kernel=kind, D=D, causal=causal, config=cfg)
                try:
                    k = triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                                       options=dict(num_warps=cfg[2], num_stages=cfg[3]))
                    path = os.path.join(out_dir, ".scan.cubin")
                    with open(path, "wb") as f:
                        f.write(k.asm["cubin"])
                    res = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True).stdout
                    sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True).stdout
                    os.remove(path)
                    m = re.search(r"REG:(\d+) STACK:(\d+)", res)
                    row.update(regs=int(m.group(1)), stack_bytes=int(m.group(2)), shared_bytes=k.metadata.shared,
                               hgmma=sass.count("HGMMA"), ldgsts=sass.count("LDGSTS"))
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(row, flush=True)
                rows.append(row)
    with open(os.path.join(out_dir, "attention_static_scan.json"), "w") as f:
        json.dump(dict(triton=triton.__version__, target="sm_90", rows=rows), f, indent=1)


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
