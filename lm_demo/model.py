"""A GPT-2-style decoder-only language model as a LightningModule, built from standard layers.

Every layer the fused callback knows is a plain PyTorch (or reference) module here:

* ``nn.LayerNorm`` (pre-norm blocks and the final norm) -> ``FusedLayerNorm``;
* the attention core, with ``attn_impl="reference"``, is ``fused_layers.modules.attention.Attention``:
  ``softmax(q k^T / sqrt(d) + causal mask) v`` computed explicitly with an ``nn.Softmax`` child. The
  callback swaps the whole core for ``FusedAttention`` (kind ``attention``) or only its softmax for
  ``FusedSoftmax`` (kind ``softmax``);
* with ``attn_impl="sdpa"`` the core is ``F.scaled_dot_product_attention`` (flash / memory-efficient
  kernels on GPU): the strongest *unfused* baseline, with nothing for the callback to swap but norms;
* the LM head and the loss are one ``LinearCrossEntropyLoss`` module (``F.linear`` then an
  ``nn.CrossEntropyLoss`` child on float32 logits); kind ``cross_entropy`` swaps the child, which turns the
  module into the chunked fused head + loss (``fused_linear_cross_entropy``: the logits are never
  materialized). The state_dict is the same either way;
* the MLP ``proj(gelu_tanh(fc(x)))`` is registered for kind ``mlp`` (``register_mlp``): fused, the activation and
  ``proj`` run as one ``fused_activation_linear``, whose backward writes the activation again instead of keeping it.

Token and position embeddings, a GELU MLP, the LM head tied to the token embedding, AdamW with decoupled
weight decay on matrices only, linear warm-up then cosine decay.

`LlamaLM` is the Llama family: Hugging Face's ``LlamaForCausalLM`` built from a ``LlamaConfig`` (GQA, SwiGLU,
RMSNorm, RoPE; transformers imported when it is built), with the same optimizer, schedule and logging. The callback
swaps transformers' look-alikes into it: ``LlamaRMSNorm`` (kind ``rms_norm``), the attention through transformers'
attention registry (``attention``) and the causal-LM loss with the fused LM head (``cross_entropy``).

Both shard themselves in ``configure_model`` under ``strategy=fsdp2`` (Lightning's ``ModelParallelStrategy``, which
sets a device mesh): ``fully_shard`` on each block / decoder layer, on the Llama LM head by itself, then on the root.
The fused callback has swapped the layers in ``setup`` by then (Lightning calls it before ``configure_model``),
so the sharded model is the swapped one; the callback's second pass after ``configure_model`` finds nothing new.
"""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from fused_layers.integrations import register_mlp
from fused_layers.ledger import gqa_flop_formulas
from fused_layers.modules.attention import Attention
from fused_layers.modules.loss import LinearCrossEntropyLoss

