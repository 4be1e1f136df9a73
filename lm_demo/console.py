"""What train.py shows on the console, and what goes to the log file only.

The console gets the job's own lines, the callbacks' reports and every warning; Lightning's own
informational lines ("GPU available: ...", "`Trainer.fit` stopped: ...") and the setup details go to the
run's log file only (``<output_dir>/train.log``, written by Hydra with times and logger names).
`ConsoleHandler` writes each line to the ``sys.stdout`` of the moment: while the progress bar is live, Rich
has replaced it with a proxy that prints above the bar, so no line is glued to the bar or makes it redraw
below itself (a handler holding the original stream does both). `ProgressBar` is Lightning's Rich bar with
plain labels. Hydra's logging config for this: ``conf/hydra/job_logging/console.yaml``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import warnings
from typing import Any

#: where Lightning's own code lives: its informational records (by calling file) stay off the console
_LIGHTNING_DIRS = tuple(
    os.path.join(p, "") for name in ("lightning", "lightning_utilities", "lightning_fabric", "pytorch_lightning")
    if (spec := importlib.util.find_spec(name)) is not None for p in (spec.submodule_search_locations or [])
)


def console_only(record: logging.LogRecord) -> bool:
    """Whether a record belongs on the console: warnings always; not Lightning's own informational lines, nor
    records logged with ``extra={"console": False}`` (the log file still has both)."""
    if record.levelno >= logging.WARNING:
        return True
    if getattr(record, "console", True) is False:
        return False
    return not (record.name.startswith("lightning") and record.pathname.startswith(_LIGHTNING_DIRS))


class ConsoleHandler(logging.StreamHandler):
    """A stream handler on the current ``sys.stdout`` (looked up per record), filtered by `console_only`."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.addFilter(console_only)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ and setStream assign it; the property wins
        pass


class ConsoleFormatter(logging.Formatter):
    """The message alone; ``warning: `` / ``error: `` before a warning or an error."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


class _DropLightningTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("\U0001f4a1 Tip")


def setup_console() -> None:
    """Set up the job's console: Lightning's loggers go through the handlers Hydra configured (console and
    log file) instead of their own stderr handler; Lightning's "Tip" adverts (litlogger, litmodels) are
    dropped; so is a deprecation warning Lightning 2.6 triggers in torch's pytree (``isinstance(treespec,
    LeafSpec)``). W&B's console lines are off through ``settings.silent`` (conf/logger/wandb.yaml); the
    Triton interpreter's numpy warnings are silenced where kernels are launched."""
    root_has_handlers = bool(logging.getLogger().handlers)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # each adds a stderr handler at import
        lg = logging.getLogger(name)
        if root_has_handlers:  # under Hydra: one set of handlers, the file gets Lightning's lines too
            for h in [h for h in lg.handlers if type(h) is logging.StreamHandler]:
                lg.removeHandler(h)
            lg.propagate = True
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningTips) for f in lg.filters):
            lg.addFilter(_DropLightningTips())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    # resuming into a new run dir (by design: ckpt_path=... starts a new output dir) is not news, nor that a run
    # resumed mid-epoch draws its batches afresh (the demo's loaders keep no position; step and optimizer continue)
    warnings.filterwarnings("ignore", message=r"The dirpath has changed from")
    warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")


def progress_bar() -> Any:
    """The job's progress bar (`ProgressBar`), or ``None`` (Lightning's default) where Rich is missing."""
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE, RichProgressBar

    if not _RICH_AVAILABLE:
        return None

    class ProgressBar(RichProgressBar):
        """Lightning's Rich progress bar, plainer: "Epoch 0" rather than "Epoch 0/-2" when training is bounded
        by steps, no logger version (``v_num``) among the metrics, and the validation after fit (train.py's
        last one) leaves no bar behind: the end-of-run summary has its loss."""

        def _get_train_description(self, current_epoch: int) -> str:
            text = f"Epoch {current_epoch}"
            if self.trainer.max_epochs is not None and self.trainer.max_epochs > 0:
                text += f"/{self.trainer.max_epochs - 1}"
            return f"{text:{len(self.validation_description)}}"

        def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
            items = super().get_metrics(trainer, pl_module)
            items.pop("v_num", None)
            return items

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            super().on_validation_end(trainer, pl_module)
            if trainer.state.fn == "validate" and self.progress is not None and self.val_progress_bar_id is not None:
                self.progress.update(self.val_progress_bar_id, advance=0, visible=False)
                self.refresh()

    return ProgressBar()
