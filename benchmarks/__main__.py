"""python -m benchmarks <suite> [options]: the one entry point (benchmarks/README.md says what each suite measures)."""

from __future__ import annotations

import argparse
import importlib
import sys

# suite -> (module, one line of what it does)
SUITES = {
    "ops": ("ops", "softmax, LayerNorm/RMSNorm, cross-entropy (+ linear), attention against their peers (GPU)"),
    "models": ("models", "HF LLMs (GPT-2 ... Gemma 2), timm ViT: a training step unfused / fused / Liger (GPU)"),
    "train": ("training", "the demo GPT-2 step of train.py, eager and torch.compile, unfused / fused (GPU)"),
    "host": ("host", "host (CPU) cost per eager call on tiny shapes, fused / PyTorch / Liger (GPU)"),
    "scale": ("scale", "a ~1B Llama on FSDP2 / ZeRO-3 over several GPUs at a memory budget: tokens/s, peak (GPUs)"),
    "sass": ("sass", "the SASS of every default kernel configuration, compiled for sm_90: fingerprints, --check (CPU)"),
    "plot": ("plot", "draw docs/figures/*.png from the results tables (CPU, matplotlib)"),
    "table": ("plot", "print the newest row of each case of a results table as Markdown (CPU)"),
}

GPU_SUITES = ("ops", "models", "train", "host", "scale")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="fused-layers benchmarks: one suite per table in benchmarks/results/ (rows appended, keyed "
                    "by gpu, torch, triton, commit, date).",
        epilog="GPU suites exit with code 2 and one line where CUDA is missing. See benchmarks/README.md.")
    sub = ap.add_subparsers(dest="suite", metavar="suite", required=True)
    for name, (module, help_) in SUITES.items():
        p = sub.add_parser(name, help=help_, description=help_)
        mod = importlib.import_module(f"benchmarks.{module}")
        if name == "table":
            mod.add_table_arguments(p)
            continue
        if name in GPU_SUITES:
            p.add_argument("--out", help=f"table to append to (default: benchmarks/results/{name}.csv)")
            p.add_argument("--dry-run", action="store_true", help="measure and print, write no row")
            p.add_argument("--smoke", action="store_true",
                           help="check the suite's code on the CPU (Triton interpreter, tiny shapes, timings "
                                "meaningless); writes only to --out, never to the committed table")
        mod.add_arguments(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    module, _ = SUITES[args.suite]
    if args.suite in GPU_SUITES and args.smoke and not args.out:
        args.dry_run = True  # smoke rows never reach the committed tables
    mod = importlib.import_module(f"benchmarks.{module}")
    run = mod.run_table if args.suite == "table" else mod.run
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
