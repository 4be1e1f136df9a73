"""What every suite shares: the row key, the results tables, timers, and the interleaved step A/B.

Tables are CSV files under ``benchmarks/results/`` (one per suite), one row per measurement, appended by every
run. Each row starts with the key columns ``gpu, torch, triton, commit, date`` (``environment()``), so a table
holds the history of a case across machines and commits, and ``latest()`` picks the newest row of each case.

Timers (GPU suites):

* ``do_bench_ms``: ``triton.testing.do_bench`` (CUDA events around single eager calls, L2 flushed between
  them): what an eager training step pays, host cost of the call included.
* ``graph_ms``: replays of a CUDA graph holding many calls, median per call: the kernels alone. At 2^26
  elements a bf16 softmax moves 256 MB in about 60 us, about what one eager call costs on the host, so
  event timing of single calls measures the host as much as the kernel.
* ``interleaved_rounds``: whole training steps of several arms, in rounds, each arm once per round in a
  rotating order, CUDA events around each arm's steps (clock and thermal drift hit every arm alike).

Nothing here imports torch at module level: ``python -m benchmarks --help`` and the ``plot`` suite run on
a machine without it.
"""

from __future__ import annotations

import csv
import datetime
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = ROOT / "docs" / "figures"

KEY = ["gpu", "torch", "triton", "commit", "date"]

# One table per suite: the key, then the suite's own columns (benchmarks/README.md says what each means).
COLUMNS: dict[str, list[str]] = {
    "ops": KEY + ["op", "pass", "dtype", "shape", "impl", "timer", "ms", "gbps", "copy_frac", "tflops",
                  "peak_mib", "note"],
    "models": KEY + ["transformers", "liger", "model", "config", "batch", "mode", "arm", "step_ms", "step_ms_lo",
                     "step_ms_hi", "speedup", "speedup_lo", "speedup_hi", "extra_peak_gib", "gpu_busy_ms", "loss",
                     "loss_diff", "swapped", "rounds", "steps", "note"],
    "train": KEY + ["model", "batch", "mode", "arm", "step_ms", "step_ms_lo", "step_ms_hi", "speedup", "speedup_lo",
                    "speedup_hi", "tokens_per_s", "extra_peak_gib", "loss", "rounds", "steps", "note"],
    "host": KEY + ["op", "pass", "dtype", "shape", "impl", "host_us", "host_us_lo", "host_us_hi", "vs_torch",
                   "calls", "rounds", "note"],
    "scale": KEY + ["transformers", "liger", "deepspeed", "strategy", "config", "arm", "gpus", "budget_gib", "seq",
                    "micro_batch", "tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi", "speedup", "speedup_lo",
                    "speedup_hi", "peak_gib", "loss", "head_fused", "swapped", "rounds", "steps", "note"],
    "sass": KEY + ["op", "case", "kernel", "sha", "regs", "shared", "insns", "opcodes"],
}
# The columns that name a case (with the key's gpu): latest() keeps the newest row of each.
CASE: dict[str, list[str]] = {
    "ops": ["gpu", "op", "pass", "dtype", "shape", "impl", "timer"],
    "models": ["gpu", "model", "mode", "arm"],
    "train": ["gpu", "model", "batch", "mode", "arm"],
    "host": ["gpu", "op", "pass", "dtype", "shape", "impl"],
    "scale": ["gpu", "strategy", "arm", "gpus", "budget_gib"],
    "sass": ["gpu", "triton", "op", "case"],  # fingerprints differ between Triton versions
}


def table_path(suite: str) -> Path:
    return RESULTS / f"{suite}.csv"


# --------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------
def read_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    """Every row of a table, as strings (empty string = not measured)."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if v != v:  # NaN: not measured
            return ""
        return f"{v:.6g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    return str(v)


def append_rows(path: str | os.PathLike, rows: Iterable[dict], suite: str) -> int:
    """Append ``rows`` to the table at ``path`` (created with its header when missing); returns how many.

    A row may leave columns out (written empty); a column the table does not have is an error, so a typo
    never writes a silent empty column."""
    cols = COLUMNS[suite]
    rows = list(rows)
    for r in rows:
        unknown = set(r) - set(cols)
        if unknown:
            raise KeyError(f"{suite} table has no column(s) {sorted(unknown)}; columns: {cols}")
    path = Path(path)
    exists = path.exists() and path.stat().st_size > 0
    if exists:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f))
        if header != cols:
            raise ValueError(f"{path}: header {header} is not the {suite} table's {cols}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        if not exists:
            w.writerow(cols)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in cols])
    return len(rows)


def latest(rows: Sequence[dict], case: Sequence[str]) -> list[dict]:
    """The newest row of each case (same values in ``case``): highest date, then the later row in the file."""
    best: dict[tuple, tuple] = {}
    for i, r in enumerate(rows):
        k = tuple(r.get(c, "") for c in case)
        rank = (r.get("date", ""), i)
        if k not in best or rank > best[k][0]:
            best[k] = (rank, r)
    return [r for _, r in sorted(best.values(), key=lambda t: t[0][1])]


def num(v, default: float = float("nan")) -> float:
    """A table cell as a float (NaN when empty)."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


