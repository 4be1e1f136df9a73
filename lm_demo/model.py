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
  materialized). The state_dict is the same either way.

Token and position embeddings, a GELU MLP, the LM head tied to the token embedding, AdamW with decoupled
weight decay on matrices only, linear warm-up then cosine decay.
"""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from fused_layers.modules.attention import Attention
from fused_layers.modules.loss import LinearCrossEntropyLoss

from .config import AttnImpl


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


class GPTLM(L.LightningModule):
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

    def setup(self, stage: str) -> None:
        # Lightning's ModelSummary runs example_input_array through the model after the strategy has
        # wrapped it; under FSDP the parameters are then flat shards and the forward fails
        # ("'weight' must be 2-D", seen on two H200s). Sharded runs skip that summary forward.
        if "FSDP" in type(self.trainer.strategy).__name__:
            self.example_input_array = None

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
