"""The training job's own Lightning callbacks (not part of the installed package).

The fused-layers callback itself is part of the package: ``fused_layers.lightning.FusedLayersCallback``.
"""

from .throughput import ThroughputCallback

__all__ = ["ThroughputCallback"]
