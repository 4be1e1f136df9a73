"""train: the training step of ``train.py``'s demo GPT-2, unfused and fused, eager and compiled.

    python -m benchmarks train                                # 16 x 1,024 and 4 x 4,096, eager and compile
    python -m benchmarks train --shapes 16x1024 --modes eager
    python -m benchmarks train --modes compile --compiled-routes mlp=kernels   # + an arm fused[mlp=kernels]

The model is ``lm_demo``'s GPT (``conf/model/gpt2_small.yaml``: 12 x d768, 12 heads, vocabulary padded to
50,304, 124M parameters), trained as ``train.py model=gpt2_small trainer=gpu`` trains it: bf16 autocast,
AdamW (fused, weight decay on matrices), the LM head and loss as one ``LinearCrossEntropyLoss``; byte tokens.

Arms, built from the same seed:

* ``unfused``  the job's default model: attention core ``F.scaled_dot_product_attention`` (``attn_impl: sdpa``)
* ``fused``    the explicit attention core (``attn_impl: reference``) after ``swap_modules``: attention,
               LayerNorm, the MLP and the LM head + loss fused, as ``train.py fused=true model.attn_impl=reference``

``--modes compile`` wraps each arm's model in ``torch.compile`` (loss included) after the swap, as the
job's ``model.compile=true``; ``--compiled-routes`` adds the arm ``fused[<routes>]``, compiled with those routes
(``fused_layers/ops/compile_config.py``) beside the fused arm and its default ones. Method as in the models suite:
warm-up steps first, then ``--rounds`` rounds of ``--steps`` steps, arms interleaved, CUDA events; medians with the
min-max over rounds, ``extra_peak_gib`` the allocator's peak during one step above what was allocated before it,
``loss`` the first step's loss.
"""

from __future__ import annotations

import gc
import time

from . import utils

GPT2_SMALL = dict(vocab_size=50304, d_model=768, n_layer=12, n_head=12, mlp_ratio=4, dropout=0.0)
SHAPES = ["16x1024", "4x4096"]


def add_arguments(p) -> None:
    p.add_argument("--shapes", default=",".join(SHAPES), help="batch x sequence, comma-separated")
    p.add_argument("--modes", default="eager,compile", help="eager and/or compile")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--compiled-routes", default="",
                   help="compile routes of one more arm, fused[<routes>], beside the fused arm (compile mode), e.g. "
                        "mlp=kernels")


class Arm:
    def __init__(self, arm: str, mode: str, batch: int, seq: int, smoke: bool):
        import torch

        from lm_demo.model import GPT

        dims = dict(GPT2_SMALL, vocab_size=256, d_model=32, n_layer=2, n_head=4) if smoke else GPT2_SMALL
        torch.manual_seed(0)
        dev = torch.device("cpu" if smoke else "cuda")
        with dev:
            self.model = GPT(seq_len=seq, attn_impl="sdpa" if arm == "unfused" else "reference", **dims)
        self.swapped = ""
        if arm.startswith("fused"):  # (fused[<routes>] too: its routes are set while it runs)
            from fused_layers import swap_modules

            report = swap_modules(self.model)
            self.swapped = ", ".join(f"{k} {c}" for k, c in sorted(report.counts().items()) if c)
        self.net = torch.compile(self.model) if mode == "compile" else self.model
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                     lr=6e-4, betas=(0.9, 0.95), fused=not smoke)
        g = torch.Generator(device="cpu").manual_seed(1)
        data = torch.randint(0, 256, (batch, seq + 1), generator=g).to(dev)
        self.x, self.y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        self.autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=not smoke)

    def step(self):
        with self.autocast:
            loss = self.net(self.x, self.y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def run_shape(shape: str, mode: str, args, env: dict) -> list[dict]:
    import torch

    batch, seq = (int(v) for v in shape.split("x"))
    if args.smoke:
        batch, seq = 2, 16
    arms, info = {}, {}
    routes = utils.compiled_routes(args.compiled_routes) if mode == "compile" else {}
    tables = utils.RouteTables(routes)
    for name in ("unfused", "fused") + ((tables.name,) if routes else ()):
        t0 = time.perf_counter()
        try:
            tables.enter(name)
            a = Arm(name, mode, batch, seq, args.smoke)
            loss = float(a.step())
            for _ in range(args.warmup - 1):
                a.step()
            utils.wait_for_fast_path()
            if args.smoke:
                peak = float("nan")
            else:
                gc.collect()
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                a.step()
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - before) / 2**30
            arms[name], info[name] = a, dict(loss=loss, peak=peak)
            print(f"[train {shape}/{mode}/{name}] ready in {time.perf_counter() - t0:.0f} s, first loss {loss:.4f}, "
                  f"extra peak {peak:.2f} GiB {a.swapped}", flush=True)
        except Exception as e:  # noqa: BLE001 - report the arm, go on
            print(f"[train {shape}/{mode}/{name}] failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    tables.enter("unfused")
    if not arms:
        return []
    times = utils.interleaved_rounds({n: a.step for n, a in arms.items()}, args.rounds, args.steps,
                                     enter={n: (lambda n=n: tables.enter(n)) for n in arms})
    tables.enter("unfused")
    ratios = utils.speedups(times, "unfused") if "unfused" in times else {}
    rows = []
    for n, ts in times.items():
        med, lo, hi = utils.median_lo_hi(ts)
        sp = ratios.get(n, (None, None, None))
        rows.append(dict(env, model="lm_demo gpt2_small", batch=f"{batch}x{seq}", mode=mode, arm=n, step_ms=med,
                         step_ms_lo=lo, step_ms_hi=hi, speedup=sp[0], speedup_lo=sp[1], speedup_hi=sp[2],
                         tokens_per_s=batch * seq / (med / 1e3), extra_peak_gib=info[n]["peak"], loss=info[n]["loss"],
                         rounds=args.rounds, steps=args.steps, note="; ".join(
                             x for x in ("smoke (CPU)" if args.smoke else "", arms[n].swapped) if x)))
        print(f"[train {shape}/{mode}/{n}] {med:.2f} ms [{lo:.2f}-{hi:.2f}]"
              + (f", {sp[0]:.3f}x [{sp[1]:.3f}-{sp[2]:.3f}]" if sp[0] else ""), flush=True)
    for a in arms.values():
        a.__dict__.clear()
    gc.collect()
    if not args.smoke:
        torch.cuda.empty_cache()
    return rows


def run(args) -> int:
    utils.require_cuda("train", args.smoke)
    import torch

    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - {"eager", "compile"}:
        print(f"python -m benchmarks train: --modes takes eager and/or compile, not {modes}")
        return 2
    try:
        utils.compiled_routes(args.compiled_routes)
    except ValueError as e:
        print(f"python -m benchmarks train: --compiled-routes: {e}")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    env = utils.environment()
    rows = []
    for shape in [s for s in args.shapes.split(",") if s]:
        for mode in modes:
            rows += run_shape(shape, mode, args, env)
    utils.write_results(args, "train", rows)
    return 0
