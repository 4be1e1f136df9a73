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
from pathlib import Path
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
    # class -> kind, (kind, aliases) or {kind: ..., aliases: {...}}; {} rather than None: OmegaConf cannot merge
    # a CLI dict (callbacks.fused.mapping={...}) into a None node of a structured config
    mapping: Dict[str, Any] = field(default_factory=dict)
    policy: str = "faster"
    measure: bool = True
    record_steps: int = 1
    warmup_steps: int = 3
    max_measure_seconds: float = 2.0
    log_table: bool = True
    ab_rounds: int = 5
    ab_warmup_rounds: int = 1
    ab_max_steps: int = 40
    ab_compiled: str = "per_arm"


@dataclass
class TrainConfig:
    fused: bool = False
    seed: int = 1234
    ckpt_path: Optional[str] = None
    output_dir: str = "${hydra:runtime.output_dir}"
    run_group: str = "${sweep_group:}"
    run_tag: str = "${fused_tag:${fused}}"
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    callbacks: Dict[str, Any] = field(default_factory=dict)
    logger: Dict[str, Any] = field(default_factory=dict)


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key (``data.path``) and the problem."""


def _fail(key: str, problem: str) -> None:
    raise ConfigError(f"{key}: {problem}")


def resolve_ckpt_path(value: str | None, roots: tuple[str, ...] = ("outputs", "multirun")) -> str | None:
    """``ckpt_path`` as a file: ``None`` stays ``None``; ``last`` is the newest ``checkpoints/last.ckpt``
    under ``roots`` (the Hydra run/sweep dirs, relative to the working directory)."""
    if value is None:
        return None
    if value == "last":
        found = [p for r in roots for p in Path(r).glob("**/checkpoints/last.ckpt")]
        if not found:
            _fail("ckpt_path", f"'last': no checkpoints/last.ckpt under {' or '.join(r + '/' for r in roots)} (has a run finished here?)")
        return str(max(found, key=lambda p: p.stat().st_mtime))
    p = Path(value).expanduser()
    if not p.is_file():
        _fail("ckpt_path", f"{value!r}: no such file")
    return str(p)


#: model hyper-parameters that fix parameter shapes: a checkpoint must agree on them to load
_SHAPE_KEYS = ("vocab_size", "seq_len", "d_model", "n_layer", "n_head", "mlp_ratio")


def check_config(cfg: Any) -> None:
    """Check what composing cannot: paths, values and every callback's settings (disabled ones too).

    Runs before anything is built (no logger, no W&B run dir, no trainer). Raises `ConfigError` naming the
    key. Callback entries are checked by their class's ``check_args`` (``FusedLayersCallback``,
    ``ThroughputCallback``) or, failing that, by binding the entry to the class's constructor signature.
    """
    import importlib
    import inspect

    d = cfg.data
    if d.path is not None:
        if d.synthetic:
            _fail("data.path", "cannot be combined with data.synthetic=true; pick one")
        p = Path(str(d.path)).expanduser()
        if not p.is_file():
            _fail("data.path", f"{d.path!r}: no such file")
    if not 0.0 < float(d.val_fraction) < 1.0:
        _fail("data.val_fraction", f"must be in (0, 1), got {d.val_fraction}")
    for key in ("batch_size", "seq_len"):
        if int(d[key]) < 1:
            _fail(f"data.{key}", f"must be >= 1, got {d[key]}")
    m = cfg.model
    if int(m.n_head) < 1 or int(m.d_model) % int(m.n_head):
        _fail("model.n_head", f"must divide model.d_model ({m.d_model}), got {m.n_head}")
    if int(cfg.trainer.max_steps) < -1:
        _fail("trainer.max_steps", f"must be -1 (no limit) or >= 0, got {cfg.trainer.max_steps}")

    for group in ("callbacks", "logger"):
        for name, entry in (cfg.get(group) or {}).items():
            if entry is None:
                continue
            key = f"{group}.{name}"
            target = entry.get("_target_")
            if not target:
                _fail(key, "has no _target_")
            mod, _, attr = str(target).rpartition(".")
            try:
                cls = getattr(importlib.import_module(mod), attr)
            except (ImportError, AttributeError, ValueError) as e:
                _fail(f"{key}._target_", f"{target!r} cannot be imported ({type(e).__name__}: {e})")
            kwargs = {k: v for k, v in OmegaConf.to_container(entry, resolve=True).items() if k not in ("_target_", "enabled")}
            kwargs = {k: v for k, v in kwargs.items() if not (isinstance(v, dict) and "_target_" in v)}  # nested objects
            checker = getattr(cls, "check_args", None)
            try:
                inspect.signature(cls).bind(**kwargs)  # unknown argument names
                if checker is not None:
                    checker(**kwargs)
            except TypeError as e:
                _fail(key, str(e))
            except ValueError as e:
                arg = getattr(e, "arg", None)
                _fail(f"{key}.{arg}" if arg else key, str(e).split(": ", 1)[-1] if arg else str(e))

    ckpt = resolve_ckpt_path(cfg.get("ckpt_path"))
    if ckpt is not None:
        check_checkpoint_fits(ckpt, cfg)


def check_checkpoint_fits(path: str, cfg: Any) -> None:
    """The checkpoint's model hyper-parameters that fix parameter shapes must equal the config's."""
    import torch

    try:
        ck = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:
        _fail("ckpt_path", f"{path!r} is not a readable checkpoint ({type(e).__name__}: {e})")
    hp = ck.get("hyper_parameters") or {}
    for k in _SHAPE_KEYS:
        if k in hp and k in cfg.model and int(hp[k]) != int(cfg.model[k]):
            _fail("ckpt_path", f"{path!r} was trained with model.{k}={hp[k]}, the config has model.{k}={cfg.model[k]}; "
                               "resume with the run's own model settings")


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
