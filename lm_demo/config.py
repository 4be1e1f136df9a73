"""The typed schema of ``conf/train.yaml``, registered with Hydra's ConfigStore as ``train_schema``.

``conf/train.yaml`` lists ``train_schema`` first in its defaults, so every value composed on top is checked
against these dataclasses: ``fused=maybe`` and a misspelt key fail while composing (``lm_demo/cli.py`` turns
that into one line naming the key). Each model conf brings its own schema through its defaults list
(``/gpt_model_schema@_here_`` or ``/llama_model_schema@_here_``: `MODEL_SCHEMAS`), so ``model.mlp_ratio`` is a key of
the demo GPT and ``model.n_kv_head`` one of the Llama family; ``strategy`` (`StrategyConfig`) is the strategy group's
node, built by ``lm_demo/strategy.py``. ``callbacks`` and ``logger`` are dicts of named ``_target_`` entries (so
``~callbacks.throughput`` drops one); the fused callback's entry is typed through ``fused_callback_schema``
(see ``conf/callbacks/fused.yaml``). Trainer arguments not listed in `TrainerConfig` can still be passed with
``+trainer.NAME=VALUE``.

Each field carries its one-line description (``doc``): ``python train.py --help`` prints those of the main
keys, ``--help-all`` every one. `check_config` checks what typing cannot (paths, ranges, callback arguments).

Also registers the OmegaConf resolvers the config uses: ``${fused_tag:${fused}}`` (``fused``/``unfused``)
and ``${sweep_group:}`` (one name shared by all jobs of a multirun).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


class AttnImpl(str, Enum):
    """How the demo GPT computes its attention core (``model.attn_impl``)."""

    reference = "reference"  # fused_layers' reference Attention: explicit nn.Softmax (swappable)
    sdpa = "sdpa"  # F.scaled_dot_product_attention (PyTorch's fused kernels)

    def __str__(self) -> str:  # "sdpa", also inside ${...} interpolations (run names)
        return self.value


class HFAttnImpl(str, Enum):
    """How the Llama family computes attention (``model.attn_impl``): transformers' attention implementation."""

    sdpa = "sdpa"  # F.scaled_dot_product_attention (the fused callback switches it to "fused_layers")
    eager = "eager"  # transformers' explicit matmul-softmax-matmul

    def __str__(self) -> str:
        return self.value


class StrategyName(str, Enum):
    """Which Lightning strategy ``strategy=NAME`` builds (``lm_demo/strategy.py``)."""

    auto = "auto"  # trainer.strategy decides (a Lightning name: auto, ddp, fsdp, ...)
    ddp = "ddp"  # DDPStrategy: a full replica per device, gradients all-reduced
    fsdp = "fsdp"  # FSDPStrategy (FSDP1): each decoder layer and the LM head its own sharded unit
    fsdp2 = "fsdp2"  # ModelParallelStrategy: the model's configure_model applies fully_shard (FSDP2)
    deepspeed = "deepspeed"  # DeepSpeedStrategy, ZeRO stage strategy.stage

    def __str__(self) -> str:
        return self.value


class ShardingStrategy(str, Enum):
    """FSDP1's ``sharding_strategy`` (``strategy=fsdp``)."""

    FULL_SHARD = "FULL_SHARD"  # parameters, gradients and optimizer state sharded (ZeRO-3)
    SHARD_GRAD_OP = "SHARD_GRAD_OP"  # gradients and optimizer state sharded, parameters kept after forward
    NO_SHARD = "NO_SHARD"  # a replica per device (DDP through FSDP)
    HYBRID_SHARD = "HYBRID_SHARD"  # full sharding within a node, replicas across nodes

    def __str__(self) -> str:
        return self.value