from .config import AttnImpl, HFAttnImpl


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: q/k/v projections, a pluggable core, output projection."""

    def __init__(self, d_model: int, n_head: int, attn_impl: AttnImpl | str = AttnImpl.reference, bias: bool = True):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        self.attn_impl = AttnImpl(attn_impl)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        # The reference core is a child module so the callback can find and swap it.
        self.core = Attention() if self.attn_impl is AttnImpl.reference else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, C) -> (B, H, T, D), the layout of F.scaled_dot_product_attention.
        q, k, v = (p(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.core is not None:
            y = self.core(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden, bias=bias)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


register_mlp(MLP, fc="fc", act="act", proj="proj")  # swap_modules' kind "mlp" knows this class from here on


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, d_model: int, n_head: int, mlp_ratio: int, dropout: float, attn_impl: AttnImpl | str):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, attn_impl)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio * d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    """Decoder-only transformer: (B, T) token ids -> (B, T, vocab_size) logits."""

    def __init__(self, vocab_size: int, seq_len: int, d_model: int, n_layer: int, n_head: int,
                 mlp_ratio: int = 4, dropout: float = 0.0, attn_impl: AttnImpl | str = AttnImpl.reference):
        super().__init__()
        self.seq_len = seq_len
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, mlp_ratio, dropout, attn_impl) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.loss = LinearCrossEntropyLoss()  # head + loss (no parameters of its own)
        self.apply(self._init_weights)
        # GPT-2: residual output projections scaled by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "mlp.proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids -> (B, T, vocab) logits; with ``targets`` (B, T), the mean next-token loss instead."""
        T = idx.shape[1]
        if T > self.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len {self.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is not None:
            return self.loss(x, self.head.weight, targets, self.head.bias)
        return self.head(x)


class _CausalLM(L.LightningModule):
    """What the demo's language models share: the steps, the logging, AdamW with warm-up + cosine, lazy
    ``torch.compile``, and FSDP2 sharding in ``configure_model``. A subclass sets ``self.model`` and the
    hyper-parameters (``lr``, ``min_lr_ratio``, ``weight_decay``, ``betas``, ``warmup_steps``, ``compile``) and
    defines ``_loss(batch)`` and ``shard_units()``."""

    def setup(self, stage: str) -> None:
        # Lightning's ModelSummary runs example_input_array through the model after the strategy has
        # wrapped it; under FSDP the parameters are then flat shards and the forward fails
        # ("'weight' must be 2-D", seen on two H200s). Sharded runs skip that summary forward.
        # Same for FSDP2 (ModelParallelStrategy) and DeepSpeed.
        if any(w in type(self.trainer.strategy).__name__ for w in ("FSDP", "ModelParallel", "DeepSpeed")):
            self.example_input_array = None
        # That summary counts the forward's FLOPs too: torch 2.11's SDPA formula raises on GQA (the Llama's K/V heads).
        gqa_flop_formulas()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def _net(self) -> nn.Module:
        """The network the steps run: ``self.model``, or with ``compile=True`` its ``torch.compile``.

        Compiled lazily at the first step, i.e. after the fused callback swapped modules in ``setup``.
        """
        if not self.hparams.compile:
            return self.model
        if self._compiled is None:
            self.__dict__["_compiled"] = torch.compile(self.model)
        return self._compiled

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return self._net()(x, y)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.last_train_loss = loss.detach()  # the run summary's loss when the last logged value is gone
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def shard_units(self) -> tuple[list[nn.Module], nn.Module | None, set[type[nn.Module]]]:
        """(the layers, each its own sharded unit; the LM head to shard by itself or None; the layer classes for
        FSDP1's auto-wrap policy)."""
        raise NotImplementedError

    def configure_model(self) -> None:
        """Under ``strategy=fsdp2`` (a device mesh set by ``ModelParallelStrategy``): ``fully_shard`` each layer,
        the LM head by itself (``strategy.shard_head``), then the root, with bf16 parameters for the all-gathers
        and fp32 gradient reductions under a bf16 precision. Anything else: nothing (the strategy wraps)."""
        mesh = getattr(self, "_device_mesh", None)
        if mesh is None or self.__dict__.get("_fsdp2_done"):
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dp = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
        precision = str(getattr(self.trainer, "precision", "32-true")) if self._trainer is not None else "32-true"
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision.startswith("bf16") else MixedPrecisionPolicy())
        reshard = bool(self.__dict__.get("fsdp2_reshard_after_forward", True))  # set by lm_demo/strategy.py
        layers, head, _ = self.shard_units()
        for layer in layers:
            fully_shard(layer, mesh=dp, mp_policy=mp, reshard_after_forward=reshard)
        if head is not None and self.__dict__.get("fsdp2_shard_head", True):
            fully_shard(head, mesh=dp, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(self.model, mesh=dp, mp_policy=mp, reshard_after_forward=reshard)
        self.__dict__["_fsdp2_done"] = True

    def configure_optimizers(self):
        hp = self.hparams
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr, betas=tuple(hp.betas), fused=bool(decay) and decay[0].is_cuda,
        )
        total = self.trainer.estimated_stepping_batches if self._trainer is not None else 10_000
        total = max(int(total) if math.isfinite(total) else 10_000, 1)
        warmup = min(hp.warmup_steps, max(total // 10, 0))

        def lr_lambda(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class GPTLM(_CausalLM):
    """Next-token prediction with `GPT`; logs ``train/loss`` and ``val/loss`` (mean cross-entropy, nats/byte)."""

    def __init__(
        self,
        vocab_size: int = 256,
        seq_len: int = 128,
        d_model: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        attn_impl: str = "reference",
        lr: float = 1e-3,
        min_lr_ratio: float = 0.1,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 20,
        compile: bool = False,
    ):
        super().__init__()
        attn_impl = AttnImpl(getattr(attn_impl, "value", attn_impl)).value
        betas = tuple(float(b) for b in betas)  # plain types, not Hydra's ListConfig: checkpoints load weights_only
        self.save_hyperparameters()
        self.hparams.attn_impl = attn_impl
        self.model = GPT(vocab_size, seq_len, d_model, n_layer, n_head, mlp_ratio, dropout, attn_impl)
        # Short on purpose: ModelSummary runs it once, and on CPU the fused kernels run in the interpreter.
        self.example_input_array = torch.zeros(2, min(seq_len, 16), dtype=torch.long)
        self.__dict__["_compiled"] = None  # not a submodule: state_dict keys stay those of self.model

    def shard_units(self) -> tuple[list[nn.Module], nn.Module | None, set[type[nn.Module]]]:
        # the head is tied to the token embedding: it stays in the root's unit with it
        return list(self.model.blocks), None, {Block}


class LlamaLM(_CausalLM):
    """Next-token prediction with Hugging Face's ``LlamaForCausalLM`` (built from a ``LlamaConfig``): grouped-query
    attention, SwiGLU MLP, RMSNorm, RoPE, an untied LM head. Logs as `GPTLM` does.

    The loss is the model's own: ``model(input_ids=x, labels=x, shift_labels=y).loss`` (``y``, the next tokens,
    given as the shifted labels, so every position of the window is a target). ``gradient_checkpointing``
    recomputes each decoder layer in backward (transformers' ``activation_checkpointing_enable``, called
    ``gradient_checkpointing_enable`` before 5.25; non-reentrant).
    """

    def __init__(
        self,
        vocab_size: int = 128256,
        seq_len: int = 4096,
        d_model: int = 2048,
        n_layer: int = 16,
        n_head: int = 32,
        n_kv_head: int = 8,
        intermediate_size: int = 5632,
        rope_theta: float = 500000.0,
        rms_norm_eps: float = 1e-5,
        attn_impl: str = "sdpa",
        gradient_checkpointing: bool = False,
        lr: float = 3e-4,
        min_lr_ratio: float = 0.1,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 100,
        compile: bool = False,
    ):
        super().__init__()
        try:
            import transformers
        except ImportError as e:
            raise ImportError("lm_demo.model.LlamaLM builds transformers' LlamaForCausalLM, and transformers is not "
                              "installed: pip install 'fused-layers[hf]'") from e
        attn_impl = HFAttnImpl(getattr(attn_impl, "value", attn_impl)).value
        betas = tuple(float(b) for b in betas)
        self.save_hyperparameters()
        self.hparams.attn_impl = attn_impl
        config = transformers.LlamaConfig(
            vocab_size=vocab_size, hidden_size=d_model, intermediate_size=intermediate_size,
            num_hidden_layers=n_layer, num_attention_heads=n_head, num_key_value_heads=n_kv_head,
            max_position_embeddings=seq_len, rope_theta=rope_theta, rms_norm_eps=rms_norm_eps,
            tie_word_embeddings=False, use_cache=False, attn_implementation=attn_impl,
        )
        if isinstance(getattr(config, "rope_parameters", None), dict):  # transformers 5: the base frequency lives here
            config.rope_parameters = {**config.rope_parameters, "rope_theta": rope_theta}
        self.model = transformers.LlamaForCausalLM(config)
        self.model.train()
        if gradient_checkpointing:  # transformers >= 5.25 names it activation checkpointing (the old name warns)
            enable = getattr(self.model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.example_input_array = torch.zeros(2, min(seq_len, 16), dtype=torch.long)
        self.__dict__["_compiled"] = None
        self.__dict__["_tokens_per_batch"] = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx).logits

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        self.__dict__["_tokens_per_batch"] = (x.shape[0], x.shape[1])
        return self._net()(input_ids=x, labels=x, shift_labels=y.contiguous()).loss  # transformers views it

    def shard_units(self) -> tuple[list[nn.Module], nn.Module | None, set[type[nn.Module]]]:
        layers = list(self.model.model.layers)
        return layers, self.model.lm_head, {type(layers[0])}

    @property
    def flops_per_batch(self) -> int | None:
        """Training FLOPs of the last batch (forward + backward, PaLM's count): ``6 N`` per token for the matrices
        (LM head included, embedding lookup not) plus ``12 L d T`` per token for attention; the recomputation of
        gradient checkpointing is not counted (MFU's convention). None before the first batch."""
        shape = self.__dict__.get("_tokens_per_batch")
        if shape is None:
            return None
        b, t = shape
        hp = self.hparams
        head_dim = hp.d_model // hp.n_head
        per_layer = (2 * hp.d_model * hp.n_head * head_dim + 2 * hp.d_model * hp.n_kv_head * head_dim
                     + 3 * hp.d_model * hp.intermediate_size)
        matrices = hp.n_layer * per_layer + hp.d_model * hp.vocab_size
        return int(b * t * (6 * matrices + 12 * hp.n_layer * hp.d_model * t))
