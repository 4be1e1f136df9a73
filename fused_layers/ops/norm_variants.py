r"""RMSNorm in the weight order of Hugging Face's Llama family and T5: the same Triton kernels.

Hugging Face's ``LlamaRMSNorm`` (and its copies: Mistral, Qwen2/Qwen3, Phi-3, ...) computes

    xf = x.float();   h = xf * rsqrt(mean(xf^2) + eps);   y = weight * h.to(x.dtype)

i.e. the normalized row is rounded to the input dtype *before* the weight multiply, and y takes the
promoted dtype of the weight and the input (a float32 weight with a bfloat16 input gives float32).
``torch.nn.functional.rms_norm`` (and ``fused_rms_norm``) multiply in float32 and round once, so the two
differ by one bfloat16 rounding of h -- small, but not what the model was trained with.  Here the
layer_norm kernels run with their ``CAST_BEFORE_W`` constexpr, which rounds h to x's dtype before the
multiply (``cast_before_weight=True``).  T5's ``T5LayerNorm`` rounds h to the *weight's* dtype when that
is half precision and not at all otherwise; with a weight in x's dtype or float32 (the only mixes the
kernels take) that is ``cast_before_weight = weight is half precision``.  In both, y's dtype is
``torch.promote_types(x.dtype, weight.dtype)``.

Backward (derivation in ``layer_norm.py``): dx is the RMSNorm gradient with g = w * dy (the rounding of
h passes gradients through), dW = sum over rows of dy * h with the same rounded h the forward used.

Autocast is not applied: these modules set their dtypes explicitly, and their own forward (float32
casts, elementwise multiply) gives the same dtypes with or without ``torch.autocast``.

``fused_rms_norm_variant`` is the entry point (``ops/_library.FusedOp``: the eager direct path or, under
``torch.compile``, the registered ops); ``rms_norm_variant_reference`` is its PyTorch reference.
"""

from __future__ import annotations

import torch

from . import _cpp, compile_config
from ._common import (
    SUPPORTED_DTYPES,
    check_float_dtype,
    check_same_device,
    check_tensor,
    is_compiling,
    use_fallback,
)
from ._library import FusedOp
from .layer_norm import _cpp_norm, norm_backward, norm_forward

_OP = "fused_rms_norm_variant"
_HALF = (torch.float16, torch.bfloat16)


def _out_dtype(x: torch.Tensor, weight: torch.Tensor, keep_input_dtype: bool) -> torch.dtype:
    return x.dtype if keep_input_dtype else torch.promote_types(x.dtype, weight.dtype)


def rms_norm_variant_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, cast_before_weight: bool,
                               keep_input_dtype: bool = False) -> torch.Tensor:
    """PyTorch reference: the Llama-family order (``cast_before_weight``) or multiply-then-cast, y in
    ``promote_types(x, weight)`` (``keep_input_dtype``: in x's dtype, as Gemma's ``type_as(x)``)."""
    xf = x.float()
    h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out_dtype = _out_dtype(x, weight, keep_input_dtype)
    if cast_before_weight:
        return (weight * h.to(x.dtype)).to(out_dtype)
    return (weight.float() * h).to(out_dtype)


def variant_supported(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """True when the kernels take this (x, weight): a 1-D weight over x's last dim, x half/float32 and
    the weight in x's dtype or float32, on one device (else a module falls back to its own forward)."""
    return (
        weight is not None
        and x.dtype in SUPPORTED_DTYPES
        and weight.dim() == 1
        and x.dim() >= 1
        and weight.shape[0] == x.shape[-1]
        and (weight.dtype == x.dtype or weight.dtype == torch.float32)
        and weight.device == x.device
    )


# Registration through ops/_library.FusedOp (custom ops for torch.compile, autograd, eager direct path).
def _variant_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, cast_before_w: bool,
                 keep_input_dtype: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return norm_forward(x, weight, None, 1, eps, True, cast_before_w=cast_before_w,
                        out_dtype=_out_dtype(x, weight, keep_input_dtype))


def _variant_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stats: torch.Tensor,
                 cast_before_w: bool) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw, _ = norm_backward(dy, x, weight, None, stats, 1, True, cast_before_w=cast_before_w)
    return dx, dw


def _setup_context(ctx, inputs, outputs):
    x, weight, _eps, cast_before_w, _keep = inputs
    ctx.cast_before_w = cast_before_w
    ctx.save_for_backward(x, weight, outputs[1])


def _grads(ctx, backward, dy):
    x, weight, stats = ctx.saved_tensors
    dx, dw = backward(dy, x, weight, stats, ctx.cast_before_w)
    return dx, dw, None, None, None


variant_op = FusedOp("rms_norm_variant", _variant_fwd, _variant_bwd, _setup_context, _grads)


def fused_rms_norm_variant(input: torch.Tensor, weight: torch.Tensor, eps: float, cast_before_weight: bool = True,
                           keep_input_dtype: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim with float32 statistics; ``cast_before_weight`` rounds the normalized
    row to ``input``'s dtype before the weight multiply (HF Llama family), else it multiplies in float32
    and rounds once.  y's dtype is ``torch.promote_types(input.dtype, weight.dtype)``, or ``input``'s with
    ``keep_input_dtype`` (Gemma: ``(h * (1 + w.float())).type_as(x)``).

    ``weight``: 1-D over the last dim, in ``input``'s dtype or float32.  Devices where Triton cannot run
    and float64 use ``rms_norm_variant_reference``.
    """
    if _cpp.ENABLED:  # a registered shape: one C++ call
        y = _cpp.fast_call("rms_variant_fast", input, weight, eps, cast_before_weight, keep_input_dtype)
        if y is not None:
            return y
    check_tensor(_OP, "input", input)
    check_tensor(_OP, "weight", weight)
    check_float_dtype(_OP, "input", input, allow_float64=True)
    check_same_device(_OP, "input", input, weight=weight)
    if input.dim() == 0 or weight.dim() != 1 or weight.shape[0] != input.shape[-1]:
        raise ValueError(
            f"{_OP}: argument 'weight' must be 1-D with input.shape[-1] = {input.shape[-1] if input.dim() else None} "
            f"elements, got shape {list(weight.shape)}"
        )
    if input.dtype == torch.float64 or weight.dtype == torch.float64 or use_fallback(_OP, input, weight):
        return rms_norm_variant_reference(input, weight, eps, cast_before_weight, keep_input_dtype)
    if weight.dtype != input.dtype and weight.dtype != torch.float32:
        raise TypeError(f"{_OP}: argument 'weight' has dtype {weight.dtype}; with a {input.dtype} input it must be "
                        f"{input.dtype} or torch.float32")
    if is_compiling() and compile_config.COMPILED.rms_norm_variant == "inductor":  # Inductor writes it (see there)
        return rms_norm_variant_reference(input, weight, eps, cast_before_weight, keep_input_dtype)
    needs_grad = torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad)
    if needs_grad and _cpp.ENABLED and _cpp.eager_ok():  # (training: the C++ node)
        out_dtype = _out_dtype(input, weight, keep_input_dtype)
        y = _cpp_norm(input, weight, None, 1, float(eps), True, needs_grad, bool(cast_before_weight),
                      None if out_dtype == input.dtype else out_dtype)
        if y is not None:
            return y
    return variant_op(input, weight, float(eps), bool(cast_before_weight), bool(keep_input_dtype),
                      needs_grad=needs_grad)
