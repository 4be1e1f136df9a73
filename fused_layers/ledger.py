"""The speedup ledger: time each swapped module against its reference on the run's own input shapes.

Usable without Lightning::

    report = swap_modules(model)
    ledger = Ledger(model)
    ledger.start_recording()          # forward pre-hooks note (kind, shapes, dtype, autocast) per module
    train_step(); train_step()
    ledger.stop_recording()
    rows = ledger.measure(max_seconds=2.0)   # once per distinct (kind, shape, dtype)
    print(ledger.format(rows)); scalars = ledger.summary(rows)

What is measured, per distinct (kind, input shapes, dtype):

* forward and forward+backward time of the reference (the fused module's own source class ``forward``
  called on the *same* module object -- same parameters, no copies) and of the fused module, on fresh
  random inputs of the recorded shapes/strides/dtypes, under the recorded autocast state;  backward uses
  ``torch.autograd.grad`` so no ``.grad`` of the model is touched; module hooks are not run;
* on CUDA: CUDA events, warm-up first, the median of repeated calls; elsewhere (the Triton interpreter on
  a CPU) ``time.perf_counter`` and the numbers are marked ``meaningful=False``;
* the fused output's max abs error against the reference (first output tensor, same dtype);
* achieved throughput of the fused forward: GB/s (bytes of the input + output tensors) for norms and
  softmax, TFLOP/s for attention kinds (FLOPs of the reference forward counted with
  ``torch.utils.flop_counter.FlopCounterMode``: a causal mask is counted dense, GQA's K/V heads as the query's,
  ``gqa_flop_formulas``).

The whole measurement is bounded by ``max_seconds`` (split evenly over the keys, fewer repetitions when
a call is slow; keys left when the budget is spent are reported as not measured).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from .swap import KINDS, fused_kind, fused_source

__all__ = ["Ledger", "Measurement", "TensorSpec", "measure_pair", "TABLE_COLUMNS", "StepAB", "StepTimer", "ArmResult",
           "KeptSteps", "gqa_flop_formulas"]

TABLE_COLUMNS = ["kind", "modules", "shape", "dtype", "reference", "ref_ms", "fused_ms", "speedup", "gbps_or_tflops",
                 "max_err"]


# --------------------------------------------------------------------------------------------------
# Recording: what a module was called with, without keeping the activations alive
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str
    requires_grad: bool

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSpec":
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device), t.requires_grad)

    def make(self) -> torch.Tensor:
        """A fresh random tensor with this shape/stride/dtype (contiguous when the strides overlap)."""
        base = torch.randn(self.shape, dtype=self.dtype, device=self.device)
        try:
            if self.stride != base.stride() and 0 not in self.stride:
                out = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
                out.copy_(base)
                base = out
        except RuntimeError:
            pass
        return base.requires_grad_(self.requires_grad and self.dtype.is_floating_point)


def _spec(x: Any) -> Any:
    """Float tensors become ``TensorSpec`` (re-made random at measure time); other tensors (masks,
    indices) are kept as they are, detached; everything else as is."""
    if isinstance(x, torch.Tensor):
        return TensorSpec.of(x) if x.dtype.is_floating_point and x.dim() > 0 else x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_spec(v) for v in x)
    return x


def _make(x: Any) -> Any:
    if isinstance(x, TensorSpec):
        return x.make()
    if isinstance(x, (list, tuple)):
        return type(x)(_make(v) for v in x)
    return x


def _key_part(x: Any) -> Any:
    if isinstance(x, TensorSpec):
        return ("T", x.shape, x.stride, str(x.dtype))
    if isinstance(x, torch.Tensor):
        return ("t", tuple(x.shape), str(x.dtype))
    if isinstance(x, (list, tuple)):
        return tuple(_key_part(v) for v in x)
    if isinstance(x, (int, float, bool, str, type(None))):
        return x
    return repr(type(x))


@dataclass
class Call:
    """One distinct way a kind of module was called (the ledger's unit of measurement)."""

    kind: str
    args: tuple
    kwargs: dict
    autocast: tuple[str, torch.dtype] | None
    modules: list[str] = field(default_factory=list)

    @property
    def shape(self) -> str:
        shapes = [list(a.shape) for a in self.args if isinstance(a, TensorSpec)]
        return ", ".join(str(s).replace(" ", "") for s in shapes)

    @property
    def dtype(self) -> str:
        if self.autocast is not None:
            return f"autocast({str(self.autocast[1]).replace('torch.', '')})"
        d = next((a.dtype for a in self.args if isinstance(a, TensorSpec)), None)
        return str(d).replace("torch.", "") if d is not None else "?"


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------
def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (list, tuple)):
        for o in out:
            if isinstance(o, torch.Tensor):
                return o
    raise TypeError(f"ledger: module output has no tensor ({type(out).__name__})")


