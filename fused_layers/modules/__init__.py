"""Drop-in ``nn.Module`` replacements (one file per module family)."""

from .attention import Attention
from .softmax import FusedSoftmax

__all__ = ["Attention", "FusedSoftmax"]
