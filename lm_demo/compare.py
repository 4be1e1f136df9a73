"""Fused against unfused, side by side, from the ``summary.json`` each run of a sweep wrote.

``python train.py -m fused=false,true`` calls this at the end of the multirun (``hydra.callbacks.compare``
in ``conf/train.yaml``); by hand: ``python -m lm_demo.compare multirun/DATE/TIME``. Writes
``comparison.md``, ``comparison.json`` and ``comparison.png`` into the sweep dir and prints the table.

Runs are grouped by the command-line overrides that differ between them, other than ``seed``.  Each
group's tokens/s comes with its spread (min-max).  Over seeds, when the group has several runs, it is the
median.  For one run it is the throughput over the run's second half, the harmonic mean of the windows
ThroughputMonitor logged there, with the slowest and fastest window as the spread.  The harmonic mean is
tokens over time, so a stall counts as much as it cost, where a median would hide it.  A ratio whose
spreads overlap is printed as "within noise".  Columns: what was actually swapped (a ``fused=true`` run
that swapped nothing is labelled ``fused (0 swapped)`` and gets no ratio), ``vs base`` (the first
``fused=false`` group), ``vs best unfused`` (the fastest group that ran unfused: where the sweep has them,
SDPA and compiled SDPA; the table says when it has neither), and the step-time A/B the fused callback
measured inside each run (``fused/step_speedup/<kind>``, median over rounds, min-max).  Per-module kernel
timings (``fused/speedup/<kind>``, against each module's reference class) are in ``comparison.json`` only.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from statistics import median
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


def _spread(values: list[float]) -> tuple[float | None, float | None, float | None]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None, None
    return median(vals), min(vals), max(vals)


def _over_windows(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """(tokens over time, slowest, fastest) of one run's throughput windows: the harmonic mean, which
    weighs every window by its duration (each covers the same number of batches)."""
    vals = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not vals:
        return None, None, None
    return len(vals) / sum(1.0 / v for v in vals), min(vals), max(vals)


def _window_samples(s: dict[str, Any], key: str = "train/device/items_per_sec") -> list[float]:
    """ThroughputMonitor's logged values in the second half of the run (after warm-up and the A/B)."""
    h = (s.get("history") or {}).get(key) or []
    if not h:
        return []
    last = h[-1][0]
    return [v for step, v in h if step >= last / 2] or [h[-1][1]]


