"""Train the demo GPT with or without fused layers: ``python train.py [fused=true] [-m fused=false,true]``.

Order as in the lightning-hydra-template: check the config -> datamodule -> model -> callbacks -> loggers ->
trainer -> fit (resumed from ``ckpt_path`` when given) -> a validation at the end when the last step did not
have one -> a JSON summary of the run in its output dir (read by ``lm_demo/compare.py`` after a multirun).
Config: ``conf/`` (``python train.py --cfg job`` prints it; schema and checks in ``lm_demo/config.py``).
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from omegaconf import DictConfig, OmegaConf, open_dict

from lm_demo.config import ConfigError, check_config, register_configs, resolve_ckpt_path
from lm_demo.summary import MemoryLogger, quiet_console, run_summary, wandb_offline

register_configs()
log = logging.getLogger("train")


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
            log.info(f"callback {name}: {entry._target_}")
            out.append(instantiate(entry))
    return out


def instantiate_loggers(cfg: DictConfig) -> list:
    return [instantiate(entry) for entry in (cfg.get("logger") or {}).values() if entry is not None]


def _fused_callback(callbacks: list) -> Any:
    from callbacks import FusedLayersCallback

    return next((cb for cb in callbacks if isinstance(cb, FusedLayersCallback)), None)


def _finish_wandb(loggers: list, exit_code: int = 0) -> Path | None:
    """End this job's W&B run (one per job, also inside a multirun's single process); its dir."""
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            import wandb

            if wandb.run is not None:
                run_dir = Path(wandb.run.dir).parent
                wandb.finish(exit_code=exit_code)
                return run_dir
    return None


def _relabel_wandb(loggers: list, summary: dict[str, Any]) -> None:
    """What actually ran, in W&B: the tag ("fused (0 swapped)" where the swap did nothing), swapped counts
    per kind in config and summary, and the step-time A/B's status."""
    fused = summary.get("fused_layers") or {}
    for lg in loggers:
        if not isinstance(lg, WandbLogger):
            continue
        run = lg.experiment
        try:
            run.tags = [summary["tag"]]
            extra = {"fused/swapped_total": fused.get("swapped_total", 0), "fused/ab_status": fused.get("ab_status", "-")}
            extra.update({f"fused/swapped/{k}": n for k, n in (fused.get("swapped") or {}).items()})
            run.summary.update(extra)
            run.config.update({"fused_effective": summary["fused_effective"], "run_tag_effective": summary["tag"],
                               "fused_swapped": fused.get("swapped", {})}, allow_val_change=True)
        except Exception as e:  # labels must not fail a finished run
            log.warning(f"W&B relabel failed: {type(e).__name__}: {e}")


def _validated_at_end(memory: MemoryLogger, trainer: L.Trainer) -> bool:
    h = memory.history.get("val/loss")
    return bool(h) and h[-1][0] >= trainer.global_step - 1


def train(cfg: DictConfig) -> dict[str, Any]:
    """Check ``cfg``, instantiate everything, fit, write ``summary.json`` into ``cfg.output_dir``; return the summary."""
    check_config(cfg)  # before any logger or trainer exists: a bad path or setting fails in one line
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"))
    quiet_console()
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
    loggers = instantiate_loggers(cfg)
    memory = MemoryLogger()  # last: trainer.logger (checkpoint dirs etc.) stays the configured one
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=[*loggers, memory])

    for lg in loggers:  # the whole resolved config, so W&B can filter and group on `fused`, sizes, ...
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))

    t0 = time.perf_counter()
    try:
        if ckpt_path:
            log.info(f"resuming from {ckpt_path}")
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        fit_seconds = time.perf_counter() - t0
        if trainer.global_step > 0 and not _validated_at_end(memory, trainer) and cfg.trainer.get("limit_val_batches") != 0:
            trainer.validate(model, datamodule=datamodule, verbose=False)  # runs shorter than val_check_interval
        ckpt_cb = next((cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)), None)
        last_ckpt = None
        if ckpt_cb is not None and ckpt_cb.dirpath:
            last_ckpt = Path(ckpt_cb.dirpath) / "last.ckpt"
            trainer.save_checkpoint(last_ckpt, weights_only=False)  # the final state (optimizer too), whatever the interval
    except BaseException:
        _finish_wandb(loggers, exit_code=1)  # marked failed, not left running
        raise

    summary = run_summary(trainer, cfg, memory, fit_seconds, fused_cb=_fused_callback(callbacks))
    if "peak_memory_gib" in summary["metrics"]:  # this job's own peak (statistics reset at its start)
        for lg in loggers:
            lg.log_metrics({"peak_memory_gib": summary["metrics"]["peak_memory_gib"]}, step=trainer.global_step)
    summary["resumed_from"] = ckpt_path
    summary["checkpoint"] = str(last_ckpt) if last_ckpt else None
    if trainer.is_global_zero:
        _relabel_wandb(loggers, summary)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    wandb_dir = _finish_wandb(loggers) if trainer.is_global_zero else None
    if trainer.is_global_zero:
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
            lines.append(f"  checkpoint: {last_ckpt}  (resume: python train.py ckpt_path={last_ckpt})")
        if wandb_dir is not None:
            lg = next(lg for lg in loggers if isinstance(lg, WandbLogger))
            if wandb_offline(lg):
                lines.append(f"  W&B offline run: {wandb_dir}  (view: wandb leet {wandb_dir}; upload: wandb sync {wandb_dir}; "
                             "log online: logger.wandb.offline=false)")
            else:
                lines.append(f"  W&B run: {wandb_dir}")
        log.info("\n".join(lines))
    return summary


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    try:
        summary = train(cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    val = summary["metrics"].get("val/loss")
    return val  # for hyper-parameter sweepers (optuna etc.)


if __name__ == "__main__":
    main()
