"""Attention modules: the reference `Attention` core (explicit softmax), and the fused replacements.

`Attention` is the project's *reference* attention core: parameter-free, it takes q, k, v laid out as
``F.scaled_dot_product_attention`` does, (B, H, S, D), and computes ``softmax(q k^T * scale + mask) v``
explicitly through an ``nn.Softmax`` child, so that ``FusedSoftmax`` has a real target when only the
softmax is swapped, and ``FusedAttention`` (a subclass) replaces the whole computation when attention is
swapped.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Reference scaled-dot-product attention with an explicit ``nn.Softmax``.

    forward(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False) follows
    ``F.scaled_dot_product_attention``'s semantics (causal mask aligned to the top-left, a boolean mask
    keeps ``True`` positions, a float mask is added to the scores; GQA repeats K/V heads).
    """

    def __init__(self) -> None:
        super().__init__()
        self.softmax = nn.Softmax(dim=-1)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            rep = q.shape[-3] // k.shape[-3]
            k = k.repeat_interleave(rep, dim=-3)
            v = v.repeat_interleave(rep, dim=-3)
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if is_causal:
            keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask
        return torch.matmul(self.softmax(scores), v)


# ==================================================================================================
# Fused replacements
# ==================================================================================================
from ..ops._common import is_compiling, warn_once  # noqa: E402
from ..ops.attention import fused_attention, key_bias_from_mask  # noqa: E402


def _mask_fusable(attn_mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> bool:
    if attn_mask is None:
        return True
    if q.dim() != 4 or k.dim() != 4:
        if not q.dim() == k.dim() == 3:
            return False
        return key_bias_from_mask(attn_mask, q.shape[0], 1, q.shape[-2], k.shape[-2]) is not None
    try:
        return key_bias_from_mask(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2]) is not None
    except ValueError:
        return False


class FusedAttention(Attention):
    """``Attention`` computed by the streaming-softmax Triton kernels (``fused_attention``).

    Same forward signature and semantics; the S x S scores are never materialized. Masks the kernels
    cannot fuse (anything but a key-padding mask) run the parent's explicit reference computation
    (with its ``softmax`` child), after a one-time warning. One difference from the reference: a query
    row whose keys are all masked outputs 0, like ``F.scaled_dot_product_attention``, not NaN.
    """

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if not _mask_fusable(attn_mask, q, k):
            warn_once(
                "FusedAttention:mask",
                "FusedAttention: attn_mask varies along the query dim and cannot be fused; "
                "using the reference attention (explicit softmax).",
            )
            return super().forward(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        # backend "auto": SDPA (cuDNN) where it is measured faster (``prefer_sdpa`` in fused_layers/ops/attention.py)
        return fused_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                               backend="auto")


def _is_causal_mask(mask: torch.Tensor, tgt_len: int, src_len: int) -> bool:
    """True when ``mask`` (nn.MultiheadAttention semantics: bool True / float -inf = masked) is causal."""
    if mask.dim() != 2 or tuple(mask.shape) != (tgt_len, src_len):
        return False
    upper = torch.ones(tgt_len, src_len, dtype=torch.bool, device=mask.device).triu(1)
    if mask.dtype == torch.bool:
        return bool(torch.equal(mask, upper))
    expected = torch.zeros(tgt_len, src_len, dtype=mask.dtype, device=mask.device).masked_fill(upper, float("-inf"))
    return bool(torch.equal(mask, expected))


