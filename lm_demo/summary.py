"""What a run leaves for ``lm_demo/compare.py``: `MemoryLogger` and `run_summary` (``summary.json``).

`MemoryLogger` is a Lightning logger that keeps every scalar logged during the run in memory.

train.py always adds one (besides the configured loggers, also with ``logger=none``), so the run's JSON
summary holds what callbacks log straight to the loggers -- ThroughputMonitor's tokens/s and the fused
callback's ``fused/speedup/<kind>`` -- without depending on either callback's internals.
"""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
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


def run_summary(trainer: L.Trainer, cfg: DictConfig, memory: MemoryLogger, fit_seconds: float) -> dict[str, Any]:
    """What compare.py reads: the run's identity, the last value of every metric logged (``memory``:
    ThroughputMonitor's, the fused callback's speedups, losses) and ``callback_metrics``, and the loss curves."""
    metrics: dict[str, float] = dict(memory.last)
    for k, v in trainer.callback_metrics.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            metrics[k] = float(v)
        elif isinstance(v, (int, float)):
            metrics[k] = float(v)
    if torch.cuda.is_available() and trainer.strategy.root_device.type == "cuda":
        metrics.setdefault("peak_memory_gib", torch.cuda.max_memory_allocated(trainer.strategy.root_device) / 2**30)
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return {
        "fused": bool(cfg.fused),
        "tag": cfg.run_tag,
        "group": cfg.run_group,
        "seed": int(cfg.seed),
        "attn_impl": config["model"]["attn_impl"],
        "compile": bool(config["model"]["compile"]),
        "precision": str(config["trainer"]["precision"]),
        "overrides": overrides(),
        "global_step": int(trainer.global_step),
        "fit_seconds": fit_seconds,
        "metrics": metrics,
        "history": {k: memory.history[k] for k in ("train/loss", "val/loss") if k in memory.history},
        "config": config,
    }


def overrides() -> list[str]:
    """This job's command-line overrides (empty outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def wandb_offline(lg: Logger) -> bool:
    return bool(getattr(lg, "_offline", False)) or os.environ.get("WANDB_MODE", "") in ("offline", "dryrun")
