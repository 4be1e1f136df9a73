"""The training job's Lightning callbacks (not part of the installed package).

``FusedLayersCallback`` lives in ``fused_layers.lightning``; it is re-exported here for configs that name
``callbacks.FusedLayersCallback``.
"""

from fused_layers.lightning import FusedLayersCallback

from .throughput import ThroughputCallback

__all__ = ["FusedLayersCallback", "ThroughputCallback"]
