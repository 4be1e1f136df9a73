"""FusedSoftmax: a drop-in subclass of nn.Softmax running the Triton kernels."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.softmax import fused_softmax


class FusedSoftmax(nn.Softmax):
    """``nn.Softmax`` with Triton forward and backward kernels.

    Same constructor (``dim``) and attributes as ``nn.Softmax``, so ``isinstance(m, nn.Softmax)`` holds
    and it can replace one in place. ``dim=None`` keeps PyTorch's legacy implicit choice.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim
        if dim is None:  # nn.Softmax's legacy implicit dim (F._get_softmax_dim with stacklevel 3)
            dim = 0 if input.dim() in (0, 1, 3) else 1
        return fused_softmax(input, dim)