class FusedMultiheadAttention(nn.MultiheadAttention):
    """Drop-in ``nn.MultiheadAttention`` whose attention runs the fused Triton kernels.

    Same constructor, parameters, ``state_dict`` keys and forward signature. The fused path runs when
    ``need_weights=False`` (what ``nn.TransformerEncoderLayer`` / ``DecoderLayer`` pass), with ``batch_first``
    either way, packed or separate projections (``kdim`` / ``vdim``), a ``key_padding_mask`` (bool or float;
    fused as a per-key bias) and a causal ``attn_mask`` (the ``is_causal=True`` hint is trusted like PyTorch
    does; without it a 2-D mask equal to the causal mask is detected, in eager calls: under torch.compile
    reading it would break the graph). Projections stay views: q, k, v are strided slices of the projection
    output and the attention output is written in (B, S, H, D) order, so nothing is copied around the kernel.

    It falls back to ``nn.MultiheadAttention.forward`` (one warning per reason) when the kernels cannot
    give the requested result: ``need_weights=True`` -- the default of ``nn.MultiheadAttention.forward``;
    the weights are the S x S matrix that the fused kernel exists to avoid, so a drop-in must compute
    them the slow way; pass ``need_weights=False`` to get the speed --, a general (non-causal)
    ``attn_mask``, ``add_bias_kv`` / ``add_zero_attn``.  Attention dropout in training runs in the kernels
    (``fused_attention(dropout_p=...)``, the same semantics: dropped attention weights, kept ones scaled).
    A query whose keys are all padded gives 0, as the non-fast path of ``nn.MultiheadAttention`` does
    (PyTorch's inference fast path gives NaN there).
    """

    def _fallback_reason(self, query, need_weights, attn_mask, is_causal, causal) -> str | None:
        if need_weights:
            return "need_weights=True (the attention weights are not materialized; pass need_weights=False)"
        if self.bias_k is not None or self.bias_v is not None:
            return "add_bias_kv=True"
        if self.add_zero_attn:
            return "add_zero_attn=True"
        if attn_mask is not None and not causal:
            return "a non-causal attn_mask"
        if query.is_nested:
            return "nested tensors"
        return None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_batched = query.dim() == 3
        tgt_len = query.shape[-2] if (self.batch_first or not is_batched) else query.shape[0]
        src_len = key.shape[-2] if (self.batch_first or not is_batched) else key.shape[0]
        causal = False
        if attn_mask is not None:
            # Compiled, the mask's values are not read (a data-dependent graph break): only the is_causal hint counts.
            causal = bool(is_causal) or (not is_compiling() and _is_causal_mask(attn_mask, tgt_len, src_len))
        elif is_causal:
            raise RuntimeError("FusedMultiheadAttention: need attn_mask if specifying the is_causal hint "
                               "(as nn.MultiheadAttention)")
        why = self._fallback_reason(query, need_weights, attn_mask, is_causal, causal)
        if why is not None:
            warn_once(f"FusedMultiheadAttention:{why}",
                      f"FusedMultiheadAttention: {why}; using nn.MultiheadAttention.forward.")
            return super().forward(
                query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal,
            )
        if not is_batched:  # unbatched (S, E): one batch element
            kpm = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
            dim = 0 if self.batch_first else 1
            out, _ = self._fused(query.unsqueeze(dim), key.unsqueeze(dim), value.unsqueeze(dim), kpm, causal)
            return out.squeeze(dim), None
        return self._fused(query, key, value, key_padding_mask, causal)

    def _fused(self, query, key, value, key_padding_mask, causal):
        E, H = self.embed_dim, self.num_heads
        Dh = E // H
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        # Projections in the input's own layout (S, B, E) or (B, S, E); q, k, v stay strided views.
        if self._qkv_same_embed_dim and query is key and key is value:
            q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        elif self._qkv_same_embed_dim and key is value:
            q = F.linear(query, w_q, b_q)
            kv_w = self.in_proj_weight[E:]
            kv_b = None if self.in_proj_bias is None else self.in_proj_bias[E:]
            k, v = F.linear(key, kv_w, kv_b).chunk(2, dim=-1)
        else:
            q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)

        def heads(x):  # -> (B, H, S, Dh) view
            x = x.unflatten(-1, (H, Dh))
            return x.transpose(1, 2) if self.batch_first else x.permute(1, 2, 0, 3)

        mask = None
        if key_padding_mask is not None:
            kpm = key_padding_mask
            if kpm.dtype == torch.bool:
                mask = (~kpm)[:, None, None, :]  # SDPA: True keeps
            else:
                mask = kpm.to(q.dtype)[:, None, None, :]
        qh, kh, vh = heads(q), heads(k), heads(v)
        p = self.dropout if self.training else 0.0
        o = fused_attention(qh, kh, vh, attn_mask=mask, dropout_p=p, is_causal=causal, backend="auto")  # as above
        # o is laid out like q: (B, S, H, Dh) or (S, B, H, Dh) in memory, so these reshapes are views.
        o = o.transpose(1, 2) if self.batch_first else o.permute(2, 0, 1, 3)
        o = o.flatten(-2)
        return F.linear(o, self.out_proj.weight, self.out_proj.bias), None
