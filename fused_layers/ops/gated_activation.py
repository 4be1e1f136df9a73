r"""The gated MLP activation ``act(gate) * up`` (SwiGLU, GeGLU): Triton forward and backward.

The MLP of Llama, Mistral, Qwen2/3, Gemma and Phi-3 is ``down(act(gate(x)) * up(x))``.  Written in PyTorch, the
product keeps three intermediate-width tensors alive for the backward (``gate``, ``up`` and ``act(gate)``) and runs
three elementwise kernels.  Here the forward is one kernel, and the backward *recomputes* ``act(gate)`` from the
saved ``gate`` instead of keeping it: autograd holds gate and up only (the inputs, which eager PyTorch keeps too),
one intermediate-width tensor less per layer than eager PyTorch.

Forward.  For a gate value g and an up value u, with the activation a(g),

    y = a(g) * u

Backward, from dy,

    dg = dy * u * a'(g),        du = dy * a(g)

with the activations and their derivatives (sigma the logistic function, Phi / phi the normal CDF / density):

    SiLU:        a(g) = g sigma(g),                       a'(g) = sigma(g) (1 + g (1 - sigma(g)))
    GELU (erf):  a(g) = g Phi(g),  Phi(g) = (1 + erf(g / sqrt 2)) / 2,
                 a'(g) = Phi(g) + g phi(g),  phi(g) = exp(-g^2 / 2) / sqrt(2 pi)
    GELU (tanh): a(g) = g (1 + t) / 2,  t = tanh(k (g + c g^3)),  k = sqrt(2 / pi),  c = 0.044715,
                 a'(g) = (1 + t) / 2 + g (1 - t^2) k (1 + 3 c g^2) / 2

tanh is computed as 1 - 2 / (exp(2u) + 1) (exact limits: exp overflowing to inf gives 1, exp underflowing to 0
gives -1).  Everything is float32 in registers; y, dg and du are rounded once to the inputs' dtype.  Eager PyTorch
in bfloat16 rounds ``a(g)`` to bfloat16 before the product (one more rounding): the kernels are the more accurate
of the two, within one bfloat16 rounding of it.

Layouts.  ``gate`` and ``up`` are viewed as M rows of width N = their last dim, with unit column stride and one row
stride each (contiguous tensors, and the two halves of one ``gate_up`` projection output, Phi-3's
``gate_up_proj(x).chunk(2, -1)``, with no copy).  Passing that concatenated tensor alone (``up=None``) also writes
the backward's two gradients into one [..., 2N] gradient, the layout its linear wants, instead of two halves that
autograd would then concatenate.  Other layouts are copied to contiguous first.

With the down projection.  ``down(y)`` keeps y for its weight gradient dW = dz^T y, another intermediate-width
tensor per layer.  ``fused_gated_activation_linear`` keeps only gate and up: its backward computes dy = dz W first,
then the backward kernel, which recomputes a(g) anyway, also writes y = a(g) u (``WRITE_Y``: one more write of the
intermediate width) for dW, over dy (each program reads its elements of dy before it writes them): the backward
allocates dg and du only.

Launch: one program per (row, block of ``BLOCK_N`` columns), rows on grid axis 0 (up to 2^31 - 1), the column
blocks on axis 1.  Configuration: ops/gated_activation_config.py.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import gated_activation_config as cfg
from ._common import (
    SUPPORTED_DTYPES,
    FusedDtypeError,
    FusedShapeError,
    autocast_dtype,
    autocast_off,
    check_float_dtype,
    check_same_device,
    check_tensor,
    concrete,
    is_compiling,
    is_dtensor,
    override_epoch,
    triton_runnable,
    use_fallback,
)
from ._library import FusedOp, Kernel
from ._rows import last_dim_row_stride

_OP = "fused_gated_activation"

#: The activations by name, as the kernels' ``ACT`` constexpr.  The names are transformers' ``hidden_act`` ones
#: where they exist ("silu", "gelu", "gelu_pytorch_tanh"); "swish" and "gelu_tanh" are accepted aliases.
ACTIVATIONS = {"silu": 0, "swish": 0, "gelu": 1, "gelu_tanh": 2, "gelu_pytorch_tanh": 2}
_SILU, _GELU, _GELU_TANH = 0, 1, 2


# ==================================================================================================
# Kernels
# ==================================================================================================
@triton.jit
def _act_and_grad(g, ACT: tl.constexpr, NEED_GRAD: tl.constexpr):
    """(a(g), a'(g)) in float32 for the activation ``ACT`` (module docstring); a'(g) is 0 unless NEED_GRAD."""
    da = g * 0.0
    if ACT == 0:  # SiLU
        s = 1.0 / (1.0 + tl.exp(-g))  # sigma(g); exp(-g) = inf for very negative g gives s = 0, a(g) = -0
        a = g * s
        if NEED_GRAD:
            da = s * (1.0 + g * (1.0 - s))
    elif ACT == 1:  # GELU, exact (erf)
        cdf = 0.5 * (1.0 + tl.erf(g * 0.7071067811865476))  # Phi(g), 1 / sqrt 2
        a = g * cdf
        if NEED_GRAD:  # Phi(g) + g phi(g), 1 / sqrt(2 pi) = 0.3989...
            da = cdf + g * 0.3989422804014327 * tl.exp(-0.5 * g * g)
    else:  # GELU, tanh approximation
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)  # k (g + c g^3), k = sqrt(2 / pi)
        t = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)  # tanh(inner), exact at both ends
        a = 0.5 * g * (1.0 + t)
        if NEED_GRAD:  # 3 c = 0.134145
            da = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * g * g)
    return a, da


@triton.jit
def _gated_fwd_kernel(
    G,  # pointer to the gate, [M, N], row stride sg, unit column stride
    U,  # pointer to the up projection, [M, N], row stride su, unit column stride
    Y,  # pointer to the output, [M, N] contiguous
    N,  # row width (the intermediate size)
    sg, su,  # row strides of G and U (elements)
    ACT: tl.constexpr,  # 0 SiLU, 1 GELU (erf), 2 GELU (tanh)
    BLOCK_N: tl.constexpr,  # columns per program
    GATED: tl.constexpr,  # False: y = a(g), no U read (fused_activation_linear's MLP)
):
    """y = a(g) * u (GATED) or y = a(g) for BLOCK_N columns of one row."""
    row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: tensors beyond 2^31 elements address correctly
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    # Load, then float32 before any math (the interpreter's 16-bit arithmetic is not the GPU's).
    g = tl.load(G + row * sg + cols, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        u = tl.load(U + row * su + cols, mask=mask, other=0.0).to(tl.float32)
    a, _ = _act_and_grad(g, ACT, False)
    if GATED:
        a = a * u
    tl.store(Y + row * N + cols, a.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gated_bwd_kernel(
    DY,  # pointer to the incoming gradient, [M, N], row stride sdy, unit column stride
    G, U,  # pointers to the saved gate and up (as in _gated_fwd_kernel)
    DG, DU,  # pointers to the gradients of gate and up (written), row strides sdg / sdu (two halves of one
    #          [M, 2N] tensor when the input was the concatenated gate_up)
    Y,  # pointer to the recomputed product y = a(g) * u, [M, N] contiguous (written only with WRITE_Y); may be DY
    #     itself when DY is contiguous: each element of DY is loaded before this program stores Y there
    N,  # row width
    sdy, sg, su, sdg, sdu,  # row strides (elements)
    ACT: tl.constexpr,  # as in _gated_fwd_kernel
    WRITE_Y: tl.constexpr,  # also write y (the linear variants: the down projection's weight gradient)
    BLOCK_N: tl.constexpr,  # columns per program
    GATED: tl.constexpr,  # False: y = a(g); no U read, no DU written (fused_activation_linear's MLP)
):
    """dg = dy * u * a'(g), du = dy * a(g) for BLOCK_N columns of one row, a(g) recomputed from g; with WRITE_Y
    also y = a(g) * u, the forward's product (the same float32 math, rounded once).  Not GATED: dg = dy * a'(g)
    and y = a(g)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    dy = tl.load(DY + row * sdy + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + row * sg + cols, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        u = tl.load(U + row * su + cols, mask=mask, other=0.0).to(tl.float32)
    # The activation is recomputed here: the forward saved no a(g).
    a, da = _act_and_grad(g, ACT, True)
    if GATED:
        tl.store(DG + row * sdg + cols, (dy * u * da).to(DG.dtype.element_ty), mask=mask)
        tl.store(DU + row * sdu + cols, (dy * a).to(DU.dtype.element_ty), mask=mask)
        if WRITE_Y:
            tl.store(Y + row * N + cols, (a * u).to(Y.dtype.element_ty), mask=mask)
    else:
        tl.store(DG + row * sdg + cols, (dy * da).to(DG.dtype.element_ty), mask=mask)
        if WRITE_Y:
            tl.store(Y + row * N + cols, a.to(Y.dtype.element_ty), mask=mask)


# ==================================================================================================
# PyTorch reference (tests, the fallback where Triton cannot run)
# ==================================================================================================
def activation_reference(g: torch.Tensor, activation: str) -> torch.Tensor:
    """a(g) by PyTorch, in g's dtype."""
    code = ACTIVATIONS[activation]
    if code == _SILU:
        return torch.nn.functional.silu(g)
    return torch.nn.functional.gelu(g, approximate="tanh" if code == _GELU_TANH else "none")


def gated_activation_reference(gate: torch.Tensor, up: Optional[torch.Tensor] = None,
                               activation: str = "silu") -> torch.Tensor:
    """``act(gate) * up`` computed in float32 (float64 stays float64), returned in gate's dtype; ``up=None``:
    ``gate`` is the concatenation [..., 2N] of gate and up."""
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    acc = torch.float64 if gate.dtype == torch.float64 else torch.float32
    return (activation_reference(gate.to(acc), activation) * up.to(acc)).to(gate.dtype)


# ==================================================================================================
# Launch plans and launchers
# ==================================================================================================
class _Plan:
    __slots__ = ("m", "n", "copy", "kernel", "ints")


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096  # a workload with ever-changing shapes re-plans instead of growing without bound


def _plan(direction: str, shape, strides: tuple, act: int) -> _Plan:
    """The launch plan of one direction for tensors of ``shape`` (the [.., N] halves) with ``strides`` (the
    inputs' then the outputs'), cached with its bound kernel."""
    key = (direction, shape, strides, act, override_epoch())
    try:
        plan = _PLANS.get(key)
    except TypeError:  # symbolic sizes (tracing with dynamic shapes): plan for their values
        return _plan(direction, concrete(shape), tuple(concrete(s) for s in strides), act)
    if plan is not None:
        return plan
    plan = _Plan()
    n = shape[-1] if len(shape) else 1
    m = 1
    for s in shape[:-1]:
        m *= s
    row = [last_dim_row_stride(shape, st) for st in strides]
    plan.m, plan.n = m, n
    plan.copy = [r is None for r in row]
    row = [n if r is None else r for r in row]
    c = cfg.FWD if direction.endswith("fwd") else cfg.BWD
    plan.ints = (n, *row)
    plan.kernel = None
    if m * n > 0:
        grid = (m, triton.cdiv(n, c.block))
        # "act_*": the activation alone (GATED=False; the U / DU pointers are the G / DG ones, never read or written)
        gated = not direction.startswith("act_")
        if direction in ("fwd", "act_fwd"):
            plan.kernel = Kernel(_gated_fwd_kernel, grid, check=(0, 1, 2), ACT=act, BLOCK_N=c.block, GATED=gated,
                                 num_warps=c.warps)
        else:  # "bwd", or "bwd_y": the backward that also writes the product
            plan.kernel = Kernel(_gated_bwd_kernel, grid, check=tuple(range(6)), ACT=act,
                                 WRITE_Y=direction.endswith("bwd_y"), BLOCK_N=c.block, GATED=gated, num_warps=c.warps)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _halves(gate: torch.Tensor, up: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    if up is None:
        n = gate.shape[-1] // 2
        return gate[..., :n], gate[..., n:]
    return gate, up


def gated_forward(gate: torch.Tensor, up: Optional[torch.Tensor], act: int) -> torch.Tensor:
    """Launch y = a(gate) * up; ``up=None``: ``gate`` is the concatenated [..., 2N] gate_up.  y is contiguous,
    in gate's dtype."""
    g, u = _halves(gate, up)
    y = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    plan = _plan("fwd", g.shape, (g.stride(), u.stride()), act)
    if plan.kernel is None:
        return y
    g = g.contiguous() if plan.copy[0] else g
    u = u.contiguous() if plan.copy[1] else u
    plan.kernel(g, u, y, *plan.ints)
    return y


def gated_backward(dy: torch.Tensor, gate: torch.Tensor, up: Optional[torch.Tensor],
                   act: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward: (d gate, d up); with ``up=None`` (d gate_up [..., 2N], an empty placeholder)."""
    return _launch_backward(dy, gate, up, act, None)


def _launch_backward(dy: torch.Tensor, gate: torch.Tensor, up: Optional[torch.Tensor], act: int,
                     y_out: Optional[torch.Tensor], over_inputs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``gated_backward``; with ``y_out`` (contiguous, the halves' shape and dtype; ``dy`` itself is allowed) also
    writes the recomputed product a(gate) * up into it; with ``over_inputs`` the gradients go over gate and up
    themselves where their layout takes them without a copy (each element read, then written, by one program)."""
    g, u = _halves(gate, up)
    if dy.dtype != g.dtype:
        dy = dy.to(g.dtype)
    over = over_inputs and all(last_dim_row_stride(t.shape, t.stride()) is not None for t in (g, u))
    if over:
        dg, du = g, u
        outs = (gate, up) if up is not None else (gate, torch.empty((0,), dtype=gate.dtype, device=gate.device))
    elif up is None:
        dgu = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        dg, du = _halves(dgu, None)
        outs = (dgu, torch.empty((0,), dtype=gate.dtype, device=gate.device))
    else:
        dg = torch.empty(g.shape, dtype=g.dtype, device=g.device)
        du = torch.empty(u.shape, dtype=u.dtype, device=u.device)
        outs = (dg, du)
    plan = _plan("bwd" if y_out is None else "bwd_y", g.shape,
                 (dy.stride(), g.stride(), u.stride(), dg.stride(), du.stride()), act)
    if plan.kernel is None:
        return outs
    dy = dy.contiguous() if plan.copy[0] else dy
    g = g.contiguous() if plan.copy[1] else g  # (never with ``over``: its layouts take no copy)
    u = u.contiguous() if plan.copy[2] else u
    # (the outputs are allocated in a layout without copies; Y is dg when not written: any valid pointer)
    plan.kernel(dy, g, u, dg, du, dg if y_out is None else y_out, *plan.ints)
    if over:  # a copy of gate / up that another op saved, read after this, raises instead of reading gradients
        for t in (gate, up):
            if t is not None:
                torch.autograd.graph.increment_version(t)
    return outs


# ==================================================================================================
# Registration (ops/_library.py): custom ops for torch.compile, autograd, the eager direct path
# ==================================================================================================
def _setup_context(ctx, inputs, outputs):
    gate, up, act = inputs
    ctx.act, ctx.has_up = act, up is not None
    ctx.save_for_backward(gate, up)  # the inputs only: a(gate) is recomputed in the backward


def _grads(ctx, backward, dy):
    gate, up = ctx.saved_tensors
    dg, du = backward(dy, gate, up, ctx.act)
    return dg, (du if ctx.has_up else None), None


gated_op = FusedOp("gated_activation", gated_forward, gated_backward, _setup_context, _grads)


def _validate(gate: object, up: object, activation: object) -> tuple[torch.Tensor, Optional[torch.Tensor], int]:
    gate = check_tensor(_OP, "gate", gate)
    if up is not None:
        up = check_tensor(_OP, "up", up)
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{_OP}: argument 'activation' must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    check_float_dtype(_OP, "gate", gate, allow_float64=True)
    if gate.dim() == 0:
        raise FusedShapeError(f"{_OP}: argument 'gate' must have at least one dimension, got a 0-d tensor")
    if up is None:
        if gate.shape[-1] % 2:
            raise FusedShapeError(f"{_OP}: with up=None, argument 'gate' is the concatenated gate_up and its last dim "
                                  f"must be even, got shape {list(gate.shape)}")
    else:
        check_same_device(_OP, "gate", gate, up=up)
        if up.dtype != gate.dtype:
            raise FusedDtypeError(f"{_OP}: arguments 'gate' ({gate.dtype}) and 'up' ({up.dtype}) must have the same "
                                  "dtype")
        if up.shape != gate.shape:
            raise FusedShapeError(f"{_OP}: arguments 'gate' and 'up' must have the same shape, got "
                                  f"{list(gate.shape)} and {list(up.shape)}")
    return gate, up, ACTIVATIONS[activation]


def fused_gated_activation(gate: torch.Tensor, up: Optional[torch.Tensor] = None,
                           activation: str = "silu") -> torch.Tensor:
    """``act(gate) * up`` in one kernel; the backward recomputes ``act(gate)`` (saves gate and up only).

    Args:
        gate: the gate projection's output, (..., N), float16 / bfloat16 / float32 (float64 and devices where
            Triton cannot run use ``gated_activation_reference``).
        up: the up projection's output, same shape and dtype; ``None``: ``gate`` is the two concatenated,
            (..., 2N), gate first (Phi-3's ``gate_up_proj`` output, ``chunk(2, dim=-1)``'s order).
        activation: ``"silu"`` (SwiGLU; alias ``"swish"``), ``"gelu"`` (GeGLU, exact erf) or ``"gelu_tanh"``
            (GeGLU, tanh approximation; alias ``"gelu_pytorch_tanh"``).

    Returns: (..., N), contiguous, in gate's dtype; math in float32, rounded once.
    """
    gate, up, act = _validate(gate, up, activation)
    if gate.dtype == torch.float64 or use_fallback(_OP, gate, up):
        return gated_activation_reference(gate, up, activation)
    if gate.dtype not in SUPPORTED_DTYPES:  # pragma: no cover - _validate took float64 and these only
        raise FusedDtypeError(f"{_OP}: argument 'gate' has dtype {gate.dtype}")
    needs_grad = torch.is_grad_enabled() and (gate.requires_grad or (up is not None and up.requires_grad))
    return gated_op(gate, up, act, needs_grad=needs_grad)


def fused_swiglu(gate: torch.Tensor, up: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``silu(gate) * up`` (Llama, Mistral, Qwen2/3, Phi-3): ``fused_gated_activation(gate, up, "silu")``."""
    return fused_gated_activation(gate, up, "silu")


def fused_geglu(gate: torch.Tensor, up: Optional[torch.Tensor] = None, approximate: str = "tanh") -> torch.Tensor:
    """``gelu(gate, approximate=approximate) * up`` (Gemma: ``"tanh"``; ``"none"``: exact erf), as
    ``fused_gated_activation``."""
    if approximate not in ("tanh", "none"):
        raise ValueError(f"fused_geglu: argument 'approximate' must be 'tanh' or 'none', got {approximate!r}")
    return fused_gated_activation(gate, up, "gelu_tanh" if approximate == "tanh" else "gelu")


# ==================================================================================================
# The activation and the down projection: the product is written again in the backward, not saved
# ==================================================================================================
_OP_LINEAR = "fused_gated_activation_linear"


class _GatedLinearFunction(torch.autograd.Function):
    """``linear(a(gate) * up, weight, bias)`` in the compute dtype, saving gate and up (and the weight) only.

    The down projection's weight gradient needs the product h = a(gate) * up, which an eager MLP keeps for the
    backward (one (tokens, intermediate) tensor per layer).  Here the backward kernel, which reads gate and up and
    recomputes a(gate) anyway, writes h again beside dgate and dup: one more intermediate-width write a layer in the
    backward for one intermediate-width tensor less held from the forward to the backward."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias, act, cdtype, over_inputs):
        with autocast_off(gate):  # the casts are explicit, as autocast makes them
            w = weight.to(cdtype)
            b = bias.to(cdtype) if bias is not None else None
            y = torch.nn.functional.linear(gated_forward(gate, up, act), w, b)  # the product dies here
        ctx.act, ctx.has_up, ctx.has_bias, ctx.over_inputs = act, up is not None, bias is not None, over_inputs
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        ctx.save_for_backward(gate, up, w)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        gate, up, w = ctx.saved_tensors
        dg, du, dw, dy2 = _gated_linear_grads(dy, gate, up, w, ctx.act, ctx.needs_input_grad[2], ctx.over_inputs)
        dw = dw.to(ctx.dtypes[0]) if dw is not None else None
        db = dy2.sum(0, dtype=torch.float32).to(ctx.dtypes[1]) if ctx.has_bias and ctx.needs_input_grad[3] else None
        return dg, (du if ctx.has_up else None), dw, db, None, None, None


def _gated_linear_grads(dy: torch.Tensor, gate: torch.Tensor, up: Optional[torch.Tensor], w: torch.Tensor, act: int,
                        need_w: bool, over_inputs: bool):
    """The backward of ``linear(a(gate) * up, w)`` from dy: (d gate, d up, dW in w's dtype or None, dy as rows)."""
    g, _ = _halves(gate, up)
    n = g.shape[-1]
    dy2 = dy.reshape(-1, dy.shape[-1]).to(w.dtype)
    dh = (dy2 @ w).reshape(g.shape)  # d(loss)/dh, (..., N)
    # The forward's product, written again beside dgate and dup where the weight's gradient needs it (a frozen
    # down projection, as under an adapter elsewhere in the model, needs none), over dh itself.
    h = _over(dh, g) if need_w else None
    dg, du = _launch_backward(dh, gate, up, act, h, over_inputs)
    del dh
    dw = dy2.t() @ h.reshape(-1, n) if h is not None else None
    return dg, du, dw, dy2


def _over(dh: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Where the backward kernel writes the recomputed product (or activation): over ``dh``, which it reads at the
    same element just before (each element read, then written, by one program), so that the backward holds one
    intermediate-width tensor less at its peak (46 MiB a layer at Llama's 8,192 x 2,816 tokens x width in bf16);
    a new tensor where dh is not ``like``'s contiguous shape and dtype."""
    if dh.dtype == like.dtype and dh.shape == like.shape and dh.is_contiguous():
        return dh
    return torch.empty(like.shape, dtype=like.dtype, device=like.device)


def _overwritable(*ts: Optional[torch.Tensor]) -> bool:
    """Each tensor an intermediate of autograd (not a leaf, nor a view of one, e.g. a parameter's slice), and no
    two of them sharing an element (the same tensor passed as gate and up would get both gradients written over it;
    the two column halves of one gate_up tensor share none): what the backward may overwrite with its gradients
    once it has read it."""
    ts = [t for t in ts if t is not None]
    for t in ts:
        base = t if t._base is None else t._base
        if not t.requires_grad or t.grad_fn is None or base.grad_fn is None:
            return False
    for i, a in enumerate(ts):
        for b in ts[i + 1:]:
            if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and not _disjoint_columns(a, b):
                return False
    return True


def _disjoint_columns(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` (views of one storage) are column blocks of the same rows that do not meet:
    equal shapes and row stride, unit column stride, their offsets at least a row's width apart within a row."""
    ra, rb = last_dim_row_stride(a.shape, a.stride()), last_dim_row_stride(b.shape, b.stride())
    if ra is None or ra != rb or a.shape != b.shape or a.dim() == 0:
        return False
    d, n = abs(a.storage_offset() - b.storage_offset()), a.shape[-1]
    return n <= d and d + n <= ra


def _linear_operands(op: str, name: str, x: torch.Tensor, up: Optional[torch.Tensor], n: int, weight: object,
                     bias: object) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.dtype]]:
    """Check the second linear's ``weight`` (out, n) and ``bias`` (out,) against the activation's input ``x`` (and
    ``up``), as ``F.linear`` would; returns (weight, bias, compute dtype), the dtype None where the kernels do not
    run (no gradient, float64, x not in the autocast dtype, where Triton cannot run)."""
    weight = check_tensor(op, "weight", weight)
    if bias is not None:
        bias = check_tensor(op, "bias", bias)
    if weight.dim() != 2 or weight.shape[1] != n:
        raise RuntimeError(f"{op}: argument 'weight' must be (out, {n}) for an input of width {n}, got shape "
                           f"{list(weight.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise RuntimeError(f"{op}: argument 'bias' must have shape [{weight.shape[0]}], got {list(bias.shape)}")
    check_same_device(op, name, x, weight=weight, bias=bias)
    adt = autocast_dtype(x)
    cdtype = adt if adt is not None else x.dtype
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, up, weight, bias))
    if (not needs_grad or x.dtype != cdtype or x.dtype not in SUPPORTED_DTYPES
            or use_fallback(op, x, up, weight, bias)):
        return weight, bias, None
    if adt is None and (weight.dtype != cdtype or (bias is not None and bias.dtype != cdtype)):
        raise RuntimeError(f"{op}: '{name}' ({x.dtype}), 'weight' ({weight.dtype}) and 'bias' must have one dtype "
                           "outside autocast (as F.linear)")
    return weight, bias, cdtype


def fused_gated_activation_linear(gate: torch.Tensor, up: Optional[torch.Tensor], weight: torch.Tensor,
                                  bias: Optional[torch.Tensor] = None, activation: str = "silu", *,
                                  reuse_inputs: bool = False) -> torch.Tensor:
    """``F.linear(act(gate) * up, weight, bias)``: a gated MLP's activation and its down projection, whose backward
    writes the product again instead of keeping it from the forward (one (tokens, intermediate) tensor less per MLP
    held for the backward: 64 MiB a layer at 4,096 tokens x 8,192 in bf16).

    Args:
        gate, up, activation: as ``fused_gated_activation`` (``up=None``: ``gate`` is the concatenated gate_up).
        weight: the down projection's weight, (out, N); bias: (out,) or None.
        reuse_inputs: the backward writes d gate and d up over gate and up instead of into new tensors (two
            intermediate-width tensors less at its peak), for inputs that nothing reads after the backward, such as
            the projections' fresh outputs in an MLP's forward: afterwards they hold gradients, and autograd raises
            if a copy of them saved by another op is read after this backward (a second backward through the graph
            included).  Leaves and views of leaves are never overwritten.

    Follows ``torch.autocast`` as ``F.linear`` does (the matmuls in the autocast dtype, the weight's gradient in
    its own dtype).  Under ``torch.compile`` it is a ``torch.library`` op, which also saves no product (and never
    writes over its inputs).  Without a gradient, for float64 and where Triton cannot run, it is
    ``F.linear(fused_gated_activation(gate, up, activation), weight, bias)``.
    """
    gate, up, act = _validate(gate, up, activation)
    n = gate.shape[-1] // 2 if up is None else gate.shape[-1]
    weight, bias, cdtype = _linear_operands(_OP_LINEAR, "gate", gate, up, n, weight, bias)
    if cdtype is None:
        return torch.nn.functional.linear(fused_gated_activation(gate, up, activation), weight, bias)
    if is_compiling():
        return _gated_linear_fwd_op(gate, up, weight.to(cdtype), bias, act)  # (below: the op under compile)
    over = bool(reuse_inputs) and _overwritable(gate, up)
    return _GatedLinearFunction.apply(gate, up, weight, bias, act, cdtype, over)


# ==================================================================================================
# A frozen gated MLP (under an adapter elsewhere): its input kept, gate and up computed again in the backward
# ==================================================================================================
class _FrozenGatedMLPFunction(torch.autograd.Function):
    """``linear(a(linear(x, Wg)) * linear(x, Wu), Wd)`` for three weights that get no gradient, saving x only.

    A frozen MLP's backward needs gate and up for d gate and d up, and nothing else: no weight gradient reads x or
    the product.  Kept from the forward, gate and up are two intermediate-width tensors a layer (128 MiB at Gemma's
    4,096 tokens x 8,192); here the backward multiplies x by Wg and Wu again (two of the forward's three matmuls)
    and keeps x, one hidden-width tensor."""

    @staticmethod
    def forward(ctx, x, wg, wu, wd, act, cdtype):
        with autocast_off(x):  # the casts are explicit, as autocast makes them
            xc = x.to(cdtype)  # (x itself where autocast is off or runs x's dtype)
            wg, wu, wd = (w.to(cdtype) for w in (wg, wu, wd))
            gate = torch.nn.functional.linear(xc, wg)
            up = torch.nn.functional.linear(xc, wu)
            y = torch.nn.functional.linear(gated_forward(gate, up, act), wd)  # gate, up and the product die here
        ctx.act, ctx.x_dtype = act, x.dtype
        ctx.save_for_backward(xc, wg, wu, wd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, wg, wu, wd = ctx.saved_tensors
        gate = torch.nn.functional.linear(x, wg)
        up = torch.nn.functional.linear(x, wu)
        dh = torch.nn.functional.linear(dy.to(wd.dtype), wd.t())  # d(loss)/d(product), (..., N)
        dg, du = _launch_backward(dh, gate, up, ctx.act, None, over_inputs=True)  # over gate and up, fresh here
        del dh
        n = dg.shape[-1]
        dx = torch.mm(dg.reshape(-1, n), wg)
        dx.addmm_(du.reshape(-1, n), wu)  # the two projections' input gradients summed in one product's epilogue
        return dx.reshape(x.shape).to(ctx.x_dtype), None, None, None, None, None


def frozen_gated_mlp(x: torch.Tensor, gate_weight: torch.Tensor, up_weight: torch.Tensor, down_weight: torch.Tensor,
                     activation: str = "silu") -> Optional[torch.Tensor]:
    """``down(act(gate(x)) * up(x))`` for bias-free projections whose weights do not train, keeping x for the backward
    instead of gate and up (module ``_FrozenGatedMLPFunction``); None where that does not apply: a weight that
    trains, no gradient to x, a saved-tensor hook at work or a backward running (activation checkpointing, either
    kind, already recomputes the layer), under ``torch.compile``, x and the weights in different dtypes outside
    autocast, or the kernels cannot run. Under ``torch.autocast`` (the HF Trainer's ``bf16=True``) x and the weights
    are cast to its dtype, as ``F.linear`` casts them there: the result in that dtype, x's gradient in x's."""
    if activation not in ACTIVATIONS or is_compiling() or not torch.is_grad_enabled() or not x.requires_grad:
        return None
    ws = (gate_weight, up_weight, down_weight)
    if any(w.requires_grad or w.dtype not in SUPPORTED_DTYPES for w in ws) or x.dtype not in SUPPORTED_DTYPES:
        return None
    cdtype = autocast_dtype(x)
    if cdtype is None and any(w.dtype != x.dtype for w in ws):  # (F.linear raises: its error, not ours)
        return None
    cdtype = cdtype or x.dtype
    if cdtype not in SUPPORTED_DTYPES or torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        return None
    if torch._C._current_graph_task_id() != -1:  # inside a backward: reentrant checkpointing recomputing the layer
        return None
    if x.shape[-1] != gate_weight.shape[1] or not triton_runnable(x) or any(map(is_dtensor, (x, *ws))):
        return None
    return _FrozenGatedMLPFunction.apply(x, gate_weight, up_weight, down_weight, ACTIVATIONS[activation], cdtype)


# ==================================================================================================
# A plain MLP's activation and its second linear (GPT-2, ViT): the activation written again in the backward
# ==================================================================================================
_OP_ACT_LINEAR = "fused_activation_linear"


def activation_forward(x: torch.Tensor, act: int) -> torch.Tensor:
    """Launch h = a(x) (the kernels without ``up``); h contiguous, in x's dtype."""
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    plan = _plan("act_fwd", x.shape, (x.stride(), x.stride()), act)
    if plan.kernel is None:
        return h
    x = x.contiguous() if plan.copy[0] else x
    plan.kernel(x, x, h, *plan.ints)
    return h


def activation_backward(dh: torch.Tensor, x: torch.Tensor, act: int, h_out: Optional[torch.Tensor],
                        over_input: bool = False) -> torch.Tensor:
    """Launch dx = dh * a'(x); with ``h_out`` (contiguous, x's shape and dtype; ``dh`` itself is allowed) also
    writes h = a(x) into it; with ``over_input`` dx goes over x itself where its layout takes it without a copy."""
    over = over_input and last_dim_row_stride(x.shape, x.stride()) is not None
    dx = x if over else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if dh.dtype != x.dtype:
        dh = dh.to(x.dtype)
    plan = _plan("act_bwd" if h_out is None else "act_bwd_y", x.shape,
                 (dh.stride(), x.stride(), x.stride(), dx.stride(), dx.stride()), act)
    if plan.kernel is None:
        return dx
    dh = dh.contiguous() if plan.copy[0] else dh
    xin = x.contiguous() if plan.copy[1] else x  # (never with ``over``)
    plan.kernel(dh, xin, xin, dx, dx, dx if h_out is None else h_out, *plan.ints)
    if over:  # a copy of x that another op saved, read after this, raises instead of reading the gradient
        torch.autograd.graph.increment_version(x)
    return dx


class _ActivationLinearFunction(torch.autograd.Function):
    """``linear(a(x), weight, bias)`` in the compute dtype, saving x (and the weight) only.

    An eager MLP keeps both x (for the activation's gradient) and a(x) (for the second linear's weight gradient):
    two (tokens, intermediate) tensors a layer.  Here the backward kernel, which reads x for a'(x), writes a(x)
    again beside dx: one more intermediate-width write a layer in the backward for one intermediate-width tensor
    less held from the forward to the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, act, cdtype, over_input):
        with autocast_off(x):  # the casts are explicit, as autocast makes them
            w = weight.to(cdtype)
            b = bias.to(cdtype) if bias is not None else None
            y = torch.nn.functional.linear(activation_forward(x, act), w, b)  # a(x) dies here
        ctx.act, ctx.has_bias, ctx.over_input = act, bias is not None, over_input
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        ctx.save_for_backward(x, w)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw, dy2 = _act_linear_grads(dy, x, w, ctx.act, ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                                        ctx.over_input)
        dw = dw.to(ctx.dtypes[0]) if dw is not None else None
        db = dy2.sum(0, dtype=torch.float32).to(ctx.dtypes[1]) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None


def _act_linear_grads(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, act: int, need_x: bool, need_w: bool,
                      over_input: bool):
    """The backward of ``linear(a(x), w)`` from dy: (dx or None, dW in w's dtype or None, dy as rows)."""
    n = x.shape[-1]
    dy2 = dy.reshape(-1, dy.shape[-1]).to(w.dtype)
    dx = h = None
    if need_x:
        # a(x) written again beside dx where the weight's gradient needs it (a frozen projection needs none), over
        # d(loss)/d(a(x)) itself
        dh = (dy2 @ w).reshape(x.shape)
        h = _over(dh, x) if need_w else None
        dx = activation_backward(dh, x, act, h, over_input)
        del dh
    elif need_w:
        h = activation_forward(x, act)
    dw = dy2.t() @ h.reshape(-1, n) if need_w else None
    return dx, dw, dy2


def activation_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                                activation: str = "gelu") -> torch.Tensor:
    """``F.linear(act(x), weight, bias)`` by PyTorch, the activation in x's dtype (as an eager MLP computes it)."""
    return torch.nn.functional.linear(activation_reference(x, activation), weight, bias)


def fused_activation_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                            activation: str = "gelu", *, reuse_inputs: bool = False) -> torch.Tensor:
    """``F.linear(act(x), weight, bias)``: a plain MLP's activation and its second linear (GPT-2's ``c_proj(act(
    c_fc(x)))``, timm's ``fc2(act(fc1(x)))``), whose backward writes ``act(x)`` again instead of keeping it from the
    forward: one (tokens, intermediate) tensor less per MLP held for the backward (0.56 GiB over GPT-2 small's 12
    layers at 8 x 1,024 tokens in bf16).

    Args:
        x: the first linear's output, (..., N), float16 / bfloat16 / float32.
        weight: the second linear's weight, (out, N) (a transposed view is fine: GPT-2's ``Conv1D.weight.t()``);
            bias: (out,) or None.
        activation: ``"gelu"`` (exact erf), ``"gelu_tanh"`` (alias ``"gelu_pytorch_tanh"``), ``"silu"``.
        reuse_inputs: the backward writes dx over x instead of into a new tensor, as
            ``fused_gated_activation_linear``'s ``reuse_inputs`` (for the first linear's fresh output).

    The activation is computed in float32 and rounded once (eager PyTorch in bf16 rounds as often as it has ops).
    Follows ``torch.autocast`` as ``F.linear`` does.  Under ``torch.compile`` it is a ``torch.library`` op, which
    also saves no ``act(x)`` (and never writes over its input).  Without a gradient, for float64 and where Triton
    cannot run, it is ``activation_linear_reference``.
    """
    x = check_tensor(_OP_ACT_LINEAR, "x", x)
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{_OP_ACT_LINEAR}: argument 'activation' must be one of {sorted(ACTIVATIONS)}, got "
                         f"{activation!r}")
    check_float_dtype(_OP_ACT_LINEAR, "x", x, allow_float64=True)
    if x.dim() == 0:
        raise FusedShapeError(f"{_OP_ACT_LINEAR}: argument 'x' must have at least one dimension, got a 0-d tensor")
    weight, bias, cdtype = _linear_operands(_OP_ACT_LINEAR, "x", x, None, x.shape[-1], weight, bias)
    if cdtype is None:
        return activation_linear_reference(x, weight, bias, activation)
    if is_compiling():
        return _act_linear_fwd_op(x, weight.to(cdtype), bias, ACTIVATIONS[activation])  # (below)
    over = bool(reuse_inputs) and _overwritable(x)
    return _ActivationLinearFunction.apply(x, weight, bias, ACTIVATIONS[activation], cdtype, over)


# ==================================================================================================
# Under torch.compile: the two projections' ops as torch.library ops
# ==================================================================================================
# The autograd.Functions above are the eager path.  Dynamo cannot put them in a graph as they are, and Inductor,
# given the PyTorch chain instead, keeps the activation (or the product) for the projection's weight gradient: its
# partitioner does not recompute what a matmul of the backward reads.  As opaque ops with their own autograd (as the
# linear cross-entropy's), the compiled graph saves what they save, the inputs and the weight.  The weight comes in
# the compute dtype (the cast stays in the graph, where autograd casts its gradient back); the bias in its own, its
# gradient summed in float32 as the eager path's; the backward never writes over its inputs under compile (an op
# that mutates its inputs would have to say so in its schema).
def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,))


def _cast(bias: Optional[torch.Tensor], weight: torch.Tensor) -> Optional[torch.Tensor]:
    return bias.to(weight.dtype) if bias is not None else None


@torch.library.custom_op("fused_layers::gated_activation_linear_fwd", mutates_args=())
def _gated_linear_fwd_op(gate: torch.Tensor, up: Optional[torch.Tensor], weight: torch.Tensor,
                         bias: Optional[torch.Tensor], act: int) -> torch.Tensor:
    return torch.nn.functional.linear(gated_forward(gate, up, act), weight, _cast(bias, weight))


@_gated_linear_fwd_op.register_fake
def _(gate, up, weight, bias, act):
    return gate.new_empty((*gate.shape[:-1], weight.shape[0]))


@torch.library.custom_op("fused_layers::gated_activation_linear_bwd", mutates_args=())
def _gated_linear_bwd_op(dy: torch.Tensor, gate: torch.Tensor, up: Optional[torch.Tensor], weight: torch.Tensor,
                         act: int, grads: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``grads``: whether (weight, bias) get a gradient; one not needed comes back empty, as d up with up=None."""
    dg, du, dw, dy2 = _gated_linear_grads(dy, gate, up, weight, act, grads[0], False)
    db = dy2.sum(0, dtype=torch.float32) if grads[1] else _empty(weight)
    return dg, (du if up is not None else _empty(gate)), (dw if dw is not None else _empty(weight)), db


@_gated_linear_bwd_op.register_fake
def _(dy, gate, up, weight, act, grads):
    return (gate.new_empty(gate.shape), up.new_empty(up.shape) if up is not None else _empty(gate),
            weight.new_empty(weight.shape) if grads[0] else _empty(weight),
            weight.new_empty(weight.shape[:1], dtype=torch.float32) if grads[1] else _empty(weight))


def _gated_linear_setup(ctx, inputs, output):
    gate, up, weight, bias, act = inputs
    ctx.act, ctx.has_up, ctx.bias_dtype = act, up is not None, bias.dtype if bias is not None else None
    ctx.save_for_backward(gate, up, weight)  # not the product: the backward writes it again


def _gated_linear_backward(ctx, dy):
    gate, up, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_b = ctx.bias_dtype is not None and need[3]
    dg, du, dw, db = _gated_linear_bwd_op(dy, gate, up, weight, ctx.act, [need[2], need_b])
    return dg, (du if ctx.has_up else None), (dw if need[2] else None), (db.to(ctx.bias_dtype) if need_b else None), \
        None


_gated_linear_fwd_op.register_autograd(_gated_linear_backward, setup_context=_gated_linear_setup)


@torch.library.custom_op("fused_layers::activation_linear_fwd", mutates_args=())
def _act_linear_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], act: int) -> torch.Tensor:
    return torch.nn.functional.linear(activation_forward(x, act), weight, _cast(bias, weight))


@_act_linear_fwd_op.register_fake
def _(x, weight, bias, act):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("fused_layers::activation_linear_bwd", mutates_args=())
def _act_linear_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, act: int,
                       grads: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``grads``: whether (x, weight, bias) get a gradient; one not needed comes back empty."""
    dx, dw, dy2 = _act_linear_grads(dy, x, weight, act, grads[0], grads[1], False)
    db = dy2.sum(0, dtype=torch.float32) if grads[2] else _empty(weight)
    return (dx if dx is not None else _empty(x)), (dw if dw is not None else _empty(weight)), db


@_act_linear_bwd_op.register_fake
def _(dy, x, weight, act, grads):
    return (x.new_empty(x.shape) if grads[0] else _empty(x),
            weight.new_empty(weight.shape) if grads[1] else _empty(weight),
            weight.new_empty(weight.shape[:1], dtype=torch.float32) if grads[2] else _empty(weight))


def _act_linear_setup(ctx, inputs, output):
    x, weight, bias, act = inputs
    ctx.act, ctx.bias_dtype = act, bias.dtype if bias is not None else None
    ctx.save_for_backward(x, weight)  # not a(x): the backward writes it again


def _act_linear_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    grads = [need[0], need[1], ctx.bias_dtype is not None and need[2]]
    dx, dw, db = _act_linear_bwd_op(dy, x, weight, ctx.act, grads)
    return (dx if grads[0] else None), (dw if grads[1] else None), (db.to(ctx.bias_dtype) if grads[2] else None), None


_act_linear_fwd_op.register_autograd(_act_linear_backward, setup_context=_act_linear_setup)
