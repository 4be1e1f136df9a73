"""`MemoryLogger`: a Lightning logger that keeps every scalar logged during the run in memory.

train.py always adds one (besides the configured loggers, also with ``logger=none``), so the run's JSON
summary holds what callbacks log straight to the loggers -- ThroughputMonitor's tokens/s and the fused
callback's ``fused/speedup/<kind>`` -- without depending on either callback's internals.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only


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
