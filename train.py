"""Train the demo GPT with or without fused layers: ``python train.py [fused=true] [-m fused=false,true]``.

``python train.py --help`` lists the config groups and keys. Before Hydra makes a run dir, ``lm_demo/cli.py``
composes and checks every job's config: a config error is one line naming the key, exit code 2, and nothing
created. Lightning, torch and the model load only after that (inside `train`), so the help and a config
error answer at once (``--help``: 3 s instead of 35 s on a busy 2-core machine where Lightning's import took 25 s).

Then, per job, in the lightning-hydra-template's order: check the config -> datamodule -> model -> callbacks
-> loggers -> strategy (``strategy=NAME``: ``lm_demo/strategy.py``) -> trainer -> fit (resumed from ``ckpt_path``
when given) -> a validation at the end when the last
step did not have one -> a JSON summary of the run in its output dir (read by ``lm_demo/compare.py`` after a
multirun). Config: ``conf/`` (``python train.py --cfg job`` prints it; schema and checks in
``lm_demo/config.py``); the console and the log file: ``lm_demo/console.py``.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from lm_demo.cli import fail, preflight, remove_run_dir
from lm_demo.config import ConfigError, check_config, register_configs, resolve_ckpt_path

if TYPE_CHECKING:
    import lightning as L

register_configs()
log = logging.getLogger("train")
FILE_ONLY = {"console": False}  # `extra` of a log record that goes to the run's log file only


def instantiate_callbacks(cfg: DictConfig) -> list[L.Callback]:
    """Build each named entry of ``cfg.callbacks``; an entry with ``enabled: false`` is skipped."""
    out = []
    for name, entry in (cfg.get("callbacks") or {}).items():
        if entry is None:
            continue
        entry = OmegaConf.create(OmegaConf.to_container(entry, resolve=True))
        with open_dict(entry):
            enabled = entry.pop("enabled", True)
        if enabled:
            log.info(f"callback {name}: {entry._target_}", extra=FILE_ONLY)
            out.append(instantiate(entry))
    return out


def instantiate_loggers(cfg: DictConfig) -> list:
    return [instantiate(entry) for entry in (cfg.get("logger") or {}).values() if entry is not None]


def train(cfg: DictConfig) -> dict[str, Any]:
    """Check ``cfg``, instantiate everything, fit, write ``summary.json`` into ``cfg.output_dir``; return it."""
    check_config(cfg)  # before any logger or trainer exists: a bad path or setting fails in one line
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"))

    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lm_demo.console import progress_bar, setup_console
    from lm_demo.strategy import build_strategy
    from lm_demo.summary import (
        MemoryLogger,
        console_report,
        finish_wandb,
        fused_callback,
        relabel_wandb,
        run_summary,
        validated_at_end,
    )

    setup_console()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if torch.cuda.is_available():  # peak memory per job, also for the jobs of one multirun process
        gc.collect()  # the previous job's model and optimizer state
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    datamodule: L.LightningDataModule = instantiate(cfg.data)
    model: L.LightningModule = instantiate(cfg.model)
    callbacks = instantiate_callbacks(cfg)
    if cfg.trainer.get("enable_progress_bar") is not False and (bar := progress_bar()) is not None:
        callbacks.append(bar)
    loggers = instantiate_loggers(cfg)
    memory = MemoryLogger()  # last: trainer.logger (checkpoint dirs etc.) stays the configured one
    strategy = build_strategy(cfg.get("strategy"), model)  # None: trainer.strategy decides (strategy=auto)
    extra = {"strategy": strategy} if strategy is not None else {}
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=[*loggers, memory], **extra)

    for lg in loggers:  # the whole resolved config, so W&B can filter and group on `fused`, sizes, ...
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))

    t0 = time.perf_counter()
    try:
        if ckpt_path:
            log.info(f"resuming from {ckpt_path}")
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        fit_seconds = time.perf_counter() - t0
        # loggers (the memory one too) record on rank 0 only: its answer holds for every rank, or the ranks disagree
        # on running the validation's collectives
        validated = trainer.strategy.broadcast(validated_at_end(memory, trainer))
        if trainer.global_step > 0 and not validated and cfg.trainer.get("limit_val_batches") != 0:
            trainer.validate(model, datamodule=datamodule, verbose=False)  # runs shorter than val_check_interval
        ckpt_cb = next((cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)), None)
        last_ckpt = None
        if ckpt_cb is not None and ckpt_cb.dirpath:
            last_ckpt = Path(ckpt_cb.dirpath) / "last.ckpt"
            trainer.save_checkpoint(last_ckpt, weights_only=False)  # the final state (optimizer too), always
    except BaseException:
        finish_wandb(loggers, exit_code=1)  # marked failed, not left running
        raise

    summary = run_summary(trainer, cfg, memory, fit_seconds, fused_cb=fused_callback(callbacks))
    if "peak_memory_gib" in summary["metrics"]:  # this job's own peak (statistics reset at its start)
        for lg in loggers:
            lg.log_metrics({"peak_memory_gib": summary["metrics"]["peak_memory_gib"]}, step=trainer.global_step)
    summary["resumed_from"] = ckpt_path
    summary["checkpoint"] = str(last_ckpt) if last_ckpt else None
    if trainer.is_global_zero:
        relabel_wandb(loggers, summary)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    wandb_dir = finish_wandb(loggers) if trainer.is_global_zero else None
    if trainer.is_global_zero:
        log.info(console_report(summary, trainer, fit_seconds, out_dir, loggers, last_ckpt, wandb_dir))
    return summary


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> float | None:
    from lm_demo.strategy import distributed_job

    try:
        with distributed_job():  # under -m, the ranks Lightning starts run this job alone; then its group ends
            summary = train(cfg)
    except ConfigError as e:  # the preflight passed this config: only a file that vanished since gets here
        if HydraConfig.initialized():
            remove_run_dir(HydraConfig.get().runtime.output_dir, HydraConfig.get().job.name)
        fail(str(e))
    return summary["metrics"].get("val/loss")  # for hyper-parameter sweepers (optuna etc.)


def main() -> None:
    preflight(sys.argv[1:], app_file=__file__)  # --help; a config error: one line, exit 2, nothing created
    hydra_main()


if __name__ == "__main__":
    main()
