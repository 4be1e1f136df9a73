"""FusedCrossEntropyLoss: a drop-in subclass of nn.CrossEntropyLoss running the fused Triton kernel."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.cross_entropy import fused_cross_entropy


class FusedCrossEntropyLoss(nn.CrossEntropyLoss):
    """``nn.CrossEntropyLoss`` whose loss and input gradient come from one fused Triton kernel.

    Same constructor, attributes (``weight`` buffer, ``ignore_index``, ``reduction``,
    ``label_smoothing``) and state_dict as ``nn.CrossEntropyLoss``, so it can replace one in place.
    """

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return fused_cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                                   reduction=self.reduction, label_smoothing=self.label_smoothing)