def run_row(s: dict[str, Any]) -> dict[str, Any]:
    """The compared quantities of one run's summary (None where the run did not log them)."""
    m = s.get("metrics", {})
    step_ms = _first(m, _STEP_MS)
    if step_ms is None and (bps := _first(m, _BATCHES)):
        step_ms = 1000.0 / bps
    fl = s.get("fused_layers") or {}
    peaks = fl.get("peak_memory_gib") or {}
    kept = fl.get("kept_steps") or {}
    row = {
        "tokens_per_sec": _first(m, _TOKENS),
        "step_ms": step_ms,
        # the kept configuration's steady state (peak statistics reset after the A/B, whose unfused arm would
        # set the run's peak), else the run's peak
        "peak_memory_gib": peaks.get("kept") if peaks.get("kept") is not None else _first(m, _MEMORY),
        "ab_peak_memory_gib": peaks.get("ab"),
        "kept_step_ms": kept.get("median_ms"),
        "kept_agrees": kept.get("agrees"),
        "mfu": _first(m, _MFU),
        "train_loss": m.get("train/loss"),
        "val_loss": m.get("val/loss"),
        "swapped": fl.get("swapped") or {},
        "swapped_total": fl.get("swapped_total", 0) if s.get("fused") else 0,
        "ab_status": fl.get("ab_status") if s.get("fused") else None,
        "_windows": _window_samples(s),
    }
    row.update({k: v for k, v in m.items() if k.startswith(("fused/speedup/", "fused/step_speedup"))})
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
        keys = sorted({k for r in rr for k in r if not k.startswith("_")
                       and k not in ("swapped", "ab_status", "kept_agrees")},
                      key=lambda k: (k.startswith("fused/"), k))
        agg: dict[str, Any] = {}
        for k in keys:
            vals = [r[k] for r in rr if isinstance(r.get(k), (int, float))]
            agg[k] = median(vals) if vals else None
        samples = [r["tokens_per_sec"] for r in rr] if len(rr) > 1 else rr[0]["_windows"]
        med, lo, hi = _spread(samples) if len(rr) > 1 else _over_windows(samples)
        if med is not None:
            agg["tokens_per_sec"], agg["tokens_lo"], agg["tokens_hi"] = med, lo, hi
            agg["tokens_spread_over"] = f"{len(rr)} seeds" if len(rr) > 1 else f"{len(samples)} windows"
        fused = bool(ss[0].get("fused"))
        swapped_total = min(r["swapped_total"] for r in rr)
        swapped: dict[str, int] = {}
        for k, n in rr[0]["swapped"].items():
            if n:
                swapped[k] = n
        rows.append({"label": label, "fused": fused, "ran_fused": fused and swapped_total > 0,
                     "tag": "unfused" if not fused else ("fused" if swapped_total else "fused (0 swapped)"),
                     "attn_impl": ss[0].get("attn_impl"), "compile": ss[0].get("compile"), "runs": len(ss),
                     "swapped": swapped, "ab_status": rr[0]["ab_status"], **agg, "history": ss[0].get("history", {}),
                     "kept_agrees": (None if all(r["kept_agrees"] is None for r in rr)
                                     else all(r["kept_agrees"] is not False for r in rr))})
    base = next((r for r in rows if r["fused"] is False), rows[0])
    unfused = [r for r in rows if not r["ran_fused"] and r.get("tokens_per_sec")]
    best = max(unfused, key=lambda r: r["tokens_per_sec"]) if unfused else None
    for r in rows:
        for name, ref in (("vs_base", base), ("vs_best_unfused", best)):
            t, b = r.get("tokens_per_sec"), (ref or {}).get("tokens_per_sec")
            r[name] = (t / b) if t and b and r["ran_fused"] == r["fused"] else None
            lo, hi = r.get("tokens_lo"), r.get("tokens_hi")
            blo, bhi = (ref or {}).get("tokens_lo"), (ref or {}).get("tokens_hi")
            r[name + "_noise"] = None if None in (lo, hi, blo, bhi) or ref is r else (lo <= bhi and blo <= hi)
    notes = []
    if not any(r["attn_impl"] == "sdpa" and not r["ran_fused"] and not r["compile"] for r in rows):
        notes.append("no unfused SDPA baseline in this sweep "
                     "(add model.attn_impl=sdpa jobs, e.g. `model.attn_impl=reference,sdpa`)")
    if not any(r["attn_impl"] == "sdpa" and not r["ran_fused"] and r["compile"] for r in rows):
        notes.append("no compiled unfused SDPA baseline in this sweep "
                     "(add `model.compile=false,true` with model.attn_impl=sdpa)")
    for r in rows:
        if r["fused"] and not r["ran_fused"]:
            notes.append(f"{r['label']}: fused=true but nothing was swapped ({r.get('ab_status') or 'no kernels'}): "
                         "an unfused run, no ratio shown")
    kinds = sorted({k for r in rows for k in r if k.startswith("fused/step_speedup/")})
    detail = sorted({k for r in rows for k in r if k.startswith("fused/speedup/")})
    result = {"sweep_dir": str(sweep_dir), "baseline": base["label"], "best_unfused": best["label"] if best else None,
              "kinds": kinds, "per_module_kinds": detail, "notes": notes,
              "rows": [{k: v for k, v in r.items() if k != "history"} for r in rows]}
    md = format_table(rows, kinds, base["label"], best["label"] if best else None, notes)
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


def _ratio(r: dict[str, Any], key: str) -> str:
    v = r.get(key)
    if v is None:
        return "-"
    return f"{v:.2f}x" + (" (within noise)" if r.get(key + "_noise") else "")