# --------------------------------------------------------------------------------------------------
# The row key
# --------------------------------------------------------------------------------------------------
def git_commit() -> str:
    """Short hash of HEAD, ``+dirty`` when tracked files differ from it (results tables excepted), or
    ``BENCHMARKS_COMMIT`` where it is set: a copy of the tree on a device machine, whose git folder, if any, may
    be older than the tree."""
    if os.environ.get("BENCHMARKS_COMMIT"):
        return os.environ["BENCHMARKS_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 ":(exclude)benchmarks/results"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        return head + ("+dirty" if status else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("BENCHMARKS_COMMIT", "unknown")


def environment() -> dict[str, str]:
    """The key columns of every row this process writes."""
    import torch

    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "-"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": tv, "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def version_of(dist: str) -> str:
    """Installed version of a distribution, or '' when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


# --------------------------------------------------------------------------------------------------
# Running a suite
# --------------------------------------------------------------------------------------------------
def require_cuda(suite: str, smoke: bool = False) -> None:
    """Exit with one line and code 2 where a GPU suite cannot run (``--smoke`` runs on the CPU instead)."""
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return
    import torch

    if not torch.cuda.is_available():
        print(f"python -m benchmarks {suite}: needs a CUDA GPU and none is visible "
              f"(`python -m benchmarks plot` and `table` run anywhere)", file=sys.stderr)
        raise SystemExit(2)


def write_results(args, suite: str, rows: list[dict]) -> None:
    """Append the run's rows to ``--out`` (default: the suite's table) unless ``--dry-run``; say where."""
    if not rows:
        print(f"[{suite}] no rows measured")
        return
    if args.dry_run:
        print(f"[{suite}] {len(rows)} rows (dry run: not written)")
        return
    out = Path(args.out) if args.out else table_path(suite)
    append_rows(out, rows, suite)
    print(f"[{suite}] {len(rows)} rows appended to {out}")


def wait_for_fast_path() -> None:
    """Wait for the eager C++ fast path's background build (started by the first fused call) to finish, so
    that no timed call runs on the slower path the library uses meanwhile. Looks for the build's thread by
    name: no import of the library's internals."""
    for t in threading.enumerate():
        if t.name == "fused_layers-cpp-build":
            t.join()


def median_lo_hi(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


# --------------------------------------------------------------------------------------------------
# Timers
# --------------------------------------------------------------------------------------------------
def do_bench_ms(fn: Callable, grad_to_none=None, rep: int = 100) -> float:
    """Median ms of one eager call (``triton.testing.do_bench``: events around calls, L2 flushed between)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=rep, grad_to_none=grad_to_none, return_mode="median")


def graph_ms(fn: Callable, grad_to_none=None, rep_ms: float = 60.0, setup: Callable | None = None) -> float:
    """Median ms of one call replayed from a CUDA graph of many calls (no host in the timing).

    ``setup`` (optional) runs once on the capture stream and its result is passed to ``fn``: a backward is
    timed by making the forward's output there (autograd runs the backward on the forward's stream)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if setup is not None:
            state = setup()
            call = lambda: fn(state)  # noqa: E731
        else:
            call = fn

        def clear():
            for t in grad_to_none or ():
                t.grad = None

        for _ in range(3):  # warm-up: compiles, autotunes, fills the allocator
            clear()
            call()
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            clear()
            call()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(5):
            g.replay()
        end.record(stream)
        end.synchronize()
        est = max(start.elapsed_time(end) / 5, 1e-3)
        n = int(min(max(rep_ms / 10 / est, 1), 200))  # calls per graph: about rep_ms / 10 of work
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(n):
                clear()
                call()
        g.replay()
        times = []
        for _ in range(10):
            start.record(stream)
            g.replay()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) / n)
    torch.cuda.current_stream().wait_stream(stream)
    return statistics.median(times)


def copy_gbps(nbytes: int = 2**30) -> float:
    """GB/s of a device-to-device copy (read + write): the ceiling of a bandwidth-bound kernel."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def peak_extra_mib(fn: Callable) -> float:
    """MiB the allocator's peak rises above what is allocated before one call of ``fn``."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def union_ms(spans: Iterable[tuple[float, float]]) -> float:
    """Milliseconds covered by the union of ``(start_us, end_us)`` intervals (kernels that overlap count once)."""
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy / 1e3


