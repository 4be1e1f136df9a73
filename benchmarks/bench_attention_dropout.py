"""What attention dropout costs inside the kernels: fused_attention fwd and fwd+bwd with dropout_p = 0
against 0.1, bf16, on the shapes of the acceptance models (and SDPA's own cost of dropout beside it).

    python benchmarks/bench_attention_dropout.py --out $OUT      # writes dropout_<gpu>.json / .md

Timing: triton.testing.do_bench (CUDA events, L2 flushed), median; eager calls (host included), the same
way for every row.  SDPA with dropout runs PyTorch's flash kernel (its Philox dropout) where it applies.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Candidates against the default (16 random bits per element, the table's tile configs), all timed with
# dropout on and off.  "nospill": dK/dV (and D128 dQ) tiles that compile without register spills when
# dropout is on (sm_90, Triton 3.9, static scan of 2026-12-01: the table's dK/dV configs spill 280 B (D64
# causal) to 688 B (D128 causal) a thread with dropout, these 0-32 B).  "8bit": one Philox call per 16
# keys (p in steps of 1/256, as FlashAttention-2).
NOSPILL = {64: dict(dkdv_block_m=32, dkdv_block_n=128, dkdv_num_warps=8, dkdv_num_stages=3),
           128: dict(dkdv_block_m=16, dkdv_block_n=128, dkdv_num_warps=8, dkdv_num_stages=3,
                     dq_block_m=128, dq_block_n=32, dq_num_warps=8, dq_num_stages=2)}
# Since session 3 of 2026-12-01 the default is 8 bits (it won at every shape); "16bit" times the old default.
# "8bit+7rounds": Philox-4x32-7 instead of -10 for the mask (attention_config "dropout_rounds").
CANDIDATES = {"16bit": lambda D: dict(dropout_bits=16), "8bit": lambda D: dict(dropout_bits=8),
              "8bit+nospill": lambda D: dict(NOSPILL[D], dropout_bits=8),
              "8bit+7rounds": lambda D: dict(dropout_bits=8, dropout_rounds=7)}

SHAPES = [  # (name, B, Hq, Hkv, S, D, causal)
    ("gpt2 12x64 S1024", 8, 12, 12, 1024, 64, True),
    ("llama 16/4x64 S2048", 4, 16, 4, 2048, 64, True),
    ("vit 12x64 S197", 64, 12, 12, 197, 64, False),
    ("S4096 D128 causal", 4, 16, 16, 4096, 128, True),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--p", type=float, default=0.1)
    args = ap.parse_args()
    from triton.testing import do_bench

    from fused_layers import fused_attention
    from fused_layers.ops._common import config_override

    rows = []
    for name, B, Hq, Hkv, S, D, causal in SHAPES:
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
        gqa = Hq != Hkv
        row = {"shape": name}
        def time_impl(impl, fn):
            """fwd and fwd+bwd ms of ``fn`` with dropout 0 and p, into row[impl_fwd_p..] / row[impl_fb_p..]."""
            for p in (0.0, args.p):
                def fwd():
                    return fn(q, k, v, None, p, causal, enable_gqa=gqa)

                def fb():
                    torch.autograd.grad(fwd(), (q, k, v), g)

                try:
                    row[f"{impl}_fwd_p{p}"] = do_bench(fwd, warmup=5, rep=40)
                    row[f"{impl}_fb_p{p}"] = do_bench(fb, warmup=5, rep=40)
                except Exception as e:  # noqa: BLE001 - e.g. SDPA without a dropout-capable kernel for GQA
                    row[f"{impl}_p{p}_error"] = f"{type(e).__name__}: {e}"[:200]

        time_impl("fused", fused_attention)
        time_impl("sdpa", F.scaled_dot_product_attention)
        for cand, ov in CANDIDATES.items():  # the fused kernels under each candidate's overrides
            with config_override("attention", **ov(D)):
                time_impl(cand, fused_attention)
        for impl in ("fused", "sdpa", *CANDIDATES):
            for part in ("fwd", "fb"):
                a, b = row.get(f"{impl}_{part}_p0.0"), row.get(f"{impl}_{part}_p{args.p}")
                if a and b:
                    row[f"{impl}_{part}_dropout_cost"] = b / a - 1
        rows.append(row)
        print(row, flush=True)
        write(rows, args)  # after every shape: a run cut short by its time limit still leaves its table


def write(rows: list, args) -> None:
    from _timing import gpu_tag

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"dropout_{gpu_tag()}"
    stem.with_suffix(".json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "p": args.p, "rows": rows}, indent=1))
    f = lambda r, key: "-" if key not in r else f"{r[key]:.3f}"  # noqa: E731
    c = lambda r, key: "-" if key not in r else f"{r[key]:+.1%}"  # noqa: E731
    lines = [f"# Attention dropout cost (p = {args.p}), bf16, {torch.cuda.get_device_name()}", "",
             "| shape | fused fwd ms p=0 / p | fused fwd+bwd ms p=0 / p | fused cost fwd / fwd+bwd | SDPA cost fwd / fwd+bwd |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {f(r, 'fused_fwd_p0.0')} / {f(r, f'fused_fwd_p{args.p}')} | "
                     f"{f(r, 'fused_fb_p0.0')} / {f(r, f'fused_fb_p{args.p}')} | "
                     f"{c(r, 'fused_fwd_dropout_cost')} / {c(r, 'fused_fb_dropout_cost')} | "
                     f"{c(r, 'sdpa_fwd_dropout_cost')} / {c(r, 'sdpa_fb_dropout_cost')} |")
    lines += ["", "Candidates (fwd+bwd ms with p, and its cost against the default kernels at p = 0; see CANDIDATES):", "",
              "| shape | default | " + " | ".join(CANDIDATES) + " |", "|---|---|" + "---|" * len(CANDIDATES)]
    for r in rows:
        base = r.get("fused_fb_p0.0")
        cells = []
        for cand in ("fused", *CANDIDATES):
            t = r.get(f"{cand}_fb_p{args.p}")
            cells.append("-" if t is None or not base else f"{t:.3f} ({t / base - 1:+.0%})")
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + " |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
