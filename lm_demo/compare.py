"""Fused against unfused, side by side, from the ``summary.json`` each run of a sweep wrote.

``python train.py -m fused=false,true`` calls this at the end of the multirun (``hydra.callbacks.compare``
in ``conf/train.yaml``); by hand: ``python -m lm_demo.compare multirun/DATE/TIME``. Writes
``comparison.md``, ``comparison.json`` and ``comparison.png`` into the sweep dir and prints the table.

Runs are grouped by the command-line overrides that differ between them, other than ``seed`` (values averaged over seeds); the
first group with ``fused=false`` is the baseline of the ``vs base`` column. Throughput keys are found
among those Lightning's ThroughputMonitor logs (``train/device/items_per_sec`` = tokens/s, ...).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from statistics import mean
from typing import Any

from hydra.experimental.callback import Callback

# Each column: candidate metric keys (first found wins) and a conversion.
_TOKENS = ("train/tokens_per_sec", "train/items_per_sec", "train/device/items_per_sec", "train/device/tokens_per_sec")
_BATCHES = ("train/device/batches_per_sec", "train/batches_per_sec")
_STEP_MS = ("train/step_time_ms",)
_MEMORY = ("train/peak_memory_gib", "peak_memory_gib")
_MFU = ("train/device/mfu", "train/mfu")


def _first(m: dict[str, float], keys: tuple[str, ...]) -> float | None:
    for k in keys:
        if k in m and m[k] is not None and math.isfinite(m[k]):
            return m[k]
    return None


def run_row(s: dict[str, Any]) -> dict[str, Any]:
    """The compared quantities of one run's summary (None where the run did not log them)."""
    m = s.get("metrics", {})
    step_ms = _first(m, _STEP_MS)
    if step_ms is None and (bps := _first(m, _BATCHES)):
        step_ms = 1000.0 / bps
    row = {
        "tokens_per_sec": _first(m, _TOKENS),
        "step_ms": step_ms,
        "peak_memory_gib": _first(m, _MEMORY),
        "mfu": _first(m, _MFU),
        "train_loss": m.get("train/loss"),
        "val_loss": m.get("val/loss"),
    }
    row.update({k: v for k, v in m.items() if k.startswith("fused/speedup/")})
    return row


def _norm(o: str) -> str:
    k, _, v = o.partition("=")
    return f"{k}={v.lower()}" if v in ("True", "False") else o


def labels(runs: list[dict[str, Any]]) -> list[str]:
    """Each run's label: its overrides that differ between runs, ``seed`` left out (else its tag)."""
    ovs = [[_norm(o) for o in s.get("overrides", []) if o.split("=", 1)[0].lstrip("+~") != "seed"] for s in runs]
    common = set.intersection(*map(set, ovs)) if ovs else set()
    return [" ".join(o for o in ov if o not in common) or s.get("tag", "run") for ov, s in zip(ovs, runs)]


def load_summaries(sweep_dir: str | Path) -> list[dict[str, Any]]:
    paths = sorted(Path(sweep_dir).glob("**/summary.json"), key=lambda p: (len(p.parts), str(p)))
    out = []
    for p in paths:
        s = json.loads(p.read_text())
        s["path"] = str(p.parent)
        out.append(s)
    # multirun job order (subdir = job number), not lexical ("10" < "2")
    out.sort(key=lambda s: (int(Path(s["path"]).name) if Path(s["path"]).name.isdigit() else 1 << 30, s["path"]))
    return out


