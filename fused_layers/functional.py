"""Functional API: the fused ops as plain functions (eager direct path, custom ops under torch.compile)."""

from .ops.softmax import fused_softmax

__all__ = ["fused_softmax"]
