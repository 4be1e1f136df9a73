"""Loss curves of the demo LM, fused against unfused head + loss (issue 10 target: the same within bf16 noise).

    python benchmarks/ce_loss_curve.py --out $OUT                 # GPU: 300 steps per variant (< 90 s)
    python benchmarks/ce_loss_curve.py --out /tmp/x --cpu-check   # tiny shapes on the CPU (plumbing only)

The model is lm_demo's ``GPT`` at a reduced size (4 layers, d 512, 8 heads, seq 512, batch 8, vocab
50,304, SDPA attention, LM head tied to the token embedding), trained under bf16 autocast with AdamW
(lr 1e-3, 20 warm-up steps, cosine to 10%), the same initial weights (same seed) and the same batches
for every variant:

* ``unfused``: ``LinearCrossEntropyLoss`` as the demo builds it: ``F.linear`` (bf16 logits under
  autocast) then ``nn.CrossEntropyLoss`` on their float32 copy;
* ``fused``: the same model after ``swap_modules(kinds=["cross_entropy"])``: the head + loss run as
  ``fused_linear_cross_entropy`` (chunked, logits never materialized), what ``fused=true`` does;
* ``unfused_fp32_head``: the unfused recipe with the head matmul and the loss in float32 (autocast off
  for them): how far bf16 rounding of the logits alone moves the curve, the yardstick for "bf16 noise".

Data: a learnable synthetic token stream over the full vocabulary (a random successor table followed
with probability 0.8, else a Zipf-distributed token), generated once from a seed, so the loss falls well
below log(V) = 10.8 within the 300 steps and the comparison covers a moving curve, not a plateau.

Writes ``ce_loss_curve.json`` (the per-step curves, max / mean |diff| of fused and of fp32-head against
unfused, final losses, seconds) to ``--out`` and prints a summary.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def make_data(steps: int, batch: int, seq: int, vocab: int, seed: int, device: str) -> torch.Tensor:
    """(steps, batch, seq + 1) token ids: successor table with prob 0.8, else a Zipf(1) draw."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randperm(vocab, generator=g)
    zipf = 1.0 / (torch.arange(vocab, dtype=torch.float64) + 10.0)
    n = steps * batch
    toks = torch.empty(n, seq + 1, dtype=torch.long)
    toks[:, 0] = torch.multinomial(zipf, n, replacement=True, generator=g)
    jump = torch.rand(n, seq, generator=g) >= 0.8
    draws = torch.multinomial(zipf, n * seq, replacement=True, generator=g).view(n, seq)
    for i in range(seq):
        toks[:, i + 1] = torch.where(jump[:, i], draws[:, i], succ[toks[:, i]])
    return toks.view(steps, batch, seq + 1).to(device)


class _Fp32Head(torch.nn.Module):
    """The unfused head + loss with autocast off: float32 matmul and loss (the bf16-noise yardstick)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, hidden, weight, target, bias=None):
        with torch.autocast(hidden.device.type, enabled=False):
            return self.inner(hidden.float(), weight.float(), target, None if bias is None else bias.float())


def train(variant: str, base: torch.nn.Module, data: torch.Tensor, lr: float, warmup: int, device: str) -> list[float]:
    from fused_layers import swap_modules

    model = copy.deepcopy(base)
    if variant == "fused":
        rep = swap_modules(model, kinds=["cross_entropy"])
        assert rep.names("cross_entropy") == ["loss.loss_fn"], rep.names()
    elif variant == "unfused_fp32_head":
        model.loss = _Fp32Head(model.loss)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=device == "cuda")
    steps = data.shape[0]

    def lr_at(s):
        if s < warmup:
            return (s + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(steps - warmup, 1)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    losses = []
    for s in range(steps):
        x, y = data[s, :, :-1], data[s, :, 1:]
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return [float(v) for v in torch.stack(losses).cpu()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-check", action="store_true", help="tiny shapes on the CPU (interpreter): plumbing only")
    args = ap.parse_args()
    device = "cuda"
    if args.cpu_check:
        os.environ["TRITON_INTERPRET"] = "1"
        device = "cpu"
        args.steps, args.layers, args.d, args.heads, args.seq, args.batch, args.vocab = 6, 1, 32, 2, 16, 2, 300
    from lm_demo.model import GPT

    t0 = time.time()
    torch.manual_seed(args.seed)
    base = GPT(args.vocab, args.seq, args.d, args.layers, args.heads, attn_impl="sdpa").to(device)
    data = make_data(args.steps, args.batch, args.seq, args.vocab, args.seed + 1, device)
    curves, seconds = {}, {}
    for variant in ("unfused", "fused", "unfused_fp32_head"):
        torch.manual_seed(args.seed + 2)
        t1 = time.time()
        curves[variant] = train(variant, base, data, args.lr, min(20, args.steps // 10 + 1), device)
        seconds[variant] = time.time() - t1
        print(f"{variant:>18}: first {curves[variant][0]:.4f}  last {curves[variant][-1]:.4f}  "
              f"({seconds[variant]:.1f} s)", flush=True)
    ref = curves["unfused"]

    def stats(c):
        d = [abs(a - b) for a, b in zip(c, ref)]
        tail = max(1, len(c) // 6)
        return dict(max_abs_diff=max(d), mean_abs_diff=sum(d) / len(d),
                    last_mean_diff=sum(c[-tail:]) / tail - sum(ref[-tail:]) / tail)

    summary = {v: stats(curves[v]) for v in ("fused", "unfused_fp32_head")}
    meta = dict(vars(args), device=torch.cuda.get_device_name() if device == "cuda" else "cpu (numbers meaningless)",
                torch=torch.__version__, seconds=time.time() - t0, seconds_per_variant=seconds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ce_loss_curve.json"), "w") as f:
        json.dump(dict(meta=meta, summary=summary, curves=curves), f, indent=1)
    print(f"\n## Loss curves, {args.steps} steps, bf16 autocast, GPT {args.layers}L d{args.d} seq {args.seq} "
          f"batch {args.batch} V {args.vocab}\n")
    print("| variant | loss step 1 | loss last | max abs diff vs unfused | mean abs diff | last-1/6 mean diff |")
    print("|---|---|---|---|---|---|")
    print(f"| unfused | {ref[0]:.4f} | {ref[-1]:.4f} | - | - | - |")
    for v, st in summary.items():
        c = curves[v]
        print(f"| {v} | {c[0]:.4f} | {c[-1]:.4f} | {st['max_abs_diff']:.4f} | {st['mean_abs_diff']:.4f} | "
              f"{st['last_mean_diff']:+.4f} |")
    for step in sorted({0, 9, 49, 99, 199, args.steps - 1}):
        if step < args.steps:
            print(f"step {step + 1:>4}: " + "  ".join(f"{v} {curves[v][step]:.4f}" for v in curves))
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
