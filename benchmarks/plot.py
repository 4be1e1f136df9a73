"""plot / table: the README's figures and tables, drawn from the results tables (CPU only, no torch).

    python -m benchmarks plot                       # docs/figures/models.png, ops.png, train.png
    python -m benchmarks plot --out /tmp/figs --gpu "NVIDIA H200"
    python -m benchmarks table models               # newest row of each case, as Markdown

Every figure uses the newest row of each case (``utils.latest``) on one GPU (default: the GPU of the
table's newest row). The ops figure uses, per op, the timer with the most rows (named in the panel's title).
"""

from __future__ import annotations

import math
from pathlib import Path

from . import ops as ops_suite
from . import utils

ARM_COLORS = {"unfused": "#9e9e9e", "fused": "#1f77b4", "liger": "#ff7f0e"}
IMPL_COLORS = {"fused": "#1f77b4", "torch": "#7f7f7f", "torch_fp32": "#bcbcbc", "compile": "#2ca02c",
               "liger": "#ff7f0e", "sdpa": "#9467bd", "sdpa_flash": "#8c564b", "sdpa_cudnn": "#e377c2",
               "sdpa_efficient": "#17becf", "flex": "#bcbd22"}
MODEL_ORDER = ["gpt2", "llama", "qwen2", "gemma", "llama3", "mistral", "gemma2", "vit", "encoder"]
MODEL_LABEL = {"gpt2": "GPT-2", "llama": "Llama\n(GQA, 32K)", "qwen2": "Qwen2\n(152K)",
               "gemma": "Gemma\n(256K)", "llama3": "Llama 3\n(128K)", "mistral": "Mistral\n(window)",
               "gemma2": "Gemma 2\n(softcap)", "vit": "ViT-B/16", "encoder": "torch\nencoder"}

# table suite: the columns printed per table
TABLE_COLUMNS = {
    "models": ["model", "batch", "mode", "arm", "step_ms", "step_ms_lo", "step_ms_hi", "speedup", "speedup_lo",
               "speedup_hi", "extra_peak_gib", "gpu_busy_ms", "loss_diff", "date", "commit"],
    "ops": ["op", "pass", "dtype", "shape", "impl", "timer", "ms", "copy_frac", "tflops", "peak_mib", "date", "commit"],
    "train": ["model", "batch", "mode", "arm", "step_ms", "step_ms_lo", "step_ms_hi", "speedup", "tokens_per_s",
              "extra_peak_gib", "date", "commit"],
    "host": ["op", "pass", "shape", "impl", "host_us", "vs_torch", "date", "commit"],
    "sass": ["op", "case", "triton", "sha", "regs", "shared", "insns", "date", "commit"],
}


def add_arguments(p) -> None:
    p.add_argument("--results", default=str(utils.RESULTS), help="folder of the tables (default: benchmarks/results)")
    p.add_argument("--out", default=str(utils.FIGURES), help="folder for the PNGs (default: docs/figures)")
    p.add_argument("--gpu", default="", help="draw this GPU's rows (default: the GPU of each table's newest row)")


def add_table_arguments(p) -> None:
    p.add_argument("table", choices=sorted(TABLE_COLUMNS), help="which results table")
    p.add_argument("--results", default=str(utils.RESULTS), help="folder of the tables (default: benchmarks/results)")
    p.add_argument("--gpu", default="", help="only this GPU's rows")
    p.add_argument("--all", action="store_true", help="every row, not only the newest of each case")
    p.add_argument("--where", action="append", default=[], metavar="COL=VALUE", help="keep rows with this value")


def load(results: str | Path, suite: str, gpu: str = "") -> list[dict]:
    """The newest row of each case of a table, on one GPU (the newest row's GPU unless ``gpu`` is given)."""
    path = Path(results) / f"{suite}.csv"
    if not path.exists():
        return []
    rows = utils.read_rows(path)
    if not rows:
        return []
    gpu = gpu or max(enumerate(rows), key=lambda t: (t[1]["date"], t[0]))[1]["gpu"]
    return utils.latest([r for r in rows if r["gpu"] == gpu], utils.CASE[suite])


