"""``FusedLayersCallback``: swap fused modules into any LightningModule and measure what the swap gains.

Needs Lightning (``pip install 'fused-layers[train]'``); everything it does is also reachable without it
(``fused_layers.swap_modules``, ``fused_layers.ledger``).  Usage::

    from fused_layers.lightning import FusedLayersCallback

    trainer = L.Trainer(callbacks=[FusedLayersCallback(policy="faster")])

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

What is measured (both on the run's own model, batches and shapes):

* **Step-time A/B** (``ab_rounds > 0``, what ``policy="faster"`` decides from): after ``warmup_steps``
  training batches, real training steps run interleaved with and without the swaps -- arms ``unfused``
  (every swap undone), ``all`` and, when several kinds are swapped, one arm per kind (only that kind
  fused) -- ``ab_warmup_rounds`` uncounted rounds, then ``ab_rounds`` rounds, each arm once per round in a
  rotating order (``fused_layers.ledger.StepAB``).  Step times: CUDA events from batch start to batch end
  (forward, backward, optimizer step), read after the last A/B step.  Each arm's speedup is the median
  over rounds of (unfused step / arm step) within a round, with its min-max spread.  The cost is
  ``(ab_warmup_rounds + ab_rounds) * len(arms)`` training steps (still training: swapping changes the
  class, not the parameters), at most ``ab_max_steps`` (fewer rounds when needed).  ``policy="faster"``
  then keeps the arm that beats ``unfused`` in every round with the best median (else ``unfused``).  Under
  ``torch.compile`` a class change makes Dynamo compile one graph per arm (cached; at least one warm-up
  round pays for it, and a measured round in which a step compiled is left out), so the A/B compares the
  compiled programs (``ab_compiled="per_arm"``, the default), or is skipped (``ab_compiled="skip"``: logged
  as not A/B-measured, no swap undone).  Its cost is reported: the steps it took, and per arm the wall
  time of the steps that compiled; the ``all`` arm's graph is the one the run's steps before the A/B
  compiled (every swap in place), which its A/B steps reuse, so those steps' compile time is its own.
* **The kept configuration's own steps** (``ab_check_steps``): after the A/B, the next steps run the kept
  arm (the graph it compiled, under compile) and are timed alike; their median is reported next to the
  A/B's verdict, with a warning when it lies outside the kept arm's min-max over the rounds.  A fused arm
  whose own steps are slower than every unfused step of the A/B is undone by ``policy="faster"``: the run's
  own evidence overrides the A/B's.  Peak memory: read at the A/B's end (its unfused arm included), then
  reset, and read again at the end of training (the kept configuration's steady state); both are in the
  summary (``peak_memory_gib``) and logged as ``fused/peak_memory_gib/ab`` and ``/kept``.
* **Per-module kernel timings** (``measure=True``, detail only): forward pre-hooks record the input
  shapes/dtypes of every swapped module during the first ``record_steps`` batches; just before the A/B
  (between steps) ``fused_layers.ledger.Ledger`` times each module's reference class against the fused
  one, once per distinct (kind, shape, dtype), in about ``max_measure_seconds``.  Those are isolated calls
  with syncs, host-bound where no real step is: the table names the reference each was compared to.
  Time spent there is in ``paused_seconds``, for a throughput monitor to take out of its elapsed time.

The console gets the swap report, the step times per arm and what ``policy="faster"`` kept, plus one
line of per-kind module speedups (the per-module table goes to the ``fused_layers.lightning`` logger at
DEBUG level and to W&B).  Logged through ``trainer.loggers``: ``fused/swapped/<kind>`` (hyper-parameters,
at setup; final counts again after the policy), ``fused/step_speedup/<kind>``, ``fused/step_speedup/all``
(+ ``_lo``/``_hi``: the spread), ``fused/step_ms/unfused|all``, ``fused/kept/<kind>``,
``fused/ab_meaningful``; per-module detail ``fused/speedup/<kind>`` (fwd+bwd against the module's
reference class, geometric mean over shapes), ``fused/speedup_fwd/<kind>``, ``fused/max_err/<kind>``; to a
logger with ``log_table`` (``WandbLogger``) also the tables ``fused/step_ab`` and ``fused/speedups`` (W&B
itself is only imported by that logger).  If training ends before the A/B is complete, the completed
rounds are used (none: not A/B-measured, said so).
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from typing import Any

import torch

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
    from lightning.pytorch.utilities.model_helpers import is_overridden
    from lightning.pytorch.utilities.rank_zero import rank_zero_info
except ImportError as e:  # the library itself needs torch and triton only
    raise ImportError(
        "fused_layers.lightning needs Lightning, which fused-layers does not install by default: "
        "pip install 'fused-layers[train]'"
    ) from e

from .ledger import TABLE_COLUMNS, KeptSteps, Ledger, Measurement, StepAB, compiled_graphs, faster_arm, fit_ab
from .ops import compile_config
from .ops._common import fallbacks
from .swap import KINDS, SkipEntry, SwapReport, _normalize_mapping, resolve_kinds, restore_modules, swap_modules

log = logging.getLogger(__name__)

POLICIES = ("always", "faster")
AB_COMPILED = ("per_arm", "skip")
INTERPRETER_NOTE = (
    "TRITON_INTERPRET=1 runs the kernels on the CPU in Triton's interpreter: for tests and debugging only, "
    "far too slow to train with (about 90 s per training step of the demo's tiny GPT, hours for a default run)"
)


def check_args(policy: str = "always", record_steps: int = 1, warmup_steps: int = 3, kinds: Any = None,
               mapping: Any = None, ab_rounds: int = 5, ab_warmup_rounds: int = 1, ab_max_steps: int = 40,
               ab_compiled: str = "per_arm", max_measure_seconds: float = 2.0, ab_check_steps: int = 5,
               compiled_routes: Any = None, **_: Any) -> None:
    """Check the constructor arguments (also used by train.py's config check, for a disabled callback too).
    Raises ``ValueError`` whose ``arg`` attribute names the argument."""

    def bad(arg: str, msg: str) -> None:
        e = ValueError(f"FusedLayersCallback: argument '{arg}' {msg}")
        e.arg = arg  # type: ignore[attr-defined]
        raise e

    if policy not in POLICIES:
        bad("policy", f"must be one of {list(POLICIES)}, got {policy!r}")
    if ab_compiled not in AB_COMPILED:
        bad("ab_compiled", f"must be one of {list(AB_COMPILED)}, got {ab_compiled!r}")
    for arg, val, lo in (("record_steps", record_steps, 1), ("warmup_steps", warmup_steps, 0),
                         ("ab_rounds", ab_rounds, 0), ("ab_warmup_rounds", ab_warmup_rounds, 0),
                         ("ab_max_steps", ab_max_steps, 0), ("ab_check_steps", ab_check_steps, 0)):
        if not isinstance(val, int) or isinstance(val, bool) or val < lo:
            bad(arg, f"must be an int >= {lo}, got {val!r}")
    if not max_measure_seconds >= 0:
        bad("max_measure_seconds", f"must be >= 0, got {max_measure_seconds!r}")
    # the swap's own checks (kinds, aliases, importable classes), the compile routes' table
    for arg, fn in (("kinds", lambda: resolve_kinds(kinds)), ("mapping", lambda: _normalize_mapping(mapping)),
                    ("compiled_routes", lambda: compile_config.check_routes(dict(compiled_routes or {})))):
        try:
            fn()
        except (ValueError, TypeError) as e:
            bad(arg, f"is invalid: {e}")


def kernels_runnable(device: torch.device) -> bool:
    """True when the Triton kernels can run on ``device`` (CUDA, or CPU under TRITON_INTERPRET=1)."""
    from .ops._common import triton_runnable

    try:
        return triton_runnable(torch.empty(0, device=device))
    except Exception:  # an unusable device
        return False


class FusedLayersCallback(Callback):
    """Swap the model's layers for their fused drop-ins at setup (the kinds of ``fused_layers.swap.KINDS``
    and their known look-alikes), time the training step with and without them, log what was gained.

    Args:
        kinds: ``{kind: on/off}`` (kinds of ``fused_layers.swap.KINDS``); ``None`` = those on by default.
        include: glob/regex patterns on qualified module names to swap (empty = all).
        exclude: patterns of module names to leave alone.
        mapping: ``{"dotted.path.Class": kind}`` for a model's own classes that behave like a source.
        policy: ``"always"`` keeps every swap; ``"faster"`` keeps, after the step-time A/B, the fastest
            measured arm (``unfused`` when no arm beats it); without an A/B (``ab_rounds=0``) it falls back
            to undoing the modules whose isolated forward+backward timing is slower than the reference.
        measure: record shapes and time each module against its reference (detail).
        ab_rounds: measured rounds of the step-time A/B (0: no A/B).
        ab_warmup_rounds: uncounted rounds first (first use of each arm; a compiled graph per arm).
        ab_max_steps: bound on the A/B's training steps (rounds are reduced to fit).
        ab_compiled: under ``torch.compile``: ``"per_arm"`` (a compiled graph per arm) or ``"skip"``.
        ab_check_steps: training steps after the A/B timed as the kept configuration's own (0: none).
        record_steps: training batches during which input shapes are recorded.
        warmup_steps: training batches to run before measuring (caches, autotuning settle).
        max_measure_seconds: time budget of the whole measurement.
        log_table: also log the per-shape table (``fused/speedups``) to a ``WandbLogger``.
        compiled_routes: ``{op: "kernels" | "inductor"}`` under ``torch.compile`` for this run
            (``fused_layers.set_compiled_routes``; set at setup, the library's defaults back at teardown).

    See the module docstring for where the swap happens and what is logged.
    """

    #: checks the constructor arguments without building (train.py checks disabled entries too)
    check_args = staticmethod(check_args)

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
        ab_rounds: int = 5,
        ab_warmup_rounds: int = 1,
        ab_max_steps: int = 40,
        ab_compiled: str = "per_arm",
        ab_check_steps: int = 5,
        compiled_routes: dict[str, str] | None = None,
        step_timer: Any = None,
    ) -> None:
        super().__init__()
        check_args(policy=policy, record_steps=record_steps, warmup_steps=warmup_steps, kinds=kinds, mapping=mapping,
                   ab_rounds=ab_rounds, ab_warmup_rounds=ab_warmup_rounds, ab_max_steps=ab_max_steps,
                   ab_compiled=ab_compiled, max_measure_seconds=max_measure_seconds, ab_check_steps=ab_check_steps,
                   compiled_routes=compiled_routes)
        self.compiled_routes = dict(compiled_routes or {})
        self._routes_before: Any = None  #: the route table the run found, put back at teardown
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
        self.ab_rounds = int(ab_rounds)
        self.ab_warmup_rounds = int(ab_warmup_rounds)
        self.ab_max_steps = int(ab_max_steps)
        self.ab_compiled = ab_compiled
        self.ab_check_steps = int(ab_check_steps)
        self.step_timer = step_timer  #: None: CUDA events / perf_counter (tests pass a fake)

        self.report = SwapReport()
        self.ab: StepAB | None = None
        self.ab_status = "not run"  #: what happened to the step-time A/B, in words (summary, logs)
        self.kept_arm: str | None = None  #: policy=faster's choice from the A/B
        self.enabled: bool | None = None
        self.ledger: Ledger | None = None
        self.measurements: list[Measurement] = []
        self.restored: dict[str, tuple[str, float]] = {}  #: policy=faster: name -> (kind, fwd+bwd speedup < 1)
        self.paused_seconds = 0.0  #: time spent measuring, between steps (a throughput monitor subtracts it)
        #: ``trainer.global_step`` after each step of the A/B (arms differ in speed on purpose: not stalls)
        self.ab_steps: list[int] = []
        self._train_batches = 0
        self._measured = False
        self._warned = False
        self._graphs_at_setup = 0
        self._step_at: tuple[int, float] | None = None  # (graphs, clock) at a step's start before the A/B
        #: wall seconds of the steps before the A/B that compiled a graph (the ``all`` arm's, every swap in place)
        self._compile_before_ab = 0.0
        #: the kept configuration's own steps after the A/B, timed like the A/B's arms (``KeptSteps``)
        self.kept: KeptSteps | None = None
        #: peak allocated GiB: ``ab`` up to the A/B's end (its unfused arm included), ``kept`` over the steps
        #: after it (the configuration the run kept, in steady state); None where not read (CPU)
        self.peak_memory_gib: dict[str, float | None] = {}
        self._fallbacks_at_setup: dict[str, int] = {}  #: ``fused_layers.fallbacks()`` when the run started

    # ----------------------------------------------------------------------------------------------
    # swapping
    # ----------------------------------------------------------------------------------------------
    def _swap(self, pl_module: LightningModule) -> SwapReport:
        rep = swap_modules(pl_module, kinds=self.kinds, include=self.include, exclude=self.exclude,
                           mapping=self.mapping)
        self.report = self.report.merge(rep) if self.report.swapped or self.report.skipped else rep
        return rep

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.enabled is not None and stage != "fit":  # e.g. trainer.validate after fit: keep the fit's swaps
            return
        if self.enabled is None:
            self.enabled = kernels_runnable(trainer.strategy.root_device)
        if not self.enabled:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"FusedLayersCallback: the Triton kernels cannot run on {trainer.strategy.root_device} "
                    "(no CUDA, and TRITON_INTERPRET=1 is not set); swapping nothing, training goes on unfused "
                    f"(0 modules swapped). {INTERPRETER_NOTE}.",
                    UserWarning,
                    stacklevel=2,
                )
                self.ab_status = "not run: nothing swapped (the kernels cannot run on this device)"
                self._log_report(trainer)
            return
        self._graphs_at_setup = compiled_graphs()
        self._fallbacks_at_setup = fallbacks()
        if self.compiled_routes and self._routes_before is None:
            self._routes_before = compile_config.set_routes(**self.compiled_routes)
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
        if self._routes_before is not None:
            compile_config.COMPILED, self._routes_before = self._routes_before, None
        if self.ledger is not None:
            self.ledger.stop_recording()

    def swapped_counts(self) -> dict[str, int]:
        """Modules swapped now, per requested kind (0 where none): what the run actually trained with."""
        counts = self.report.counts()
        return {k: counts.get(k, 0) for k in resolve_kinds(self.kinds)}

    def fallbacks(self) -> dict[str, int]:
        """What ran something else than the kernels during this run (``fused_layers.fallbacks()`` since setup):
        message -> eager calls or compiled traces."""
        return fallbacks(since=self._fallbacks_at_setup)

    def summary(self) -> dict[str, Any]:
        """What the callback did, for a run summary (train.py's summary.json)."""
        out: dict[str, Any] = {
            "swapped": self.swapped_counts(),
            "swapped_total": len(self.report.swapped),
            "kernels_runnable": bool(self.enabled),
            "policy": self.policy,
            "restored": {n: {"kind": k, "speedup": s} for n, (k, s) in self.restored.items()},
            "ab_status": self.ab_status if (self.report.swapped or self.restored or self.ab_status != "not run")
            else "not run: nothing swapped",
            "kept_arm": self.kept_arm,
        }
        if self.compiled_routes:
            out["compiled_routes"] = dict(self.compiled_routes)
        if self.ab is not None and self.ab.results:
            out["step_ab"] = {a: {"kinds": r.kinds, "step_ms": r.step_ms, "median_ms": r.median_ms,
                                  "speedup": r.speedup, "speedup_lo": r.speedup_lo, "speedup_hi": r.speedup_hi}
                              for a, r in self.ab.results.items()}
            out["step_ab_meaningful"] = self.ab.meaningful
        if self.ab is not None:
            out["ab_cost"] = {"steps": self.ab.steps_run, "compile_seconds": dict(self.ab.compile_seconds),
                              "compiled_before_ab": list(self.ab.compiled_before_ab),
                              "rounds_left_out_for_compiling": list(self.ab.compile_rounds)}
        if self.kept is not None and self.kept.agrees is not None:
            out["kept_steps"] = self.kept.summary()
        if self.peak_memory_gib:
            out["peak_memory_gib"] = dict(self.peak_memory_gib)
        out["fallbacks"] = self.fallbacks()
        return out

    def _log_report(self, trainer: Trainer) -> None:
        rep = self.report
        rank_zero_info(str(rep))
        params: dict[str, Any] = {f"fused/swapped/{k}": n for k, n in self.swapped_counts().items()}
        params["fused/swapped_total"] = len(rep.swapped)
        params["fused/skipped"] = len(rep.skipped)
        params["fused/policy"] = self.policy
        for lg in trainer.loggers:
            try:
                lg.log_hyperparams(params)
                if hasattr(lg, "log_text") and rep.rows():
                    lg.log_text(key="fused/swap_report", columns=["module", "kind", "status", "detail"],
                                data=rep.rows())
            except Exception as e:  # a logger that cannot take them must not stop training
                log.warning("FusedLayersCallback: logger %s: %s", type(lg).__name__, e)

    # ----------------------------------------------------------------------------------------------
    # recording and measuring
    # ----------------------------------------------------------------------------------------------
    @property
    def measure_at(self) -> int:
        """Index of the training batch at whose start the per-module timing and then the A/B start."""
        return max(self.warmup_steps, self.record_steps)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not self.enabled or not self.report.swapped:
            return
        if self._train_batches == 0 and self.measure and not self._measured:
            self.ledger = Ledger(pl_module)
            self.ledger.start_recording()
        if self._train_batches < self.measure_at:
            self._step_at = (compiled_graphs(), time.perf_counter())
            return
        if self.measure and not self._measured:
            self._measure(trainer, pl_module)
        if self.ab is None and self.ab_status == "not run":
            self._start_ab(trainer, pl_module)
        if self.ab is not None and not self.ab.done:
            self.ab.begin_step()
        elif self.kept is not None and not self.kept.done:
            self.kept.begin_step()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._train_batches += 1
        if self._step_at is not None:
            graphs, t0 = self._step_at
            self._step_at = None
            if compiled_graphs() > graphs:
                self._compile_before_ab += time.perf_counter() - t0
        if self.ledger is not None and self._train_batches >= self.record_steps:
            dropped = self.ledger.recompiled
            self.ledger.stop_recording()
            if self.ledger.recompiled and not dropped:
                self._compile_before_ab = 0.0  # those graphs held the recording hooks: the next step compiles anew
        if self.ab is not None and not self.ab.results and self.ab._token is not None:
            self.ab.end_step()
            self.ab_steps.append(trainer.global_step)
            if self.ab.done:
                self._finish_ab(trainer, pl_module)
        elif self.kept is not None and self.kept._token is not None:
            self.kept.end_step()
            if self.kept.done:
                self._finish_kept(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.enabled:
            return
        self._log_fallbacks(trainer)
        if self.measure and not self._measured and self.ledger is not None and self.ledger.calls:
            self._measure(trainer, pl_module)
        if self.ab is not None and not self.ab.results:
            self.ab._token = None  # a step that started but did not end is not counted
            self._finish_ab(trainer, pl_module, ended_early=True)
        if self.kept is not None and self.kept.agrees is None and self.kept._stopped:
            self._finish_kept(trainer, pl_module)  # training ended during the check: what was timed
        if "ab" in self.peak_memory_gib:
            self.peak_memory_gib["kept"] = peak_memory_gib(trainer.strategy.root_device)
            self._log_peak(trainer)
        elif self.ab is None and self.ab_status == "not run" and self.report.swapped and self.ab_rounds > 0:
            self.ab_status = (f"not run: training ended after {self._train_batches} batches, before the A/B's start "
                              f"(batch {self.measure_at})")
            self._log_ab(trainer)

    # step-time A/B --------------------------------------------------------------------------------
    def _start_ab(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.ab_rounds <= 0:
            self.ab_status = "not run: ab_rounds=0"
            if self.policy == "faster":
                self._apply_module_policy(trainer, pl_module)
            return
        compiled = compiled_graphs() > self._graphs_at_setup or bool(self.ledger is not None and self.ledger.recompiled)
        if compiled and self.ab_compiled == "skip":
            self.ab_status = "not A/B-measured: the model runs under torch.compile and ab_compiled=skip"
            rank_zero_info("fused_layers: step times not compared (the model runs under torch.compile and "
                           "ab_compiled=skip); every swap kept.")
            self._log_ab(trainer)
            return
        swapped = {e.name: e.kind for e in self.report.swapped}
        warm = max(self.ab_warmup_rounds, 1) if compiled else self.ab_warmup_rounds  # each arm compiles first
        n_arms, rounds, why = fit_ab(swapped, self.ab_rounds, warm, self.ab_max_steps)
        if rounds is None:
            self.ab_status = why
            self._log_ab(trainer)
            return
        if compiled:
            _raise_recompile_limit(n_arms)
        before = {"all": self._compile_before_ab} if compiled and self._compile_before_ab > 0 else None
        self.ab = StepAB(pl_module, swapped, rounds=rounds, warmup_rounds=warm, timer=self.step_timer,
                         device=trainer.strategy.root_device, mapping=self.mapping, compiled_before=before)
        self.ab.compiled = compiled
        alone = ", each kind alone" if n_arms > 2 else ""
        rank_zero_info(f"fused_layers: timing the next {self.ab.steps} training steps unfused, fully fused{alone} "
                       f"({warm} warm-up + {rounds} measured round(s)"
                       f"{'; torch.compile builds one graph for each' if compiled else ''})")

    def _finish_ab(self, trainer: Trainer, pl_module: LightningModule, ended_early: bool = False) -> None:
        ab = self.ab
        assert ab is not None
        t0 = time.perf_counter()
        results = ab.finish()
        n = len(results.get("unfused").step_ms) if results.get("unfused") else 0
        how = "compiled, one graph per arm" if getattr(ab, "compiled", False) else "eager"
        if n == 0:
            self.ab_status = f"not A/B-measured: training ended during the A/B's warm-up ({ab._i} of {ab.steps} steps)"
        else:
            self.ab_status = (f"A/B-measured ({how}): {n} round(s) of {len(ab.arms)} arms"
                              + (", training ended before all rounds" if ended_early and n < ab.rounds else ""))
        if n:
            mode = "compiled" if getattr(ab, "compiled", False) else "eager"
            rank_zero_info(f"fused_layers: training step time ({mode}; speedup = unfused step time / step time, "
                           f"median of {n} round(s) and its min-max):\n" + ab.format())
        else:
            rank_zero_info("fused_layers: training ended before the step times were compared; every swap kept.")
        if self.policy == "faster" and n:
            if ab.meaningful:
                best = faster_arm(results)  # beats unfused in every round, else unfused
                best = trainer.strategy.broadcast(best, src=0)  # every rank keeps the same swaps
                self.kept_arm = best
                keep = ab.arms[best]
                ab.set_fused(keep)
                self._record_restored(pl_module, [nm for nm, k in ab.swapped.items() if k not in keep],
                                      {k: results[best].speedup if best != "unfused" else 1.0 for k in ab.kinds},
                                      how="step A/B")
                if keep:
                    rank_zero_info(f"fused_layers (policy=faster): keeping the fused {', '.join(keep)} "
                                   f"(step {results[best].speedup:.2f}x faster than unfused).")
                else:
                    rank_zero_info("fused_layers (policy=faster): no fused setting was faster than unfused in every "
                                   "round; every swap undone.")
            else:
                rank_zero_info("fused_layers (policy=faster): step times in the Triton interpreter say nothing about "
                               "GPU speed; every swap kept.")
        if n and ab.compile_seconds:
            rank_zero_info("fused_layers: the A/B's compiles (wall seconds of the steps that compiled a graph): "
                           + ", ".join(f"{a} {t:.1f} s" + (" (the run's steps before the A/B, whose graph it reused)"
                                                            if a in ab.compiled_before_ab else "")
                                       for a, t in ab.compile_seconds.items())
                           + (f"; {len(ab.compile_rounds)} measured round(s) held a compile and were left out"
                              if ab.compile_rounds else ""))
        if n and self.ab_check_steps > 0 and not ended_early:
            self.kept = KeptSteps(ab, self.kept_arm or "all", self.ab_check_steps)
        device = trainer.strategy.root_device
        self.peak_memory_gib["ab"] = peak_memory_gib(device)
        reset_peak_memory(device)  # from here on: the kept configuration's own peak
        self.paused_seconds += time.perf_counter() - t0
        self._log_ab(trainer)

    def _finish_kept(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The kept configuration's own steps against the A/B's verdict; policy=faster undoes a fused arm that
        the run's own steps show slower than every unfused step of the A/B."""
        kept, ab = self.kept, self.ab
        assert kept is not None and ab is not None
        kept.finish()
        if kept.agrees is None:
            return
        rank_zero_info("fused_layers: the kept configuration's own steps after the A/B:\n" + kept.format())
        if not kept.agrees:
            warnings.warn(f"FusedLayersCallback: the kept arm '{kept.arm}' ran {kept.median_ms:.3f} ms a step after "
                          "the A/B, outside the A/B's spread for it; the A/B's verdict does not describe this run"
                          + (" (policy=faster undoes it: slower than every unfused step)"
                             if kept.loses and self.policy == "faster" and ab.meaningful else "") + ".",
                          UserWarning, stacklevel=2)
        if self.policy == "faster" and kept.loses and ab.meaningful:
            # the kept arm's kinds are all that is fused: undoing them leaves the run unfused
            undo = trainer.strategy.broadcast([nm for nm, k in ab.swapped.items() if k in ab.arms[kept.arm]], src=0)
            ab.set_fused([])
            self.kept_arm = "unfused"
            self._record_restored(pl_module, undo, {}, how="kept steps")
            rank_zero_info(f"fused_layers (policy=faster): undid the fused {', '.join(ab.arms[kept.arm])}: the run's "
                           f"own steps ran {kept.median_ms:.3f} ms, slower than every unfused step of the A/B.")
        metrics = {"fused/kept_step_ms": kept.median_ms, "fused/kept_step_speedup": kept.speedup,
                   "fused/kept_agrees_with_ab": float(kept.agrees), **{f"fused/kept/{k}": float(c)
                                                                       for k, c in self.swapped_counts().items()}}
        for lg in trainer.loggers:
            try:
                lg.log_metrics(metrics, step=trainer.global_step)
            except Exception as e:  # a logger that cannot take them must not stop training
                log.warning("FusedLayersCallback: logger %s: %s", type(lg).__name__, e)

    def _log_fallbacks(self, trainer: Trainer) -> None:
        """What ran something else than the kernels, as the swap report's companion (W&B: a table)."""
        found = self.fallbacks()
        if not found:
            return
        rank_zero_info("fused_layers fell back during the run: "
                       + "; ".join(f"{m} ({n} calls or traces)" for m, n in found.items()))
        for lg in trainer.loggers:
            try:
                if hasattr(lg, "log_text"):
                    lg.log_text(key="fused/fallbacks", columns=["what", "calls or traces"],
                                data=[[m, n] for m, n in found.items()])
            except Exception as e:  # a logger that cannot take them must not stop training
                log.warning("FusedLayersCallback: logger %s: %s", type(lg).__name__, e)

    def _log_peak(self, trainer: Trainer) -> None:
        metrics = {f"fused/peak_memory_gib/{k}": v for k, v in self.peak_memory_gib.items() if v is not None}
        for lg in trainer.loggers:
            try:
                if metrics:
                    lg.log_metrics(metrics, step=trainer.global_step)
            except Exception as e:  # a logger that cannot take them must not stop training
                log.warning("FusedLayersCallback: logger %s: %s", type(lg).__name__, e)

    def _record_restored(self, pl_module: LightningModule, names: list[str], speedups: dict[str, float],
                         how: str) -> None:
        if not names:
            return
        kinds = {e.name: e.kind for e in self.report.swapped}
        self.report.swapped = [e for e in self.report.swapped if e.name not in names]
        for name in names:
            k = kinds.get(name, "?")
            if how == "step A/B":
                reason = f"restored by policy=faster: the step-time A/B kept arm '{self.kept_arm}'"
                self.restored[name] = (k, float("nan"))
            elif how == "kept steps":
                kept = self.kept
                reason = (f"restored by policy=faster: after the A/B the run's own steps ran {kept.median_ms:.3f} ms, "
                          f"slower than every unfused step of the A/B ({kept.speedup:.3f}x)")
                self.restored[name] = (k, kept.speedup)
            else:
                reason = f"restored by policy=faster: fwd+bwd speedup {speedups[name]:.3f}x"
                self.restored[name] = (k, speedups[name])
            self.report.skipped.append(SkipEntry(name, k, reason))

    def _log_ab(self, trainer: Trainer) -> None:
        metrics: dict[str, float] = {}
        ab = self.ab
        if ab is not None and ab.results:
            metrics.update(ab.metrics())
            metrics["fused/ab_meaningful"] = float(ab.meaningful)
            metrics["fused/ab_compiled"] = float(getattr(ab, "compiled", False))
            metrics["fused/ab_steps"] = float(ab.steps_run)
            metrics.update({f"fused/ab_compile_seconds/{a}": t for a, t in ab.compile_seconds.items()})
        counts = self.swapped_counts()
        metrics.update({f"fused/kept/{k}": float(n) for k, n in counts.items()})
        for kind in {k for k, _ in self.restored.values()}:
            metrics[f"fused/restored/{kind}"] = float(sum(1 for k, _ in self.restored.values() if k == kind))
        metrics["fused/swapped_total"] = float(sum(counts.values()))
        for lg in trainer.loggers:
            try:
                lg.log_metrics(metrics, step=trainer.global_step)
                if hasattr(lg, "log_hyperparams"):
                    lg.log_hyperparams({"fused/ab_status": self.ab_status,
                                        **{f"fused/swapped/{k}": n for k, n in counts.items()}})
                if self.log_table and hasattr(lg, "log_table") and ab is not None and ab.results:
                    def ratio(a: str, v: float) -> float | None:
                        return None if a == "unfused" else round(v, 4)

                    rows = [[a, ",".join(r.kinds) or "none (reference classes)", round(r.median_ms, 4),
                             ratio(a, r.speedup), ratio(a, r.speedup_lo), ratio(a, r.speedup_hi),
                             a != "unfused" and r.within_noise, len(r.step_ms)]
                            for a, r in ab.results.items()]
                    lg.log_table(key="fused/step_ab", data=rows,
                                 columns=["arm", "fused kinds", "median step ms", "step speedup vs unfused", "min",
                                          "max", "within noise", "rounds"])
                if self.log_table and hasattr(lg, "log_table") and self.measurements:
                    # per-module detail next to the step-time A/B of its kind (what policy=faster used)
                    step = ({k: r.speedup for k, r in ab.kind_speedups().items()}
                            if ab is not None and ab.results else {})
                    lg.log_table(key="fused/speedups", columns=[*TABLE_COLUMNS, "step A/B speedup of kind"],
                                 data=[[*m.row(), None if m.kind not in step else round(step[m.kind], 4)]
                                       for m in self.measurements])
            except Exception as e:  # a logger that cannot take them must not stop training
                log.warning("FusedLayersCallback: logger %s: %s", type(lg).__name__, e)

    # per-module detail ----------------------------------------------------------------------------
    def _measure(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._measured = True
        if self.ledger is None:
            return
        self.ledger.stop_recording()
        t0 = time.perf_counter()
        try:
            rows = self.ledger.measure(self.max_measure_seconds)
        except Exception as e:  # measurement is advisory: never stop the run for it
            warnings.warn(f"FusedLayersCallback: speed measurement failed ({type(e).__name__}: {e}); swaps kept.")
            rows = []
        self.measurements = rows
        if torch.cuda.is_available() and trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        self.paused_seconds += time.perf_counter() - t0
        self._log_measurements(trainer)

    def _apply_module_policy(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """policy=faster without a step A/B (ab_rounds=0): undo modules whose isolated timing lost."""
        rows = self.measurements
        if not rows:
            return
        if not all(r.meaningful for r in rows):  # interpreter / CPU timings say nothing about the GPU
            rank_zero_info("fused_layers (policy=faster): timings in the Triton interpreter say nothing about "
                           "GPU speed; every swap kept.")
            return
        slower = {n: s for n, s in self.ledger.module_speedups(rows).items() if s < 1.0}
        slower = trainer.strategy.broadcast(slower, src=0)  # every rank undoes the same swaps
        if not slower:
            return
        restore_modules(pl_module, list(slower))
        self._record_restored(pl_module, list(slower), slower, how="module")
        rank_zero_info(f"fused_layers (policy=faster): undid {len(slower)} swap(s) slower than their reference "
                       f"module: {', '.join(sorted(slower))}")
        self._log_ab(trainer)

    def _log_measurements(self, trainer: Trainer) -> None:
        rows = self.measurements
        metrics = Ledger.summary(rows)
        if rows:
            metrics["fused/measure_seconds"] = self.paused_seconds
            metrics["fused/timings_meaningful"] = float(all(r.meaningful for r in rows))
        if self.ledger is not None and self.ledger.not_measured:
            metrics["fused/not_measured"] = float(len(self.ledger.not_measured))
        if rows:
            log.debug("per-module timings (isolated calls, reference / fused, forward+backward):\n%s",
                      Ledger.format(rows))
            kinds = ", ".join(f"{k.rsplit('/', 1)[1]} {v:.3g}x" for k, v in metrics.items()
                              if k.startswith("fused/speedup/"))
            note = "" if all(r.meaningful for r in rows) else " (Triton interpreter: says nothing about GPU speed)"
            rank_zero_info(f"fused_layers: fused modules timed alone against their reference (forward+backward): "
                           f"{kinds}{note}")
        if not metrics:
            return
        for lg in trainer.loggers:
            try:
                lg.log_metrics(metrics, step=trainer.global_step)
                if self.log_table and hasattr(lg, "log_table") and rows and self.ab_rounds == 0:  # else with the A/B
                    lg.log_table(key="fused/speedups", columns=list(TABLE_COLUMNS), data=[r.row() for r in rows])
            except Exception as e:
                log.warning("FusedLayersCallback: logger %s: %s", type(lg).__name__, e)


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak allocated GiB on ``device`` since the last reset (None off CUDA)."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def reset_peak_memory(device: torch.device) -> None:
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)


def _raise_recompile_limit(n_arms: int) -> None:
    """One compiled graph per arm: make sure Dynamo's per-frame recompile limit leaves room for them."""
    try:
        import torch._dynamo.config as dc

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dc, name):
                setattr(dc, name, max(getattr(dc, name), 8 + n_arms))
                break
    except Exception:  # pragma: no cover
        pass


__all__ = ["FusedLayersCallback", "kernels_runnable", "check_args", "KINDS"]
