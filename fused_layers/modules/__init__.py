"""Drop-in ``nn.Module`` replacements (one file per module family)."""

from .attention import Attention, FusedAttention, FusedMultiheadAttention
from .softmax import FusedSoftmax

__all__ = ["FusedAttention", "FusedMultiheadAttention", "Attention", "FusedSoftmax"]
