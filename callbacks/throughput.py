"""``ThroughputCallback``: Lightning's ``ThroughputMonitor`` set up for the training job and fused runs.

It is ``lightning.pytorch.callbacks.ThroughputMonitor`` (samples/s, items/s = tokens/s, FLOP/s and MFU,
logged as ``train|...``) with three additions:

* **FLOPs per batch from the unfused model.**  With ``flops_from="meta"``, on the first training batch it
  counts forward+backward FLOPs (``lightning.fabric.utilities.throughput.measure_flops``) of
  ``pl_module(x)`` with every parameter, buffer and the input on the ``meta`` device (through
  ``torch.func.functional_call``: nothing is copied or allocated) and with any fused module temporarily
  given back its reference class, then sets ``pl_module.flops_per_batch``.  Fused and unfused runs
  therefore report comparable MFU.  ``flops_from="module"`` leaves it to the module's own
  ``flops_per_batch`` (Lightning's default); a module that defines one is never overridden.
* **Peak FLOP/s for H100/H200.**  Lightning 2.6 does not recognise ``"NVIDIA H200"`` (only names with
  "sxm1"/"nvl1") and lists the H200 with sparsity figures; ``PEAK_FLOPS`` has the dense datasheet peaks,
  used when the device name matches, else Lightning's ``get_available_flops``.
* **Measurement pauses excluded.**  Time a ``FusedLayersCallback`` spends measuring between steps
  (its ``paused_seconds``) is taken out of the elapsed time, like Lightning does for validation.
* **Stalls named at the end of training.**  A windowed median of tokens/s hides a stall (the first
  compiled seq-4,096 job of a process on the H200 lost up to 45% of its wall clock to one), so every
  step's synchronized wall time is kept (``ThroughputMonitor`` synchronizes each step), with Python's
  garbage-collector pauses (``gc.callbacks``) and the steps after which ``torch.compile`` compiled new
  code.  The steps of a ``FusedLayersCallback``'s step-time A/B are left out: its arms differ in speed
  on purpose (and compile once each under ``torch.compile``).  The numbers are logged as ``stall/*``;
  the console gets one plain sentence only when the steps slower than twice the median cost
  ``STALL_SHARE`` of the training time or more.

The batch is the demo LM's ``(x, y)`` pair of ``(B, T)`` token tensors: ``batch_size_fn`` = ``B``,
``length_fn`` = ``B * T`` tokens (items/s is tokens/s).  For other batch layouts pass your own.

Args:
    window_size: batches in the moving window of ``Throughput`` (Lightning's default 100; 20 here).
    flops_from: ``"meta"`` (count on the unfused model, above), ``"module"`` (``pl_module.flops_per_batch``)
        or ``"none"`` (no FLOPs, no MFU).
    batch_size_fn, length_fn: override the ``(x, y)`` defaults.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable, Collection

import torch
from lightning.fabric.utilities.throughput import get_available_flops, measure_flops
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn

#: Share of the training time that steps over twice the median step must add for the console to name a stall
#: (10%: a stall that size moves the run's tokens/s beyond run-to-run noise; smaller ones go to stall/* only).
STALL_SHARE = 0.10

#: Dense (no sparsity) peak FLOP/s from NVIDIA's datasheets, per chip and compute dtype.
#: H100 SXM5 / H200 SXM: 989.4 TFLOP/s bf16/fp16, 494.7 tf32, 66.9 fp32;  H100 PCIe: 756 / 378 / 51.2;
#: H100 NVL / H200 NVL: 835.5 / 417.6 / 60.
PEAK_FLOPS: dict[str, dict[Any, float]] = {
    "h200 nvl": {torch.bfloat16: 835.5e12, torch.float16: 835.5e12, "tfloat32": 417.6e12, torch.float32: 60e12},
    "h200": {torch.bfloat16: 989.4e12, torch.float16: 989.4e12, "tfloat32": 494.7e12, torch.float32: 66.9e12},
    "h100 nvl": {torch.bfloat16: 835.5e12, torch.float16: 835.5e12, "tfloat32": 417.6e12, torch.float32: 60e12},
    "h100 pcie": {torch.bfloat16: 756e12, torch.float16: 756e12, "tfloat32": 378e12, torch.float32: 51.2e12},
    "h100": {torch.bfloat16: 989.4e12, torch.float16: 989.4e12, "tfloat32": 494.7e12, torch.float32: 66.9e12},
}


def peak_flops(device_name: str, dtype: torch.dtype | str) -> float | None:
    """Dense peak FLOP/s of an H100/H200 by its CUDA device name (e.g. "NVIDIA H200"), else ``None``."""
    name = device_name.lower()
    for chip in PEAK_FLOPS:  # most specific first
        words = chip.split()
        if all(w in name for w in words):
            return PEAK_FLOPS[chip].get(dtype)
    return None


def available_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s for ``device`` at compute ``dtype``: ``PEAK_FLOPS`` for H100/H200, else Lightning's."""
    if device.type == "cuda":
        key: Any = dtype
        if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
            key = "tfloat32"
        peak = peak_flops(torch.cuda.get_device_name(device), key)
        if peak is not None:
            return peak
    return get_available_flops(device, dtype)


