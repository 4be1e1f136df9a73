"""fused-layers: Triton forward+backward kernels as drop-in nn.Module replacements."""

from . import functional
from .functional import fused_softmax
from .modules import Attention, FusedSoftmax
from .swap import SwapReport, restore_modules, swap_modules

__version__ = "0.1.0"

__all__ = ["functional", "fused_softmax", "Attention", "FusedSoftmax", "swap_modules", "restore_modules", "SwapReport"]
