"""Independent timing of ``train.py`` runs, and the issue-12 acceptance checks over their sweeps.

1. ``WallClock`` -- a Lightning callback added to the runs under test
   (``+callbacks.wallclock._target_=benchmarks.train_ab_check.WallClock +callbacks.wallclock.start_step=N``).
   It shares no code with ``ThroughputMonitor`` or the fused callback: ``torch.cuda.synchronize()`` and
   ``time.perf_counter()`` at the start of training batch ``start_step`` (after warm-up, the per-module
   timing and the step-time A/B) and at the end of training, tokens counted from the batches themselves.
   Writes ``wallclock.json`` into the job's output dir.

2. ``python benchmarks/train_ab_check.py SWEEP_DIR... --out OUT.json --md OUT.md``: for every job, the
   comparison's tokens/s (ThroughputMonitor, median over the second half's windows) against the wall-clock
   one (agreement within 3% is the acceptance bar); every fused run against its unfused twin (same
   attention implementation, compile setting and sequence length; "no fused run slower than its twin");
   the best fused run against the best unfused run per sequence length (target >= 1.1x).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback


class WallClock(Callback):
    """Wall-clock tokens/s over training batches ``start_step`` .. end, with a device sync at both ends."""

    def __init__(self, start_step: int = 50) -> None:
        self.start_step = int(start_step)
        self.t0: float | None = None
        self.tokens = 0
        self.steps = 0
        self._batch = 0

    def _sync(self, trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._batch == self.start_step:
            self._sync(trainer)
            self.t0 = time.perf_counter()
        if self.t0 is not None:
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            self.tokens += int(x.numel())
            self.steps += 1
        self._batch += 1

    def on_train_end(self, trainer, pl_module) -> None:
        out: dict[str, Any] = {"start_step": self.start_step, "steps": self.steps, "tokens": self.tokens}
        if self.t0 is not None and self.steps:
            self._sync(trainer)
            dt = time.perf_counter() - self.t0
            out.update(seconds=dt, tokens_per_sec=self.tokens / dt, step_ms=1e3 * dt / self.steps)
        if trainer.is_global_zero:
            Path(trainer.default_root_dir).mkdir(parents=True, exist_ok=True)
            (Path(trainer.default_root_dir) / "wallclock.json").write_text(json.dumps(out, indent=2))


def _jobs(sweep: Path) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lm_demo.compare import run_row

    jobs = []
    for p in sorted(sweep.glob("*/summary.json")):
        s = json.loads(p.read_text())
        wc = p.parent / "wallclock.json"
        w = json.loads(wc.read_text()) if wc.exists() else {}
        row = run_row(s)
        windows = row["_windows"]
        med = sorted(windows)[len(windows) // 2] if windows else row["tokens_per_sec"]
        fl = s.get("fused_layers") or {}
        jobs.append({
            "sweep": str(sweep), "job": p.parent.name, "overrides": s.get("overrides"),
            "attn_impl": s.get("attn_impl"), "compile": s.get("compile"), "seq_len": s["config"]["model"]["seq_len"],
            "fused": s.get("fused"), "tag": s.get("tag"), "swapped": fl.get("swapped"), "kept_arm": fl.get("kept_arm"),
            "ab_status": fl.get("ab_status"), "step_ab": {a: {k: r[k] for k in ("median_ms", "speedup", "speedup_lo", "speedup_hi")}
                                                        for a, r in (fl.get("step_ab") or {}).items()},
            "tokens_per_sec_table": med, "tokens_per_sec_wallclock": w.get("tokens_per_sec"),
            "peak_memory_gib": row.get("peak_memory_gib"),
        })
        j = jobs[-1]
        if j["tokens_per_sec_table"] and j["tokens_per_sec_wallclock"]:
            j["table_vs_wallclock"] = j["tokens_per_sec_table"] / j["tokens_per_sec_wallclock"]
            j["agree_3pct"] = abs(j["table_vs_wallclock"] - 1) <= 0.03
    return jobs


def check(sweeps: list[Path]) -> dict[str, Any]:
    jobs = [j for s in sweeps for j in _jobs(s)]
    tps = lambda j: j["tokens_per_sec_wallclock"] or j["tokens_per_sec_table"] or 0.0  # noqa: E731
    twins = []
    for j in jobs:
        if not j["fused"]:
            continue
        twin = next((u for u in jobs if not u["fused"] and (u["attn_impl"], u["compile"], u["seq_len"]) ==
                     (j["attn_impl"], j["compile"], j["seq_len"])), None)
        if twin:
            twins.append({"fused_job": f"{Path(j['sweep']).name}/{j['job']}", "attn_impl": j["attn_impl"], "compile": j["compile"],
                          "seq_len": j["seq_len"], "ratio": tps(j) / tps(twin) if tps(twin) else None, "kept_arm": j["kept_arm"]})
    best = {}
    for seq in sorted({j["seq_len"] for j in jobs}):
        f = [j for j in jobs if j["seq_len"] == seq and j["fused"] and j["tag"] == "fused"]
        u = [j for j in jobs if j["seq_len"] == seq and (not j["fused"] or j["tag"] != "fused")]
        if f and u:
            bf, bu = max(f, key=tps), max(u, key=tps)
            name = lambda j: f"{Path(j['sweep']).name}/{j['job']} ({j['attn_impl']}, compile={j['compile']})"  # noqa: E731
            best[str(seq)] = {"best_fused": name(bf), "best_unfused": name(bu), "ratio": tps(bf) / tps(bu)}
    return {
        "jobs": jobs, "twins": twins, "best": best,
        "all_agree_3pct": all(j.get("agree_3pct", False) for j in jobs),
        "no_fused_slower_than_twin": all((t["ratio"] or 0) >= 0.99 for t in twins),  # 1% = run-to-run noise
    }


def to_md(res: dict[str, Any]) -> str:
    lines = ["| sweep/job | seq | attn | compile | ran as | kept arm | table tok/s | wall-clock tok/s | table/wall | peak GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
    for j in res["jobs"]:
        lines.append(f"| {Path(j['sweep']).name}/{j['job']} | {j['seq_len']} | {j['attn_impl']} | {j['compile']} | {j['tag']} | "
                     f"{j['kept_arm'] or '-'} | {f(j['tokens_per_sec_table'], ',.0f')} | {f(j['tokens_per_sec_wallclock'], ',.0f')} | "
                     f"{f(j.get('table_vs_wallclock'), '.3f')} | {f(j['peak_memory_gib'], '.2f')} |")
    lines += ["", "fused vs unfused twin (wall-clock tokens/s):"]
    lines += [f"- {t['fused_job']} seq {t['seq_len']} {t['attn_impl']} compile={t['compile']}: {f(t['ratio'], '.3f')}x (kept {t['kept_arm']})"
              for t in res["twins"]]
    lines += ["", "best fused vs best unfused:"]
    lines += [f"- seq {s}: {b['ratio']:.3f}x ({b['best_fused']} vs {b['best_unfused']}); target >= 1.1x" for s, b in res["best"].items()]
    lines += ["", f"table within 3% of wall clock for every job: {res['all_agree_3pct']}; "
                  f"no fused run slower than its twin (1% noise): {res['no_fused_slower_than_twin']}"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--md", type=Path)
    a = ap.parse_args()
    res = check(a.sweeps)
    a.out.write_text(json.dumps(res, indent=2, default=str))
    md = to_md(res)
    if a.md:
        a.md.write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
