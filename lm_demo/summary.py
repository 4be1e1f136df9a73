"""What a run leaves for ``lm_demo/compare.py``: `MemoryLogger` and `run_summary` (``summary.json``), and
train.py's end-of-job helpers (W&B run labels and finish, the report printed at the end).

`MemoryLogger` is a Lightning logger that keeps every scalar logged during the run in memory.

train.py always adds one (besides the configured loggers, also with ``logger=none``), so the run's JSON
summary holds what callbacks log straight to the loggers -- ThroughputMonitor's tokens/s and the fused
callback's ``fused/speedup/<kind>`` -- without depending on either callback's internals.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf


class MemoryLogger(Logger):
    """Last value and (step, value) history of every scalar metric; writes nothing."""

    def __init__(self, max_history: int = 5000):
        super().__init__()
        self.last: dict[str, float] = {}
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.max_history = max_history

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> None:
        return None

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        for k, v in metrics.items():
            try:
                v = float(v)
            except (TypeError, ValueError):
                continue
            self.last[k] = v
            h = self.history.setdefault(k, [])
            if len(h) < self.max_history:
                h.append((int(step) if step is not None else len(h), v))


def run_tag(fused_requested: bool, swapped_total: int | None) -> str:
    """The label of what ran: ``unfused``, ``fused``, or ``fused (0 swapped)`` where fused=true swapped nothing
    (no runnable kernels, no swappable module, or policy=faster undid every swap)."""
    if not fused_requested:
        return "unfused"
    return "fused" if swapped_total else "fused (0 swapped)"


def run_summary(trainer: L.Trainer, cfg: DictConfig, memory: MemoryLogger, fit_seconds: float,
                fused_cb: Any = None) -> dict[str, Any]:
    """What compare.py reads: the run's identity, what the fused callback actually did (swapped modules per
    kind, the step-time A/B), the last value of every metric logged (``memory``: ThroughputMonitor's, the
    fused callback's speedups, losses) and ``callback_metrics``, the loss and throughput curves."""
    metrics: dict[str, float] = dict(memory.last)
    for k, v in trainer.callback_metrics.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            metrics[k] = float(v)
        elif isinstance(v, (int, float)):
            metrics[k] = float(v)
    last = getattr(trainer.lightning_module, "last_train_loss", None)
    if "train/loss" not in metrics and last is not None:  # a final validation clears callback_metrics
        metrics["train/loss"] = float(last)
    if torch.cuda.is_available() and trainer.strategy.root_device.type == "cuda":
        # train.py resets the peak statistics at the start of each job (one process runs a whole multirun)
        metrics.setdefault("peak_memory_gib", torch.cuda.max_memory_allocated(trainer.strategy.root_device) / 2**30)
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    fused_info = fused_cb.summary() if fused_cb is not None else None
    swapped_total = fused_info["swapped_total"] if fused_info else 0
    return {
        "fused": bool(cfg.fused),
        "fused_effective": bool(cfg.fused) and swapped_total > 0,
        "fused_layers": fused_info,
        "tag": run_tag(bool(cfg.fused), swapped_total),
        "group": cfg.run_group,
        "seed": int(cfg.seed),
        "attn_impl": config["model"]["attn_impl"],
        "compile": bool(config["model"]["compile"]),
        "precision": str(config["trainer"]["precision"]),
        "overrides": overrides(),
        "global_step": int(trainer.global_step),
        "fit_seconds": fit_seconds,
        "metrics": metrics,
        "history": {k: memory.history[k] for k in ("train/loss", "val/loss", "train/device/items_per_sec",
                                                   "train/device/batches_per_sec") if k in memory.history},
        "config": config,
    }


def overrides() -> list[str]:
    """This job's command-line overrides (empty outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def wandb_offline(lg: Logger) -> bool:
    return bool(getattr(lg, "_offline", False)) or os.environ.get("WANDB_MODE", "") in ("offline", "dryrun")


def fused_callback(callbacks: list) -> Any:
    from fused_layers.lightning import FusedLayersCallback

    return next((cb for cb in callbacks if isinstance(cb, FusedLayersCallback)), None)


def finish_wandb(loggers: list, exit_code: int = 0) -> Path | None:
    """End this job's W&B run (one per job, also inside a multirun's single process); its dir."""
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            import wandb

            if wandb.run is not None:
                run_dir = Path(wandb.run.dir).parent
                wandb.finish(exit_code=exit_code)
                return run_dir
    return None


def relabel_wandb(loggers: list, summary: dict[str, Any]) -> None:
    """What actually ran, in W&B: the tag ("fused (0 swapped)" where the swap did nothing), swapped counts
    per kind in config and summary, and the step-time A/B's status."""
    fused = summary.get("fused_layers") or {}
    for lg in loggers:
        if not isinstance(lg, WandbLogger):
            continue
        run = lg.experiment
        try:
            run.tags = [summary["tag"]]
            extra = {"fused/swapped_total": fused.get("swapped_total", 0),
                     "fused/ab_status": fused.get("ab_status", "-")}
            # peak memory of the configuration the run kept (after the A/B) next to the A/B's own
            extra.update({f"fused/peak_memory_gib/{k}": v for k, v in (fused.get("peak_memory_gib") or {}).items()
                          if v is not None})
            kept = fused.get("kept_steps") or {}
            if kept.get("agrees") is not None:
                extra.update({"fused/kept_step_ms": kept["median_ms"], "fused/kept_agrees_with_ab": kept["agrees"]})
            extra.update({f"fused/swapped/{k}": n for k, n in (fused.get("swapped") or {}).items()})
            run.summary.update(extra)
            run.config.update({"fused_effective": summary["fused_effective"], "run_tag_effective": summary["tag"],
                               "fused_swapped": fused.get("swapped", {})}, allow_val_change=True)
        except Exception as e:  # labels must not fail a finished run
            logging.getLogger("train").warning(f"W&B relabel failed: {type(e).__name__}: {e}")


