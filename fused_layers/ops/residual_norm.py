r"""Residual add + RMSNorm / LayerNorm in one kernel: ``h = x + residual`` and ``y = norm(h)``, forward and backward.

A pre-norm decoder layer (Llama and its copies) runs, between attention and MLP,

    h = residual + attn_out;    residual = h;    y = post_attention_layernorm(h)

as two kernels that read h twice.  Here one kernel reads x and the residual once, writes h (the next residual, in
the promoted dtype of the two, as ``residual + x``) and y, and saves the norm's float32 statistics; the backward
takes the gradients of *both* outputs:

    d x = d residual = dh + dnorm(dy),

with dnorm the norm's own backward (derivation in ``layer_norm.py``): with xhat = (h - mu) * rstd (RMSNorm:
h * rstd) and g = w * dy,

    dnorm(dy) = rstd * (g - xhat * c1 - c2),   c1 = sum(g * xhat) / N,   c2 = sum(g) / N   (RMSNorm: c2 = 0)
    dw = sum over rows of dy * xhat,   db = sum over rows of dy.

The norm reads h *as stored* (rounded to x's dtype): what ``post_attention_layernorm(h)`` reads in the model, so a
bfloat16 model gets the statistics of its own h.  The weight orders of ``norm_variants.py`` carry over:
``cast_before_weight`` rounds xhat to x's dtype before the weight multiply (Llama's ``weight *
h.to(input_dtype)``; dW then sums dy times the rounded xhat), y takes ``promote_types(x, weight)`` or, with
``keep_input_dtype``, x's dtype (Gemma's ``(h * (1 + w.float())).type_as(x)``; ``weight_offset=1.0`` adds the 1).

Kernels.  Rows up to ``layer_norm_config.BWD_MAX_SINGLE`` (8,192) wide, every hidden size of the models above,
take the single-block kernels below: a program holds BLOCK_M whole rows in registers (forward), or walks a
contiguous group of rows in tiles accumulating dW / dB partial rows that ``layer_norm.py``'s fixed-order reduce sums
(backward; no atomics, bitwise deterministic).  Wider rows compose the norm's own kernels with the add (one more read
of h and of the gradient): correct at any width, fused where models are.

Layout.  x and the residual are viewed as M rows of their last dim (unit column stride, one row stride each; other
layouts are copied); h, y and dx are contiguous.  Dtypes: x and the residual float16, bfloat16 or float32, not
necessarily alike (under autocast a bfloat16 attention output meets a float32 residual stream): h takes their
promoted dtype, as ``residual + x`` does, and "x's dtype" above means h's; the weight and bias any of the three.
float64 and devices where Triton cannot run use ``residual_norm_reference``.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import layer_norm_config as cfg
from ._common import (
    FusedShapeError,
    check_float_dtype,
    check_same_device,
    check_tensor,
    concrete,
    get_override,
    next_power_of_2,
    override_epoch,
    use_fallback,
)
from ._library import FusedOp, Kernel
from ._rows import last_dim_row_stride
from .layer_norm import _reduce_kernel, _stats_ptrs, norm_backward, norm_forward

_OP = "fused_add_rms_norm"


# ==================================================================================================
# Kernels
# ==================================================================================================
@triton.jit
def _res_norm_fwd_kernel(
    X,  # pointer to the input (e.g. the attention output), [M, N], row stride sx, unit column stride
    R,  # pointer to the residual, [M, N], row stride sr, unit column stride
    H,  # pointer to h = x + residual (written), [M, N] contiguous, X's dtype
    Y,  # pointer to y = norm(h) (written), [M, N] contiguous
    W,  # pointer to the weight [N] (unused unless HAS_W)
    B,  # pointer to the bias [N] (unused unless HAS_B)
    STATS,  # pointer to the float32 statistics (written): row means at [0, M) unless IS_RMS, then row 1/std
    M,  # number of rows
    N,  # row width
    sx, sr,  # row strides of X and R (elements)
    eps,  # added to the variance
    IS_RMS: tl.constexpr,  # RMSNorm: no mean, no bias
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N: the whole row in one tile
    CAST_BEFORE_W: tl.constexpr,  # round xhat to H's dtype before the weight (HF Llama-family order)
):
    """Each program adds and normalizes BLOCK_M full rows held in registers."""
    eps = tl.cast(eps, tl.float32)  # a float argument may arrive as fp64 (Inductor's launch)
    MEAN, RSTD = _stats_ptrs(STATS, M, IS_RMS)
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    r64 = rows.to(tl.int64)  # 64-bit offsets: tensors beyond 2^31 elements address correctly
    # h = x + residual, in float32, rounded to H's dtype and stored: the next layer's residual.
    x = tl.load(X + (r64 * sx)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + (r64 * sr)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(H.dtype.element_ty)
    tl.store(H + (r64 * N)[:, None] + cols[None, :], h, mask=mask)
    # The norm reads h as stored (0 in the padding: the identity of the sums below).
    h = h.to(tl.float32)
    if IS_RMS:
        hc = h
    else:
        mean = tl.sum(h, axis=1) / N
        hc = tl.where(mask, h - mean[:, None], 0.0)
        # Corrected two-pass (layer_norm.py): remove the rounding error of the first sum.
        corr = tl.sum(hc, axis=1) / N
        hc = tl.where(mask, hc - corr[:, None], 0.0)
        mean = mean + corr
        tl.store(MEAN + rows, mean, mask=row_ok)
    var = tl.sum(hc * hc, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(RSTD + rows, rstd, mask=row_ok)
    # y = xhat * w + b, stored in Y's dtype.
    y = hc * rstd[:, None]
    if HAS_W:
        if CAST_BEFORE_W:
            y = y.to(H.dtype.element_ty).to(tl.float32)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_B:
        b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y + b[None, :]
    tl.store(Y + (r64 * N)[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _res_norm_bwd_kernel(
    H,  # pointer to the saved h, [M, N] contiguous
    DY,  # pointer to the gradient of y, [M, N], row stride sdy, unit column stride
    DH,  # pointer to the gradient of h, [M, N], row stride sdh, unit column stride
    DX,  # pointer to the gradient of x and of the residual (written), [M, N] contiguous
    W,  # pointer to the weight [N] (unused unless HAS_W)
    STATS,  # pointer to the forward's float32 statistics (layout as in _res_norm_fwd_kernel)
    PARTS,  # pointer to the float32 partials: [G, N] dW rows (if HAS_W), then [G, N] dB rows (if HAS_B)
    M, N,  # rows, row width
    sdy, sdh,  # row strides of DY and DH (elements)
    ROWS_PER_PROG,  # rows owned by each program (a contiguous group, whole tiles)
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,  # next power of two >= N
    CAST_BEFORE_W: tl.constexpr,  # the forward rounded xhat to H's dtype before the weight: dW uses that
):
    """dx = dh + rstd (g - xhat c1 - c2) per row in one pass; dW / dB partial rows over this program's rows."""
    MEAN, RSTD = _stats_ptrs(STATS, M, IS_RMS)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    row_start = pid * ROWS_PER_PROG
    row_end = tl.minimum(row_start + ROWS_PER_PROG, M)
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    # float32 accumulators of one row: each tile's rows are summed into them.
    dw_acc = tl.zeros([BLOCK_N], tl.float32)
    db_acc = tl.zeros([BLOCK_N], tl.float32)
    for r0 in range(row_start, row_end, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        r64 = rows.to(tl.int64)
        # 0 is the identity of the row sums and of the column accumulators.
        h = tl.load(H + (r64 * N)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + (r64 * sdy)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dh = tl.load(DH + (r64 * sdh)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        if IS_RMS:
            xhat = h * rstd[:, None]
        else:
            mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (h - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_W:
            g = dy * w[None, :]
        else:
            g = dy
        # The norm's gradient, plus the gradient that reached h directly (h is also the next residual).
        c1 = tl.sum(g * xhat, axis=1) / N
        if IS_RMS:
            dx = (g - xhat * c1[:, None]) * rstd[:, None] + dh
        else:
            c2 = tl.sum(g, axis=1) / N
            dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None] + dh
        tl.store(DX + (r64 * N)[:, None] + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_W:
            if CAST_BEFORE_W:  # dx above uses the exact xhat (the rounding passes gradients through)
                xhat = xhat.to(H.dtype.element_ty).to(tl.float32)
            dw_acc += tl.sum(dy * xhat, axis=0)
        if HAS_B:
            db_acc += tl.sum(dy, axis=0)
    # One partial row of dW and dB per program; layer_norm.py's _norm_reduce_partials_kernel sums them.
    if HAS_W:
        tl.store(PARTS + pid.to(tl.int64) * N + cols, dw_acc, mask=col_ok)
    if HAS_B:
        DBP = PARTS  # dB's rows follow dW's G rows
        if HAS_W:
            DBP = PARTS + tl.num_programs(0).to(tl.int64) * N
        tl.store(DBP + pid.to(tl.int64) * N + cols, db_acc, mask=col_ok)


# ==================================================================================================
# PyTorch reference (tests, the fallback where Triton cannot run)
# ==================================================================================================
def _h_dtype(x: torch.Tensor, residual: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, residual.dtype)


def _out_dtype(h_dtype: torch.dtype, weight: Optional[torch.Tensor], keep_input_dtype: bool) -> torch.dtype:
    return h_dtype if keep_input_dtype or weight is None else torch.promote_types(h_dtype, weight.dtype)


def residual_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor] = None,
                            bias: Optional[torch.Tensor] = None, eps: float = 1e-6, is_rms: bool = True,
                            cast_before_weight: bool = False,
                            keep_input_dtype: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y): h = x + residual (in their promoted dtype), y = norm(h) with float32 statistics (float64 stays
    float64) in the weight order and dtype of the module docstring."""
    h = x + residual
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    hf = h.to(acc)
    if is_rms:
        xhat = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    else:
        xc = hf - hf.mean(-1, keepdim=True)
        xhat = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    out_dtype = _out_dtype(h.dtype, weight, keep_input_dtype)
    if weight is None:
        y = xhat
    elif cast_before_weight:
        y = weight * xhat.to(h.dtype)
    else:
        y = weight.to(acc) * xhat
    if bias is not None:
        y = y + bias.to(acc)
    return h, y.to(out_dtype)


# ==================================================================================================
# Launch plans and launchers
# ==================================================================================================
class _Plan:
    __slots__ = ("m", "n", "copy", "single", "kernel", "ints", "g", "reduce")


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096


def _plan(direction: str, shape, strides: tuple, dtype: torch.dtype, has_w: bool, has_b: bool, is_rms: bool,
          cast_before_w: bool, device_index: int) -> _Plan:
    key = (direction, shape, strides, dtype, has_w, has_b, is_rms, cast_before_w, device_index, override_epoch())
    try:
        plan = _PLANS.get(key)
    except TypeError:  # symbolic sizes: plan for their values
        return _plan(direction, concrete(shape), tuple(concrete(s) for s in strides), dtype, has_w, has_b, is_rms,
                     cast_before_w, device_index)
    if plan is not None:
        return plan
    plan = _Plan()
    n = shape[-1]
    m = 1
    for s in shape[:-1]:
        m *= s
    rows = [last_dim_row_stride(shape, st) for st in strides]
    plan.m, plan.n = m, n
    plan.copy = [r is None for r in rows]
    rows = [n if r is None else r for r in rows]
    n_pow2 = next_power_of_2(n)
    # (config_override("residual_norm", max_single=...): tests reach the composed path on small rows)
    plan.single = n_pow2 <= get_override("residual_norm", "max_single", cfg.BWD_MAX_SINGLE) and m * n > 0
    plan.kernel = plan.reduce = None
    plan.g = 0
    meta = dict(IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_b, CAST_BEFORE_W=cast_before_w, BLOCK_N=n_pow2)
    if plan.single and direction == "fwd":
        c = cfg.fwd_config(n, n_pow2, dtype.itemsize, is_rms)
        block_m, warps = (c.block_m, c.warps) if isinstance(c, cfg.FwdTile) else (1, 8)
        plan.ints = (m, n, *rows)
        # every tensor checked: x's, the residual's and the weight's dtypes, and so y's, are not in the plan's key
        plan.kernel = Kernel(_res_norm_fwd_kernel, (triton.cdiv(m, block_m),), check=tuple(range(7)),
                             BLOCK_M=block_m, num_warps=warps, **meta)
    elif plan.single:
        c = cfg.bwd_config(n, n_pow2, dtype.itemsize, is_rms)
        block_m, warps, per_sm = (c.block_m, c.warps, c.progs_per_sm) if isinstance(c, cfg.BwdTile) else (1, 8, 2)
        # G programs over contiguous groups of whole tiles (every program owns >= 1 row: every partial row written)
        g = cfg.bwd_programs(max(1, min(per_sm * cfg.sm_count(device_index), triton.cdiv(m, block_m))))
        rows_per_prog = triton.cdiv(triton.cdiv(m, g), block_m) * block_m
        plan.g = triton.cdiv(m, rows_per_prog)
        plan.ints = (m, n, *rows, rows_per_prog)
        plan.kernel = Kernel(_res_norm_bwd_kernel, (plan.g,), check=tuple(range(7)), BLOCK_M=block_m,
                             num_warps=warps, **meta)
        if has_w or has_b:
            plan.reduce = _reduce_kernel(n, plan.g, has_w, has_b)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def residual_norm_forward(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                          bias: Optional[torch.Tensor], eps: float, is_rms: bool, cast_before_w: bool,
                          keep_input_dtype: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward: (h, y, stats), h and y contiguous; stats as ``layer_norm.norm_forward``'s."""
    h_dtype = _h_dtype(x, residual)
    out_dtype = _out_dtype(h_dtype, weight, keep_input_dtype)
    plan = _plan("fwd", x.shape, (x.stride(), residual.stride()), h_dtype, weight is not None, bias is not None,
                 is_rms, cast_before_w, -1)
    if not plan.single:  # wide rows (or no rows): the add, then the norm's own kernels
        h = torch.add(x, residual).contiguous()
        y, stats = norm_forward(h, weight, bias, 1, eps, is_rms, cast_before_w=cast_before_w, out_dtype=out_dtype)
        return h, y, stats
    h = torch.empty(x.shape, dtype=h_dtype, device=x.device)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    stats = torch.empty((plan.m if is_rms else 2 * plan.m,), dtype=torch.float32, device=x.device)
    x = x.contiguous() if plan.copy[0] else x
    residual = residual.contiguous() if plan.copy[1] else residual
    # Missing parameters: any pointer does (HAS_W / HAS_B are constexpr False, never dereferenced).
    w = x if weight is None else weight.contiguous()
    b = x if bias is None else bias.contiguous()
    plan.kernel(x, residual, h, y, w, b, stats, *plan.ints, eps)
    return h, y, stats


def residual_norm_backward(dy: torch.Tensor, dh: torch.Tensor, h: torch.Tensor, weight: Optional[torch.Tensor],
                           bias: Optional[torch.Tensor], stats: torch.Tensor, is_rms: bool,
                           cast_before_w: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward: (dx, dw, db) with dx the gradient of x and of the residual; a missing parameter's
    gradient is an empty float32 tensor."""
    has_w, has_b = weight is not None, bias is not None
    empty = torch.empty((0,), dtype=torch.float32, device=h.device)
    if dy.dtype != h.dtype:
        dy = dy.to(h.dtype)
    if dh.dtype != h.dtype:
        dh = dh.to(h.dtype)
    plan = _plan("bwd", h.shape, (dy.stride(), dh.stride()), h.dtype, has_w, has_b, is_rms, cast_before_w,
                 h.get_device())
    if not plan.single:
        dx, dw, db = norm_backward(dy, h, weight, bias, stats, 1, is_rms, cast_before_w=cast_before_w)
        return dx.add_(dh), (empty if dw is None else dw), (empty if db is None else db)
    dy = dy.contiguous() if plan.copy[0] else dy
    dh = dh.contiguous() if plan.copy[1] else dh
    dx = torch.empty(h.shape, dtype=h.dtype, device=h.device)
    parts = torch.empty(((int(has_w) + int(has_b)) * plan.g * plan.n,), dtype=torch.float32, device=h.device)
    w = h if weight is None else weight.contiguous()
    plan.kernel(h, dy, dh, dx, w, stats, parts if (has_w or has_b) else stats, *plan.ints)
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=h.device) if has_w else empty
    db = torch.empty(bias.shape, dtype=bias.dtype, device=h.device) if has_b else empty
    if plan.reduce is not None:
        plan.reduce(parts, dx if not has_w else dw, dx if not has_b else db, plan.g, plan.n)
    return dx, dw, db


# ==================================================================================================
# Registration (ops/_library.py): two differentiable outputs (h, y), the statistics saved
# ==================================================================================================
def _setup_context(ctx, inputs, outputs):
    x, residual, weight, bias, _eps, is_rms, cast_before_w, _keep = inputs
    ctx.is_rms, ctx.cast_before_w = is_rms, cast_before_w
    ctx.dtypes = (x.dtype, residual.dtype)
    ctx.has_w, ctx.has_b = weight is not None, bias is not None
    ctx.save_for_backward(outputs[0], weight, bias, outputs[2])


def _grads(ctx, backward, dh, dy):
    h, weight, bias, stats = ctx.saved_tensors
    dh = torch.zeros_like(h) if dh is None else dh  # (an output no loss reached)
    dy = torch.zeros_like(h) if dy is None else dy
    dx, dw, db = backward(dy, dh, h, weight, bias, stats, ctx.is_rms, ctx.cast_before_w)
    # one gradient for both, in h's dtype; an input of a narrower dtype (x in bf16, the residual in float32 under
    # autocast) gets it in its own
    dxs = tuple(dx if dt == dx.dtype else dx.to(dt) for dt in ctx.dtypes)
    return *dxs, (dw if ctx.has_w else None), (db if ctx.has_b else None), None, None, None, None


residual_norm_op = FusedOp("residual_norm", residual_norm_forward, residual_norm_backward, _setup_context, _grads,
                           outputs=2)


def _validate(x: object, residual: object, weight: object, bias: object, op: str) -> None:
    check_tensor(op, "input", x)
    check_tensor(op, "residual", residual)
    check_float_dtype(op, "input", x, allow_float64=True)
    check_same_device(op, "input", x, residual=residual, weight=weight, bias=bias)
    check_float_dtype(op, "residual", residual, allow_float64=True)
    if residual.shape != x.shape or x.dim() == 0:
        raise FusedShapeError(f"{op}: arguments 'input' and 'residual' must have the same shape of at least one dim, "
                              f"got {list(x.shape)} and {list(residual.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        check_tensor(op, name, p)
        if p.dim() != 1 or p.shape[0] != x.shape[-1]:
            raise FusedShapeError(f"{op}: argument '{name}' must be 1-D with input.shape[-1] = {x.shape[-1]} "
                                  f"elements, got shape {list(p.shape)}")
        check_float_dtype(op, name, p, allow_float64=True)


def _call(x, residual, weight, bias, eps, is_rms, cast_before_weight, keep_input_dtype, op):
    _validate(x, residual, weight, bias, op)
    if (any(p is not None and p.dtype == torch.float64 for p in (x, residual, weight, bias))
            or use_fallback(op, x, residual, weight)):
        return residual_norm_reference(x, residual, weight, bias, eps, is_rms, cast_before_weight, keep_input_dtype)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                 for t in (x, residual, weight, bias))
    return residual_norm_op(x, residual, weight, bias, float(eps), bool(is_rms), bool(cast_before_weight),
                            bool(keep_input_dtype), needs_grad=needs_grad)


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor] = None,
                       eps: float = 1e-6, cast_before_weight: bool = False, keep_input_dtype: bool = False,
                       weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = input + residual`` and RMSNorm of h over the last dim, in one kernel: returns ``(h, norm(h))``.

    ``h`` is in ``promote_types(input, residual)`` (the next residual; a bfloat16 input and a float32 residual, as
    under autocast, give float32); the norm reads h as stored, with float32 statistics.  ``cast_before_weight``:
    round the normalized row to h's dtype before the weight multiply (HF Llama family: ``weight *
    h.to(input_dtype)``), else multiply in float32 and round once.  y's dtype is ``promote_types(h, weight)``, or h's
    with ``keep_input_dtype``.  ``weight_offset``: the weight used is ``weight.float() +
    weight_offset`` (Gemma: 1.0, with ``keep_input_dtype=True``).  Both outputs are differentiable; the backward
    gives input and residual the same gradient ``dh + dnorm(dy)``.
    """
    if weight is not None and weight_offset:
        check_tensor(_OP, "weight", weight)
        weight = weight.float() + weight_offset  # an N-element op; its gradient is the weight's
    return _call(input, residual, weight, None, eps, True, cast_before_weight, keep_input_dtype, _OP)


def fused_add_layer_norm(input: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor] = None,
                         bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = input + residual`` and LayerNorm of h over the last dim, in one kernel: returns ``(h, norm(h))``, y in
    ``promote_types(input, weight)`` (as ``fused_add_rms_norm``, multiply in float32)."""
    return _call(input, residual, weight, bias, eps, False, False, False, "fused_add_layer_norm")
