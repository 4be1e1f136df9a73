"""The demo beside train.py: a GPT-style byte-level LM (`GPTLM`), its data (`ByteLMDataModule`),
the typed config schema (`config`), the command line in front of Hydra (`cli`), the console (`console`)
and the fused-vs-unfused comparison (`compare`).

Demo code only: the `fused_layers` library does not depend on it. `GPTLM` and `ByteLMDataModule` are
imported on first use, so that ``python train.py --help`` and a config error answer before Lightning loads.
"""

from typing import Any

__all__ = ["ByteLMDataModule", "GPTLM"]


def __getattr__(name: str) -> Any:
    if name == "GPTLM":
        from .model import GPTLM

        return GPTLM
    if name == "ByteLMDataModule":
        from .data import ByteLMDataModule

        return ByteLMDataModule
    raise AttributeError(f"module 'lm_demo' has no attribute {name!r}")
