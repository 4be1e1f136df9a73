"""Launch configuration of the gated MLP activation (ops/gated_activation.py): data, read by its launchers only.

The op is elementwise over rows of the intermediate width I (11,008 for Llama 2 7B, 14,336 for Llama 3 8B,
18,944 for Qwen2 7B): every program streams one block of one row, so the only choices are the block width and the
warps that cover it.  Each entry says why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Elementwise:
    """One program: ``block`` columns of one row, ``warps`` warps."""

    block: int
    warps: int


#: Forward (reads gate and up, writes the product): 1,024 columns x 4 warps is 8 elements a thread, two 16-byte
#: vectors of bf16 per input, the shape Triton's elementwise tutorials settle on for a bandwidth-bound op; rows of
#: 11,008 take 11 programs each, so a 4 x 2,048-token batch launches 90K programs, enough to fill any GPU.
FWD = Elementwise(1024, 4)

#: Backward (reads dy, gate and up, writes both gradients: five streams): the same 8 elements a thread; more warps
#: a program only lengthens a row's ragged last block.
BWD = Elementwise(1024, 4)

#: A gated MLP whose three projections do not train (an adapter on the attention only, a frozen model's MLP) keeps
#: its input for the backward and computes gate and up again there (``frozen_gated_mlp``) instead of keeping them: two
#: intermediate-width tensors a layer less for two more matmuls a layer in the backward.  On, for the memory that
#: decides batch size and context length: with a LoRA adapter the step's extra peak fell from 1,505 to 843 MiB on
#: Gemma (Liger 1,443) and from 2,404 to 1,902 on Llama (Liger 2,409), for 1.0 ms more GPU time a step (Gemma 18.5
#: -> 19.5 ms busy, Llama 19.5 -> 20.5), which these host-bound steps hid (35.0 / 35.0 and 45.6 / 44.7 ms, H100).
RECOMPUTE_FROZEN = True