def _time_ms(fn: Callable[[], Any], cuda: bool, budget_s: float, min_reps: int = 3, max_reps: int = 50) -> float:
    """Median milliseconds of ``fn()`` after warm-up, spending about ``budget_s``."""
    fn()  # warm-up (compiles / autotunes on the first call)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(max_reps, max(min_reps, budget_s / one)))
    times: list[float] = []
    if cuda:
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@dataclass
class Measurement:
    kind: str
    modules: list[str]
    shape: str
    dtype: str
    ref_fwd_ms: float
    fused_fwd_ms: float
    ref_ms: float  #: forward + backward
    fused_ms: float  #: forward + backward
    speedup_fwd: float
    speedup: float  #: forward + backward, reference time / fused time
    metric: str  #: "GB/s" or "TFLOP/s"
    achieved: float  #: of the fused forward, in ``metric`` units
    max_err: float
    meaningful: bool  #: False when timed on the CPU (Triton interpreter): only the keys are meaningful
    reference: str = ""  #: what ``ref_ms`` timed: the module's reference class (e.g. the explicit-softmax Attention)

    def row(self) -> list[Any]:
        return [self.kind, ",".join(self.modules), self.shape, self.dtype, self.reference, round(self.ref_ms, 4),
                round(self.fused_ms, 4), round(self.speedup, 4), f"{self.achieved:.4g} {self.metric}",
                float(self.max_err)]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _autocast_ctx(autocast: tuple[str, torch.dtype] | None):
    """Replay the autocast state the module was called under (none: leave autocast as it is)."""
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(autocast[0], dtype=autocast[1])


def _kv_heads_as_query(q: Any, *kv: Any) -> list[tuple[int, ...]]:
    """Key / value shapes (B, H, S, D) with the query's head count where theirs divides it (GQA / MQA)."""
    q, out = tuple(q), []
    for s in kv:
        s = tuple(s)
        if len(q) == len(s) == 4 and 0 < s[1] != q[1] and q[1] % s[1] == 0:
            s = (s[0], q[1], *s[2:])
        out.append(s)
    return out


def gqa_flop_formulas() -> bool:
    """Make ``torch.utils.flop_counter`` count SDPA calls whose key / value have fewer heads than the query (GQA,
    SDPA's ``enable_gqa``, as transformers' Llama calls it) where this torch's formulas reject them.

    torch 2.11's ``sdpa_flop_count`` raises ``AssertionError: sdpa_flop_count: query/key/value shapes are
    incompatible`` on them, inside any ``FlopCounterMode``: Lightning's model summary, which counts the FLOPs of
    ``example_input_array``, crashed a GQA Llama's ``fit`` with it on an H100.  The wrapped formulas count the K/V
    heads broadcast to the query's, what the kernels compute and what later torch releases count; every other shape
    goes to torch's own formula unchanged.  Process-wide and idempotent; a no-op where torch counts GQA already
    (torch 2.13).  Returns True when torch's formulas are wrapped.
    """
    from torch.utils import flop_counter

    # (formula, where the query's shape is in its arguments, a GQA probe); torch's formulas look both up by name
    formulas = (("sdpa_flop_count", 0, ((1, 2, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1))),
                ("sdpa_backward_flop_count", 1, ((1, 2, 1, 1), (1, 2, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1))))
    wrapped = False
    for name, q_at, probe in formulas:
        fn = getattr(flop_counter, name, None)
        if fn is None:
            continue
        if getattr(fn, "_fused_layers_gqa", False):
            wrapped = True
            continue
        try:
            fn(*probe)
            continue  # counts GQA already
        except AssertionError:
            pass
        except Exception:  # a formula of another signature: not the one this wraps
            continue

        @functools.wraps(fn)
        def counted(*shapes: Any, _fn: Callable[..., int] = fn, _q: int = q_at, **kwargs: Any) -> int:
            return _fn(*shapes[:_q + 1], *_kv_heads_as_query(shapes[_q], *shapes[_q + 1:]), **kwargs)

        counted._fused_layers_gqa = True  # type: ignore[attr-defined]
        setattr(flop_counter, name, counted)
        wrapped = True
    return wrapped


