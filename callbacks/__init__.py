"""Lightning callbacks: swap in the fused layers and measure them, end-to-end throughput."""

from .fused import FusedLayersCallback
from .throughput import ThroughputCallback

__all__ = ["FusedLayersCallback", "ThroughputCallback"]
