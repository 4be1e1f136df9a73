"""``FusedLayersCallback``: swap fused modules into any LightningModule, measure what each swap gains.

Where the swap happens (Lightning 2.6, ``Trainer._run``)::

    callbacks' setup  ->  module setup  ->  module configure_model  ->  checkpoint restore (modules)
        ->  strategy.setup (precision convert, move to device, DDP/FSDP wrap, *optimizers built*)
        ->  on_fit_start  ->  training

* ``setup`` swaps the layers that exist then (the usual case: layers built in ``__init__``).
* There is no callback hook between ``configure_model`` and ``strategy.setup``.  For a module that
  overrides ``configure_model``, ``setup`` wraps that method on the *instance* (``functools.wraps``, so
  Lightning still sees it as overridden) so that a second, idempotent swap runs right after the user's
  ``configure_model`` returns -- before the strategy wraps the model and before optimizers exist.  The
  wrapper removes itself once it has run.  Swapping at ``on_fit_start`` would be too late for FSDP,
  which shards in ``strategy.setup``; for plain/DDP runs swaps keep the same ``Parameter`` objects,
  so an optimizer still sees the right tensors either way.
* Every rank runs the same deterministic swap on the same model, so all ranks agree; with
  ``policy="faster"`` rank 0's decision is broadcast.

Speed measurement (``measure=True``): forward pre-hooks record the real input shapes/dtypes of every
swapped module during the first ``record_steps`` training batches; at the start of training batch
``max(warmup_steps, record_steps)`` (between steps, so not inside any step's time) the
``fused_layers.ledger.Ledger`` times reference against fused once per distinct (kind, shape, dtype),
spending about ``max_measure_seconds``.  The time spent is in ``paused_seconds`` (``ThroughputCallback``
subtracts it).  Logged through ``trainer.loggers``: ``fused/speedup/<kind>`` (fwd+bwd, geometric mean
over the kind's shapes), ``fused/speedup_fwd/<kind>``, ``fused/max_err/<kind>``, ``fused/ref_ms/<kind>``,
``fused/fused_ms/<kind>``, ``fused/restored/<kind>`` (policy=faster), plus a ``fused/speedups`` table on
a ``WandbLogger``.  If training ends before that batch, the measurement runs at ``on_train_end``.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from fused_layers.ledger import TABLE_COLUMNS, Ledger, Measurement
from fused_layers.swap import KINDS, SkipEntry, SwapReport, resolve_kinds, restore_modules, swap_modules

log = logging.getLogger(__name__)

POLICIES = ("always", "faster")


def kernels_runnable(device: torch.device) -> bool:
    """True when the Triton kernels can run on ``device`` (CUDA, or CPU under TRITON_INTERPRET=1)."""
    from fused_layers.ops._common import triton_runnable

    try:
        return triton_runnable(torch.empty(0, device=device))
    except Exception:  # an unusable device
        return False


class FusedLayersCallback(Callback):
    """Swap ``nn.LayerNorm``/``RMSNorm``/``Softmax``/``MultiheadAttention``/``Attention`` for their fused
    drop-ins at setup, measure the per-kind speedups on the run's own shapes, log them.

    Args:
        kinds: ``{kind: on/off}`` (kinds of ``fused_layers.swap.KINDS``); ``None`` = all.
        include: glob/regex patterns on qualified module names to swap (empty = all).
        exclude: patterns of module names to leave alone.
        mapping: ``{"dotted.path.Class": kind}`` for a model's own classes that behave like a source.
        policy: ``"always"`` keeps every swap; ``"faster"`` undoes, after measuring, each swap whose
            forward+backward on the run's shapes is slower than the reference.
        measure: record shapes and time reference vs fused (off: swap only).
        record_steps: training batches during which input shapes are recorded.
        warmup_steps: training batches to run before measuring (caches, autotuning settle).
        max_measure_seconds: time budget of the whole measurement.
        log_table: also log the per-shape table (``fused/speedups``) to a ``WandbLogger``.

    See the module docstring for where the swap happens and what is logged.
    """

    def __init__(
        self,
        kinds: dict[str, bool] | None = None,
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        mapping: dict[str, str] | None = None,
        policy: str = "always",
        measure: bool = True,
        record_steps: int = 1,
        warmup_steps: int = 3,
        max_measure_seconds: float = 2.0,
        log_table: bool = True,
    ) -> None:
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(f"FusedLayersCallback: argument 'policy' must be one of {POLICIES}, got {policy!r}")
        if record_steps < 1:
            raise ValueError(f"FusedLayersCallback: argument 'record_steps' must be >= 1, got {record_steps}")
        if warmup_steps < 0:
            raise ValueError(f"FusedLayersCallback: argument 'warmup_steps' must be >= 0, got {warmup_steps}")
        resolve_kinds(kinds)  # validates names early (clear error at config time)
        self.kinds = dict(kinds) if kinds is not None else None
        self.include = list(include or [])
        self.exclude = list(exclude or [])
        self.mapping = dict(mapping or {})
        self.policy = policy
        self.measure = measure
        self.record_steps = int(record_steps)
        self.warmup_steps = int(warmup_steps)
        self.max_measure_seconds = float(max_measure_seconds)
        self.log_table = log_table

        self.report = SwapReport()
        self.enabled: bool | None = None
        self.ledger: Ledger | None = None
        self.measurements: list[Measurement] = []
        self.restored: dict[str, tuple[str, float]] = {}  #: policy=faster: name -> (kind, fwd+bwd speedup < 1)
        self.paused_seconds = 0.0  #: time spent measuring, between steps (ThroughputCallback subtracts it)
        self._train_batches = 0
        self._measured = False
        self._warned = False

    # ----------------------------------------------------------------------------------------------
    # swapping
    # ----------------------------------------------------------------------------------------------
    def _swap(self, pl_module: LightningModule) -> SwapReport:
        rep = swap_modules(pl_module, kinds=self.kinds, include=self.include, exclude=self.exclude, mapping=self.mapping)
        self.report = self.report.merge(rep) if self.report.swapped or self.report.skipped else rep
        return rep

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.enabled is None:
            self.enabled = kernels_runnable(trainer.strategy.root_device)
        if not self.enabled:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"FusedLayersCallback: the Triton kernels cannot run on {trainer.strategy.root_device} "
                    "(no CUDA, and TRITON_INTERPRET=1 is not set); swapping nothing, training goes on unfused.",
                    UserWarning,
                    stacklevel=2,
                )
            return
        self._swap(pl_module)
        if is_overridden("configure_model", pl_module) and "configure_model" not in pl_module.__dict__:
            self._wrap_configure_model(trainer, pl_module)
        else:
            self._log_report(trainer)

    def _wrap_configure_model(self, trainer: Trainer, pl_module: LightningModule) -> None:
        original = pl_module.configure_model

        @functools.wraps(original)
        def configure_model(*args: Any, **kwargs: Any) -> Any:
            pl_module.__dict__.pop("configure_model", None)
            out = original(*args, **kwargs)
            self._swap(pl_module)
            self._log_report(trainer)
            return out

        pl_module.__dict__["configure_model"] = configure_model

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        pl_module.__dict__.pop("configure_model", None)
        if self.ledger is not None:
            self.ledger.stop_recording()

    def _log_report(self, trainer: Trainer) -> None:
        rep = self.report
        rank_zero_info(str(rep))
        counts = rep.counts()
        params: dict[str, Any] = {f"fused/swapped/{k}": counts.get(k, 0) for k in resolve_kinds(self.kinds)}
        params["fused/skipped"] = len(rep.skipped)
        params["fused/policy"] = self.policy
        for lg in trainer.loggers:
            try:
                lg.log_hyperparams(params)
                if hasattr(lg, "log_text") and rep.rows():
                    lg.log_text(key="fused/swap_report", columns=["module", "kind", "status", "detail"], data=rep.rows())
            except Exception as e:  # a logger that cannot take them must not stop training
                log.warning("FusedLayersCallback: logger %s: %s", type(lg).__name__, e)

    # ----------------------------------------------------------------------------------------------
    # recording and measuring
    # ----------------------------------------------------------------------------------------------
    @property
    def measure_at(self) -> int:
        """Index of the training batch at whose start the measurement runs."""
        return max(self.warmup_steps, self.record_steps)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not (self.enabled and self.measure) or self._measured or not self.report.swapped:
            return
        if self._train_batches == 0:
            self.ledger = Ledger(pl_module)
            self.ledger.start_recording()
        elif self._train_batches >= self.measure_at:
            self._measure(trainer, pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._train_batches += 1
        if self.ledger is not None and self._train_batches >= self.record_steps:
            self.ledger.stop_recording()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.enabled and self.measure and not self._measured and self.ledger is not None and self.ledger.calls:
            self._measure(trainer, pl_module)

    def _measure(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._measured = True
        assert self.ledger is not None
        self.ledger.stop_recording()
        t0 = time.perf_counter()
        try:
            rows = self.ledger.measure(self.max_measure_seconds)
        except Exception as e:  # measurement is advisory: never stop the run for it
            warnings.warn(f"FusedLayersCallback: speed measurement failed ({type(e).__name__}: {e}); swaps kept.")
            rows = []
        self.measurements = rows
        if self.policy == "faster" and rows:
            if all(r.meaningful for r in rows):
                self._apply_policy(trainer, pl_module)
            else:  # interpreter / CPU timings say nothing about the GPU: keep the swaps
                rank_zero_info("FusedLayersCallback(policy=faster): timings not meaningful on this device "
                               "(Triton interpreter); no swap undone.")
        if torch.cuda.is_available() and trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        self.paused_seconds += time.perf_counter() - t0
        self._log_measurements(trainer)

    def _apply_policy(self, trainer: Trainer, pl_module: LightningModule) -> None:
        slower = {n: s for n, s in self.ledger.module_speedups(self.measurements).items() if s < 1.0}
        slower = trainer.strategy.broadcast(slower, src=0)  # every rank undoes the same swaps
        if not slower:
            return
        restore_modules(pl_module, list(slower))
        kinds = {e.name: e.kind for e in self.report.swapped}
        self.report.swapped = [e for e in self.report.swapped if e.name not in slower]
        for name, s in slower.items():
            self.report.skipped.append(SkipEntry(name, kinds.get(name, "?"), f"restored by policy=faster: fwd+bwd speedup {s:.3f}x"))
        self.restored = {n: (kinds.get(n, "?"), s) for n, s in slower.items()}
        rank_zero_info(f"FusedLayersCallback(policy=faster): restored {len(slower)} slower swap(s): {sorted(slower)}")

    def _log_measurements(self, trainer: Trainer) -> None:
        rows = self.measurements
        metrics = Ledger.summary(rows)
        if self.policy == "faster":
            for kind in {r.kind for r in rows}:
                metrics[f"fused/restored/{kind}"] = float(sum(1 for k, _ in self.restored.values() if k == kind))
        if rows:
            metrics["fused/measure_seconds"] = self.paused_seconds
            metrics["fused/timings_meaningful"] = float(all(r.meaningful for r in rows))
        if self.ledger is not None and self.ledger.not_measured:
            metrics["fused/not_measured"] = float(len(self.ledger.not_measured))
        rank_zero_info("fused_layers speedups (reference / fused, fwd+bwd):\n" + Ledger.format(rows))
        if not metrics:
            return
        for lg in trainer.loggers:
            try:
                lg.log_metrics(metrics, step=trainer.global_step)
                if self.log_table and hasattr(lg, "log_table") and rows:
                    lg.log_table(key="fused/speedups", columns=list(TABLE_COLUMNS), data=[r.row() for r in rows])
            except Exception as e:
                log.warning("FusedLayersCallback: logger %s: %s", type(lg).__name__, e)


__all__ = ["FusedLayersCallback", "kernels_runnable", "KINDS"]
