"""Drop-in ``nn.Module`` replacements (one file per module family)."""

from .attention import Attention, FusedAttention, FusedMultiheadAttention
from .loss import FusedCrossEntropyLoss, FusedLinearCrossEntropyLoss, LinearCrossEntropyLoss
from .norm import FusedLayerNorm, FusedRMSNorm
from .softmax import FusedSoftmax

__all__ = [
    "FusedAttention", "FusedMultiheadAttention", "FusedLayerNorm", "FusedRMSNorm", "Attention", "FusedSoftmax",
    "FusedCrossEntropyLoss", "FusedLinearCrossEntropyLoss", "LinearCrossEntropyLoss",
]