def _tokens(batch: Any) -> torch.Tensor:
    return batch[0] if isinstance(batch, (tuple, list)) else batch


class ThroughputCallback(ThroughputMonitor):
    """Lightning's ``ThroughputMonitor`` with FLOPs counted on the unfused model (meta device), dense
    H100/H200 peaks for MFU, and ``FusedLayersCallback`` measurement pauses excluded.

    Args:
        window_size: batches in ``Throughput``'s moving window.
        flops_from: ``"meta"`` | ``"module"`` | ``"none"`` (see the module docstring).
        batch_size_fn: samples in a batch; default ``batch[0].shape[0]`` (the LM's ``(x, y)``, x: (B, T)).
        length_fn: items (tokens) in a batch; default ``batch[0].numel()`` = B * T.
    """

    @staticmethod
    def check_args(window_size: int = 20, flops_from: str = "meta", **_: Any) -> None:
        """Check the arguments (train.py's config check); the ``ValueError`` names the argument in ``arg``."""
        for arg, ok, msg in (
            ("flops_from", flops_from in ("meta", "module", "none"),
             f"must be 'meta', 'module' or 'none', got {flops_from!r}"),
            ("window_size", isinstance(window_size, int) and not isinstance(window_size, bool) and window_size >= 1,
             f"must be an int >= 1, got {window_size!r}"),
        ):
            if not ok:
                e = ValueError(f"ThroughputCallback: argument '{arg}' {msg}")
                e.arg = arg  # type: ignore[attr-defined]
                raise e

    def __init__(
        self,
        window_size: int = 20,
        flops_from: str = "meta",
        batch_size_fn: Callable[[Any], int] | None = None,
        length_fn: Callable[[Any], int] | None = None,
    ) -> None:
        self.check_args(window_size=window_size, flops_from=flops_from)
        super().__init__(
            batch_size_fn=batch_size_fn or (lambda b: int(_tokens(b).shape[0])),
            length_fn=length_fn or (lambda b: int(_tokens(b).numel())),
            window_size=window_size,
        )
        self.flops_from = flops_from
        self.flops_per_batch: int | None = None
        self._paused_seen = 0.0
        # stalls
        self._step_end: float | None = None
        self._step_ms: list[tuple[int, float]] = []  # (global step, synchronized wall ms)
        self._gc_ms = 0.0
        self._gc_full = 0  # generation-2 collections
        self._gc_t0 = 0.0
        self._frames = 0
        self._compiled_after: list[int] = []  # steps after which torch.compile had compiled new code

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        dtype = _plugin_to_compute_dtype(trainer.precision_plugin)
        peak = available_flops(trainer.strategy.root_device, dtype)
        self.available_flops = peak
        for tp in self._throughputs.values():
            tp.available_flops = peak

    # FLOPs ----------------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.flops_per_batch is not None or self.flops_from != "meta":
            return
        if "flops_per_batch" in type(pl_module).__dict__ or "flops_per_batch" in pl_module.__dict__:
            self.flops_from = "module"  # the module's own number wins
            return
        try:
            self.flops_per_batch = int(count_flops(pl_module, _tokens(batch)))
        except Exception as e:  # no MFU rather than a failed run
            rank_zero_warn(f"ThroughputCallback: could not count the model's FLOPs ({type(e).__name__}: {e}); "
                           "MFU is not logged.")
            self.flops_from = "none"
            return
        pl_module.flops_per_batch = self.flops_per_batch

    # pauses ---------------------------------------------------------------------------------------
    @rank_zero_only
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           *args: Any) -> None:
        paused = sum(getattr(cb, "paused_seconds", 0.0) for cb in trainer.callbacks if cb is not self)
        if paused > self._paused_seen and RunningStage.TRAINING in self._t0s:
            self._t0s[RunningStage.TRAINING] += paused - self._paused_seen
        pause = paused - self._paused_seen
        self._paused_seen = paused
        super().on_train_batch_end(trainer, pl_module, outputs, batch, *args)  # (synchronizes the device)
        now = time.perf_counter()
        if self._step_end is not None:
            self._step_ms.append((trainer.global_step, (now - self._step_end - max(pause, 0.0)) * 1e3))
        self._step_end = now
        frames = _frames_compiled()
        if frames > self._frames:
            self._compiled_after.append(trainer.global_step)
            self._frames = frames

    # stalls ---------------------------------------------------------------------------------------
    def _gc_callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0:  # "stop" of a collection whose start we saw
            self._gc_ms += (time.perf_counter() - self._gc_t0) * 1e3
            self._gc_full += int(info.get("generation") == 2)
            self._gc_t0 = 0.0

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._frames = _frames_compiled()
        if self._gc_callback not in gc.callbacks:
            gc.callbacks.append(self._gc_callback)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)
        ab_steps = {s for cb in trainer.callbacks if cb is not self for s in getattr(cb, "ab_steps", ())}
        report = self.stall_report(skip=ab_steps)
        if report and trainer.is_global_zero:
            message = stall_message(report)
            if message:
                rank_zero_info(message)
            for lg in trainer.loggers:
                lg.log_metrics({f"stall/{k}": float(v) for k, v in report.items() if isinstance(v, (int, float))},
                               step=trainer.global_step)

    def stall_report(self, skip: Collection[int] = ()) -> dict[str, Any]:
        """Step times of the run (ms, synchronized, measurement pauses excluded): median, slowest, total; the
        steps over twice the median (``stalled_steps``) and what they took beyond it (``excess_ms``);
        garbage-collector pauses; the three slowest steps and the steps after which ``torch.compile``
        compiled new code (lists of step indices).  Numbers are logged as ``stall/<key>``.  Steps in ``skip``
        (a ``FusedLayersCallback``'s step-time A/B, whose arms differ in speed on purpose) are left out."""
        steps = [(s, t) for s, t in self._step_ms if s not in skip]
        if len(steps) < 2:
            return {}
        times = [t for _, t in steps]
        median = statistics.median(times)
        slow = sorted(steps, key=lambda st: -st[1])[:3]
        stalled = [t for t in times if t > 2 * median]
        return {
            "steps": len(times),
            "median_step_ms": round(median, 2),
            "max_step_ms": round(slow[0][1], 2),
            "total_step_ms": round(sum(times), 1),
            "stalled_steps": len(stalled),
            "excess_ms": round(sum(t - median for t in stalled), 1),
            "gc_ms": round(self._gc_ms, 1),
            "gc_full_collections": self._gc_full,
            "slowest_steps": [s for s, _ in slow],
            "compiled_after_steps": [s for s in self._compiled_after if s not in skip],
        }


