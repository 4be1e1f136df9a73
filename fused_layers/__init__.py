"""fused-layers: Triton forward+backward kernels as drop-in nn.Module replacements.

Needs torch and triton only.  The Lightning callback is ``fused_layers.lightning.FusedLayersCallback``
(``pip install 'fused-layers[train]'``); it is not imported here.
"""

from . import functional
from .functional import (
    fused_activation_linear,
    fused_add_layer_norm,
    fused_add_rms_norm,
    fused_attention,
    fused_attention_varlen,
    fused_cross_entropy,
    fused_gated_activation,
    fused_gated_activation_linear,
    fused_geglu,
    fused_layer_norm,
    fused_linear_cross_entropy,
    fused_rms_norm,
    fused_rope,
    fused_softmax,
    fused_swiglu,
)
from .modules import (
    Attention,
    FusedAttention,
    FusedCrossEntropyLoss,
    FusedLayerNorm,
    FusedLinearCrossEntropyLoss,
    FusedMultiheadAttention,
    FusedRMSNorm,
    FusedSoftmax,
    LinearCrossEntropyLoss,
)
from .ops._common import fallbacks
from .ops.compile_config import set_routes as set_compiled_routes
from .swap import SwapReport, restore_modules, swap_modules

__version__ = "0.1.0"

__all__ = [
    "fused_cross_entropy", "FusedCrossEntropyLoss", "fused_linear_cross_entropy", "FusedLinearCrossEntropyLoss",
    "LinearCrossEntropyLoss", "fused_attention", "fused_attention_varlen", "FusedAttention", "FusedMultiheadAttention",
    "functional", "fused_layer_norm", "fused_rms_norm", "FusedLayerNorm", "FusedRMSNorm", "fused_softmax", "Attention",
    "FusedSoftmax", "swap_modules", "restore_modules", "SwapReport", "fused_gated_activation", "fused_swiglu",
    "fused_geglu", "fused_gated_activation_linear", "fused_activation_linear", "fused_add_rms_norm",
    "fused_add_layer_norm", "fused_rope", "set_compiled_routes", "fallbacks",
]
