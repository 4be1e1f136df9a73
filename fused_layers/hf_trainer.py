"""``FusedLayersTrainerCallback``: the fused kernels in a Hugging Face ``Trainer`` run, with a step-time A/B.

Needs transformers (``pip install 'fused-layers[hf]'``).  Usage::

    from fused_layers.hf_trainer import FusedLayersTrainerCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[FusedLayersTrainerCallback()])
    trainer.train()

Where the swap happens: ``on_init_end``, at the end of ``Trainer.__init__``, on the model the Trainer holds.  That is
before ``train()`` builds the optimizer, before accelerate wraps the model (DDP, FSDP, DeepSpeed) and before
``torch_compile=True`` compiles it; every rank runs the same deterministic swap.  A callback added later
(``trainer.add_callback``) swaps at ``on_train_begin`` instead (swaps are class changes that keep the parameters, so an
optimizer built before still holds the right tensors).

What is measured, as ``fused_layers.lightning.FusedLayersCallback`` does: after ``warmup_steps`` optimizer steps, the
next optimizer steps run interleaved with and without the swaps (``fused_layers.ledger.StepAB``: arms ``unfused``,
``all`` and one per swapped kind; ``ab_warmup_rounds`` uncounted rounds, then ``ab_rounds`` measured rounds, at most
``ab_max_steps`` steps).  A step is timed from ``on_step_begin`` to ``on_step_end``: every micro-batch of its gradient
accumulation and the optimizer step.  ``policy="faster"`` then keeps the fastest arm that beat ``unfused`` in every
round (else ``unfused``), rank 0's choice broadcast so every rank keeps the same swaps.

Reported: the swap report and the A/B table on the console (rank 0); the metrics (``fused/swapped/<kind>``,
``fused/step_speedup/<kind>`` with ``_lo``/``_hi``, ``fused/step_ms/unfused|all``, ``fused/kept/<kind>``) in
``state.log_history`` and, when a W&B run is active, in that run (with the tables ``fused/swap_report`` and
``fused/step_ab``); ``callback.summary()`` returns all of it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError as e:  # the library itself needs torch and triton only
    raise ImportError("fused_layers.hf_trainer needs transformers: pip install 'fused-layers[hf]'") from e

from .ledger import StepAB, faster_arm, fit_ab
from .ops._common import fallbacks
from .swap import SwapReport, resolve_kinds, swap_modules

log = logging.getLogger(__name__)

POLICIES = ("always", "faster")


def _check(policy: str, warmup_steps: int, ab_rounds: int, ab_warmup_rounds: int, ab_max_steps: int,
           kinds: Any) -> None:
    if policy not in POLICIES:
        raise ValueError(f"FusedLayersTrainerCallback: argument 'policy' must be one of {list(POLICIES)}, "
                         f"got {policy!r}")
    for arg, val, lo in (("warmup_steps", warmup_steps, 0), ("ab_rounds", ab_rounds, 0),
                         ("ab_warmup_rounds", ab_warmup_rounds, 0), ("ab_max_steps", ab_max_steps, 0)):
        if not isinstance(val, int) or isinstance(val, bool) or val < lo:
            raise ValueError(f"FusedLayersTrainerCallback: argument '{arg}' must be an int >= {lo}, got {val!r}")
    resolve_kinds(kinds)  # ValueError naming the unknown kinds


def _rank_zero_choice(value: str) -> str:
    """Rank 0's ``value`` on every rank (as is where no process group is initialized)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class FusedLayersTrainerCallback(TrainerCallback):
    """Swap the model's layers for their fused drop-ins when the ``Trainer`` is built, time the training step with
    and without them, keep what is faster (``policy="faster"``), and report it.

    Args:
        kinds, include, exclude, mapping: what to swap (``fused_layers.swap_modules``'s arguments).
        policy: ``"always"`` keeps every swap; ``"faster"`` keeps the arm the step-time A/B found fastest.
        warmup_steps: optimizer steps before the A/B starts.
        ab_rounds: measured rounds of the A/B (0: no A/B).
        ab_warmup_rounds: uncounted rounds first (first use of each arm; a compiled graph per arm).
        ab_max_steps: bound on the A/B's optimizer steps (rounds are reduced to fit).
        step_timer: ``None`` (CUDA events; ``time.perf_counter`` on the CPU, marked not meaningful) or an object with
            ``start() / stop(token) / elapsed_ms(stopped)`` and ``meaningful`` (tests).
    """

    def __init__(self, kinds: Any = None, include: list[str] | None = None, exclude: list[str] | None = None,
                 mapping: dict[str, str] | None = None, policy: str = "always", warmup_steps: int = 3,
                 ab_rounds: int = 5, ab_warmup_rounds: int = 1, ab_max_steps: int = 40, step_timer: Any = None) -> None:
        _check(policy, warmup_steps, ab_rounds, ab_warmup_rounds, ab_max_steps, kinds)
        self.kinds = kinds
        self.include, self.exclude = list(include or []), list(exclude or [])
        self.mapping = dict(mapping or {})
        self.policy = policy
        self.warmup_steps, self.ab_rounds = int(warmup_steps), int(ab_rounds)
        self.ab_warmup_rounds, self.ab_max_steps = int(ab_warmup_rounds), int(ab_max_steps)
        self.step_timer = step_timer
        self.report: SwapReport | None = None
        self.ab: StepAB | None = None
        self.ab_status = "not run"
        self.kept_arm: str | None = None
        self._model: torch.nn.Module | None = None
        self._steps = 0
        self._logged: dict[str, Any] = {}
        self._fallbacks_at_swap: dict[str, int] = {}  #: ``fused_layers.fallbacks()`` when the model was swapped

    # -- swapping ------------------------------------------------------------------------------------
    def _swap(self, model: torch.nn.Module | None, state: Any) -> None:
        if self.report is not None or model is None:
            return
        from .ops._common import triton_runnable

        self._model = model
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
        if not triton_runnable(torch.empty(0, device=device)) and not torch.cuda.is_available():
            self.report = SwapReport()
            self.ab_status = "not run: nothing swapped (the kernels cannot run on this machine)"
            log.warning("FusedLayersTrainerCallback: no CUDA and TRITON_INTERPRET=1 is not set; nothing swapped")
            return
        self._fallbacks_at_swap = fallbacks()
        self.report = swap_modules(model, kinds=self.kinds, include=self.include, exclude=self.exclude,
                                   mapping=self.mapping)
        if self.ab_rounds == 0:
            self.ab_status = "not run: ab_rounds=0"
        if state is None or state.is_world_process_zero:
            log.info("%s", self.report)
        counts = self.swapped_counts()
        self._record(state, {f"fused/swapped/{k}": n for k, n in counts.items()}, table="swap_report")

    def on_init_end(self, args, state, control, model=None, **kwargs):
        self._swap(model, state)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._swap(model, state)  # a callback added after the Trainer was built

    def swapped_counts(self) -> dict[str, int]:
        counts = self.report.counts() if self.report is not None else {}
        return {k: counts.get(k, 0) for k in resolve_kinds(self.kinds)}

    # -- the step-time A/B ------------------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        if self.report is None or not self.report.swapped:
            return
        if self.ab is None and self.ab_status == "not run" and self._steps >= self.warmup_steps:
            self._start_ab(args, state)
        if self.ab is not None and not self.ab.results:
            self.ab.begin_step()

    def on_step_end(self, args, state, control, **kwargs):
        self._steps += 1
        ab = self.ab
        if ab is not None and not ab.results and ab._token is not None:
            ab.end_step()
            if ab.done:
                self._finish_ab(state)

    def fallbacks(self) -> dict[str, int]:
        """What ran something else than the kernels since the swap (``fused_layers.fallbacks()``): message -> eager
        calls or compiled traces."""
        return fallbacks(since=self._fallbacks_at_swap)

    def on_train_end(self, args, state, control, **kwargs):
        found = self.fallbacks()
        if found and (state is None or state.is_world_process_zero):
            log.info("fused_layers fell back during training: %s",
                     "; ".join(f"{m} ({n} calls or traces)" for m, n in found.items()))
        if self.ab is not None and not self.ab.results:
            self.ab._token = None  # a step that began but did not end is not counted
            self._finish_ab(state, ended_early=True)
        elif self.ab is None and self.ab_status == "not run" and self.report is not None and self.report.swapped \
                and self.ab_rounds > 0:
            self.ab_status = (f"not run: training ended after {self._steps} steps, before the A/B's start "
                              f"(step {self.warmup_steps})")

    def _start_ab(self, args, state) -> None:
        swapped = {e.name: e.kind for e in self.report.swapped}
        n_arms, rounds, why = fit_ab(swapped, self.ab_rounds, self.ab_warmup_rounds, self.ab_max_steps)
        if rounds is None:
            self.ab_status = why
            return
        device = getattr(args, "device", None) or torch.device("cpu")
        self.ab = StepAB(self._model, swapped, rounds=rounds, warmup_rounds=self.ab_warmup_rounds,
                         timer=self.step_timer, device=device, mapping=self.mapping)
        if state.is_world_process_zero:
            log.info("fused_layers: timing the next %d optimizer steps unfused, fully fused%s (%d warm-up + %d "
                     "measured round(s))", self.ab.steps, ", each kind alone" if n_arms > 2 else "",
                     self.ab_warmup_rounds, rounds)

    def _finish_ab(self, state, ended_early: bool = False) -> None:
        ab = self.ab
        results = ab.finish()
        n = len(results["unfused"].step_ms) if results.get("unfused") else 0
        if n == 0:
            self.ab_status = f"not A/B-measured: training ended during the A/B's warm-up ({ab._i} of {ab.steps} steps)"
        else:
            self.ab_status = (f"A/B-measured: {n} round(s) of {len(ab.arms)} arms"
                              + (", training ended before all rounds" if ended_early and n < ab.rounds else ""))
            if state.is_world_process_zero:
                log.info("fused_layers: optimizer step time (speedup = unfused / arm, median of %d round(s) and its "
                         "min-max):\n%s", n, ab.format())
        if self.policy == "faster" and n and ab.meaningful:
            best = _rank_zero_choice(faster_arm(results))  # every rank keeps the same swaps
            self.kept_arm = best
            ab.set_fused(ab.arms[best])
            gone = [name for name, k in ab.swapped.items() if k not in ab.arms[best]]
            self.report.swapped = [e for e in self.report.swapped if e.name not in gone]
            if state.is_world_process_zero:
                kept = ", ".join(ab.arms[best]) or "nothing (every swap undone)"
                log.info("fused_layers (policy=faster): keeping %s", kept)
        metrics = dict(ab.metrics()) if n else {}
        metrics["fused/ab_meaningful"] = float(ab.meaningful)
        metrics.update({f"fused/kept/{k}": float(v) for k, v in self.swapped_counts().items()})
        self._record(state, metrics, table="step_ab")

    # -- reporting ------------------------------------------------------------------------------------
    def _record(self, state: Any, metrics: dict[str, Any], table: str) -> None:
        self._logged.update(metrics)
        if state is not None:
            state.log_history.append({**metrics, "step": state.global_step})
            if not state.is_world_process_zero:
                return
        wandb = sys.modules.get("wandb")
        run = getattr(wandb, "run", None) if wandb is not None else None
        if run is None:
            return
        try:
            run.log(dict(metrics), commit=False)
            if table == "swap_report" and self.report is not None and self.report.rows():
                run.log({"fused/swap_report": wandb.Table(columns=["module", "kind", "status", "detail"],
                                                          data=self.report.rows())}, commit=False)
            if table == "step_ab" and self.ab is not None and self.ab.results:
                rows = [[a, ",".join(r.kinds) or "none", r.median_ms, None if a == "unfused" else r.speedup,
                         None if a == "unfused" else r.speedup_lo, None if a == "unfused" else r.speedup_hi,
                         len(r.step_ms)] for a, r in self.ab.results.items()]
                run.log({"fused/step_ab": wandb.Table(columns=["arm", "fused kinds", "median step ms", "speedup",
                                                               "min", "max", "rounds"], data=rows)}, commit=False)
            run.summary.update({"fused/ab_status": self.ab_status})
        except Exception as e:  # a logger that cannot take them must not stop training
            log.warning("FusedLayersTrainerCallback: W&B: %s", e)

    def summary(self) -> dict[str, Any]:
        """What the callback did: swapped counts, the A/B's status and results, the kept arm."""
        out: dict[str, Any] = {"swapped": self.swapped_counts(), "policy": self.policy, "ab_status": self.ab_status,
                               "kept_arm": self.kept_arm, "metrics": dict(self._logged), "fallbacks": self.fallbacks()}
        if self.ab is not None and self.ab.results:
            out["step_ab"] = {a: {"kinds": r.kinds, "median_ms": r.median_ms, "speedup": r.speedup,
                                  "speedup_lo": r.speedup_lo, "speedup_hi": r.speedup_hi}
                              for a, r in self.ab.results.items()}
        return out


__all__ = ["FusedLayersTrainerCallback"]