def stall_message(report: dict[str, Any], share: float = STALL_SHARE) -> str | None:
    """One plain sentence on the console when steps over twice the median took ``share`` of the training
    time or more beyond the median (``None`` otherwise; the numbers are logged as ``stall/*`` either way)."""
    if not report or not report["stalled_steps"] or report["excess_ms"] < share * report["total_step_ms"]:
        return None
    msg = (f"Training stalled: {report['stalled_steps']} of {report['steps']} steps took more than twice the usual "
           f"{report['median_step_ms']:.0f} ms (slowest: step {report['slowest_steps'][0]}, "
           f"{report['max_step_ms'] / 1e3:.1f} s) and cost {report['excess_ms'] / 1e3:.1f} s, "
           f"{report['excess_ms'] / report['total_step_ms']:.0%} of the training time")
    if report["compiled_after_steps"]:
        steps = ", ".join(str(s) for s in report["compiled_after_steps"][:5])
        msg += f"; torch.compile compiled new code after step {steps}"
    if report["gc_ms"] >= share * report["excess_ms"]:
        msg += f"; Python's garbage collector paused for {report['gc_ms'] / 1e3:.1f} s in all"
    return msg + "."


def _frames_compiled() -> int:
    """Frames torch.compile (Dynamo) has compiled so far in this process (0 where it cannot tell)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["ok"])
    except Exception:  # a torch without these counters: compiles are not counted
        return 0


def count_flops(model: torch.nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor] | None = None) -> int:
    """Forward+backward FLOPs of ``model(x)`` computed on the meta device with the *unfused* classes.

    Parameters, buffers and ``x`` are replaced by meta tensors through ``torch.func.functional_call``
    (no copy of the model); fused modules get their reference class back for the count and are swapped
    again afterwards (same objects).  ``loss_fn`` defaults to the sum of the first output tensor.
    """
    from fused_layers.swap import fused_source

    def meta(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(t, device="meta")
        return out.requires_grad_(t.requires_grad) if t.is_floating_point() else out

    state = {n: meta(p) for n, p in model.named_parameters()}
    state.update({n: meta(b) for n, b in model.named_buffers()})
    xm = torch.empty_like(x, device="meta")
    fused = [(m, type(m)) for m in model.modules() if fused_source(m) is not None]
    was_training = model.training

    def first(out: Any) -> torch.Tensor:
        return out if isinstance(out, torch.Tensor) else next(o for o in out if isinstance(o, torch.Tensor))

    loss = loss_fn or (lambda out: first(out).sum())
    try:
        for m, _ in fused:
            m.__class__ = fused_source(m)
        return measure_flops(model, lambda: torch.func.functional_call(model, state, (xm,)), loss_fn=loss)
    finally:
        for m, cls in fused:
            m.__class__ = cls
        model.train(was_training)
