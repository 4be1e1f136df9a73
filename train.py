"""Train the demo GPT with or without fused layers: ``python train.py [fused=true] [-m fused=false,true]``.

Order as in the lightning-hydra-template: datamodule -> model -> callbacks -> loggers -> trainer -> fit,
then a JSON summary of the run in its output dir (read by ``lm_demo/compare.py`` after a multirun).
Config: ``conf/`` (``python train.py --cfg job`` prints it; schema in ``lm_demo/config.py``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf, open_dict

from lm_demo.config import register_configs
from lm_demo.summary import MemoryLogger, run_summary, wandb_offline

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


def train(cfg: DictConfig) -> dict[str, Any]:
    """Instantiate everything from ``cfg``, fit, write ``summary.json`` into ``cfg.output_dir``; return the summary."""
    L.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    datamodule: L.LightningDataModule = instantiate(cfg.data)
    model: L.LightningModule = instantiate(cfg.model)
    callbacks = instantiate_callbacks(cfg)
    loggers = instantiate_loggers(cfg)
    memory = MemoryLogger()  # last: trainer.logger (checkpoint dirs etc.) stays the configured one
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=[*loggers, memory])

    for lg in loggers:  # the whole resolved config, so W&B can filter and group on `fused`, sizes, ...
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))

    t0 = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    summary = run_summary(trainer, cfg, memory, time.perf_counter() - t0)
    if trainer.is_global_zero:
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        m = summary["metrics"]
        log.info(f"[{cfg.run_tag}] steps={trainer.global_step} train/loss={m.get('train/loss', float('nan')):.4f} "
                 f"val/loss={m.get('val/loss', float('nan')):.4f} -> {out_dir / 'summary.json'}")
    for lg in loggers:
        if isinstance(lg, WandbLogger) and trainer.is_global_zero:
            import wandb

            if wandb.run is not None:
                run_dir = Path(wandb.run.dir).parent
                wandb.finish()  # one W&B run per job, also inside a multirun's single process
                if wandb_offline(lg):
                    log.info(f"W&B offline run: {run_dir}  (upload: wandb sync {run_dir})")
    return summary


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    summary = train(cfg)
    val = summary["metrics"].get("val/loss")
    return val  # for hyper-parameter sweepers (optuna etc.)


if __name__ == "__main__":
    main()
