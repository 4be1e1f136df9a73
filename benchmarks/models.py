"""models: a whole training step of real models, unfused / fused / Liger, interleaved in one process.

    python -m benchmarks models                               # every model, eager
    python -m benchmarks models --models llama,qwen2 --modes eager,compile
    python -m benchmarks models --models gpt2 --modes compile --compiled-routes mlp=kernels

Models, built from their libraries' configs with random weights (no download), bf16 parameters, AdamW
(fused), one step = forward, loss, backward, optimizer step:

* ``gpt2``   HF ``GPT2LMHeadModel(GPT2Config())``: GPT-2 small, 12 x d768, vocab 50,257, its dropout 0.1; 8 x 1,024
* ``llama``  HF Llama, 8 x d1,024, 16 heads / 4 KV heads (GQA), FFN 2,816, vocab 32,000; 4 x 2,048
* ``qwen2``  HF Qwen2, 12 of Qwen2-0.5B's layers (d896, 14 heads / 2 KV heads, FFN 4,864), tied head,
             vocab 151,936; 4 x 2,048
* ``gemma``  HF Gemma, 6 x d1,024, 8 heads / 1 KV head (MQA), head dim 128, FFN 8,192, vocab 256,000; 4 x 1,024
* ``llama3`` HF Llama with Llama 3's vocabulary (128,256) and RoPE base (500,000), otherwise ``llama``; 4 x 2,048
* ``mistral`` HF Mistral, ``llama``'s sizes with a 1,024-token sliding window; 4 x 2,048
* ``gemma2`` HF Gemma 2, 6 x d1,024, 8 heads / 4 KV heads, head dim 128, FFN 8,192, vocab 256,000, attention
             soft-capping 50, final logit soft-capping 30, a 512-token window on every other layer; 4 x 1,024
* ``vit``    timm ``vit_base_patch16_224`` (ViT-B/16), 1,000 classes; 64 x 224^2
* ``encoder`` torch ``nn.TransformerEncoder``: 12 pre-norm ``nn.TransformerEncoderLayer`` (d768, 12 heads, FFN 3,072,
             GELU, dropout 0.1) over a 30,522-token embedding, mean-pooled into a 2-class head (a BERT-base-sized
             sequence classifier written with torch's own modules); 32 x 512

Arms, each its own model built from the same seed (identical weights) and its own optimizer:

* ``unfused``  as the library builds it (attention: SDPA)
* ``fused``    after ``fused_layers.swap_modules(model)``: every norm, attention and LM-head loss it knows
* ``fused-<kind>[-<kind>...]``  the same with those kinds left out (``fused-mlp``: every kind but the plain MLP),
               to measure what one kind costs or gains inside the step; ``fused+<kind>`` with a kind that is off
               by default swapped too (``fused+mlp_recompute``: timm's MLP, memory for speed)
* ``liger``    after Liger-Kernel's ``apply_liger_kernel_to_<family>(model=...)`` (Llama, Qwen2, Gemma; when
               installed). Liger also rebinds functions of the transformers module (RoPE); those globals are
               set to each arm's own values before its steps, so every arm runs its own code in one process.

Method: each arm is warmed up (``--warmup`` steps: Triton JIT, torch.compile, the allocator, the library's
C++ fast path), then ``--rounds`` rounds of ``--steps`` steps per arm, arms interleaved in a rotating order,
CUDA events per arm and round, the setup's Python objects frozen out of the garbage collector while timing
(``utils.interleaved_rounds``). ``step_ms`` is the median over rounds with its min-max; ``speedup`` is the
unfused median over the arm's median, with the min-max over rounds of the in-round ratio. ``extra_peak_gib``:
the allocator's peak during one step above what was allocated before it (activations, logits, gradients,
temporaries). ``gpu_busy_ms``: how long a step keeps the GPU busy (its kernels' intervals under
``torch.profiler``, two steps after the timed rounds): well below ``step_ms``, the step waits on the host's
launches. ``loss``: the first batch's loss in eval mode before any step; ``loss_diff`` its distance to
the unfused arm's. Each model runs in a subprocess of its own (``--timeout`` seconds).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

from . import utils

MODELS = ["gpt2", "llama", "qwen2", "gemma", "llama3", "mistral", "gemma2", "vit", "encoder"]
LIGER = {"llama": "apply_liger_kernel_to_llama", "qwen2": "apply_liger_kernel_to_qwen2",
         "gemma": "apply_liger_kernel_to_gemma", "llama3": "apply_liger_kernel_to_llama",
         "mistral": "apply_liger_kernel_to_mistral", "gemma2": "apply_liger_kernel_to_gemma2"}
CONFIG = {
    "gpt2": "GPT-2 small, 12 x d768, vocab 50,257, dropout 0.1",
    "llama": "8 x d1024, GQA 16/4, FFN 2816, vocab 32,000",
    "qwen2": "12 x d896, GQA 14/2, FFN 4864, vocab 151,936, tied head",
    "gemma": "6 x d1024, MQA 8/1, head dim 128, FFN 8192, vocab 256,000",
    "llama3": "8 x d1024, GQA 16/4, FFN 2816, vocab 128,256, RoPE base 500,000",
    "mistral": "8 x d1024, GQA 16/4, FFN 2816, vocab 32,000, sliding window 1024",
    "gemma2": "6 x d1024, GQA 8/4, head dim 128, FFN 8192, vocab 256,000, softcap 50 / 30, window 512",
    "vit": "timm vit_base_patch16_224, 1,000 classes",
    "encoder": "torch nn.TransformerEncoder, 12 x d768 pre-norm, 12 heads, FFN 3072 GELU, 2 classes",
}


def add_arguments(p) -> None:
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--modes", default="eager", help="eager and/or compile (torch.compile of each arm's model)")
    p.add_argument("--arms", default="unfused,fused,liger",
                   help="comma-separated: unfused, fused, liger, fused-<kind>[-<kind>...] (fused without those kinds), "
                        "fused+<kind> (with a kind that is off by default)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per arm first")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--steps", type=int, default=3, help="steps per arm and round")
    p.add_argument("--variants", default="plain",
                   help="comma-separated of plain, grad_ckpt (the model's activation checkpointing) and lora (a PEFT "
                        "LoRA adapter, r 16, on the attention projections; only the adapter trains), applied to every "
                        "arm after its swap or patch; a row's mode reads e.g. eager+lora")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per model and mode (its subprocess)")
    p.add_argument("--compiled-routes", default="",
                   help="compile routes (fused_layers/ops/compile_config.py) of one more arm, fused[<routes>], "
                        "interleaved beside the fused arm and its default routes, e.g. mlp=kernels,softmax=inductor")
    p.add_argument("--child-json", help=argparse.SUPPRESS)  # internal: one model's rows, from its subprocess


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------
def build(name: str, smoke: bool):
    """(model on the device, batch, loss_fn(model, batch), items per step, "B x S")."""
    import torch

    dev = torch.device("cpu" if smoke else "cuda")
    g = torch.Generator(device="cpu").manual_seed(1)
    torch.manual_seed(0)
    if name == "vit":
        import timm

        kw = dict(img_size=32, patch_size=16, depth=2, embed_dim=32, num_heads=2) if smoke else {}
        with dev:
            model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000, **kw)
        bs, hw = (2, 32) if smoke else (64, 224)
        batch = (torch.randn(bs, 3, hw, hw, generator=g).to(dev), torch.randint(0, 1000, (bs,), generator=g).to(dev))

        def loss_fn(m, b):
            return torch.nn.functional.cross_entropy(m(b[0].to(next(m.parameters()).dtype)).float(), b[1])

        return _finish(model, smoke), batch, loss_fn, bs, f"{bs}x{hw}^2"
    if name == "encoder":
        return _encoder(dev, g, smoke)
    import transformers as T

    if name == "gpt2":
        cfg = T.GPT2Config(attn_implementation="sdpa")
        cls, (bs, seq) = T.GPT2LMHeadModel, (8, 1024)
        if smoke:
            cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, attn_implementation="sdpa")
    else:
        base = dict(max_position_embeddings=4096, attn_implementation="sdpa")
        if name == "llama":
            cls, (bs, seq) = T.LlamaForCausalLM, (4, 2048)
            cfg = T.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                num_attention_heads=16, num_key_value_heads=4, **base)
        elif name == "qwen2":
            cls, (bs, seq) = T.Qwen2ForCausalLM, (4, 2048)
            cfg = T.Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=12,
                                num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, **base)
        elif name == "gemma":
            cls, (bs, seq) = T.GemmaForCausalLM, (4, 1024)
            cfg = T.GemmaConfig(vocab_size=256000, hidden_size=1024, intermediate_size=8192, num_hidden_layers=6,
                                num_attention_heads=8, num_key_value_heads=1, head_dim=128, **base)
        elif name == "llama3":
            cls, (bs, seq) = T.LlamaForCausalLM, (4, 2048)
            cfg = T.LlamaConfig(vocab_size=128256, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                num_attention_heads=16, num_key_value_heads=4, rope_theta=500000.0, **base)
        elif name == "mistral":
            cls, (bs, seq) = T.MistralForCausalLM, (4, 2048)
            cfg = T.MistralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                  num_attention_heads=16, num_key_value_heads=4, sliding_window=1024, **base)
        elif name == "gemma2":
            cls, (bs, seq) = T.Gemma2ForCausalLM, (4, 1024)
            cfg = T.Gemma2Config(vocab_size=256000, hidden_size=1024, intermediate_size=8192, num_hidden_layers=6,
                                 num_attention_heads=8, num_key_value_heads=4, head_dim=128, sliding_window=512,
                                 attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                 **dict(base, attn_implementation="eager"))  # its own default: SDPA cannot soft-cap
        else:
            raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
        if smoke:
            for k, v in dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, head_dim=8).items():
                setattr(cfg, k, v)
            if getattr(cfg, "sliding_window", None):
                cfg.sliding_window = 8
            cfg.num_key_value_heads = min(cfg.num_key_value_heads, 2)
    if smoke:
        bs, seq = 2, 16
    with dev:
        model = cls(cfg)
    model.config.use_cache = False  # training: no KV cache
    ids = torch.randint(0, cfg.vocab_size, (bs, seq), generator=g).to(dev)
    batch = {"input_ids": ids, "labels": ids}

    def loss_fn(m, b):
        return m(**b).loss

    return _finish(model, smoke), batch, loss_fn, bs * seq, f"{bs}x{seq}"


def _encoder(dev, g, smoke: bool):
    """torch's own encoder as a user writes it: embedding, ``nn.TransformerEncoder``, mean pool, a linear head."""
    import torch
    from torch import nn

    d, heads, ff, layers, vocab = (32, 2, 64, 2, 64) if smoke else (768, 12, 3072, 12, 30522)
    bs, seq = (2, 16) if smoke else (32, 512)

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, activation="gelu", batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d), enable_nested_tensor=False)
            self.head = nn.Linear(d, 2)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids)).mean(1))

    with dev:
        model = Classifier()
    batch = (torch.randint(0, vocab, (bs, seq), generator=g).to(dev), torch.randint(0, 2, (bs,), generator=g).to(dev))

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]).float(), b[1])

    return _finish(model, smoke), batch, loss_fn, bs * seq, f"{bs}x{seq}"


