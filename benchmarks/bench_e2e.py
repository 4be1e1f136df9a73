"""End-to-end training throughput of the demo GPT (GPT-2 small: 124M parameters, sequence 1024, bf16
autocast), fused against the unfused baselines, side by side in one process on one GPU.

    python benchmarks/bench_e2e.py --out benchmarks/results                 # writes e2e_<gpu>.json/.md
    python benchmarks/bench_e2e.py --out benchmarks/results --lightning     # + train.py runs (Trainer path)

Variants (the same initial weights, data and AdamW; each a full training step: forward, LM head +
cross-entropy (the model's ``LinearCrossEntropyLoss``; float32 logits unless swapped), backward, optimizer
step; ``torch.compile`` variants compile the whole model, loss included):

* ``unfused``            attention core = fused_layers' reference ``Attention`` (explicit ``nn.Softmax``)
* ``unfused_sdpa``       core = ``F.scaled_dot_product_attention`` (flash kernels): the strongest eager baseline
* ``compile``            ``torch.compile`` of ``unfused``
* ``compile_sdpa``       ``torch.compile`` of ``unfused_sdpa``
* ``fused``              ``unfused`` after ``swap_modules`` (all kinds: FusedAttention + FusedLayerNorm) = fused=true
* ``fused_softmax_ln``   ``unfused`` with only softmax + layer_norm swapped (attention core left explicit)
* ``fused_compile``      ``fused``, then ``torch.compile`` (fused ops as custom ops inside the graph)

Method: every variant is built and warmed up first (compilation and Triton JIT excluded), then
``--rounds`` rounds, each running ``--steps`` steps of every variant in turn (interleaved, so clock or
thermal drift hits all alike), timed with CUDA events; the median round gives tokens/s and step time.
Peak memory: for one step of each variant, the allocator's peak above what was allocated before the step,
plus the variant's own resident parameters and optimizer state (what a run of that variant alone needs).
First-step losses are compared with ``unfused`` as a correctness check. ``--lightning`` also runs
``train.py model=gpt2_small trainer=gpu data=synthetic fused=false|true`` (and sdpa) through the real
Trainer + callbacks and reports ThroughputMonitor's tokens/s from each run's summary.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _timing import gpu_tag, interleaved_step_ms  # noqa: E402

VARIANTS = ["unfused", "unfused_sdpa", "compile", "compile_sdpa", "fused", "fused_softmax_ln", "fused_compile"]
GPT2_SMALL = dict(vocab_size=50304, seq_len=1024, d_model=768, n_layer=12, n_head=12)


class Variant:
    def __init__(self, name: str, args: argparse.Namespace, device: torch.device):
        from fused_layers.swap import swap_modules
        from lm_demo.model import GPTLM

        self.name = name
        torch.manual_seed(0)  # same initial weights for every variant
        attn = "sdpa" if name.endswith("sdpa") else "reference"
        self.lm = GPTLM(**{**GPT2_SMALL, "seq_len": args.seq_len}, attn_impl=attn).to(device)
        self.report = None
        if name.startswith("fused"):
            kinds = {"softmax": True, "layer_norm": True} if name == "fused_softmax_ln" else None
            self.report = swap_modules(self.lm, kinds=kinds)
        self.net = torch.compile(self.lm.model) if "compile" in name else self.lm.model
        decay = [p for p in self.lm.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.lm.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                     lr=1e-4, betas=(0.9, 0.95), fused=True)
        self.losses: list[float] = []

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.net(x, y)  # the LM head + loss module (swapped by kind cross_entropy), inside any compile
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def resident_bytes(self) -> int:
        params = sum(p.numel() * p.element_size() for p in self.lm.parameters())
        state = sum(t.numel() * t.element_size() for s in self.opt.state.values() for t in s.values() if torch.is_tensor(t))
        return params + state

    def free(self) -> None:
        self.__dict__.clear()


def bench_direct(args: argparse.Namespace) -> dict:
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    g = torch.Generator(device="cpu").manual_seed(1)
    data = torch.randint(0, 256, (args.batch_size, args.seq_len + 1), generator=g).to(device)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    tokens = args.batch_size * args.seq_len

    variants: dict[str, Variant] = {}
    results: dict[str, dict] = {}
    for name in args.variants:
        t0 = time.perf_counter()
        try:
            v = Variant(name, args, device)
            v.losses.append(float(v.step(x, y)))  # first step: the correctness check, compile/JIT
            for _ in range(args.warmup - 1):
                v.step(x, y)
            torch.cuda.synchronize()
            # memory of one step, on top of what is resident before it
            gc.collect()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            v.step(x, y)
            torch.cuda.synchronize()
            transient = torch.cuda.max_memory_allocated() - before
            results[name] = {
                "first_loss": v.losses[0],
                "peak_memory_gib": (transient + v.resident_bytes()) / 2**30,
                "setup_seconds": time.perf_counter() - t0,
                "swapped": None if v.report is None else len(v.report.swapped),
            }
            variants[name] = v
            print(f"[{name}] ready in {time.perf_counter() - t0:.1f}s, first loss {v.losses[0]:.4f}, "
                  f"peak {results[name]['peak_memory_gib']:.2f} GiB", flush=True)
        except Exception as e:  # report and go on with the others
            results[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print(f"[{name}] FAILED: {results[name]['error']}", flush=True)
            v = None
            gc.collect()
            torch.cuda.empty_cache()

    times = interleaved_step_ms({n: (lambda v=v: v.step(x, y)) for n, v in variants.items()}, args.rounds, args.steps)
    ref_loss = results.get("unfused", results.get("unfused_sdpa", {})).get("first_loss")
    for name, ts in times.items():
        ms = statistics.median(ts)
        res = results[name]
        res.update({
            "step_ms": ms, "step_ms_rounds": ts, "tokens_per_sec": tokens / (ms / 1e3),
            "first_loss_diff_vs_unfused": None if ref_loss is None else abs(res["first_loss"] - ref_loss),
        })
    base = results.get("unfused", {}).get("tokens_per_sec")
    for name in times:
        results[name]["speedup_vs_unfused"] = results[name]["tokens_per_sec"] / base if base else None
    best = max((results[n]["tokens_per_sec"], n) for n in times if n in ("unfused_sdpa", "compile_sdpa")) if (
        {"unfused_sdpa", "compile_sdpa"} & set(times)) else None
    for name in times:
        results[name]["vs_best_unfused"] = results[name]["tokens_per_sec"] / best[0] if best else None
        results[name]["best_unfused"] = best[1] if best else None
    if args.profile_steps:
        for name, v in variants.items():
            results[name].update(profile_variant(v, x, y, args.profile_steps))
            r = results[name]
            print(f"[{name}] step {r['step_ms']:.2f} ms, GPU kernels {r['gpu_kernel_ms']:.2f} ms "
                  f"(step / GPU = {r['step_ms'] / r['gpu_kernel_ms']:.3f})", flush=True)
    for v in variants.values():
        v.free()
    return results


def profile_variant(v: "Variant", x, y, steps: int) -> dict:
    """GPU kernel time per step (sum of CUDA kernel durations from torch.profiler), and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            v.step(x, y)
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = {}
    total = 0.0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = e.self_cuda_time_total
        if t <= 0:
            continue
        total += t
        per_kernel[e.key] = per_kernel.get(e.key, 0.0) + t
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:25]
    return {"gpu_kernel_ms": total / steps / 1e3,
            "top_kernels_ms": [(k[:120], t / steps / 1e3) for k, t in top]}