def format_table(rows: list[dict[str, Any]], kinds: list[str], base_label: str, best_label: str | None = None,
                 notes: list[str] | None = None) -> str:
    short = [k.rsplit("/", 1)[-1] for k in kinds]
    head = ["run", "ran as", "n", "tokens/s [min-max]", "vs base", "vs best unfused", "step ms", "peak GiB",
            "A/B peak GiB", "MFU", "train loss", "val loss"] + [f"step A/B {k}" for k in short] + ["kept steps ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        label = (r["label"] + (" (base)" if r["label"] == base_label else "")
                 + (" (best unfused)" if r["label"] == best_label else ""))
        ran = r["tag"] + (": " + ", ".join(f"{k} {n}" for k, n in r["swapped"].items()) if r["swapped"] else "")
        tps = "-" if r.get("tokens_per_sec") is None else (
            f"{r['tokens_per_sec']:,.0f} [{r['tokens_lo']:,.0f}-{r['tokens_hi']:,.0f}]"
            if r.get("tokens_lo") is not None
            else f"{r['tokens_per_sec']:,.0f}")
        cells = [label, ran, str(r["runs"]), tps, _ratio(r, "vs_base"), _ratio(r, "vs_best_unfused"),
                 _fmt(r.get("step_ms"), ".1f"), _fmt(r.get("peak_memory_gib"), ".2f"),
                 _fmt(r.get("ab_peak_memory_gib"), ".2f"), _fmt(r.get("mfu"), ".1%"),
                 _fmt(r.get("train_loss"), ".4f"), _fmt(r.get("val_loss"), ".4f")]
        for k, sk in zip(kinds, short):
            v = r.get(k)
            lo, hi = r.get(f"fused/step_speedup_lo/{sk}"), r.get(f"fused/step_speedup_hi/{sk}")
            over_rounds = f" [{lo:.3f}-{hi:.3f}]" if lo is not None and hi is not None else ""
            cells.append("-" if v is None else f"{v:.3f}x{over_rounds}")
        kept = r.get("kept_step_ms")
        cells.append("-" if kept is None else f"{kept:.3f}" + ("" if r.get("kept_agrees") else " (outside the A/B)"))
        lines.append("| " + " | ".join(cells) + " |")
    spread = sorted({r.get("tokens_spread_over", "") for r in rows} - {""})
    lines.append("")
    lines.append(f"tokens/s [min-max] over {' / '.join(spread) or '-'}: over seeds the median; "
                 "over windows (one run) the run's second half as tokens / time (a stall counts), "
                 "with the slowest and fastest window; a ratio whose ranges overlap is within noise. "
                 "step A/B: the fused callback's interleaved step-time A/B inside the run "
                 "(unfused step / step with that kind fused; median [min-max] over rounds); kept steps ms: the "
                 "steps after the A/B in the configuration it kept, timed alike (outside the A/B: not within the "
                 "kept arm's min-max there). peak GiB: the kept configuration's steady state where the A/B ran "
                 "(peak statistics reset after it), else the run's; A/B peak GiB: up to the A/B's end, its "
                 "unfused arm included.")
    for n in notes or []:
        lines.append(f"- note: {n}")
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
    colors = ["tab:orange" if r["ran_fused"] else "tab:blue" for r in rows]
    for ax, (title, key) in zip(axes, panels):
        vals = [r.get(key) or 0.0 for r in rows]
        err = None
        if key == "tokens_per_sec" and all(r.get("tokens_lo") is not None for r in rows):
            err = [[v - r["tokens_lo"] for v, r in zip(vals, rows)], [r["tokens_hi"] - v for v, r in zip(vals, rows)]]
            title = "tokens/s (median over seeds or tokens / time over windows; min-max)"
        ax.bar(range(len(rows)), vals, color=colors, yerr=err, capsize=3)
        if key == "tokens_per_sec":  # the ratio a user compares: against the fastest unfused run of the sweep
            for i, r in enumerate(rows):
                if r.get("vs_best_unfused") is not None:
                    ax.text(i, vals[i], f"{r['vs_best_unfused']:.2f}x", ha="center", va="bottom", fontsize=7)
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
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    ax = axes[4]
    if kinds:
        measured = [(r, c) for r, c in zip(rows, colors) if any(r.get(k) is not None for k in kinds)]
        width = 0.8 / max(len(measured), 1)
        for i, (r, c) in enumerate(measured):
            ax.bar([j + i * width for j in range(len(kinds))], [r.get(k) or 0.0 for k in kinds], width, color=c,
                   label=r["label"])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(kinds)), [k.rsplit("/", 1)[-1] for k in kinds], fontsize=8)
        ax.legend(fontsize=6)
    ax.set_title("step-time A/B speedup per kind" if kinds else "step-time A/B: none measured")
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