def compare(sweep_dir: str | Path, plot: bool = True, echo: bool = True) -> dict[str, Any]:
    """Build the comparison of every run under ``sweep_dir``; write .md/.json/.png there; return it."""
    sweep_dir = Path(sweep_dir)
    runs = load_summaries(sweep_dir)
    if not runs:
        raise FileNotFoundError(f"no summary.json under {sweep_dir}: did the runs finish?")
    groups: dict[str, list[dict[str, Any]]] = {}
    for s, label in zip(runs, labels(runs)):
        groups.setdefault(label, []).append(s)
    rows = []
    for label, ss in groups.items():
        rr = [run_row(s) for s in ss]
        keys = sorted({k for r in rr for k in r}, key=lambda k: (k.startswith("fused/"), k))
        agg = {k: (mean(v) if (v := [r[k] for r in rr if r.get(k) is not None]) else None) for k in keys}
        rows.append({"label": label, "fused": ss[0].get("fused"), "attn_impl": ss[0].get("attn_impl"),
                     "compile": ss[0].get("compile"), "runs": len(ss), **agg,
                     "history": ss[0].get("history", {})})
    base = next((r for r in rows if r["fused"] is False), rows[0])
    for r in rows:
        t, b = r.get("tokens_per_sec"), base.get("tokens_per_sec")
        r["vs_base"] = (t / b) if t and b else None
    kinds = sorted({k for r in rows for k in r if k.startswith("fused/speedup/")})
    result = {"sweep_dir": str(sweep_dir), "baseline": base["label"], "kinds": kinds,
              "rows": [{k: v for k, v in r.items() if k != "history"} for r in rows]}
    md = format_table(rows, kinds, base["label"])
    (sweep_dir / "comparison.md").write_text(md + "\n")
    (sweep_dir / "comparison.json").write_text(json.dumps(result, indent=2))
    if plot:
        result["plot"] = _plot(rows, kinds, sweep_dir / "comparison.png")
    if echo:
        print(f"\nfused vs unfused ({len(runs)} runs, {sweep_dir}):\n{md}")
        if result.get("plot"):
            print(f"plot: {result['plot']}")
    return result


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(rows: list[dict[str, Any]], kinds: list[str], base_label: str) -> str:
    head = ["run", "n", "tokens/s", "vs base", "step ms", "peak GiB", "MFU", "train loss", "val loss"]
    head += [f"speedup {k.rsplit('/', 1)[-1]}" for k in kinds]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"] + (" (base)" if r["label"] == base_label else ""), str(r["runs"]),
                 _fmt(r.get("tokens_per_sec"), ",.0f"), _fmt(r.get("vs_base"), ".2f") + ("x" if r.get("vs_base") else ""),
                 _fmt(r.get("step_ms"), ".1f"), _fmt(r.get("peak_memory_gib"), ".2f"), _fmt(r.get("mfu"), ".1%"),
                 _fmt(r.get("train_loss"), ".4f"), _fmt(r.get("val_loss"), ".4f")]
        cells += [_fmt(r.get(k), ".3g") + ("x" if r.get(k) is not None else "") for k in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], kinds: list[str], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare: matplotlib is not installed; no plot (pip install matplotlib)")
        return None
    labels = [r["label"] for r in rows]
    panels = [("tokens/s", "tokens_per_sec"), ("step time (ms)", "step_ms"), ("peak memory (GiB)", "peak_memory_gib")]
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.2))
    colors = ["tab:orange" if r["fused"] else "tab:blue" for r in rows]
    for ax, (title, key) in zip(axes, panels):
        vals = [r.get(key) or 0.0 for r in rows]
        ax.bar(range(len(rows)), vals, color=colors)
        ax.set_xticks(range(len(rows)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(title if any(vals) else f"{title}: not logged")
    ax = axes[3]
    for r, c in zip(rows, colors):
        for key, style in (("train/loss", "-"), ("val/loss", "o--")):
            h = r["history"].get(key)
            if h:
                ax.plot([p[0] for p in h], [p[1] for p in h], style, color=c, alpha=0.8, label=f"{r['label']} {key}")
    ax.set_title("loss (nats/byte)")
    ax.set_xlabel("step")
    ax.legend(fontsize=6)
    ax = axes[4]
    if kinds:
        measured = [(r, c) for r, c in zip(rows, colors) if any(r.get(k) is not None for k in kinds)]
        width = 0.8 / max(len(measured), 1)
        for i, (r, c) in enumerate(measured):
            ax.bar([j + i * width for j in range(len(kinds))], [r.get(k) or 0.0 for k in kinds], width, color=c, label=r["label"])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(kinds)), [k.rsplit("/", 1)[-1] for k in kinds], fontsize=8)
        ax.legend(fontsize=6)
    ax.set_title("per-kind speedup (fwd+bwd)" if kinds else "per-kind speedup: none measured")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


class CompareOnMultirunEnd(Callback):
    """Hydra callback: run `compare` on the sweep dir when a multirun ends (never fails the sweep)."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        try:
            compare(config.hydra.sweep.dir)
        except Exception as e:  # the runs themselves succeeded; a comparison problem must not hide that
            print(f"compare: no comparison for {config.hydra.sweep.dir}: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m lm_demo.compare SWEEP_DIR")
    compare(sys.argv[1])