def measure_pair(
    ref: Callable[..., Any],
    fused: Callable[..., Any],
    args: tuple,
    kwargs: dict | None = None,
    params: tuple[torch.Tensor, ...] = (),
    kind: str = "softmax",
    autocast: tuple[str, torch.dtype] | None = None,
    budget_s: float = 0.5,
    modules: list[str] | None = None,
    shape: str = "",
    dtype: str = "",
) -> Measurement:
    """Time ``ref`` against ``fused`` (forward, forward+backward) on ``args`` and measure the error.

    ``args``/``kwargs`` may hold real tensors or ``TensorSpec`` (re-made random).  ``params`` are the
    parameters to differentiate besides the float inputs that require grad.  ``kind`` picks the metric.
    """
    kwargs = dict(kwargs or {})
    args = _make(tuple(args))
    kwargs = {k: _make(v) for k, v in kwargs.items()}
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    leaves += [p for p in params if p.requires_grad]
    dev = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    cuda = dev.type == "cuda"
    ctx = functools.partial(_autocast_ctx, autocast)

    with torch.enable_grad(), ctx():
        ref_out = _first_tensor(ref(*args, **kwargs))
        fused_out = _first_tensor(fused(*args, **kwargs))
    max_err = (fused_out.detach().float() - ref_out.detach().float()).abs().max().item() if ref_out.numel() else 0.0
    grad_out = torch.randn_like(ref_out)
    do_bwd = bool(leaves) and ref_out.requires_grad and fused_out.requires_grad

    def fwd(fn):
        def run():
            with torch.no_grad(), ctx():
                return fn(*args, **kwargs)
        return run

    def fwd_bwd(fn):
        def run():
            with torch.enable_grad(), ctx():
                out = _first_tensor(fn(*args, **kwargs))
            return torch.autograd.grad(out, leaves, grad_out, allow_unused=True)
        return run if do_bwd else fwd(fn)

    per = budget_s / 4
    ref_fwd = _time_ms(fwd(ref), cuda, per)
    fused_fwd = _time_ms(fwd(fused), cuda, per)
    ref_fb = _time_ms(fwd_bwd(ref), cuda, per)
    fused_fb = _time_ms(fwd_bwd(fused), cuda, per)

    metric = KINDS[kind].metric if kind in KINDS else "GB/s"
    if metric == "TFLOP/s":
        from torch.utils.flop_counter import FlopCounterMode

        gqa_flop_formulas()  # a GQA reference (SDPA with enable_gqa) is counted, not rejected, on torch 2.11
        counter = FlopCounterMode(display=False)
        try:
            with torch.no_grad(), ctx(), counter:
                ref(*args, **kwargs)
            achieved = counter.get_total_flops() / (fused_fwd * 1e-3) / 1e12
        except Exception:  # a FLOP formula that rejects the call's shapes
            achieved = float("nan")  # the rate is detail; the timings above stand
    else:
        nbytes = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        nbytes += fused_out.numel() * fused_out.element_size()
        achieved = nbytes / (fused_fwd * 1e-3) / 1e9
    return Measurement(
        kind=kind, modules=list(modules or []), shape=shape, dtype=dtype,
        ref_fwd_ms=ref_fwd, fused_fwd_ms=fused_fwd, ref_ms=ref_fb, fused_ms=fused_fb,
        speedup_fwd=ref_fwd / fused_fwd, speedup=ref_fb / fused_fb,
        metric=metric, achieved=achieved, max_err=max_err, meaningful=cuda,
    )


def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process (grows when a model runs under torch.compile)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # pragma: no cover
        return 0


