"""Acceptance table for issue 11: the models people train, built by their own libraries, unfused vs fused.

    python benchmarks/bench_models.py --out $OUT                       # every model, one subprocess each
    python benchmarks/bench_models.py --out $OUT --models llama,vit    # a subset

Models (random init from configs, no download; bf16 parameters, AdamW(fused), full training steps:
forward, loss, backward, optimizer step):

* ``gpt2``   HF ``GPT2LMHeadModel(GPT2Config())`` (GPT-2 small, its default dropout 0.1), batch 8 x 1,024
* ``llama``  HF Llama, 8 layers, d 1,024, 16 heads / 4 KV heads (GQA), FFN 2,816, vocab 32,000, batch 4 x 2,048
* ``qwen2``  HF Qwen2, same sizes, 2 KV heads (qkv bias), batch 4 x 2,048
* ``vit``    timm ``vit_base_patch16_224`` (ViT-B/16), batch 64 x 224^2, 1,000 classes

Variants, in one process per model, built from the same seed (identical weights):

* ``unfused``  as the library builds it (attention: ``sdpa``)
* ``fused``    ``swap_modules(model)``: every norm and attention swapped (policy ``always``)
* ``faster``   what ``FusedLayersCallback(policy="faster")`` keeps: swap, run the step-time A/B
               (``fused_layers.ledger.StepAB``: unfused / all / each kind, interleaved training steps), keep
               the arm that beat unfused in every round (else unfused)
* ``liger``    (llama, qwen2; when liger-kernel is installed) ``apply_liger_kernel_to_<model>(model=...)``.
               Liger replaces module globals of transformers (rope) and so would change the unfused
               model too: its rounds run *after* the interleaved ones, against this process's unfused
               rounds (marked "sequential").

Method: warm-up steps first (Triton JIT, allocator), then ``--rounds`` interleaved rounds of
``--steps`` steps per variant (CUDA events); reported: median ms/step, min-max spread over rounds,
speedup of medians.  First-step loss: the loss of the first batch in eval mode (no dropout: comparable)
before any step, difference to unfused; the train-mode first loss too.  Peak memory: the allocator's
peak during one step above what was allocated before it, plus the variant's own parameters, gradients
and optimizer state (what a run of that variant alone holds).
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
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ["gpt2", "llama", "qwen2", "vit"]
LIGER = {"llama": "apply_liger_kernel_to_llama", "qwen2": "apply_liger_kernel_to_qwen2"}


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------
def build(name: str, args):
    """(model on the GPU in bf16, batch, loss_fn(model, batch), items per step, description)."""
    import torch

    dev = torch.device("cpu" if args.smoke else "cuda")
    torch.manual_seed(0)
    g = torch.Generator(device="cpu").manual_seed(1)
    if name in ("gpt2", "llama", "qwen2"):
        import transformers as T

        if args.smoke:  # CPU check of this script (Triton interpreter): tiny configs
            small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
            T = _Tiny(T, small)
        if name == "gpt2":
            cfg = T.GPT2Config(attn_implementation="sdpa")
            model = T.GPT2LMHeadModel(cfg)
            bs, seq = args.batch or (2 if args.smoke else 8), args.seq or (16 if args.smoke else 1024)
        else:
            common = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                          num_attention_heads=16, max_position_embeddings=4096, attn_implementation="sdpa")
            if name == "llama":
                cfg, cls = T.LlamaConfig(num_key_value_heads=4, **common), T.LlamaForCausalLM
            else:
                cfg, cls = T.Qwen2Config(num_key_value_heads=2, **common), T.Qwen2ForCausalLM
            model = cls(cfg)
            bs, seq = args.batch or (2 if args.smoke else 4), args.seq or (16 if args.smoke else 2048)
        model.config.use_cache = False  # training: no KV cache (what HF's Trainer runs)
        ids = torch.randint(0, cfg.vocab_size, (bs, seq), generator=g).to(dev)
        batch = {"input_ids": ids, "labels": ids}

        def loss_fn(m, b):
            return m(**b).loss

        desc = f"batch {bs} x {seq}"
        items = bs * seq
    elif name == "vit":
        import timm

        kw = dict(img_size=32, patch_size=16, depth=2, embed_dim=32, num_heads=2) if args.smoke else {}
        model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000, **kw)
        bs = args.batch or 64
        hw = 32 if args.smoke else 224
        x = torch.randn(bs, 3, hw, hw, generator=g).to(dev, torch.bfloat16)
        y = torch.randint(0, 1000, (bs,), generator=g).to(dev)
        batch = (x, y)

        def loss_fn(m, b):
            return torch.nn.functional.cross_entropy(m(b[0]).float(), b[1])

        desc = f"batch {bs} x 224^2"
        items = bs
    else:
        raise ValueError(name)
    model = model.to(dev, torch.bfloat16 if not args.smoke else torch.float32).train()
    if args.smoke and name == "vit":
        batch = (batch[0].float(), batch[1])
    return model, batch, loss_fn, items, desc


class _Tiny:
    """transformers, with the config classes shrunk (``--smoke`` only)."""

    def __init__(self, T, small):
        self._T, self._small = T, small

    def __getattr__(self, name):
        obj = getattr(self._T, name)
        if name == "GPT2Config":
            return lambda **kw: obj(**{**kw, "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64})
        if name.endswith("Config"):
            return lambda **kw: obj(**{**kw, **self._small})
        return obj


class Variant:
    def __init__(self, model_name: str, name: str, args):
        import torch

        self.name = name
        self.model, self.batch, self.loss_fn, self.items, self.desc = build(model_name, args)
        self.report = None
        self.restored: dict[str, float] = {}
        if name in ("fused", "faster"):
            from fused_layers import swap_modules

            self.report = swap_modules(self.model)
        if name == "liger":
            import liger_kernel.transformers as lk

            getattr(lk, LIGER[model_name])(model=self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, fused=not args.smoke)
        self.eval_loss = self.first_train_loss = None

    def step(self):
        loss = self.loss_fn(self.model, self.batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def first_losses(self):
        import torch

        self.model.eval()
        with torch.no_grad():
            self.eval_loss = float(self.loss_fn(self.model, self.batch))
        self.model.train()
        self.first_train_loss = float(self.step())

    def apply_policy_faster(self, rounds: int):
        """What the callback's policy=faster does: a step-time A/B of the swaps on this model's own training
        steps (arms unfused / all / each kind, interleaved), then keep the arm that beat unfused in every
        round (``fused_layers.ledger.faster_arm``), else unfused."""
        import torch

        from fused_layers.ledger import StepAB, faster_arm

        swapped = {e.name: e.kind for e in self.report.swapped}
        ab = StepAB(self.model, swapped, rounds=rounds, warmup_rounds=1,
                    device="cuda" if torch.cuda.is_available() else "cpu")
        while ab.begin_step():
            self.step()
            ab.end_step()
        results = ab.finish()
        best = faster_arm(results) if ab.meaningful else "all"  # CPU timings undo nothing (as the callback)
        ab.set_fused(ab.arms[best])
        self.kept_arm = best
        self.step_ab = {arm: {"speedup": r.speedup, "lo": r.speedup_lo, "hi": r.speedup_hi, "step_ms": r.step_ms}
                        for arm, r in results.items()}
        self.restored = {n: results.get(k, results["all"]).speedup for n, k in swapped.items() if k not in ab.arms[best]}

    def resident_bytes(self) -> int:
        params = sum(p.numel() * p.element_size() * 2 for p in self.model.parameters())  # + grads
        state = sum(t.numel() * t.element_size() for s in self.opt.state.values() for t in s.values()
                    if hasattr(t, "numel") and t.dim() > 0)
        return params + state


def _step_peak(v: Variant, args) -> int:
    """Bytes one step needs above what was allocated before it, plus the variant's resident state."""
    import torch

    if args.smoke:
        v.step()
        return v.resident_bytes()
    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    v.step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before + v.resident_bytes()


