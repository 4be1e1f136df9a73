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