def run_table(args) -> int:
    path = Path(args.results) / f"{args.table}.csv"
    rows = utils.read_rows(path)
    if args.gpu:
        rows = [r for r in rows if r["gpu"] == args.gpu]
    for cond in args.where:
        col, _, val = cond.partition("=")
        rows = [r for r in rows if r.get(col) == val]
    if not args.all:
        rows = utils.latest(rows, utils.CASE[args.table])
    print(utils.markdown(rows, TABLE_COLUMNS[args.table]))
    return 0


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_models(rows: list[dict], out: Path) -> Path | None:
    """Speedup of a training step over unfused (bars, min-max whiskers) and extra peak memory, per model."""
    rows = [r for r in rows if r["mode"] == "eager"]
    models = [m for m in MODEL_ORDER if any(r["model"] == m for r in rows)]
    if not models:
        return None
    mem_models = [m for m in models if any(r["model"] == m and r["extra_peak_gib"] for r in rows)]
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 4.4), gridspec_kw={"width_ratios": [1.25, 1]})
    by = {(r["model"], r["arm"]): r for r in rows}
    width = 0.38
    for j, arm in enumerate(["fused", "liger"]):
        pts = []  # (x, median, lo, hi)
        for i, m in enumerate(models):
            r = by.get((m, arm))
            if r is None or math.isnan(utils.num(r["speedup"])):
                continue
            y = utils.num(r["speedup"])
            pts.append((i + (j - 0.5) * width, y, utils.num(r["speedup_lo"]), utils.num(r["speedup_hi"])))
        if not pts:
            continue
        ax1.bar([p[0] for p in pts], [p[1] for p in pts], width, color=ARM_COLORS[arm],
                label={"fused": "fused-layers (swap_modules)", "liger": "Liger-Kernel"}[arm])
        spread = [p for p in pts if not (math.isnan(p[2]) or math.isnan(p[3]))]
        if spread:
            ax1.errorbar([p[0] for p in spread], [p[1] for p in spread], fmt="none", ecolor="black", capsize=3,
                         yerr=[[p[1] - p[2] for p in spread], [p[3] - p[1] for p in spread]])
        for x, y, lo, hi in pts:
            ax1.text(x, (y if math.isnan(hi) else hi) + 0.02, f"{y:.2f}x", ha="center", va="bottom", fontsize=8)
    ax1.axhline(1.0, color="black", lw=0.8, ls="--")
    ax1.set_xticks(range(len(models)), [MODEL_LABEL[m] for m in models], fontsize=9)
    ax1.set_ylabel("training step speedup over unfused")
    ax1.set_title("Step time (bf16, AdamW, eager): higher is better", fontsize=10)
    ax1.set_ylim(0, max(1.9, ax1.get_ylim()[1] * 1.25))  # headroom for the legend above the bars
    ax1.legend(fontsize=8, loc="upper right", ncol=2)
    width = 0.27
    for j, arm in enumerate(["unfused", "fused", "liger"]):
        xs, ys = [], []
        for i, m in enumerate(mem_models):
            r = by.get((m, arm))
            if r is not None and not math.isnan(utils.num(r["extra_peak_gib"])):
                xs.append(i + (j - 1) * width)
                ys.append(utils.num(r["extra_peak_gib"]))
        if xs:
            ax2.bar(xs, ys, width, color=ARM_COLORS[arm], label=arm)
    ax2.set_xticks(range(len(mem_models)), [MODEL_LABEL[m] for m in mem_models], fontsize=9)
    ax2.set_ylabel("extra peak memory of a step (GiB)")
    ax2.set_title("Memory above weights + optimizer: lower is better", fontsize=10)
    ax2.legend(fontsize=8)
    gpu = rows[0]["gpu"]
    fig.suptitle(f"Hugging Face / timm models, {gpu}", fontsize=11)
    fig.tight_layout()
    path = out / "models.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _default_shape(r: dict) -> bool:
    """The shapes the ops suite runs by default (the figure leaves out one-off shapes kept in the table)."""
    op, shape = r["op"], r["shape"]
    if op in ops_suite.WIDTHS:
        return int(_width(shape)) in ops_suite.WIDTHS[op]
    if op == "cross_entropy":
        return shape in {ops_suite.shape_name(ops_suite.CE_ROWS, v) for v in ops_suite.CE_VOCABS}
    if op == "linear_cross_entropy":
        return shape in {ops_suite.shape_name(*c) for c in ops_suite.LINEAR_CE}
    return shape in {ops_suite.attention_name(*c) for c in ops_suite.ATTENTION}


def _case_label(shape: str) -> str:
    """A short tick label: 'S4096 D128 c' and 'GQA 32/8' on two lines (attention); tokens, hidden, vocabulary."""
    if "x" in shape and " " not in shape:
        n, h, v = shape.split("x")
        return f"N {n}\nH {h}\nV {v}"
    parts = shape.split()
    gqa = [p for p in parts if p.startswith(("Hq", "Hkv"))]
    label = "\n".join(p for p in parts if p.startswith(("S", "D"))) + (" c" if "causal" in parts else "")
    return label + ("\nGQA " + "/".join(p.lstrip("Hqkv") for p in gqa) if gqa else "")