def gpu_busy_ms(fn: Callable, calls: int = 2) -> float:
    """Milliseconds one call of ``fn`` keeps the GPU busy (its kernels' and copies' intervals, ``torch.profiler``,
    the mean of ``calls`` calls). Beside the call's step time, the difference is the GPU waiting for the host: a
    step that the host's launches bound. NaN without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return float("nan")
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return union_ms((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == cuda) / calls


def interleaved_rounds(steps: dict[str, Callable], rounds: int, per_round: int,
                       enter: dict[str, Callable] | None = None) -> dict[str, list[float]]:
    """ms per step of each arm, one value per round: ``rounds`` rounds, each running every arm's
    ``steps[arm]()`` ``per_round`` times, arms in an order that rotates by one every round. ``enter[arm]()``
    (optional) runs before an arm's steps, untimed (e.g. to set process-wide state an arm needs). One untimed
    step of every arm, in the same order, comes first: a compiled arm recompiles once after another arm
    changed what its guards read (seen on an H100: 500 ms in the first timed round). The objects that exist when
    timing starts (every arm's model and optimizer) are frozen out of Python's garbage collector (``gc.freeze``)
    while it runs: one process holds every arm's model where a training run holds one, and the collector's full
    passes over the others' objects would land in whichever arm's step they happen to fall. Without CUDA
    (``--smoke``) the wall clock times the steps: checks the code path, not the speed."""
    import gc

    gc.collect()
    gc.freeze()
    try:
        return _rounds(steps, rounds, per_round, enter)
    finally:
        gc.unfreeze()


def _rounds(steps: dict[str, Callable], rounds: int, per_round: int,
            enter: dict[str, Callable] | None) -> dict[str, list[float]]:
    import time

    import torch

    names = list(steps)
    out: dict[str, list[float]] = {n: [] for n in names}
    cuda = torch.cuda.is_available()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for n in names:  # the untimed round
        if enter and n in enter:
            enter[n]()
        steps[n]()
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            if enter and n in enter:
                enter[n]()
            if cuda:
                torch.cuda.synchronize()
                start.record()
                for _ in range(per_round):
                    steps[n]()
                end.record()
                end.synchronize()
                out[n].append(start.elapsed_time(end) / per_round)
            else:
                t0 = time.perf_counter()
                for _ in range(per_round):
                    steps[n]()
                out[n].append((time.perf_counter() - t0) * 1e3 / per_round)
    return out


def speedups(times: dict[str, list[float]], base: str) -> dict[str, tuple[float, float, float]]:
    """(median, min, max) over rounds of base's step / the arm's step in the same round."""
    out = {}
    for n, ts in times.items():
        ratios = [b / t for b, t in zip(times[base], ts)]
        out[n] = (statistics.median(times[base]) / statistics.median(ts), min(ratios), max(ratios))
    return out


# --------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------
TEXT_COLUMNS = set(KEY) | {"op", "pass", "dtype", "shape", "impl", "timer", "note", "transformers", "liger", "model",
                           "config", "batch", "mode", "arm", "swapped", "case", "kernel", "sha", "opcodes"}


def markdown(rows: Sequence[dict], cols: Sequence[str]) -> str:
    """A Markdown table of ``rows`` with the given columns (numbers to 4 significant digits)."""
    def fmt(col, v):
        f = num(v)
        if col in TEXT_COLUMNS or f != f:
            return "" if v is None or (isinstance(v, float) and v != v) else str(v)
        return f"{f:,.0f}" if abs(f) >= 1e5 else f"{f:.4g}"

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(c, r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Compile routes per arm (models and train suites: --compiled-routes)
# --------------------------------------------------------------------------------------------------
class RouteTables:
    """The compile routes (ops/compile_config.py) of each arm: ``--compiled-routes``' table for the arm named
    ``fused[<op>=<route>;...]``, the library's defaults for every other one, set by ``enter(arm)``.  Routes are read
    while Dynamo traces, and Dynamo guards on the table: each arm's compiled frames run with its own."""

    def __init__(self, routes: dict[str, str]):
        import dataclasses

        from fused_layers.ops import compile_config

        self.module = compile_config
        self.default = compile_config.COMPILED
        self.routed = dataclasses.replace(self.default, **routes) if routes else self.default
        self.name = "fused[" + ";".join(f"{k}={v}" for k, v in routes.items()) + "]"

    def enter(self, arm: str) -> None:
        self.module.COMPILED = self.routed if arm == self.name else self.default


def compiled_routes(spec: str) -> dict[str, str]:
    """``"op=route,..."`` -> {op: route}, checked by the library's ``check_routes`` (ValueError naming what is
    wrong)."""
    from fused_layers.ops.compile_config import check_routes

    out = {}
    for item in (x for x in spec.split(",") if x):
        op, _, route = item.partition("=")
        try:
            out.update(check_routes({op: route}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{item!r}: expected op=kernels|inductor ({e})") from None
    return out