def bench_lightning(args: argparse.Namespace) -> dict:
    """train.py through the real Trainer + callbacks; tokens/s from ThroughputMonitor (summary.json)."""
    runs = {"fused=false": ["fused=false"], "fused=false sdpa": ["fused=false", "model.attn_impl=sdpa"], "fused=true": ["fused=true"]}
    out = {}
    for label, ov in runs.items():
        run_dir = Path("/tmp/bench_e2e_lightning") / label.replace(" ", "_").replace("=", "-")
        cmd = [sys.executable, str(ROOT / "train.py"), "model=gpt2_small", "trainer=gpu", "data=synthetic", "logger=none",
               f"model.seq_len={args.seq_len}", f"data.batch_size={args.batch_size}", f"trainer.max_steps={args.lightning_steps}",
               "trainer.limit_val_batches=0", "trainer.enable_checkpointing=false", "trainer.enable_progress_bar=false",
               f"hydra.run.dir={run_dir}", *ov]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            out[label] = {"error": r.stderr[-2000:]}
            print(f"[lightning {label}] FAILED:\n{r.stderr[-2000:]}", flush=True)
            continue
        m = json.loads((run_dir / "summary.json").read_text())["metrics"]
        out[label] = {
            "tokens_per_sec": m.get("train/device/items_per_sec"), "mfu": m.get("train/device/mfu"),
            "peak_memory_gib": m.get("peak_memory_gib"), "wall_seconds": time.perf_counter() - t0,
            "speedups": {k: v for k, v in m.items() if k.startswith("fused/speedup/")},
        }
        print(f"[lightning {label}] {out[label]}", flush=True)
    base = out.get("fused=false", {}).get("tokens_per_sec")
    for v in out.values():
        if base and v.get("tokens_per_sec"):
            v["speedup_vs_unfused"] = v["tokens_per_sec"] / base
    return out


