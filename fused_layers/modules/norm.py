"""FusedLayerNorm and FusedRMSNorm: drop-in subclasses of nn.LayerNorm / nn.RMSNorm on the Triton kernels."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.layer_norm import fused_layer_norm, fused_rms_norm


class FusedLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` with Triton forward and backward kernels.

    Same constructor (``normalized_shape``, ``eps``, ``elementwise_affine``, ``bias``, ``device``,
    ``dtype``), parameters and state_dict as ``nn.LayerNorm``, so ``isinstance(m, nn.LayerNorm)`` holds
    and state_dicts load strictly in both directions.  Parameters may be float32 with a bfloat16 / float16
    input (AMP); under ``torch.autocast`` it behaves like ``nn.LayerNorm`` (float32 on CUDA, probed once).
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return fused_layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class FusedRMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` with Triton forward and backward kernels.

    Same constructor (``normalized_shape``, ``eps`` -- ``None`` means what it means to ``nn.RMSNorm`` --,
    ``elementwise_affine``, ``device``, ``dtype``), parameters and state_dict as ``nn.RMSNorm``.  Under
    ``torch.autocast`` the output dtype is what ``nn.RMSNorm`` gives on the installed torch (probed once).
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return fused_rms_norm(input, self.normalized_shape, self.weight, self.eps)