def doc(default: Any = MISSING, help: str = "", *, main: bool = False, factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with its one-line description; ``main`` fields are listed by ``python train.py --help``."""
    meta = {"help": help, "main": main}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    """The demo GPT (``lm_demo/model.py``) and its optimizer; typed by ``gpt_model_schema`` (conf/model/tiny.yaml)."""

    _target_: str = "lm_demo.model.GPTLM"
    vocab_size: int = doc(256, "vocabulary size: tokens are bytes (0..255); gpt2_small pads it to GPT-2's 50304")
    seq_len: int = doc(128, "tokens per sequence (the data follows it)", main=True)
    d_model: int = doc(128, "width of the residual stream", main=True)
    n_layer: int = doc(4, "transformer blocks", main=True)
    n_head: int = doc(4, "attention heads; must divide d_model", main=True)
    mlp_ratio: int = doc(4, "MLP hidden width as a multiple of d_model")
    dropout: float = doc(0.0, "dropout probability, in [0, 1)")
    attn_impl: AttnImpl = doc(AttnImpl.reference, "reference: explicit softmax (swappable) | sdpa: PyTorch SDPA",
                              main=True)
    lr: float = doc(1e-3, "peak learning rate (AdamW)", main=True)
    min_lr_ratio: float = doc(0.1, "final learning rate as a fraction of the peak (cosine decay)")
    weight_decay: float = doc(0.1, "AdamW weight decay (matrices only)")
    betas: List[float] = doc(help="AdamW betas", factory=lambda: [0.9, 0.95])
    warmup_steps: int = doc(20, "steps of linear learning-rate warm-up")
    compile: bool = doc(False, "torch.compile the network (after the swaps)", main=True)


@dataclass
class LlamaModelConfig:
    """A Llama-style model, Hugging Face's ``LlamaForCausalLM`` (``lm_demo/model.py``, ``LlamaLM``), with the demo
    GPT's optimizer; typed by ``llama_model_schema`` (conf/model/llama_*.yaml). Needs transformers."""

    _target_: str = "lm_demo.model.LlamaLM"
    vocab_size: int = doc(128256, "vocabulary size (Llama 3's 128,256); byte data uses ids 0..255 of it")
    seq_len: int = doc(4096, "tokens per sequence, and the longest RoPE position (the data follows it)", main=True)
    d_model: int = doc(2048, "width of the residual stream (hidden_size)", main=True)
    n_layer: int = doc(16, "decoder layers", main=True)
    n_head: int = doc(32, "query heads; must divide d_model", main=True)
    n_kv_head: int = doc(8, "key/value heads (grouped-query attention); must divide n_head", main=True)
    intermediate_size: int = doc(5632, "SwiGLU MLP hidden width")
    rope_theta: float = doc(500000.0, "RoPE base frequency")
    rms_norm_eps: float = doc(1e-5, "RMSNorm epsilon, > 0")
    attn_impl: HFAttnImpl = doc(HFAttnImpl.sdpa, "transformers' attention: sdpa | eager (the callback swaps either)",
                                main=True)
    gradient_checkpointing: bool = doc(False, "recompute each decoder layer in backward (HF's "
                                       "gradient_checkpointing_enable): less memory, about a third more compute",
                                       main=True)
    lr: float = doc(3e-4, "peak learning rate (AdamW)", main=True)
    min_lr_ratio: float = doc(0.1, "final learning rate as a fraction of the peak (cosine decay)")
    weight_decay: float = doc(0.1, "AdamW weight decay (matrices only)")
    betas: List[float] = doc(help="AdamW betas", factory=lambda: [0.9, 0.95])
    warmup_steps: int = doc(100, "steps of linear learning-rate warm-up")
    compile: bool = doc(False, "torch.compile the network (after the swaps)", main=True)


#: the model schemas, by the ``_target_`` their confs instantiate
MODEL_SCHEMAS = {"lm_demo.model.GPTLM": ModelConfig, "lm_demo.model.LlamaLM": LlamaModelConfig}


@dataclass
class StrategyConfig:
    """How several devices share the work (``conf/strategy/``, built by ``lm_demo/strategy.py``)."""

    name: StrategyName = doc(StrategyName.auto, "auto (trainer.strategy decides), ddp, fsdp, fsdp2 or deepspeed",
                             main=True)
    find_unused_parameters: bool = doc(False, "ddp: look for parameters without a gradient each step (slower)")
    sharding_strategy: ShardingStrategy = doc(ShardingStrategy.FULL_SHARD, "fsdp: FULL_SHARD, SHARD_GRAD_OP, "
                                              "NO_SHARD or HYBRID_SHARD")
    shard_head: bool = doc(True, "fsdp, fsdp2: the LM head is a sharded unit of its own (gathered for its call)")
    reshard_after_forward: bool = doc(True, "fsdp2: free the gathered parameters after each layer's forward")
    stage: int = doc(3, "deepspeed: ZeRO stage, 1, 2 or 3")


@dataclass
class DataConfig:
    """Byte-level text or random tokens (``lm_demo/data.py``)."""

    _target_: str = "lm_demo.data.ByteLMDataModule"
    seq_len: int = doc("${model.seq_len}", "tokens per sample (follows model.seq_len)")
    batch_size: int = doc(16, "sequences per training step", main=True)
    path: Optional[str] = doc(None, "your own text file; null: this Python's stdlib source", main=True)
    synthetic: bool = doc(False, "random tokens instead of text (nothing to learn: for speed runs)")
    max_bytes: int = doc(4_000_000, "bytes read from the corpus at most")
    val_fraction: float = doc(0.1, "share of the corpus held out for validation, in (0, 1)")
    synthetic_samples: int = doc(1024, "random sequences per epoch when synthetic=true")
    num_workers: int = doc(0, "DataLoader worker processes")
    seed: int = doc("${seed}", "seed of the batch order and of the random tokens (follows seed)")
    vocab_size: int = doc("${model.vocab_size}", "synthetic=true draws token ids 0..vocab_size-1 (follows "
                          "model.vocab_size); text is bytes, 0..255")


@dataclass
class TrainerConfig:
    """Lightning ``Trainer`` arguments (any other one: ``+trainer.NAME=VALUE``)."""

    _target_: str = "lightning.pytorch.Trainer"
    accelerator: str = doc("auto", "cpu, gpu, or auto (a GPU when there is one)", main=True)
    devices: Any = doc(1, "devices per node, e.g. 2 with trainer.strategy=ddp", main=True)
    num_nodes: int = doc(1, "machines")
    strategy: Any = doc("auto", "a Lightning strategy name (auto, ddp, fsdp, ...); with strategy=NAME leave it auto",
                        main=True)
    precision: Any = doc("32-true", "32-true, bf16-mixed, 16-mixed, ...", main=True)
    max_steps: int = doc(-1, "optimizer steps to train (-1: no limit)", main=True)
    max_epochs: Optional[int] = doc(None, "passes over the training data at most (null: no limit with max_steps)")
    max_time: Optional[str] = doc(None, "stop after this wall-clock time, DD:HH:MM:SS")
    val_check_interval: Any = doc(None, "validate every this many steps", main=True)
    check_val_every_n_epoch: Optional[int] = doc(1, "validate every this many epochs (null: by val_check_interval)")
    limit_train_batches: Any = doc(None, "training batches per epoch at most (int, or a fraction)")
    limit_val_batches: Any = doc(None, "batches per validation (or a fraction; 0: none)", main=True)
    num_sanity_val_steps: Optional[int] = doc(None, "validation batches run once before training, as a check")
    log_every_n_steps: Optional[int] = doc(None, "steps between logged training metrics", main=True)
    gradient_clip_val: Optional[float] = doc(None, "clip the gradient norm to this value")
    accumulate_grad_batches: int = doc(1, "batches whose gradients add up to one optimizer step")
    enable_progress_bar: Optional[bool] = doc(None, "show the progress bar")
    enable_model_summary: Optional[bool] = doc(None, "print the model's summary table at the start")
    enable_checkpointing: Optional[bool] = doc(None, "write <output_dir>/checkpoints/last.ckpt (false: none)",
                                               main=True)
    deterministic: Any = doc(None, "deterministic algorithms only (slower)")
    benchmark: Optional[bool] = doc(None, "cudnn.benchmark")
    default_root_dir: Optional[str] = doc(None, "Lightning's own output folder (the run dir)")


@dataclass
class FusedCallbackConfig:
    """``fused_layers.lightning.FusedLayersCallback``'s arguments; ``enabled`` is train.py's switch (``fused``)."""

    _target_: str = "fused_layers.lightning.FusedLayersCallback"
    enabled: bool = doc("${fused}", "build this callback (follows fused)")
    kinds: Optional[Dict[str, bool]] = doc(None, "kinds to swap, e.g. callbacks.fused.kinds.attention=false",
                                           main=True)
    include: Optional[List[str]] = doc(None, "swap only modules whose names match these patterns", main=True)
    exclude: Optional[List[str]] = doc(None, "never swap modules whose names match these patterns")
    # {} rather than None: OmegaConf cannot merge a CLI dict (callbacks.fused.mapping={...}) into a None node
    mapping: Dict[str, Any] = doc(help="your module classes -> kind: ++callbacks.fused.mapping={my.Norm:layer_norm}",
                                  factory=dict)
    policy: str = doc("faster", "faster: keep swaps that made steps faster; always: keep all",
                      main=True)
    measure: bool = doc(True, "also time every swapped module against its reference (a table in the log)")
    record_steps: int = doc(1, "steps whose input shapes the per-module timings use")
    warmup_steps: int = doc(3, "training steps before the step-time comparison starts")
    max_measure_seconds: float = doc(2.0, "time budget of the per-module timings")
    log_table: bool = doc(True, "log the per-module table (W&B: as a table)")
    ab_rounds: int = doc(5, "rounds of the step-time comparison (each: one step per variant); 0: none")
    ab_warmup_rounds: int = doc(1, "uncounted rounds before those")
    ab_max_steps: int = doc(40, "training steps the comparison may use at most")
    ab_compiled: str = doc("per_arm", "under model.compile=true: per_arm (one compiled graph per variant) or skip")
    ab_check_steps: int = doc(5, "steps after the comparison timed as the kept variant's own (does the verdict "
                                 "hold for the run?)")
    compiled_routes: Dict[str, str] = doc(help="under model.compile=true, op -> kernels|inductor: "
                                               "++callbacks.fused.compiled_routes.mlp=kernels keeps no MLP activation "
                                               "(less memory, a slightly longer step)", factory=dict)


@dataclass
class TrainConfig:
    fused: bool = doc(False, "swap the fused Triton layers into the model", main=True)
    seed: int = doc(1234, "seed of the weights and the data order", main=True)
    ckpt_path: Optional[str] = doc(None, "resume: a .ckpt file, or last (the newest run's last.ckpt)", main=True)
    output_dir: str = doc("${hydra:runtime.output_dir}", "where the run writes (the run dir Hydra makes)")
    run_group: str = doc("${sweep_group:}", "W&B group: the sweep's name, so one multirun's jobs sit together")
    run_tag: str = doc("${fused_tag:${fused}}", "W&B tag and run-name prefix: fused or unfused")
    model: Any = MISSING  # each model conf brings its schema (MODEL_SCHEMAS): gpt_model_schema, llama_model_schema
    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    strategy: StrategyConfig = MISSING
    callbacks: Dict[str, Any] = field(default_factory=dict)
    logger: Dict[str, Any] = field(default_factory=dict)


#: what each config group selects (``python train.py --help``); the options' own lines are their yaml's first comment
GROUP_HELP = {
    "model": "the network: sizes, attention, optimizer",
    "data": "what it trains on",
    "trainer": "Lightning Trainer: device, precision, steps, validation",
    "strategy": "how several devices share the work (auto: trainer.strategy decides)",
    "callbacks": "named entries, each built from its _target_; drop one with ~callbacks.NAME",
    "logger": "where metrics go; several at once: logger=[wandb,csv]",
}

#: descriptions of keys in untyped entries (callbacks other than fused, loggers), as the schema's ``doc`` would
ENTRY_HELP = {
    "callbacks.throughput.window_size": ("steps in the moving window of tokens/s and MFU", True),
    "callbacks.throughput.flops_from": ("meta: count FLOPs on the unfused model, so MFU compares; module; none", False),
    "callbacks.checkpoint.every_n_train_steps": ("steps between checkpoints (and one at the end)", True),
    "logger.wandb.offline": ("true: the run stays on disk (wandb sync uploads it)", True),
    "logger.wandb.project": ("W&B project", True),
}


def key_help(typed: type = TrainConfig, prefix: str = "", model: type = ModelConfig) -> dict[str, tuple[str, bool]]:
    """``{dotted key: (description, main)}`` for every documented key of the schema (with ``model`` as the model's
    schema, one of `MODEL_SCHEMAS`) and of `ENTRY_HELP`."""
    out: dict[str, tuple[str, bool]] = {}
    for f in dataclasses.fields(typed):
        if f.metadata.get("help"):
            out[prefix + f.name] = (f.metadata["help"], bool(f.metadata.get("main")))
    if typed is TrainConfig:
        for name, sub in (("model", model), ("data", DataConfig), ("trainer", TrainerConfig),
                          ("strategy", StrategyConfig), ("callbacks.fused", FusedCallbackConfig)):
            out.update(key_help(sub, name + "."))
        out.update(ENTRY_HELP)
    return out


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
        found = [p for r in roots for p in Path(r).glob("**/checkpoints/last.ckpt") if _is_checkpoint(p)]
        if not found:
            where = " or ".join(r + "/" for r in roots)
            _fail("ckpt_path", f"'last': no checkpoints/last.ckpt under {where} (has a run finished here?)")
        return str(max(found, key=lambda p: p.stat().st_mtime))
    p = Path(value).expanduser()
    if not _is_checkpoint(p):
        _fail("ckpt_path", f"{value!r}: no such file")
    return str(p)


#: model hyper-parameters that fix parameter shapes: a checkpoint must agree on them to load
_SHAPE_KEYS = ("vocab_size", "seq_len", "d_model", "n_layer", "n_head", "mlp_ratio", "n_kv_head", "intermediate_size")


def check_config(cfg: Any) -> None:
    """Check what composing cannot: paths, values and every callback's settings (disabled ones too).

    Runs before anything is built: in ``lm_demo/cli.py``'s preflight, for every job of the command, before
    Hydra makes a run dir, and again at the start of train.py's ``train`` (no logger, no W&B run dir, no
    trainer yet). Raises `ConfigError` naming the key. Callback entries are checked by their class's
    ``check_args`` (``FusedLayersCallback``, ``ThroughputCallback``) or, failing that, by binding the entry to
    the class's constructor signature.
    """
    import importlib.util
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
    for key in ("batch_size", "seq_len", "max_bytes", "synthetic_samples", "vocab_size"):
        if int(d[key]) < 1:
            _fail(f"data.{key}", f"must be >= 1, got {d[key]}")
    if int(d.num_workers) < 0:
        _fail("data.num_workers", f"must be >= 0, got {d.num_workers}")
    m = cfg.model
    schema = MODEL_SCHEMAS.get(str(m.get("_target_")))  # None: a model of the user's own; its keys unchecked
    for key in ("vocab_size", "seq_len", "d_model", "n_layer", "n_head", "mlp_ratio", "n_kv_head",
                "intermediate_size"):  # each first on its own
        if key in m and int(m[key]) < 1:
            _fail(f"model.{key}", f"must be >= 1, got {m[key]}")
    if "n_head" in m and "d_model" in m and int(m.d_model) % int(m.n_head):
        _fail("model.n_head", f"must divide model.d_model ({m.d_model}), got {m.n_head}")
    if schema is LlamaModelConfig:
        if int(m.n_head) % int(m.n_kv_head):
            _fail("model.n_kv_head", f"must divide model.n_head ({m.n_head}), got {m.n_kv_head}")
        if (int(m.d_model) // int(m.n_head)) % 2:
            _fail("model.n_head", f"must leave an even head size for RoPE, got d_model / n_head = "
                                  f"{int(m.d_model) // int(m.n_head)}")
        for key in ("rope_theta", "rms_norm_eps"):
            if not float(m[key]) > 0.0:
                _fail(f"model.{key}", f"must be > 0, got {m[key]}")
        if importlib.util.find_spec("transformers") is None:
            _fail("model", f"{m._target_} builds transformers' LlamaForCausalLM, and transformers is not installed: "
                           "pip install 'fused-layers[hf]'")
    if "vocab_size" in m and int(d.vocab_size) > int(m.vocab_size):
        _fail("data.vocab_size", f"must be <= model.vocab_size ({m.vocab_size}), got {d.vocab_size}")
    if not d.synthetic and "vocab_size" in m and int(m.vocab_size) < 256:
        _fail("model.vocab_size", f"text data is bytes (ids 0..255): must be >= 256, got {m.vocab_size}")
    if "seq_len" in m and int(d.seq_len) > int(m.seq_len):
        _fail("data.seq_len", f"must be <= model.seq_len ({m.seq_len}, the longest position), got {d.seq_len}")
    if "dropout" in m and not 0.0 <= float(m.dropout) < 1.0:
        _fail("model.dropout", f"must be in [0, 1), got {m.dropout}")
    if "lr" in m and not float(m.lr) > 0.0:
        _fail("model.lr", f"must be > 0, got {m.lr}")
    if "min_lr_ratio" in m and not 0.0 <= float(m.min_lr_ratio) <= 1.0:
        _fail("model.min_lr_ratio", f"must be in [0, 1], got {m.min_lr_ratio}")
    if "warmup_steps" in m and int(m.warmup_steps) < 0:
        _fail("model.warmup_steps", f"must be >= 0, got {m.warmup_steps}")
    if "betas" in m and (len(m.betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in m.betas)):
        _fail("model.betas", f"must be two numbers in [0, 1), got {list(m.betas)}")
    check_strategy(cfg)
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
            kwargs = {k: v for k, v in OmegaConf.to_container(entry, resolve=True).items()
                      if k not in ("_target_", "enabled")
                      and not (isinstance(v, dict) and "_target_" in v)}  # nested objects are built on their own
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


def check_strategy(cfg: Any) -> None:
    """``strategy`` and ``trainer.strategy`` pick one strategy between them; what the chosen one needs is there."""
    import importlib.util

    st = cfg.get("strategy")
    name = str(st.name) if st is not None else "auto"
    trainer_strategy = cfg.trainer.get("strategy", "auto")
    if name == "auto":
        return
    if not (isinstance(trainer_strategy, str) and trainer_strategy == "auto"):
        _fail("trainer.strategy", f"{trainer_strategy!r} and strategy={name} both pick a strategy; use one "
                                  f"(strategy=auto trainer.strategy=..., or strategy={name} alone)")
    if name == "deepspeed":
        if importlib.util.find_spec("deepspeed") is None:
            _fail("strategy", "deepspeed is not installed (pip install deepspeed); or pick strategy=fsdp2, fsdp or ddp")
        if int(st.stage) not in (1, 2, 3):
            _fail("strategy.stage", f"must be 1, 2 or 3, got {st.stage}")
    if name in ("fsdp", "deepspeed"):  # Lightning builds these for CUDA devices only
        accelerator = str(cfg.trainer.get("accelerator", "auto"))
        if accelerator == "cpu" or (accelerator == "auto" and not _cuda_available()):
            where = "" if accelerator == "cpu" else " on a machine without one"
            _fail("trainer.accelerator", f"strategy={name} needs GPUs (Lightning's {name} strategy is CUDA-only), "
                                         f"got {accelerator!r}{where}; on the CPU use strategy=ddp or fsdp2")
    if name == "fsdp2":
        allowed = ("32-true", "bf16-mixed", "bf16-true", "16-true")  # what Lightning's ModelParallelStrategy takes
        if str(cfg.trainer.precision) not in allowed:
            _fail("trainer.precision", f"strategy=fsdp2 takes {', '.join(allowed)}, got {cfg.trainer.precision!r}")
        if str(cfg.model.get("_target_")) not in MODEL_SCHEMAS:
            _fail("strategy", f"fsdp2 needs a model whose configure_model shards it; {cfg.model.get('_target_')!r} "
                              f"is none of {', '.join(MODEL_SCHEMAS)}")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _is_checkpoint(p: Path) -> bool:
    """A checkpoint file, or the folder of a sharded one (FSDP2's distributed checkpoint: ``meta.pt`` + shards)."""
    return p.is_file() or (p.is_dir() and (p / "meta.pt").is_file())


def check_checkpoint_fits(path: str, cfg: Any) -> None:
    """The checkpoint's model hyper-parameters that fix parameter shapes must equal the config's."""
    import torch

    meta = Path(path) / "meta.pt"  # a sharded checkpoint: its hyper-parameters are in the metadata file
    try:
        ck = torch.load(meta if meta.is_file() else path, map_location="cpu", weights_only=False,
                        mmap=not meta.is_file())
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
    cs.store(name="gpt_model_schema", node=ModelConfig)
    cs.store(name="llama_model_schema", node=LlamaModelConfig)
    cs.store(name="fused_callback_schema", node=FusedCallbackConfig)
    if not OmegaConf.has_resolver("fused_tag"):
        OmegaConf.register_new_resolver("fused_tag", lambda f: "fused" if f else "unfused")
    if not OmegaConf.has_resolver("sweep_group"):
        OmegaConf.register_new_resolver("sweep_group", sweep_group)
