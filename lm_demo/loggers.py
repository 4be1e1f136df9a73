"""Loggers of the demo: Lightning's ``WandbLogger`` minus one console warning.

Lightning 2.6 always passes ``anonymous=None`` to ``wandb.init``; wandb >= 0.2x warns "The anonymous
setting has no effect and will be removed" for any value but unset. This subclass drops the key when it is
``None`` (the argument does nothing in those wandb versions either way).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import WandbLogger as _WandbLogger


class WandbLogger(_WandbLogger):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)
