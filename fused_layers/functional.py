"""Functional API: the fused ops as plain functions (eager direct path, custom ops under torch.compile)."""

from .ops.attention import fused_attention, fused_attention_varlen
from .ops.cross_entropy import fused_cross_entropy
from .ops.gated_activation import (
    fused_activation_linear,
    fused_gated_activation,
    fused_gated_activation_linear,
    fused_geglu,
    fused_swiglu,
)
from .ops.layer_norm import fused_layer_norm, fused_rms_norm
from .ops.linear_cross_entropy import fused_linear_cross_entropy
from .ops.residual_norm import fused_add_layer_norm, fused_add_rms_norm
from .ops.rope import fused_rope
from .ops.softmax import fused_softmax

__all__ = [
    "fused_cross_entropy", "fused_linear_cross_entropy", "fused_attention", "fused_attention_varlen",
    "fused_layer_norm", "fused_rms_norm", "fused_softmax", "fused_gated_activation", "fused_swiglu", "fused_geglu",
    "fused_gated_activation_linear", "fused_activation_linear", "fused_add_rms_norm", "fused_add_layer_norm",
    "fused_rope",
]