def _width(shape: str) -> float:
    return float(shape.split("x")[-1])


def _pick_timer(rows: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["timer"]] = counts.get(r["timer"], 0) + 1
    return max(sorted(counts), key=lambda t: counts[t]) if counts else ""


def plot_ops(rows: list[dict], out: Path, dtype: str = "bf16") -> Path | None:
    """Per op, fwd+bwd: fraction of copy bandwidth against the width (softmax, norms, CE); TFLOP/s per case
    (attention); ms per case (linear cross-entropy)."""
    rows = [r for r in rows if r["pass"] == "fwd+bwd" and r["dtype"] == dtype and _default_shape(r)]
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, op in zip(axes.flat, ["softmax", "layer_norm", "rms_norm", "cross_entropy", "linear_cross_entropy",
                                  "attention"]):
        sel = [r for r in rows if r["op"] == op]
        timer = _pick_timer(sel)
        sel = [r for r in sel if r["timer"] == timer]
        if not sel:
            ax.set_visible(False)
            continue
        impls = [i for i in IMPL_COLORS if any(r["impl"] == i for r in sel)]
        if op in ("attention", "linear_cross_entropy"):
            metric = "tflops"
            cases = list(dict.fromkeys(r["shape"] for r in sel))
            w = 0.8 / max(1, len(impls))
            for j, impl in enumerate(impls):
                xs, ys = [], []
                for i, c in enumerate(cases):
                    r = next((r for r in sel if r["impl"] == impl and r["shape"] == c), None)
                    if r is not None and not math.isnan(utils.num(r[metric])):
                        xs.append(i + (j - (len(impls) - 1) / 2) * w)
                        ys.append(utils.num(r[metric]))
                ax.bar(xs, ys, w, color=IMPL_COLORS[impl], label=impl)
            ax.set_xticks(range(len(cases)), [_case_label(c) for c in cases], fontsize=7)
            ax.set_ylabel("TFLOP/s (fwd+bwd)")
        else:
            for impl in impls:
                pts = sorted((_width(r["shape"]), utils.num(r["copy_frac"])) for r in sel if r["impl"] == impl)
                pts = [p for p in pts if not math.isnan(p[1])]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=IMPL_COLORS[impl], label=impl,
                            lw=2.2 if impl == "fused" else 1.2, ms=4)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("vocabulary" if op == "cross_entropy" else "row width")
            ax.set_ylabel("fraction of copy bandwidth (fwd+bwd)")
            ax.set_ylim(0, 1.1)
        ax.set_title(f"{op} ({dtype}, {timer})", fontsize=10)
        ax.legend(fontsize=7, ncol=3 if op == "attention" else 1)
        if op == "attention":
            ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Ops against their peers, forward + backward, {rows[0]['gpu']} (c: causal)", fontsize=11)
    fig.tight_layout()
    path = out / "ops.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_train(rows: list[dict], out: Path) -> Path | None:
    """train.py's demo GPT-2: tokens/s, unfused and fused, eager and compiled, per batch x sequence."""
    if not rows:
        return None
    plt = _plt()
    groups = list(dict.fromkeys((r["batch"], r["mode"]) for r in rows))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    w = 0.38
    for j, arm in enumerate(["unfused", "fused"]):
        xs, ys = [], []
        for i, (b, m) in enumerate(groups):
            r = next((r for r in rows if r["batch"] == b and r["mode"] == m and r["arm"] == arm), None)
            if r is not None:
                xs.append(i + (j - 0.5) * w)
                ys.append(utils.num(r["tokens_per_s"]) / 1e3)
        ax.bar(xs, ys, w, color=ARM_COLORS[arm], label=arm)
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:.0f}K", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(groups)), [f"{b}\n{m}" for b, m in groups], fontsize=9)
    ax.set_ylabel("training tokens/s (thousands)")
    ax.set_title(f"train.py demo GPT-2 small, {rows[0]['gpu']}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "train.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    drawn = [plot_models(load(args.results, "models", args.gpu), out),
             plot_ops(load(args.results, "ops", args.gpu), out),
             plot_train(load(args.results, "train", args.gpu), out)]
    for p in drawn:
        if p is not None:
            print(f"wrote {p}")
    if not any(drawn):
        print(f"no rows to draw in {args.results}")
        return 1
    return 0