def _finish(model, smoke: bool):
    import torch

    return model.to(torch.float32 if smoke else torch.bfloat16).train()


class GlobalsSwitch:
    """Module globals that a patch function rebinds (Liger's RoPE, ...), kept per arm: ``capture(fn)`` runs
    ``fn`` and records what it changed in any loaded ``transformers`` module, then restores the originals;
    ``enter(patched)`` sets the patched or the original values."""

    def __init__(self):
        self.original: dict = {}
        self.patched: dict = {}

    @staticmethod
    def _modules():
        return [m for n, m in list(sys.modules.items()) if n.startswith("transformers") and m is not None]

    def capture(self, fn) -> None:
        before = {m: dict(vars(m)) for m in self._modules()}
        fn()
        for m, old in before.items():
            for k, v in vars(m).items():
                if k in old and old[k] is not v:  # a name rebound (names added by lazy imports are left alone)
                    self.original[(m, k)], self.patched[(m, k)] = old[k], v
        self.enter(False)

    def enter(self, patched: bool) -> None:
        for (m, k), v in (self.patched if patched else self.original).items():
            setattr(m, k, v)


VARIANTS = ("plain", "grad_ckpt", "lora")
LORA_TARGETS = {"gpt2": ["c_attn"], "vit": ["qkv", "proj"]}  # the rest: the HF decoders' attention projections