# --------------------------------------------------------------------------------------------------
# The ledger
# --------------------------------------------------------------------------------------------------
class Ledger:
    """Records how the fused modules of ``model`` are called, then measures each distinct call once."""

    def __init__(self, model: nn.Module, names: list[str] | None = None) -> None:
        self.model = model
        self.names = names
        self.calls: dict[tuple, Call] = {}
        self._handles: list[Any] = []
        self.measurements: list[Measurement] = []
        self.not_measured: list[Call] = []
        self._graphs_at_start = 0
        self.recompiled = False  # stop_recording dropped Dynamo's code caches (see there)

    # recording ------------------------------------------------------------------------------------
    def fused_modules(self) -> dict[str, tuple[nn.Module, str]]:
        out = {}
        for name, m in self.model.named_modules():
            kind = fused_kind(m)
            if getattr(type(m), "_fused_ledger_skip", False):  # e.g. a whole HF model (its loss swapped)
                continue
            if kind is not None and (self.names is None or name in self.names):
                out[name] = (m, kind)
        return out

    def start_recording(self) -> None:
        self.stop_recording()
        self._graphs_at_start = compiled_graphs()
        for name, (m, kind) in self.fused_modules().items():
            # Under torch.compile the hook runs eagerly (a graph break during the recording steps only).
            hook = torch.compiler.disable(functools.partial(self._hook, name, kind))
            self._handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))

    def stop_recording(self) -> None:
        """Remove the hooks.  If Dynamo compiled graphs while they were attached, its cached code still
        breaks the graph at every hooked module after they are gone: Dynamo does not recompile when a hook
        is removed (measured: a 3-module model kept running 3 graphs per call; on the H200, a compiled
        GPT-2 step that kept these breaks ran 0.875x as fast as its twin).  So the code caches are dropped
        once (``torch._dynamo.reset_code_caches``): the next call compiles the hook-free graph, which the
        step-time A/B compiles per arm anyway."""
        had = bool(self._handles)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if had and compiled_graphs() > self._graphs_at_start:
            import torch._dynamo as dynamo

            (getattr(dynamo, "reset_code_caches", None) or dynamo.reset)()
            self.recompiled = True
            self._graphs_at_start = compiled_graphs()

    @property
    def recording(self) -> bool:
        return bool(self._handles)

    def _hook(self, name: str, kind: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        dev = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        if dev == "meta":  # shape propagation or FLOP counting (ThroughputCallback), not a training call
            return
        prep = getattr(module, "_fused_ledger_inputs", None)  # a fused class may drop stateful inputs (caches)
        if prep is not None:
            args, kwargs = prep(tuple(args), dict(kwargs))
        sargs = _spec(tuple(args))
        skw = {k: _spec(v) for k, v in kwargs.items()}
        autocast = None
        try:
            if torch.is_autocast_enabled(dev):
                autocast = (dev, torch.get_autocast_dtype(dev))
        except (TypeError, RuntimeError):  # torch < 2.4, or a device type without autocast
            pass
        key = (kind, _key_part(sargs), tuple(sorted((k, _key_part(v)) for k, v in skw.items())), autocast)
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = Call(kind, sargs, skw, autocast)
        if name not in call.modules:
            call.modules.append(name)

    # measuring ------------------------------------------------------------------------------------
    def measure(self, max_seconds: float = 2.0, timer: Callable[..., Measurement] | None = None) -> list[Measurement]:
        """Measure every recorded call once, within about ``max_seconds``; returns (and keeps) the rows."""
        timer = timer or measure_pair
        modules = self.fused_modules()
        calls = list(self.calls.values())
        self.measurements, self.not_measured = [], []
        t_end = time.perf_counter() + max_seconds
        for i, call in enumerate(calls):
            left = t_end - time.perf_counter()
            if left <= 0:
                self.not_measured.extend(calls[i:])
                break
            name = next((n for n in call.modules if n in modules), None)
            if name is None:
                continue
            m, _ = modules[name]
            src = fused_source(m)
            ref = functools.partial(src.forward, m)
            fused = functools.partial(type(m).forward, m)
            row = timer(ref, fused, call.args, call.kwargs, params=tuple(m.parameters()), kind=call.kind,
                        autocast=call.autocast, budget_s=left / (len(calls) - i), modules=list(call.modules),
                        shape=call.shape, dtype=call.dtype)
            row.reference = reference_name(src)
            self.measurements.append(row)
        return self.measurements

    # summaries ------------------------------------------------------------------------------------
    @staticmethod
    def summary(rows: list[Measurement], prefix: str = "fused") -> dict[str, float]:
        """Per-kind scalars: geometric means over that kind's shapes of the fwd+bwd and fwd speedups."""
        out: dict[str, float] = {}
        by_kind: dict[str, list[Measurement]] = {}
        for r in rows:
            by_kind.setdefault(r.kind, []).append(r)
        for kind, rs in by_kind.items():
            out[f"{prefix}/speedup/{kind}"] = _gmean([r.speedup for r in rs])
            out[f"{prefix}/speedup_fwd/{kind}"] = _gmean([r.speedup_fwd for r in rs])
            out[f"{prefix}/max_err/{kind}"] = max(r.max_err for r in rs)
            out[f"{prefix}/ref_ms/{kind}"] = sum(r.ref_ms for r in rs)
            out[f"{prefix}/fused_ms/{kind}"] = sum(r.fused_ms for r in rs)
        return out

    def module_speedups(self, rows: list[Measurement] | None = None) -> dict[str, float]:
        """Per module name: geometric mean fwd+bwd speedup over the calls it took part in."""
        acc: dict[str, list[float]] = {}
        for r in self.measurements if rows is None else rows:
            for n in r.modules:
                acc.setdefault(n, []).append(r.speedup)
        return {n: _gmean(v) for n, v in acc.items()}

    @staticmethod
    def format(rows: list[Measurement]) -> str:
        """The rows as a text table (``TABLE_COLUMNS``; floats to 4 significant digits, cells cut at 40 characters)."""

        def cell(v: Any) -> str:
            v = f"{v:.4g}" if isinstance(v, float) else str(v)
            return v if len(v) <= 40 else v[:37] + "..."

        cells = [list(TABLE_COLUMNS)] + [[cell(v) for v in r.row()] for r in rows]
        w = [max(len(c[i]) for c in cells) for i in range(len(TABLE_COLUMNS))]
        lines = ["  ".join(f"{v:>{w[i]}}" for i, v in enumerate(c)) for c in cells]
        if rows and not rows[0].meaningful:
            lines.append("(timed in the Triton interpreter on the CPU: these times say nothing about GPU speed)")
        return "\n".join(lines)


def reference_name(cls: type) -> str:
    """A short name for what a fused module was timed against (``nn.LayerNorm``; the reference
    ``Attention`` computes an explicit softmax, which is not what SDPA users run)."""
    name = cls.__qualname__
    if cls.__module__.startswith("torch.nn"):
        return f"nn.{name}"
    if name == "Attention" and cls.__module__ == "fused_layers.modules.attention":
        return "Attention (explicit softmax, not SDPA)"
    return f"{cls.__module__}.{name}"


def _gmean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


# --------------------------------------------------------------------------------------------------
# Step-time A/B: what swapping does to the run's own training step
# --------------------------------------------------------------------------------------------------
class StepTimer:
    """Times training steps: CUDA events on a CUDA device (read once, after the last step, so that no
    step waits on the host), ``time.perf_counter`` elsewhere (then ``meaningful`` is False: the Triton
    interpreter says nothing about GPU speed).  Tests pass their own timer with the same three methods."""

    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.meaningful = self.cuda

    def start(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, token: Any) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return (token, ev)
        return (time.perf_counter() - token) * 1e3

    def elapsed_ms(self, stopped: Any) -> float:
        if self.cuda:
            start, end = stopped
            end.synchronize()
            return float(start.elapsed_time(end))
        return float(stopped)


@dataclass
class ArmResult:
    """One arm of the A/B: which kinds were fused during its steps, and what they cost."""

    arm: str  #: "unfused", "all", or a kind name (only that kind fused)
    kinds: list[str]
    step_ms: list[float]  #: one per measured round
    median_ms: float = float("nan")
    speedup: float = float("nan")  #: median over rounds of (unfused step / this arm's step), paired per round
    speedup_lo: float = float("nan")  #: min over rounds
    speedup_hi: float = float("nan")  #: max over rounds

    @property
    def within_noise(self) -> bool:
        return self.speedup_lo <= 1.0 <= self.speedup_hi


def faster_arm(results: dict[str, ArmResult]) -> str:
    """The arm ``policy=faster`` keeps: the fastest arm that beat unfused in every measured round (its
    min-max range of paired speedups lies above 1); "unfused" when none did, so a kept swap is never one
    whose gain was within the noise of the A/B."""
    scores = {arm: r.speedup for arm, r in results.items()
              if arm != "unfused" and r.step_ms and not r.within_noise and r.speedup > 1.0}
    return max(scores, key=scores.get) if scores else "unfused"


def fit_ab(swapped: dict[str, str], rounds: int, warmup_rounds: int, max_steps: int) -> tuple[int, int | None, str]:
    """(arms, measured rounds, why not) of a ``StepAB`` over the ``swapped`` modules' kinds within ``max_steps``
    steps: the rounds are reduced until ``(rounds + warmup_rounds) * arms`` fits; ``None`` (and why) when not even
    one round does."""
    n_kinds = len(set(swapped.values()))
    n_arms = 2 + (n_kinds if n_kinds > 1 else 0)
    while rounds > 1 and (rounds + warmup_rounds) * n_arms > max_steps:
        rounds -= 1
    if (rounds + warmup_rounds) * n_arms > max_steps:
        return n_arms, None, (f"not run: one round of {n_arms} arms plus warm-up needs "
                              f"{(1 + warmup_rounds) * n_arms} steps > ab_max_steps={max_steps}")
    return n_arms, rounds, ""


class StepAB:
    """Interleaved step-time A/B of the swaps of ``model`` (usable without Lightning).

    Arms: ``unfused`` (every swapped module given back its reference class), ``all`` (every swap in
    place) and, when more than one kind is swapped, one arm per kind (only that kind fused).  Swapping and
    restoring are class changes (same parameters, same optimizer state), so the arms are real training
    steps of the same run.  The schedule is ``warmup_rounds`` uncounted rounds (first use of each arm:
    autotuning, allocator, a compiled graph per arm), then ``rounds`` measured rounds; each round runs every
    arm once, in an order rotated from round to round, so that drift hits every arm alike.  Each kind's
    speedup is the median over rounds of ``t(unfused) / t(kind)`` taken within the same round, with the
    min and max over rounds as its spread.  Total cost: ``(warmup_rounds + rounds) * len(arms)`` steps.

    Use: ``ab.begin_step()`` before a step (sets the arm's classes, starts the timer; False once done),
    ``ab.end_step()`` after it, ``ab.finish()`` when done (restores every swap, returns the results).

    Under ``torch.compile`` each arm's first step compiles its graph (a class change is a guard failure).
    ``graphs`` (default: Dynamo's count of compiled graphs) is read around every step: a step during which a
    graph was compiled is that arm's compile, whose wall time goes to ``compile_seconds[arm]``, and a
    measured round holding one is left out of the results (``compile_rounds``), so the rounds compare the
    compiled programs themselves, never their compilation.  An arm whose graph the run compiled before the
    A/B (``all``: the configuration the run starts with, whose cached graph its A/B steps reuse) compiles
    nothing in the A/B: ``compiled_before`` gives its compile time from those earlier steps, which starts its
    ``compile_seconds`` (the arm is listed in ``compiled_before_ab``).
    """

    def __init__(self, model: nn.Module, swapped: dict[str, str], rounds: int = 5, warmup_rounds: int = 1,
                 timer: Any = None, device: torch.device | str = "cpu", mapping: dict | None = None,
                 graphs: Callable[[], int] | None = None, clock: Callable[[], float] = time.perf_counter,
                 compiled_before: dict[str, float] | None = None) -> None:
        self.model = model
        self.swapped = dict(swapped)  #: module name -> kind, as swapped before the A/B
        self.mapping = dict(mapping or {})  #: swap_modules' mapping (a model's own classes), to swap them back in
        order = list(KINDS)
        self.kinds = sorted(set(self.swapped.values()), key=lambda k: (order.index(k) if k in order else len(order), k))
        self.arms: dict[str, list[str]] = {"unfused": [], "all": list(self.kinds)}
        if len(self.kinds) > 1:
            self.arms.update({k: [k] for k in self.kinds})
        self.rounds, self.warmup_rounds = int(rounds), int(warmup_rounds)
        names = list(self.arms)
        self.schedule: list[tuple[int, str]] = []  # (round, arm); round < 0: warm-up
        for r in range(-self.warmup_rounds, self.rounds):
            shift = r % len(names)
            self.schedule += [(r, a) for a in names[shift:] + names[:shift]]
        self.timer = timer if timer is not None else StepTimer(device)
        self._i = 0
        self._token: Any = None
        self._stopped: list[tuple[int, str, Any]] = []
        self._fused_now = set(self.kinds)
        self.results: dict[str, ArmResult] = {}
        self.graphs = graphs if graphs is not None else compiled_graphs
        self.clock = clock
        self._at: tuple[int, float] = (0, 0.0)  # (graphs, clock) at the running step's start
        unknown = set(compiled_before or {}) - set(self.arms)
        if unknown:
            raise ValueError(f"StepAB: compiled_before names arms {sorted(unknown)} that this A/B does not have "
                             f"(arms: {list(self.arms)})")
        #: per arm: wall time of its steps that compiled a graph (before the A/B too, see ``compiled_before_ab``)
        self.compile_seconds: dict[str, float] = {a: float(t) for a, t in (compiled_before or {}).items()}
        self.compiled_before_ab: list[str] = list(self.compile_seconds)  #: arms whose graph was compiled before
        self.compile_rounds: list[int] = []  #: measured rounds left out because a step in them compiled

    @property
    def steps(self) -> int:
        return len(self.schedule)

    @property
    def done(self) -> bool:
        return self._i >= len(self.schedule)

    @property
    def meaningful(self) -> bool:
        return bool(getattr(self.timer, "meaningful", False))

    def set_fused(self, kinds: list[str]) -> None:
        """Make exactly ``kinds`` (of the swapped modules) fused; the rest get their reference class."""
        from .swap import restore_modules, swap_modules

        want = set(kinds)
        off = [n for n, k in self.swapped.items() if k in self._fused_now - want]
        if off:
            restore_modules(self.model, off)
        for kind in want - self._fused_now:
            names = [n for n, k in self.swapped.items() if k == kind]
            swap_modules(self.model, kinds=[kind], include=[re.escape(n) for n in names], mapping=self.mapping)
        self._fused_now = want

    def begin_step(self) -> bool:
        if self.done:
            return False
        _, arm = self.schedule[self._i]
        self.set_fused(self.arms[arm])
        self._at = (self.graphs(), self.clock())
        self._token = self.timer.start()
        return True

    def end_step(self) -> None:
        if self._token is None:
            return
        r, arm = self.schedule[self._i]
        stopped = self.timer.stop(self._token)
        compiled = self.graphs() > self._at[0]
        if compiled:
            self.compile_seconds[arm] = self.compile_seconds.get(arm, 0.0) + self.clock() - self._at[1]
        self._stopped.append((r, arm, stopped, compiled))
        self._token = None
        self._i += 1

    @property
    def steps_run(self) -> int:
        """Training steps the A/B has taken so far (its cost)."""
        return len(self._stopped)

    def finish(self, keep: list[str] | None = None) -> dict[str, ArmResult]:
        """Stop: set ``keep`` kinds fused (default: all swapped kinds), compute the results."""
        self.set_fused(self.kinds if keep is None else keep)
        self._schedule_left = self.schedule[self._i:]
        self._i = len(self.schedule)
        per_round: dict[int, dict[str, float]] = {}
        compiling = set()
        for r, arm, stopped, compiled in self._stopped:
            ms = self.timer.elapsed_ms(stopped)
            if r >= 0:
                per_round.setdefault(r, {})[arm] = ms
                if compiled:
                    compiling.add(r)
        self.compile_rounds = sorted(compiling)
        full = [d for r, d in per_round.items() if len(d) == len(self.arms) and r not in compiling]
        self.results = {}
        for arm, kinds in self.arms.items():
            ms = [d[arm] for d in full]
            res = ArmResult(arm, list(kinds), ms)
            if ms:
                res.median_ms = statistics.median(ms)
                ratios = [d["unfused"] / d[arm] for d in full if d[arm] > 0]
                if ratios:
                    res.speedup, res.speedup_lo, res.speedup_hi = statistics.median(ratios), min(ratios), max(ratios)
            self.results[arm] = res
        return self.results

    def kind_speedups(self) -> dict[str, ArmResult]:
        """Per swapped kind: the arm that fused only that kind (``all`` when a single kind is swapped)."""
        if len(self.kinds) == 1:
            return {self.kinds[0]: self.results["all"]} if "all" in self.results else {}
        return {k: self.results[k] for k in self.kinds if k in self.results}

    def metrics(self, prefix: str = "fused") -> dict[str, float]:
        """``<prefix>/step_speedup/<kind>`` and ``/all`` (median), with ``_lo``/``_hi`` and step medians."""
        out: dict[str, float] = {}
        items = {**self.kind_speedups(), "all": self.results.get("all")}
        for name, res in items.items():
            if res is None or not res.step_ms:
                continue
            out[f"{prefix}/step_speedup/{name}"] = res.speedup
            out[f"{prefix}/step_speedup_lo/{name}"] = res.speedup_lo
            out[f"{prefix}/step_speedup_hi/{name}"] = res.speedup_hi
        if self.results.get("unfused") is not None and self.results["unfused"].step_ms:
            out[f"{prefix}/step_ms/unfused"] = self.results["unfused"].median_ms
            out[f"{prefix}/step_ms/all"] = self.results["all"].median_ms
        out[f"{prefix}/ab_rounds"] = float(len(self.results.get("unfused", ArmResult("", [], [])).step_ms))
        return out

    def format(self) -> str:
        """The results as a text table: one row per arm with its fused kinds, median step ms and speedup."""
        rows = [("arm", "fused kinds", "step ms", "speedup (min-max)")]
        for arm, res in self.results.items():
            sp = "-" if arm == "unfused" else f"{res.speedup:.3f}x ({res.speedup_lo:.3f}-{res.speedup_hi:.3f})"
            if arm != "unfused" and res.step_ms and res.within_noise:
                sp += " within noise"
            rows.append((arm, ", ".join(res.kinds) or "none", f"{res.median_ms:.3f}", sp))
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"  {a:<{w[0]}}  {k:<{w[1]}}  {ms:>{w[2]}}  {sp}" for a, k, ms, sp in rows]
        if not self.meaningful:
            lines.append("  (timed in the Triton interpreter on the CPU: these times say nothing about GPU speed)")
        return "\n".join(lines)


