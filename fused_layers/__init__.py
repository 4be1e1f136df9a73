"""fused-layers: Triton forward+backward kernels as drop-in nn.Module replacements."""

from . import functional
from .functional import fused_cross_entropy, fused_linear_cross_entropy, fused_attention, fused_attention_varlen, fused_layer_norm, fused_rms_norm, fused_softmax
from .modules import FusedCrossEntropyLoss, FusedLinearCrossEntropyLoss, LinearCrossEntropyLoss, Attention, FusedAttention, FusedMultiheadAttention, FusedLayerNorm, FusedRMSNorm, FusedSoftmax
from .swap import SwapReport, restore_modules, swap_modules

__version__ = "0.1.0"

__all__ = ["fused_cross_entropy", "FusedCrossEntropyLoss", "fused_linear_cross_entropy", "FusedLinearCrossEntropyLoss", "LinearCrossEntropyLoss", "fused_attention", "fused_attention_varlen", "FusedAttention", "FusedMultiheadAttention", "functional", "fused_layer_norm", "fused_rms_norm", "FusedLayerNorm", "FusedRMSNorm", "fused_softmax", "Attention", "FusedSoftmax", "swap_modules", "restore_modules", "SwapReport"]
