"""PEFT's LoRA linear layer (``peft.tuners.lora.layer.Linear``): the ``lora`` kind.

A LoRA layer computes ``base(x) + lora_B(lora_A(dropout(x))) * scaling``.  PEFT keeps its adapters in float32 beside
a bf16 / fp16 model (``autocast_adapter_dtype``) and casts x to float32 for them, so autograd keeps a float32 copy
of every adapted projection's input for lora_A's weight gradient: with LoRA on q, k, v and o, four copies a layer
at twice the input's size (128 MiB a layer at 8,192 tokens x 1,024).  The fused forward runs the same operations
in the same dtypes (the same result, the same dropout draw) without PEFT's module calls: the base linear, lora_B,
the scaling and the sum as autograd ops, and lora_A's product ``linear(x.to(float32), A)`` with saved-tensor hooks
that keep x in its own dtype in place of its float32 copy and cast it again in the backward (with a dropout, a small
``autograd.Function`` that does the same and keeps the dropout's bool mask; under autocast the product keeps
autocast's 16-bit copy already, and PEFT's ops run as they are).  Measured on an H100
(the models suite's LoRA rows, q, k, v, o adapted): extra peak Llama 1.86 -> 0.99 GiB, Qwen2 2.45 -> 1.30, Gemma
0.82 -> 0.50, for one more cast of each adapted input in the backward (GPU time +2-5 % of these steps).

Verified by the syntax tree of the forward (``integrations.fingerprint``, PEFT 0.21's), with the instance checked at
each call; anything else runs PEFT's forward: adapters disabled or merged, several active adapters, a variant (DoRA,
...), a dropout module other than ``nn.Dropout`` / ``nn.Identity``, a base layer or adapter that is not exactly an
``nn.Linear`` or that something hooks (quantized, ZeRO-3), an adapter bias, extra arguments (``adapter_names``),
DTensors, no gradient, and ``torch.compile`` (Dynamo traces PEFT's code). Under ``torch.autocast`` (the HF Trainer's
``bf16=True``) the linears take their operands cast as autocast casts them.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..ops._common import autocast_dtype, is_compiling, is_dtensor
from . import REGISTRY, LookAlike
from ._hf_decoder import _plain_linear, unhooked

LORA_LINEAR_FORWARD = '''
def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    self._check_forward_args(x, *args, **kwargs)
    adapter_names = kwargs.pop("adapter_names", None)
    variant_kwargs = {k: kwargs.pop(k, None) for k in VARIANT_KWARG_KEYS}  # don't pass these to base_layer

    if self.disable_adapters:
        if self.merged:
            self.unmerge()
        result = self.base_layer(x, *args, **kwargs)
    elif adapter_names is not None:
        result = self._mixed_batch_forward(x, *args, adapter_names=adapter_names, **variant_kwargs, **kwargs)
    elif self.merged:
        result = self.base_layer(x, *args, **kwargs)
    else:
        result = self.base_layer(x, *args, **kwargs)
        torch_result_dtype = result.dtype

        lora_A_keys = self.lora_A.keys()
        for active_adapter in self.active_adapters:
            if active_adapter not in lora_A_keys:
                continue

            lora_A = self.lora_A[active_adapter]
            lora_B = self.lora_B[active_adapter]
            dropout = self.lora_dropout[active_adapter]
            scaling = self.scaling[active_adapter]
            x = self._cast_input_dtype(x, lora_A.weight.dtype)
            if active_adapter not in self.lora_variant:  # vanilla LoRA
                result = result + lora_B(lora_A(dropout(x))) * scaling
            else:
                result = self.lora_variant[active_adapter].forward(
                    self,
                    active_adapter=active_adapter,
                    x=x,
                    result=result,
                    **variant_kwargs,
                    **kwargs,
                )

        result = result.to(torch_result_dtype)

    return result
'''


def _dropout(xc: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.Dropout(p)`` in training, as ``F.dropout`` draws it (the fused kernel on CUDA / XPU, a noise tensor on the
    CPU): (output, the kept elements as a bool mask)."""
    if xc.device.type in ("cuda", "xpu"):
        return torch.native_dropout(xc, p, True)
    noise = torch.empty_like(xc).bernoulli_(1 - p).div_(1 - p)
    return xc * noise, noise != 0


