"""The typed schema of ``conf/train.yaml``, registered with Hydra's ConfigStore as ``train_schema``.

``conf/train.yaml`` lists ``train_schema`` first in its defaults, so every value composed on top is
checked against these dataclasses: ``fused=maybe`` fails ("Value 'maybe' is not a valid bool"), and a
misspelled key fails ("Key 'fuse' is not in struct"). ``callbacks`` and ``logger`` are dicts of named
``_target_`` entries (so ``~callbacks.throughput`` drops one); the fused callback's own entry is typed
through ``fused_callback_schema`` (see ``conf/callbacks/fused.yaml``). Trainer arguments not listed in
`TrainerConfig` can still be passed with ``+trainer.NAME=VALUE``.

Also registers the OmegaConf resolvers the config uses: ``${fused_tag:${fused}}`` (``fused``/``unfused``)
and ``${sweep_group:}`` (one name shared by all jobs of a multirun).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from .model import AttnImpl


@dataclass
class ModelConfig:
    _target_: str = "lm_demo.model.GPTLM"
    vocab_size: int = 256
    seq_len: int = 128
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    attn_impl: AttnImpl = AttnImpl.reference
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_steps: int = 20
    compile: bool = False


@dataclass
class DataConfig:
    _target_: str = "lm_demo.data.ByteLMDataModule"
    seq_len: int = "${model.seq_len}"  # type: ignore[assignment]
    batch_size: int = 16
    path: Optional[str] = None
    synthetic: bool = False
    max_bytes: int = 4_000_000
    val_fraction: float = 0.1
    synthetic_samples: int = 1024
    num_workers: int = 0
    seed: int = "${seed}"  # type: ignore[assignment]


@dataclass
class TrainerConfig:
    _target_: str = "lightning.pytorch.Trainer"
    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    strategy: Any = "auto"
    precision: Any = "32-true"
    max_steps: int = -1
    max_epochs: Optional[int] = None
    max_time: Optional[str] = None
    val_check_interval: Any = None
    check_val_every_n_epoch: Optional[int] = 1
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    num_sanity_val_steps: Optional[int] = None
    log_every_n_steps: Optional[int] = None
    gradient_clip_val: Optional[float] = None
    accumulate_grad_batches: int = 1
    enable_progress_bar: Optional[bool] = None
    enable_model_summary: Optional[bool] = None
    enable_checkpointing: Optional[bool] = None
    deterministic: Any = None
    benchmark: Optional[bool] = None
    default_root_dir: Optional[str] = None


@dataclass
class FusedCallbackConfig:
    """Mirrors ``callbacks.FusedLayersCallback``'s constructor; ``enabled`` is train.py's switch."""

    _target_: str = "callbacks.FusedLayersCallback"
    enabled: bool = "${fused}"  # type: ignore[assignment]
    kinds: Optional[Dict[str, bool]] = None
    include: Optional[List[str]] = None
    exclude: Optional[List[str]] = None
    mapping: Optional[Dict[str, Any]] = None  # class -> kind, (kind, aliases) or {kind: ..., aliases: {...}}
    policy: str = "faster"
    measure: bool = True
    record_steps: int = 1
    warmup_steps: int = 3
    max_measure_seconds: float = 2.0
    log_table: bool = True


@dataclass
class TrainConfig:
    fused: bool = False
    seed: int = 1234
    output_dir: str = "${hydra:runtime.output_dir}"
    run_group: str = "${sweep_group:}"
    run_tag: str = "${fused_tag:${fused}}"
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    callbacks: Dict[str, Any] = field(default_factory=dict)
    logger: Dict[str, Any] = field(default_factory=dict)


_GROUP_CACHE: dict[str, str] = {}


def sweep_group() -> str:
    """A name shared by every job of one multirun (the sweep dir), else this run's dir name, else a timestamp."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized():
            hc = HydraConfig.get()
            d = hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.run.dir
            return "_".join(p for p in str(d).replace("\\", "/").split("/")[-2:] if p)
    except Exception:  # pragma: no cover - outside a Hydra app
        pass
    return _GROUP_CACHE.setdefault("group", time.strftime("%Y-%m-%d_%H-%M-%S"))


def register_configs() -> None:
    """Register the schema and resolvers (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="fused_callback_schema", node=FusedCallbackConfig)
    if not OmegaConf.has_resolver("fused_tag"):
        OmegaConf.register_new_resolver("fused_tag", lambda f: "fused" if f else "unfused")
    if not OmegaConf.has_resolver("sweep_group"):
        OmegaConf.register_new_resolver("sweep_group", sweep_group)
