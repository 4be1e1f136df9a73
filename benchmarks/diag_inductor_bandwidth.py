"""How close the kernels Inductor generates for a compiled GPT-2 step are to the copy ceiling (issue 12).

Issue 12 asks for a fused run 1.1x faster than the best unfused one. The best unfused run is the
``torch.compile``d SDPA model. Its step at seq 1,024 is 31.2 ms of GPU time (README, *Where the time goes*):
cuBLAS 16.4, cuDNN attention 3.6, Inductor's Triton kernels 7.3, fused AdamW 1.0. A 1.1x faster step needs
about 2.8 ms less. Kernels of ours can only replace the memory-bound part: Inductor's norms, GELU, adds and
loss. This script measures that part kernel by kernel. It gives each kernel's time, the bytes Inductor
counts for it, and its fraction of the 4.22 TB/s copy. It then bounds what a faster kernel for the same
bytes could save: sum(time) - sum(bytes / copy rate).

Method: ``TORCHINDUCTOR_PROFILE=1`` (set below, before torch is imported) makes every generated Triton
kernel a ``DebugAutotuner``. It times the kernel once with ``do_bench`` (L2 flushed) and records
(ms, GB, GB/s, name) on every call. The wrapper of each compiled graph clears that record at its start and
reports it at its end (``start_graph`` / ``end_graph``). We wrap ``end_graph`` to keep each graph call's
list, run the compiled ``compile_sdpa`` variant of ``bench_e2e.py`` for a warm-up step and one measured step,
and sum the forward and backward graphs of the measured step.

    python benchmarks/diag_inductor_bandwidth.py --out $OUT [--seq-len 4096 --batch-size 4]

Needs a CUDA GPU (on the CPU Inductor emits C++, not Triton).
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_PROFILE", "1")  # before torch._inductor.config is imported

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

COPY_GBS = 4220.0  # H200 device-to-device copy, GB/s (read + write)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--gpu-ms", type=float, default=None,
                    help="GPU ms of the compiled step (README: 31.2 at seq 1,024, 38.9 at 4,096); sets the 1.1x budget")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("diag_inductor_bandwidth.py needs a CUDA GPU (Inductor emits C++ kernels on the CPU)")

    from torch._inductor.runtime import triton_heuristics as th

    graphs: list[list[tuple]] = []
    orig_end = th.end_graph

    def end_graph(output_file):  # keep each compiled graph call's kernel list
        graphs.append(list(th.collected_calls))
        return orig_end(output_file)

    th.end_graph = end_graph

    from bench_e2e import Variant  # the compiled SDPA GPT-2 step of bench_e2e.py

    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    v = Variant("compile_sdpa", argparse.Namespace(seq_len=args.seq_len), dev)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randint(0, 50304, (args.batch_size, args.seq_len), device=dev, generator=g)
    y = torch.randint(0, 50304, (args.batch_size, args.seq_len), device=dev, generator=g)
    v.step(x, y)  # compile + first timing of every kernel
    torch.cuda.synchronize()
    graphs.clear()
    v.step(x, y)  # the measured step: forward graph + backward graph
    torch.cuda.synchronize()
    th.end_graph = orig_end
    if not graphs:
        raise SystemExit("no Inductor graph reported its kernels: was TORCHINDUCTOR_PROFILE set before torch was imported?")

    per_kernel: dict[str, dict] = defaultdict(lambda: dict(calls=0, ms=0.0, gb=0.0))
    for calls in graphs:
        for ms, gb, _gbs, name in calls:
            k = per_kernel[name]
            k["calls"] += 1
            k["ms"] += ms
            k["gb"] += gb
    total_ms = sum(k["ms"] for k in per_kernel.values())
    total_gb = sum(k["gb"] for k in per_kernel.values())
    floor_ms = total_gb / COPY_GBS * 1e3
    rows = sorted(per_kernel.items(), key=lambda kv: -kv[1]["ms"])
    res = dict(
        seq_len=args.seq_len, batch_size=args.batch_size, graphs=len(graphs), kernels=len(rows),
        inductor_ms=total_ms, inductor_gb=total_gb, frac_of_copy=(total_gb / (total_ms / 1e3)) / COPY_GBS,
        at_copy_ms=floor_ms, max_saving_ms=total_ms - floor_ms,
        per_kernel=[dict(name=n, **k, frac=(k["gb"] / (k["ms"] / 1e3)) / COPY_GBS if k["ms"] else None) for n, k in rows],
    )
    if args.gpu_ms:
        res["gpu_ms"] = args.gpu_ms
        res["saving_needed_for_1_1x_ms"] = args.gpu_ms * (1 - 1 / 1.1)
    os.makedirs(args.out, exist_ok=True)
    tag = f"s{args.seq_len}"
    with open(os.path.join(args.out, f"inductor_bandwidth_{tag}.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    lines = [
        f"# Inductor's Triton kernels in one compiled GPT-2 step (B{args.batch_size} x {args.seq_len}), {torch.cuda.get_device_name()}",
        "",
        f"`python benchmarks/diag_inductor_bandwidth.py --seq-len {args.seq_len} --batch-size {args.batch_size}`; "
        "each kernel timed by Inductor's profile_bandwidth (do_bench, L2 flushed), bytes as Inductor counts them.",
        "",
        f"- {len(rows)} kernels, {sum(k['calls'] for k in per_kernel.values())} calls over {len(graphs)} graph calls: "
        f"{total_ms:.2f} ms, {total_gb:.2f} GB, {res['frac_of_copy']:.2f} of copy overall",
        f"- the same bytes at the copy rate: {floor_ms:.2f} ms, so faster kernels for the same bytes save at most "
        f"{res['max_saving_ms']:.2f} ms",
    ]
    if args.gpu_ms:
        lines.append(f"- a 1.1x faster step ({args.gpu_ms} ms of GPU time) needs {res['saving_needed_for_1_1x_ms']:.2f} ms less")
    lines += ["", "| kernel | calls | ms | GB | frac of copy |", "|---|---|---|---|---|"]
    for n, k in rows[:40]:
        frac = (k["gb"] / (k["ms"] / 1e3)) / COPY_GBS if k["ms"] else 0.0
        lines.append(f"| {n} | {k['calls']} | {k['ms']:.3f} | {k['gb']:.3f} | {frac:.2f} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, f"inductor_bandwidth_{tag}.md"), "w") as fh:
        fh.write(md)
    print(md)


if __name__ == "__main__":
    main()
