"""Losses: FusedCrossEntropyLoss (drop-in nn.CrossEntropyLoss) and the LM head + loss modules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.cross_entropy import fused_cross_entropy
from ..ops.linear_cross_entropy import fused_linear_cross_entropy


class FusedCrossEntropyLoss(nn.CrossEntropyLoss):
    """``nn.CrossEntropyLoss`` whose loss and input gradient come from one fused Triton kernel.

    Same constructor, attributes (``weight`` buffer, ``ignore_index``, ``reduction``,
    ``label_smoothing``) and state_dict as ``nn.CrossEntropyLoss``, so it can replace one in place.
    """

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return fused_cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                                   reduction=self.reduction, label_smoothing=self.label_smoothing)


class LinearCrossEntropyLoss(nn.Module):
    """LM head + loss: ``loss_fn(F.linear(hidden, weight, bias).float(), target)`` (the unfused recipe).

    Holds no parameters (the head weight is passed in, e.g. a tied embedding), only its loss as an
    ``nn.CrossEntropyLoss`` child ``loss_fn``.  When that child is swapped for ``FusedCrossEntropyLoss``
    (kind ``cross_entropy``) and has no class weight, the forward runs ``fused_linear_cross_entropy``
    instead: the head matmul and the loss chunked over tokens, never materializing the (N, V) logits.
    The state_dict is the same either way (the child has only its optional ``weight`` buffer).

    ``hidden`` (..., H), ``weight`` (V, H), ``target`` (...): the logits are flattened to (N, V).
    """

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.loss_fn = nn.CrossEntropyLoss(ignore_index=ignore_index, reduction=reduction,
                                           label_smoothing=label_smoothing)

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        fn = self.loss_fn
        if isinstance(fn, FusedCrossEntropyLoss) and fn.weight is None:
            return fused_linear_cross_entropy(hidden, weight, target, bias, ignore_index=fn.ignore_index,
                                              reduction=fn.reduction, label_smoothing=fn.label_smoothing)
        logits = F.linear(hidden, weight, bias)
        loss = fn(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
        return loss.reshape(target.shape) if fn.reduction == "none" else loss


class FusedLinearCrossEntropyLoss(LinearCrossEntropyLoss):
    """``LinearCrossEntropyLoss`` built fused: its ``loss_fn`` is a ``FusedCrossEntropyLoss`` from the start."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(ignore_index, reduction, label_smoothing)
        self.loss_fn.__class__ = FusedCrossEntropyLoss
