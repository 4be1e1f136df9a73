"""Timing shared by the memory-bound benchmarks.

Kernel time is measured with CUDA-graph replays (median over replays of a graph holding many calls): at
2^26 elements a bf16 forward moves 256 MB in about 60 us, which is about what one eager call costs on
the host (Python, autograd, the launcher), so event timing of single eager calls measures the host as
much as the kernel. Graph replay removes the host for every provider alike; the host cost of an eager
call is reported on its own (each benchmark's "dispatch" section). ``TIMING=eager`` in the environment
switches to ``triton.testing.do_bench`` (events around single calls, L2 flushed in between).

``setup`` (optional) runs first on the capture stream and its result is passed to ``fn``: a backward is
timed by making the forward output in ``setup`` (autograd runs backward ops on the forward's stream, so
both must be on the capture stream).
"""

from __future__ import annotations

import os
import statistics

import torch

MODE = os.environ.get("TIMING", "graph")


def _clear(grad_to_none):
    for t in grad_to_none or ():
        t.grad = None


def _graph_ms(fn, grad_to_none, rep_ms: float, stream=None) -> float:
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: compiles, autotunes, fills the allocator
            _clear(grad_to_none)
            fn()
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            _clear(grad_to_none)
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(5):
            g.replay()
        end.record(stream)
        end.synchronize()
        est = max(start.elapsed_time(end) / 5, 1e-3)
        n = int(min(max(rep_ms / 10 / est, 1), 200))  # calls per graph: ~rep/10 ms of work
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(n):
                _clear(grad_to_none)
                fn()
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


def bench(fn, grad_to_none=None, rep: int = 60, setup=None) -> float:
    """Median milliseconds of one call of ``fn`` (or ``fn(setup())`` when ``setup`` is given)."""
    from triton.testing import do_bench

    if MODE == "graph":
        try:
            if setup is not None:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    state = setup()
                stream.synchronize()
                return _graph_ms(lambda: fn(state), grad_to_none, rep, stream=stream)
            return _graph_ms(fn, grad_to_none, rep)
        except Exception as e:  # noqa: BLE001 - a provider that cannot be captured is timed eagerly
            print(f"[graph capture failed ({type(e).__name__}: {str(e)[:100]}); timing eagerly]")
            torch.cuda.synchronize()
    call = (lambda s=setup(): lambda: fn(s))() if setup is not None else fn
    return do_bench(call, warmup=25, rep=rep, grad_to_none=grad_to_none, return_mode="median")



def fractions_of_copy(fn, nbytes: int, copy_gbs: float = 4220.0) -> tuple[float, float]:
    """(do_bench, CUDA-graph replay) fractions of the copy ceiling of ``fn`` moving ``nbytes``: do_bench with its
    L2 flush between calls (the host included), and graph replay (the kernels alone), medians."""
    from triton.testing import do_bench

    d = do_bench(fn, warmup=25, rep=100, return_mode="median")
    g = _graph_ms(fn, None, 60)
    return nbytes / (d * 1e-3) / (copy_gbs * 1e9), nbytes / (g * 1e-3) / (copy_gbs * 1e9)


def gpu_tag() -> str:
    """Short name of the GPU for result file names ("h200", ...; "cpu" without CUDA)."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    for tag in ("h200", "h100", "a100", "l40s", "l4"):
        if tag in name.lower():
            return tag
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def interleaved_step_ms(steps: dict, rounds: int, per_round: int, wall_clock: bool = False) -> dict[str, list[float]]:
    """Training-step A/B: ``rounds`` rounds, each running every variant's ``steps[name]()`` ``per_round``
    times back to back, variants in turn (interleaved, so clock and thermal drift hit them alike).  Returns
    ms per step, one value per round and variant.  CUDA events around each variant's steps (a sync before
    each); ``wall_clock=True`` (CPU checks of a script) times with perf_counter instead."""
    import time

    out: dict[str, list[float]] = {n: [] for n in steps}
    if wall_clock:
        for _ in range(rounds):
            for n, step in steps.items():
                t0 = time.perf_counter()
                for _ in range(per_round):
                    step()
                out[n].append((time.perf_counter() - t0) * 1e3 / per_round)
        return out
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for n, step in steps.items():
            torch.cuda.synchronize()
            start.record()
            for _ in range(per_round):
                step()
            end.record()
            end.synchronize()
            out[n].append(start.elapsed_time(end) / per_round)
    return out