def run_one(model_name: str, args) -> dict:
    import torch
    from _timing import interleaved_step_ms

    torch.backends.cuda.matmul.allow_tf32 = True
    from fused_layers.ops import _cpp

    _cpp.extension(wait=True)  # FUSED_LAYERS_CPP=1: built (or loaded from torch's cache) before any timing
    variants: dict[str, Variant] = {}
    res: dict = {"model": model_name, "variants": {}}
    names = ["unfused", "fused", "faster"]
    for name in names:
        t0 = time.perf_counter()
        try:
            v = Variant(model_name, name, args)
            v.first_losses()
            if name == "faster":
                v.apply_policy_faster(args.ab_rounds)
            for _ in range(args.warmup):
                v.step()
            peak = _step_peak(v, args)
            r = res["variants"][name] = {
                "eval_loss": v.eval_loss, "first_train_loss": v.first_train_loss, "peak_gib": peak / 2**30,
                "setup_s": time.perf_counter() - t0,
            }
            if v.report is not None:
                r["swapped"] = v.report.counts()
                r["swapped_names"] = v.report.rows()
                r["skipped"] = len(v.report.skipped)
            if name == "faster":
                r["restored"] = v.restored
                r["kept_arm"] = v.kept_arm
                r["step_ab"] = v.step_ab
                kept = dict(v.report.counts())
                for n in v.restored:
                    kind = next((e.kind for e in v.report.swapped if e.name == n), None)
                    if kind:
                        kept[kind] -= 1
                r["swapped_after_policy"] = kept
            res["desc"], res["items"] = v.desc, v.items
            variants[name] = v
            print(f"[{model_name}/{name}] ready {time.perf_counter() - t0:.1f}s eval loss {v.eval_loss:.5f} "
                  f"peak {peak / 2**30:.2f} GiB {r.get('swapped', '')}", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            res["variants"][name] = {"error": f"{type(e).__name__}: {e}"[:1500], "trace": traceback.format_exc()[-3000:]}
            print(f"[{model_name}/{name}] FAILED {e}\n{traceback.format_exc()[-2000:]}", flush=True)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    def time_rounds(vs):  # smoke (no CUDA): wall clock, meaningless (interpreter); checks the code path only
        return interleaved_step_ms({n: v.step for n, v in vs.items()}, args.rounds, args.steps, wall_clock=args.smoke)

    times = time_rounds(variants)
    # Liger last (its patches change transformers' module globals for every model of that family)
    if model_name in LIGER and not args.no_liger:
        try:
            import liger_kernel  # noqa: F401

            t0 = time.perf_counter()
            lv = Variant(model_name, "liger", args)
            lv.first_losses()
            for _ in range(args.warmup):
                lv.step()
            peak = _step_peak(lv, args)
            res["variants"]["liger"] = {"eval_loss": lv.eval_loss, "first_train_loss": lv.first_train_loss,
                                        "peak_gib": peak / 2**30, "setup_s": time.perf_counter() - t0,
                                        "sequential": True}
            times.update(time_rounds({"liger": lv}))
        except ImportError:
            res["liger"] = "liger-kernel not installed"
        except Exception as e:  # noqa: BLE001
            res["variants"]["liger"] = {"error": f"{type(e).__name__}: {e}"[:1500]}
    base = statistics.median(times["unfused"]) if times.get("unfused") else None
    ref_loss = res["variants"].get("unfused", {}).get("eval_loss")
    for n, ts in times.items():
        if not ts:
            continue
        r = res["variants"][n]
        med = statistics.median(ts)
        r.update(step_ms=med, step_ms_min=min(ts), step_ms_max=max(ts), spread=(max(ts) - min(ts)) / med,
                 rounds_ms=ts, items_per_s=res["items"] / (med / 1e3))
        if base:
            r["speedup"] = base / med
        if ref_loss is not None and r.get("eval_loss") is not None:
            r["eval_loss_diff"] = abs(r["eval_loss"] - ref_loss)
    return res


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------
def to_markdown(all_res: dict) -> str:
    lines = [
        f"# Issue 11 acceptance: library models, unfused vs fused ({all_res['gpu']})",
        "",
        f"torch {all_res['torch']}, triton {all_res['triton']}, transformers {all_res.get('transformers')}, "
        f"timm {all_res.get('timm')}.  Command: `{all_res['command']}`",
        f"bf16 parameters, AdamW; median of {all_res['args']['rounds']} interleaved rounds x "
        f"{all_res['args']['steps']} steps (spread = (max - min) / median over rounds); "
        "loss diff: first batch, eval mode, vs unfused.  `faster` = what policy=faster keeps.",
        "",
        "| model | variant | step ms (min-max) | spread | vs unfused | peak GiB | loss diff | swapped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, res in all_res["models"].items():
        if "error" in res:
            lines.append(f"| {m} | failed: {res['error'][:150]} | | | | | | |")
            continue
        for n, r in res["variants"].items():
            if "error" in r:
                lines.append(f"| {m} ({res.get('desc', '')}) | {n} | failed: {r['error'][:120]} | | | | | |")
                continue
            if "step_ms" not in r:
                continue
            sw = r.get("swapped_after_policy", r.get("swapped"))
            sw = ", ".join(f"{k} {c}" for k, c in sorted(sw.items())) if sw else "-"
            tag = " (sequential)" if r.get("sequential") else ""
            ld = r.get("eval_loss_diff")
            lines.append(
                f"| {m} ({res.get('desc', '')}) | {n}{tag} | {r['step_ms']:.1f} ({r['step_ms_min']:.1f}-{r['step_ms_max']:.1f}) | "
                f"{r['spread']:.1%} | {r.get('speedup', float('nan')):.3f}x | {r['peak_gib']:.2f} | "
                f"{'-' if ld is None else f'{ld:.2e}'} | {sw} |")
    lines.append("")
    for m, res in all_res["models"].items():
        f = res.get("variants", {}).get("faster", {})
        if f.get("restored"):
            lines.append(f"- {m}, policy=faster undid: " + ", ".join(f"{n or '(model: loss_function)'} ({s:.2f}x)" for n, s in sorted(f["restored"].items())))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory for models_<gpu>.json / .md")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one model, write --json
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ab-rounds", type=int, default=3, help="measured rounds of the policy=faster variant's step-time A/B")
    ap.add_argument("--timeout", type=float, default=80.0, help="seconds per model (subprocess)")
    ap.add_argument("--no-liger", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the script (TRITON_INTERPRET=1, tiny models)")
    args = ap.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        sys.exit("bench_models.py needs a CUDA GPU (--smoke checks the script on the CPU)")
    if args.one:
        res = run_one(args.one, args)
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        return
    if not args.out:
        ap.error("--out is required")
    import triton

    def version(mod):
        try:
            return __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            return f"not importable ({type(e).__name__})"

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    all_res = {"gpu": torch.cuda.get_device_name() if not args.smoke else "cpu (smoke)", "torch": torch.__version__, "triton": triton.__version__,
               "transformers": version("transformers"), "timm": version("timm"), "args": vars(args),
               "command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]), "models": {}}
    from _timing import gpu_tag

    stem = out / f"models_{gpu_tag()}"
    for m in [x for x in args.models.split(",") if x]:
        tmp = out / f".{m}.json"
        cmd = [sys.executable, __file__, "--one", m, "--json", str(tmp), "--warmup", str(args.warmup),
               "--steps", str(args.steps), "--rounds", str(args.rounds), "--ab-rounds", str(args.ab_rounds),
               "--batch", str(args.batch), "--seq", str(args.seq)] + (["--no-liger"] if args.no_liger else []) \
            + (["--smoke"] if args.smoke else [])
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, cwd=ROOT, timeout=args.timeout, capture_output=True, text=True)
            sys.stdout.write(r.stdout[-6000:])
            if tmp.exists():
                all_res["models"][m] = json.loads(tmp.read_text())
                tmp.unlink()
            else:
                all_res["models"][m] = {"error": (r.stderr or r.stdout)[-1500:]}
                sys.stdout.write(r.stderr[-3000:])
        except subprocess.TimeoutExpired as e:
            all_res["models"][m] = {"error": f"timed out after {args.timeout:.0f}s"}
            sys.stdout.write((e.stdout or b"").decode(errors="replace")[-3000:] if isinstance(e.stdout, bytes) else str(e.stdout or "")[-3000:])
        print(f"[{m}] {time.perf_counter() - t0:.0f}s", flush=True)
        stem.with_suffix(".json").write_text(json.dumps(all_res, indent=1, default=str))  # partial results survive
        stem.with_suffix(".md").write_text(to_markdown(all_res))
    print(to_markdown(all_res))


if __name__ == "__main__":
    main()
