"""The demo beside train.py: a GPT-style byte-level LM (`GPTLM`), its data (`ByteLMDataModule`),
the typed config schema (`config`) and the fused-vs-unfused comparison (`compare`).

Demo code only: the `fused_layers` library does not depend on it.
"""

from .data import ByteLMDataModule
from .model import GPTLM

__all__ = ["ByteLMDataModule", "GPTLM"]
