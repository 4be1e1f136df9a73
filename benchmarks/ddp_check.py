"""DDP check on two GPUs: the FusedLayersCallback swaps the same modules on both ranks, and the fused run's
loss curve matches the unfused run's.

    python benchmarks/ddp_check.py --out benchmarks/results/ddp_check   # driver: runs both, compares

The driver runs ``--run unfused`` and ``--run fused`` one after the other (each a Lightning DDP launch on
``--devices`` GPUs, same seed and data); every rank writes ``<out>/<run>_rank<r>.json`` (its swap report,
the modules ``policy`` restored, per-step local losses, the speedup rows); the driver then checks

* the fused run swapped the same module names on every rank (and restored the same ones);
* per rank and step, |loss_fused - loss_unfused| <= --tol (bf16-mixed autocast, so not bit-identical);

and writes ``<out>/summary.md``.  Exit status 0 when both hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(mode: str, out: Path, args: argparse.Namespace) -> None:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks import FusedLayersCallback
    from lm_demo.model import GPTLM

    L.seed_everything(0, workers=True)
    model = GPTLM(vocab_size=256, seq_len=args.seq_len, d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
                  attn_impl="reference", lr=1e-3, warmup_steps=5)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (args.steps * args.batch * args.devices, args.seq_len + 1), generator=g)
    data = DataLoader(TensorDataset(x[:, :-1], x[:, 1:]), batch_size=args.batch, shuffle=False)

    losses: list[float] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"].detach()))

    cbs: list[L.Callback] = [Record()]
    fused = None
    if mode == "fused":
        fused = FusedLayersCallback(policy=args.policy, warmup_steps=3, max_measure_seconds=5.0)
        cbs.append(fused)
    trainer = L.Trainer(
        accelerator=args.accelerator, devices=args.devices, strategy="ddp",
        precision="bf16-mixed" if args.accelerator == "gpu" else "32-true", max_steps=args.steps,
        callbacks=cbs, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, deterministic=False,
    )
    trainer.fit(model, train_dataloaders=data)
    rank = trainer.global_rank
    rec = {
        "mode": mode,
        "rank": rank,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "losses": losses,
        "swapped": sorted(fused.report.names()) if fused else [],
        "swapped_kinds": fused.report.counts() if fused else {},
        "restored": sorted(fused.restored) if fused else [],
        "speedups": [m.as_dict() for m in fused.measurements] if fused else [],
        "optimizer_holds_module_params": {id(p) for g_ in trainer.optimizers[0].param_groups for p in g_["params"]}
        == {id(p) for p in model.parameters()},
    }
    (out / f"{mode}_rank{rank}.json").write_text(json.dumps(rec, indent=1))


def compare(out: Path, args: argparse.Namespace) -> int:
    recs = {(m, r): json.loads((out / f"{m}_rank{r}.json").read_text()) for m in ("fused", "unfused") for r in range(args.devices)}
    swaps = {r: recs["fused", r]["swapped"] for r in range(args.devices)}
    restored = {r: recs["fused", r]["restored"] for r in range(args.devices)}
    params_ok = all(rec["optimizer_holds_module_params"] for rec in recs.values())
    same_swaps = all(s == swaps[0] for s in swaps.values()) and all(s == restored[0] for s in restored.values()) and bool(swaps[0] or restored[0])
    diffs = {}
    for r in range(args.devices):
        a, b = recs["fused", r]["losses"], recs["unfused", r]["losses"]
        diffs[r] = max(abs(x - y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
    curves_match = all(d <= args.tol for d in diffs.values())
    prec = "bf16-mixed" if args.accelerator == "gpu" else "32-true"
    lines = [f"# DDP check ({args.devices} x {recs['fused', 0]['device']}, {prec}, {args.steps} steps)", "",
             f"command: `python benchmarks/ddp_check.py --out {out}`", "",
             f"same swaps on every rank: **{same_swaps}**  (swapped {recs['fused', 0]['swapped_kinds']}, restored by policy={args.policy}: {restored[0]})", "",
             f"optimizer holds the module's parameters on every rank: **{params_ok}**", "",
             f"max |loss fused - loss unfused| per rank: {diffs} (tol {args.tol}) -> **{curves_match}**", "",
             "| step | " + " | ".join(f"unfused r{r} | fused r{r}" for r in range(args.devices)) + " |",
             "|---|" + "---|---|" * args.devices]
    for i in range(len(recs["fused", 0]["losses"])):
        cells = []
        for r in range(args.devices):
            cells += [f"{recs['unfused', r]['losses'][i]:.4f}", f"{recs['fused', r]['losses'][i]:.4f}"]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines += ["", "speedups measured on rank 0 (reference / fused):", "",
              "| kind | modules | shape | dtype | ref ms | fused ms | speedup | fwd speedup | achieved | max err |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m in recs["fused", 0]["speedups"]:
        lines.append(f"| {m['kind']} | {','.join(m['modules'])[:60]} | {m['shape']} | {m['dtype']} | {m['ref_ms']:.4f} | {m['fused_ms']:.4f} | "
                     f"{m['speedup']:.3f} | {m['speedup_fwd']:.3f} | {m['achieved']:.4g} {m['metric']} | {m['max_err']:.3g} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same_swaps and curves_match and params_ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ddp_check")
    p.add_argument("--run", choices=["fused", "unfused"], help="(internal) run one mode under DDP")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--accelerator", default="gpu", help="gpu; cpu (with TRITON_INTERPRET=1) is a smoke test of the script")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--policy", default="always", choices=["always", "faster"])
    p.add_argument("--tol", type=float, default=0.05, help="max abs loss difference (nats), bf16-mixed")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.run:
        run(args.run, args.out, args)
        return 0
    for mode in ("unfused", "fused"):
        cmd = [sys.executable, __file__, "--run", mode] + [a for a in sys.argv[1:]]
        env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT")}
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return compare(args.out, args)


if __name__ == "__main__":
    sys.exit(main())