def validated_at_end(memory: MemoryLogger, trainer: L.Trainer) -> bool:
    h = memory.history.get("val/loss")
    return bool(h) and h[-1][0] >= trainer.global_step - 1


def console_report(summary: dict[str, Any], trainer: L.Trainer, fit_seconds: float, out_dir: Path, loggers: list,
                   last_ckpt: Path | None, wandb_dir: Path | None) -> str:
    """The lines train.py prints at the end of a job: steps, tokens/s, losses, and where everything went."""
    m = summary["metrics"]
    tps = m.get("train/device/items_per_sec")
    lines = [f"[{summary['tag']}] {trainer.global_step} steps in {fit_seconds:.0f} s"
             + (f", {tps:,.0f} tokens/s" if tps else "")
             + f", train/loss {m.get('train/loss', float('nan')):.4f}"
             + (f", val/loss {m['val/loss']:.4f}" if "val/loss" in m else ", no validation"),
             f"  summary:    {out_dir / 'summary.json'}"]
    for lg in loggers:
        if isinstance(lg, CSVLogger):
            lines.append(f"  metrics:    {Path(lg.log_dir) / 'metrics.csv'}")
    if last_ckpt:
        lines += [f"  checkpoint: {last_ckpt}", f"    resume: python train.py ckpt_path={last_ckpt}"]
    if wandb_dir is not None:
        lg = next(lg for lg in loggers if isinstance(lg, WandbLogger))
        if wandb_offline(lg):
            lines += [f"  W&B offline run: {wandb_dir}",
                      f"    view: wandb leet {wandb_dir}", f"    upload: wandb sync {wandb_dir}",
                      "    log online next time: logger.wandb.offline=false"]
        else:
            lines.append(f"  W&B run: {wandb_dir}")
    return "\n".join(lines)