def to_markdown(res: dict) -> str:
    a = res["args"]
    lines = [
        f"# End-to-end training throughput: GPT-2 small ({res['params_m']:.0f}M params), bf16 autocast, "
        f"batch {a['batch_size']} x seq {a['seq_len']}, {res['gpu']}",
        "",
        f"torch {res['torch']}, triton {res['triton']}. Command: `{res['command']}`",
        f"Median of {a['rounds']} interleaved rounds of {a['steps']} steps (CUDA events); warm-up (compile, JIT) excluded.",
        "",
        "| variant | tokens/s | step ms | GPU kernel ms | step / GPU | vs unfused | vs best unfused | peak GiB | first-step loss diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in res["direct"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:120]} | | | | |")
            continue
        gk = r.get("gpu_kernel_ms")
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        lines.append(f"| {name} | {r['tokens_per_sec']:,.0f} | {r['step_ms']:.2f} | {fmt(gk, '.2f')} | "
                     f"{fmt(None if gk is None else r['step_ms'] / gk, '.3f')} | {fmt(r['speedup_vs_unfused'], '.2f')}x | "
                     f"{fmt(r.get('vs_best_unfused'), '.3f')}x | {r['peak_memory_gib']:.2f} | "
                     f"{fmt(r['first_loss_diff_vs_unfused'], '.2e')} |")
    for name, r in res["direct"].items():
        if r.get("top_kernels_ms"):
            lines += ["", f"GPU time per step by kernel, {name} (ms):", ""]
            lines += [f"- {t:.3f} `{k}`" for k, t in r["top_kernels_ms"][:12]]
    if res.get("lightning"):
        lines += ["", "train.py through the Trainer (ThroughputMonitor tokens/s, data=synthetic):", "",
                  "| run | tokens/s | vs fused=false | MFU | peak GiB |", "|---|---|---|---|---|"]
        for label, r in res["lightning"].items():
            if "error" in r:
                lines.append(f"| {label} | failed | | | |")
                continue
            f = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
            lines.append(f"| {label} | {f(r['tokens_per_sec'], ',.0f')} | {f(r.get('speedup_vs_unfused'), '.2f')} | "
                         f"{f(r['mfu'], '.1%')} | {f(r['peak_memory_gib'], '.2f')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for e2e_<gpu>.json and .md")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=3, help="steps under torch.profiler per variant (0: none)")
    ap.add_argument("--tag", default="", help="suffix of the result files (e.g. _s4096)")
    ap.add_argument("--lightning", action="store_true", help="also run train.py fused=false/true (needs hydra)")
    ap.add_argument("--lightning-steps", type=int, default=80)
    args = ap.parse_args()
    from fused_layers.ops import _cpp

    _cpp.extension(wait=True)  # the C++ fast path built (or loaded from torch's cache) before anything is timed
    args.variants = [v for v in args.variants.split(",") if v]
    bad = set(args.variants) - set(VARIANTS)
    if bad:
        ap.error(f"--variants: unknown {sorted(bad)}; choose from {VARIANTS}")
    if not torch.cuda.is_available():
        sys.exit("bench_e2e.py needs a CUDA GPU")
    import triton

    from lm_demo.model import GPTLM

    with torch.device("meta"):
        params = sum(p.numel() for p in GPTLM(**GPT2_SMALL).parameters())
    res = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "params_m": params / 1e6, "args": vars(args),
        "command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "direct": bench_direct(args),
    }
    if args.lightning:
        res["lightning"] = bench_lightning(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"e2e_{gpu_tag()}{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(res, indent=2))
    md = to_markdown(res)
    stem.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
