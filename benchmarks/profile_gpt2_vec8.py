"""Issue 10, session 24: what the VEC8 cross-entropy buys a real model whose vocabulary is not a multiple of 16:
Hugging Face ``GPT2LMHeadModel(GPT2Config())`` (GPT-2 small, vocab 50,257), bf16, AdamW(fused), batch 8 x 1,024, every
kind swapped (``swap_modules``: the loss runs the fused linear cross-entropy, chunks of 50,257-wide logits).

Arms, interleaved in one process on one model: the default (VEC8) and session 23's route for such rows
(``misaligned_vec8=False``: the streaming kernel).  Reported: each arm's CUDA time per step in the cross-entropy
kernels (torch.profiler, summed over kernels named ``_ce_*``) and the median step time (CUDA events).

    python benchmarks/profile_gpt2_vec8.py [--steps 10] [--rounds 5] > $OUT/gpt2_vec8.txt
    python benchmarks/profile_gpt2_vec8.py --smoke          # CPU plumbing check (interpreter, tiny model)
    ARMS='{"name": {config overrides}}' python benchmarks/profile_gpt2_vec8.py   # the default against these arms
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--smoke", action="store_true")
args = ap.parse_args()

import transformers as T  # noqa: E402

from fused_layers import swap_modules  # noqa: E402
from fused_layers.ops import _cpp  # noqa: E402
from fused_layers.ops._common import config_override  # noqa: E402

if not args.smoke:
    _cpp.extension(wait=True)  # the C++ fast path built first (session 25's first run timed steps while it built)

dev = "cpu" if args.smoke else "cuda"
torch.manual_seed(0)
if args.smoke:
    cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=257, attn_implementation="sdpa")
    bs, seq = 2, 16
else:
    cfg = T.GPT2Config(attn_implementation="sdpa")
    bs, seq = 8, 1024
model = T.GPT2LMHeadModel(cfg).to(dev, torch.float32 if args.smoke else torch.bfloat16).train()
model.config.use_cache = False
report = swap_modules(model)
print("swapped:", {k: len(v) for k, v in report.by_kind().items()} if hasattr(report, "by_kind") else report,
      flush=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=not args.smoke)
ids = torch.randint(0, cfg.vocab_size, (bs, seq), device=dev)


def step():
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


ARMS = {"VEC8 (default)": {}, "stream (session 23)": {"misaligned_vec8": False}}
if os.environ.get("ARMS"):  # e.g. ARMS='{"4K x 4 warps": {"persist_block": 4096, "persist_warps": 4}}': the default, then these
    import json

    ARMS = {"default": {}, **json.loads(os.environ["ARMS"])}
losses = {}
for arm, over in ARMS.items():  # warm-up: compile and bind each arm's kernels
    with config_override("cross_entropy", **over):
        losses[arm] = [float(step()) for _ in range(1 if args.smoke else 3)]
print("first losses:", losses, flush=True)
if args.smoke:
    sys.exit(0)

ce_ms = {}
for arm, over in ARMS.items():
    with config_override("cross_entropy", **over):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
    tot = {}
    for e in prof.key_averages():
        if e.key.startswith("_ce_"):
            tot[e.key] = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / 3 / 1000
    ce_ms[arm] = tot
    print(f"{arm:22s} CE kernels per step: " + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(tot.items())) +
          f"  (sum {sum(tot.values()):.3f} ms)", flush=True)

times = {arm: [] for arm in ARMS}
for _ in range(args.rounds):
    for arm, over in ARMS.items():
        with config_override("cross_entropy", **over):
            step()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(args.steps):
                step()
            b.record()
            torch.cuda.synchronize()
            times[arm].append(a.elapsed_time(b) / args.steps)
for arm, t in times.items():
    print(f"{arm:22s} step {statistics.median(t):.2f} ms (rounds {', '.join(f'{x:.2f}' for x in t)})", flush=True)