def apply_variant(model, model_name: str, variant: str):
    """``model`` with gradient checkpointing on, or wrapped in a LoRA adapter (the model returned), or as it is."""
    if variant == "grad_ckpt":
        if model_name == "vit":
            model.set_grad_checkpointing(True)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif variant == "lora":
        import peft

        targets = LORA_TARGETS.get(model_name, ["q_proj", "k_proj", "v_proj", "o_proj"])
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                           target_modules=targets))
    return model


def fused_kinds(arm: str) -> list[str] | None:
    """The kinds a ``fused`` arm swaps: those on by default (None), less those named after ``fused-``, plus those named
    after ``fused+`` (ValueError for another arm name or a kind the library does not have)."""
    from fused_layers.swap import KINDS, resolve_kinds

    if arm == "fused":
        return None
    if not arm.startswith(("fused-", "fused+")):
        raise ValueError(f"unknown arm {arm!r}; arms: unfused, fused, fused-<kind>[-<kind>...], fused+<kind>, liger")
    signed = re.findall(r"([-+])([^-+]*)", arm[len("fused"):])  # [("-", "mlp"), ("+", "mlp_recompute"), ...]
    unknown = [k for _, k in signed if k not in KINDS]
    if unknown:
        raise ValueError(f"arm {arm!r}: no kind {', '.join(unknown)} (kinds: {', '.join(KINDS)})")
    kinds = set(resolve_kinds(None)) | {k for sign, k in signed if sign == "+"}
    return [k for k in KINDS if k in kinds and ("-", k) not in signed]