def _dropout_again(t: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """``t`` times the dropout's noise, as its forward (t = x') and backward (t = the gradient) multiply by it."""
    if t.device.type in ("cuda", "xpu"):
        return torch.ops.aten.native_dropout_backward(t, mask, 1.0 / (1 - p))  # t * mask * scale, as the kernel
    return t * mask.to(t.dtype).div_(1 - p)


class _LoraAFunction(torch.autograd.Function):
    """lora_A's product ``linear(drop(x'), A)`` with ``x' = x.to(cast)``, as PEFT computes it, saving x (not x' nor
    drop(x')), the dropout's bool mask and A.  Under autocast (``cd``, its dtype) the product takes its operands cast
    to it, as autocast casts them.

    Backward, from d xa (r columns): ``dA = d xa^T drop(x')`` with drop(x') built again from x and the mask, and
    ``dx = drop(d xa A)`` cast back through the casts x went through (to x' 's dtype from ``cd``, then to x's), as
    autograd's ``mm``, ``native_dropout`` and ``_to_copy`` backwards form them."""

    @staticmethod
    def forward(ctx, x, a, cast, cd, p):
        xc = x if cast is None else x.to(cast)
        xd, mask = _dropout(xc, p) if p else (xc, None)
        if cd is None:
            ar = a
            xa = torch.nn.functional.linear(xd, a)  # x' and drop(x') die here
        else:
            with torch.autocast(x.device.type, enabled=False):  # the casts are explicit, as autocast makes them
                ar = a.to(cd)
                xa = torch.nn.functional.linear(xd.to(cd), ar)
        ctx.cast, ctx.cd, ctx.p, ctx.a_dtype = cast, cd, p, a.dtype
        ctx.save_for_backward(x, ar, mask)
        return xa

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_xa):
        x, ar, mask = ctx.saved_tensors
        cast, cd, p = ctx.cast, ctx.cd, ctx.p
        d2 = d_xa.reshape(-1, d_xa.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        m2 = mask.reshape(x2.shape) if p else None
        da = dx = None
        if ctx.needs_input_grad[1]:
            xd = x2 if cast is None else x2.to(cast)
            if p:
                xd = _dropout_again(xd, m2, p)
            da = d2.t().mm(xd if cd is None else xd.to(cd)).to(ctx.a_dtype)
        if ctx.needs_input_grad[0]:
            dxd = d2.mm(ar)
            if cd is not None:
                dxd = dxd.to(cast or x.dtype)
            if p:
                dxd = _dropout_again(dxd, m2, p)
            dx = dxd.to(x.dtype).reshape(x.shape)
        return dx, da, None, None, None


def _keep_input(x: torch.Tensor, xc: torch.Tensor) -> tuple:
    """Saved-tensor hooks under which autograd keeps x in place of its copy ``xc = x.to(dtype)`` (or a view of it
    with xc's memory, as a linear's matmul saves a 3-D input), casting x again when the backward reads it: the same
    values, bit for bit, for half the memory of a float32 copy of a 16-bit x."""
    ptr, dtype, numel = xc.data_ptr(), xc.dtype, xc.numel()

    def pack(t: torch.Tensor):
        if t.data_ptr() == ptr and t.dtype == dtype and t.numel() == numel and t.is_contiguous():
            return x, t.shape, x._version
        return t

    def unpack(saved):
        if type(saved) is not tuple:
            return saved
        if saved[0]._version != saved[2]:  # as autograd checks what it saves itself
            raise RuntimeError("one of the variables needed for gradient computation has been modified by an "
                               "inplace operation: the input of a LoRA layer, kept for lora_A's weight gradient")
        return saved[0].to(dtype).view(saved[1])

    return pack, unpack


def _lora_a(x: torch.Tensor, a: torch.Tensor, cast: Optional[torch.dtype], cd: Optional[torch.dtype],
            p: float) -> torch.Tensor:
    """lora_A's product ``linear(drop(x.to(cast)), A)``, keeping x rather than a float32 copy of it for A's gradient.

    Without dropout or autocast, PEFT's own autograd ops under saved-tensor hooks (``_keep_input``), so autograd's
    C++ backward runs them: a LoRA layer's forward + backward took 247 us of host time against 275 us with
    ``_LoraAFunction``'s Python backward and 221 us in PEFT's module (CPU, tiny tensors).  Under
    autocast the product saves autocast's 16-bit copy of its input, no float32 one, so PEFT's ops run as they are
    (the dropout's mask is a bool on CUDA there; on the CPU ``F.dropout`` keeps a float32 noise, so the Function
    runs).  With a dropout and no autocast, or where other saved-tensor hooks are active (activation
    checkpointing), ``_LoraAFunction``."""
    if cast is None and not p and cd is None:
        return torch.nn.functional.linear(x, a)  # no copy to keep: PEFT's ops as they are
    if cd is not None and (not p or x.device.type in ("cuda", "xpu")):
        xc = x if cast is None else x.to(cast)
        return torch.nn.functional.linear(torch.nn.functional.dropout(xc, p, True) if p else xc, a)
    if p or cd is not None or not x.is_contiguous() or torch._C._autograd._top_saved_tensors_default_hooks(False):
        return _LoraAFunction.apply(x, a, cast, cd, p)
    xc = x.to(cast)
    with torch.autograd.graph.saved_tensors_hooks(*_keep_input(x, xc)):
        return torch.nn.functional.linear(xc, a)


def _lora_forward(x, w, b, a, bw, scaling, cast, cd, p):
    """PEFT's ``base(x) + lora_B(lora_A(dropout(x'))) * scaling`` cast to the base's result dtype: the base linear,
    lora_B, the scaling and the sum as autograd ops (autocast casts them as in PEFT), lora_A's product ``_lora_a``."""
    result = torch.nn.functional.linear(x, w, b)
    lb = torch.nn.functional.linear(_lora_a(x, a, cast, cd, p), bw)
    return (result + lb * scaling).to(result.dtype)


def _lora_call(self: nn.Module, x: torch.Tensor) -> Optional[tuple]:
    """The fused call's arguments after x, or None where PEFT's own forward must run (module docstring)."""
    if self._disable_adapters or self.merged_adapters or not torch.is_grad_enabled():
        return None
    active = self.active_adapter
    names = [active] if isinstance(active, str) else list(active)
    if len(names) != 1 or names[0] in getattr(self, "lora_variant", {}):
        return None
    # Submodules and parameters read from their dicts: nn.Module.__getattr__ costs about 1 us a lookup, most of
    # this check's host time (14.4 -> 5.4 us a call on the CPU).
    name, mods = names[0], self._modules
    base = mods.get("base_layer")
    lora_a, lora_b, drop = (getattr(mods.get(k), "_modules", {}).get(name)
                            for k in ("lora_A", "lora_B", "lora_dropout"))
    if not (_plain_linear(base) and _plain_linear(lora_a) and _plain_linear(lora_b) and drop is not None
            and unhooked(drop)):
        return None
    ap, bp = lora_a._parameters, lora_b._parameters
    if ap.get("bias") is not None or bp.get("bias") is not None:
        return None
    if type(drop) is nn.Dropout:
        p = float(drop.p) if drop.training else 0.0
        if not 0 <= p < 1:
            return None
    elif type(drop) is nn.Identity:
        p = 0.0
    else:
        return None
    scaling = self.scaling[name]
    cd = autocast_dtype(x)
    if type(scaling) not in (int, float) or cd not in (None, torch.bfloat16, torch.float16):
        return None
    bw = base._parameters
    ws = (bw.get("weight"), ap.get("weight"), bp.get("weight"))
    if any(w is None for w in ws):
        return None
    if not (x.requires_grad or any(w.requires_grad for w in ws)) or any(map(is_dtensor, (x, *ws))):
        return None
    dt = ws[1].dtype
    cast = dt if getattr(self, "cast_input_dtype_enabled", True) and x.dtype != dt else None
    return ws[0], bw.get("bias"), ws[1], ws[2], float(scaling), cast, cd, p


def _build_lora_linear(cls: type) -> dict:
    source_forward = cls.forward

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = None if (args or kwargs or is_compiling()) else _lora_call(self, x)
        if call is None:
            return source_forward(self, x, *args, **kwargs)
        return _lora_forward(x, *call)

    return {"forward": forward}


def _lora_check(m: nn.Module) -> Optional[str]:
    base = getattr(m, "base_layer", None)
    if type(base) is not nn.Linear:
        return (f"its base layer is {type(base).__module__}.{type(base).__qualname__}, not an nn.Linear (a quantized "
                "layer): PEFT's forward runs")
    return None


REGISTRY.append(
    LookAlike("peft_lora_linear", "peft", "lora", "peft.tuners.lora.layer.Linear", _build_lora_linear,
              forward_src=LORA_LINEAR_FORWARD, check=_lora_check,
              note="PEFT LoRA on an nn.Linear: its ops, the input kept in its dtype (PEFT keeps a float32 copy)"),
)