class KeptSteps:
    """The run's own steps after an A/B, timed as the A/B timed its arms: does the verdict hold?

    The A/B compares arms over a few interleaved rounds; what the run keeps afterwards runs one of those
    arms for the rest of training.  Under ``torch.compile`` the kept steps run the graph the arm compiled,
    but a verdict can still be wrong for the run (another graph taken after the A/B, a recompile, drift):
    ``steps`` steps of the kept configuration are timed with the A/B's timer (steps that compiled a graph
    left out) and set against the kept arm's A/B step times.  ``agrees``: their median lies within the
    kept arm's min-max over the A/B's rounds.  ``loses``: it is slower than every unfused step of the A/B,
    the run's own evidence against a fused arm (what ``policy=faster`` undoes it for).

    Use like :class:`StepAB`: ``begin_step()`` / ``end_step()`` around each step, ``finish()`` once ``done``.
    """

    def __init__(self, ab: StepAB, arm: str, steps: int = 5) -> None:
        self.ab, self.arm, self.steps = ab, arm, int(steps)
        self._token: Any = None
        self._at = 0
        self._stopped: list[tuple[Any, bool]] = []
        self.step_ms: list[float] = []
        self.median_ms = float("nan")
        self.agrees: bool | None = None  #: None: nothing to compare (no A/B result, no timed step)
        self.loses = False

    @property
    def done(self) -> bool:
        return len(self._stopped) >= self.steps

    def begin_step(self) -> None:
        if not self.done:
            self._at = self.ab.graphs()
            self._token = self.ab.timer.start()

    def end_step(self) -> None:
        if self._token is None:
            return
        self._stopped.append((self.ab.timer.stop(self._token), self.ab.graphs() > self._at))
        self._token = None

    def finish(self) -> "KeptSteps":
        self._token = None
        self.step_ms = [self.ab.timer.elapsed_ms(s) for s, compiled in self._stopped if not compiled]
        arm, unfused = self.ab.results.get(self.arm), self.ab.results.get("unfused")
        if self.step_ms and arm is not None and arm.step_ms:
            self.median_ms = statistics.median(self.step_ms)
            self.agrees = min(arm.step_ms) <= self.median_ms <= max(arm.step_ms)
            self.loses = bool(self.arm != "unfused" and unfused is not None and unfused.step_ms
                              and self.median_ms > max(unfused.step_ms))
        return self

    @property
    def speedup(self) -> float:
        """The A/B's unfused median step over the kept steps' median (what the run gained, by its own steps)."""
        unfused = self.ab.results.get("unfused")
        if unfused is None or not unfused.step_ms or not self.median_ms > 0:
            return float("nan")
        return unfused.median_ms / self.median_ms

    def summary(self) -> dict[str, Any]:
        arm = self.ab.results.get(self.arm)
        return {"arm": self.arm, "steps": len(self.step_ms), "step_ms": self.step_ms, "median_ms": self.median_ms,
                "speedup": self.speedup, "ab_step_ms_lo": min(arm.step_ms) if arm and arm.step_ms else None,
                "ab_step_ms_hi": max(arm.step_ms) if arm and arm.step_ms else None, "agrees": self.agrees,
                "loses": self.loses}

    def format(self) -> str:
        s = self.summary()
        if s["agrees"] is None:
            return f"  kept '{self.arm}': its own steps were not timed"
        verdict = ("within the A/B's spread" if s["agrees"]
                   else "OUTSIDE the A/B's spread: the A/B did not predict the run")
        return (f"  kept '{self.arm}': its own {s['steps']} steps {s['median_ms']:.3f} ms median "
                f"({s['speedup']:.3f}x the A/B's unfused), A/B {s['ab_step_ms_lo']:.3f}-{s['ab_step_ms_hi']:.3f} ms: "
                f"{verdict}")