class Arm:
    def __init__(self, model_name: str, arm: str, mode: str, smoke: bool, switch: GlobalsSwitch,
                 variant: str = "plain"):
        import torch

        self.name = arm
        self.model, self.batch, self.loss_fn, self.items, self.batch_desc = build(model_name, smoke)
        self.swapped = ""
        if arm == "fused" or arm.startswith(("fused-", "fused+")):
            from fused_layers import swap_modules

            # the variant first, as the callbacks find a model (a PEFT model's LoRA layers are swapped too)
            self.model = apply_variant(self.model, model_name, variant)
            report = swap_modules(self.model, kinds=fused_kinds(arm))
            self.swapped = ", ".join(f"{k} {c}" for k, c in sorted(report.counts().items()) if c)
        else:
            if arm == "liger":  # Liger patches the transformers model, before PEFT wraps it
                import liger_kernel.transformers as lk

                apply = getattr(lk, LIGER[model_name])
                switch.capture(lambda: apply(model=self.model))
                self.swapped = LIGER[model_name]
            self.model = apply_variant(self.model, model_name, variant)
        self.net = torch.compile(self.model) if mode == "compile" else self.model
        params = [p for p in self.model.parameters() if p.requires_grad]  # (LoRA: the adapter's)
        self.opt = torch.optim.AdamW(params, lr=1e-5, fused=not smoke)

    def step(self):
        loss = self.loss_fn(self.net, self.batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def eval_loss(self) -> float:
        import torch

        self.model.eval()
        with torch.no_grad():
            loss = float(self.loss_fn(self.model, self.batch))
        self.model.train()
        return loss

    def extra_peak_gib(self, smoke: bool) -> float:
        import torch

        if smoke:
            self.step()
            return float("nan")
        gc.collect()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        self.step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**30


def fallback_note(messages) -> str:
    """``fused_layers.fallbacks()`` messages, each cut to what fell back and why (a row's note): e.g.
    "fused_layers attention: a mask tensor under torch.compile is not fused; ..." -> "attention: a mask tensor
    under torch.compile"."""
    out = []
    for m in messages:
        m = m.removeprefix("fused_layers").lstrip(" :.").split(" is not fused")[0].split("; ")[0].strip().rstrip(".")
        if m not in out:
            out.append(m[:160])
    return "fell back: " + " | ".join(out) if out else ""


def run_model(model_name: str, mode: str, args) -> list[dict]:
    """Every arm of one model in this process; returns the table rows."""
    import torch

    from fused_layers import fallbacks

    torch.backends.cuda.matmul.allow_tf32 = True
    routes = utils.compiled_routes(args.compiled_routes) if mode == "compile" else {}
    tables = utils.RouteTables(routes)
    row_mode = mode if args.variants == "plain" else f"{mode}+{args.variants}"
    env = utils.environment()
    env.update(transformers=utils.version_of("transformers"), liger=utils.version_of("liger-kernel"))
    switch = GlobalsSwitch()
    arms: dict[str, Arm] = {}
    info: dict[str, dict] = {}
    names = [a for a in args.arms.split(",") if a]
    if "liger" in names and (model_name not in LIGER or not env["liger"] or args.smoke):
        names.remove("liger")
    if routes and "fused" in names:
        names.insert(names.index("fused") + 1, tables.name)

    def enter(name: str) -> None:  # the process-wide state of an arm: Liger's patched globals, the compile routes
        switch.enter(name == "liger")
        tables.enter(name)

    for name in names:
        t0 = time.perf_counter()
        try:
            before = fallbacks()
            a = Arm(model_name, "fused" if name == tables.name else name, mode, args.smoke, switch, args.variants)
            enter(name)
            loss = a.eval_loss()
            for _ in range(args.warmup):
                a.step()
            new = fallbacks(since=before)  # this arm's, traced or called
            utils.wait_for_fast_path()
            peak = a.extra_peak_gib(args.smoke)
            arms[name] = a
            info[name] = dict(loss=loss, extra_peak_gib=peak, swapped=a.swapped,
                              fallbacks=fallback_note(new))
            print(f"[{model_name}/{row_mode}/{name}] ready in {time.perf_counter() - t0:.0f} s: loss {loss:.5f}, "
                  f"extra peak {peak:.2f} GiB {a.swapped}"
                  + (f"; {info[name]['fallbacks']}" if info[name]["fallbacks"] else ""), flush=True)
        except ImportError as e:  # timm, Liger: a one-line reason
            print(f"[{model_name}/{row_mode}/{name}] skipped: {e} (pip install -e '.[bench,hf]')", flush=True)
        except Exception as e:  # noqa: BLE001 - report the arm and go on with the others
            print(f"[{model_name}/{row_mode}/{name}] failed: {type(e).__name__}: {str(e)[:300]}\n"
                  f"{traceback.format_exc()[-1500:]}", flush=True)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    enter("unfused")
    if not arms:
        return []
    times = utils.interleaved_rounds({n: a.step for n, a in arms.items()}, args.rounds, args.steps,
                                     enter={n: (lambda n=n: enter(n)) for n in arms})
    busy = {}
    for n, a in arms.items():  # after the timed rounds: the profiler's overhead stays out of them
        enter(n)
        busy[n] = utils.gpu_busy_ms(a.step)
    enter("unfused")
    base = "unfused" if "unfused" in times else None
    ratios = utils.speedups(times, base) if base else {}
    ref_loss = info.get("unfused", {}).get("loss")
    rows = []
    for n, ts in times.items():
        med, lo, hi = utils.median_lo_hi(ts)
        sp = ratios.get(n, (None, None, None))
        loss = info[n]["loss"]
        rows.append(dict(env, model=model_name, config=CONFIG[model_name], batch=arms[n].batch_desc, mode=row_mode,
                         arm=n,
                         step_ms=med, step_ms_lo=lo, step_ms_hi=hi, speedup=sp[0], speedup_lo=sp[1], speedup_hi=sp[2],
                         extra_peak_gib=info[n]["extra_peak_gib"], gpu_busy_ms=busy[n], loss=loss,
                         loss_diff=None if ref_loss is None else abs(loss - ref_loss), swapped=info[n]["swapped"],
                         rounds=args.rounds, steps=args.steps,
                         note="; ".join(x for x in ("smoke (CPU)" if args.smoke else "", info[n]["fallbacks"]) if x)))
        print(f"[{model_name}/{row_mode}/{n}] {med:.2f} ms [{lo:.2f}-{hi:.2f}]"
              + (f", {sp[0]:.3f}x [{sp[1]:.3f}-{sp[2]:.3f}]" if sp[0] else "")
              + ("" if math.isnan(busy[n]) else f", GPU busy {busy[n]:.2f} ms"), flush=True)
    return rows


def run(args) -> int:
    utils.require_cuda("models", args.smoke)
    models = [m for m in args.models.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    bad = (sorted(set(models) - set(MODELS)) + sorted(set(modes) - {"eager", "compile"})
           + sorted(set(variants) - set(VARIANTS)))
    if bad or not variants:
        print(f"python -m benchmarks models: unknown {bad or args.variants!r}; models {MODELS}, modes eager, compile, "
              f"variants {', '.join(VARIANTS)}")
        return 2
    try:
        utils.compiled_routes(args.compiled_routes)
    except ValueError as e:
        print(f"python -m benchmarks models: --compiled-routes: {e}")
        return 2
    for arm in (a for a in args.arms.split(",") if a not in ("", "unfused", "liger")):
        try:
            fused_kinds(arm)
        except ValueError as e:
            print(f"python -m benchmarks models: --arms: {e}")
            return 2
    if args.child_json:  # inside the per-model subprocess (one model, mode and variant)
        rows = run_model(models[0], modes[0], args)
        with open(args.child_json, "w") as f:
            json.dump(rows, f)
        return 0
    rows: list[dict] = []
    for m, mode, variant in ((m, mode, v) for m in models for mode in modes for v in variants):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.json")
            cmd = [sys.executable, "-m", "benchmarks", "models", "--models", m, "--modes", mode,
                   "--variants", variant, "--arms", args.arms, "--warmup", str(args.warmup),
                   "--rounds", str(args.rounds), "--steps", str(args.steps), "--child-json", out,
                   "--compiled-routes", args.compiled_routes] + (["--smoke"] if args.smoke else [])
            t0 = time.perf_counter()
            try:
                subprocess.run(cmd, cwd=utils.ROOT, timeout=args.timeout, check=False)
            except subprocess.TimeoutExpired:
                print(f"[{m}/{mode}/{variant}] timed out after {args.timeout:.0f} s", flush=True)
            print(f"[{m}/{mode}/{variant}] {time.perf_counter() - t0:.0f} s", flush=True)
            if os.path.exists(out):  # written as each case ends: a run stopped later keeps what it measured
                case = json.load(open(out))
                utils.write_results(args, "models", case)
                rows += case
    if not rows:
        print("[models] no rows measured")
    else:
        print(utils.markdown(rows, ["model", "mode", "arm", "step_ms", "speedup", "speedup_lo", "speedup_hi",
                                    "extra_peak_gib", "gpu_busy_ms", "loss_diff", "swapped"]))
    return 0
