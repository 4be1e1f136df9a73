r"""Rotary position embedding (RoPE) of q and k from Hugging Face's cos / sin: Triton forward and backward.

transformers' rotary embedding returns ``cos`` and ``sin`` of shape (B, S, D_rot) (or (S, D_rot), broadcast over the
batch) and each attention applies them with its model's ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``,
q (B, Hq, S, D) and k (B, Hk, S, D) (``unsqueeze_dim=2``: (B, S, H, D)).  Only the first D_rot dims of a head rotate
(partial rotary: Phi, GLM, StableLM, ...); the others pass through.

Forward.  Output column j < D_rot of a head x is

    y_j = x_j * c_j + sign_j * x_{p(j)} * s_j

with the partner p(j), the sign and the cos / sin index of the two layouts:

* half-split (``rotate_half``: Llama and its copies, Phi-3, ...): p(j) = j + D_rot/2 for the first half (sign -1),
  j - D_rot/2 for the second (sign +1), c_j = cos[j], s_j = sin[j].  Exactly HF's ``x * cos + rotate_half(x) *
  sin`` for any cos / sin (its two halves need not repeat);
* interleaved (GPT-J / GLM pairs (2i, 2i + 1)): p(j) = j xor 1, sign -1 on even j, +1 on odd, and the pair's angle
  at index i = j // 2 of cos / sin given in HF's layout (GLM's ``cos[..., :D_rot // 2].repeat_interleave(2)``).

Backward.  y = C x + S P x with C, S diagonal and P the signed permutation above, so dx = C dy + P^T S dy:

    dx_j = dy_j * c_j - sign_j * dy_{p(j)} * s_{p(j)}

(P^T = -P for both layouts): RoPE with -sin, the sine taken at the partner's index (the same value wherever the
halves repeat, as HF's do).  One kernel serves both directions (``BACKWARD`` flips the sign and the sine's index).
cos and sin are not differentiated (HF builds them under ``no_grad``); where they require a gradient the reference
runs, so autograd sees them.

Launch: one program per (batch, position) rotates every head of q and then of k, in tiles of BLOCK_H heads x
BLOCK_D columns, loading the cos / sin row once.  Each tile is read twice, at its columns and at their partners (the
second from L1 / L2).  Columns past D_rot are copied by an out-of-place call and left alone by an in-place one.
Math in float32, one rounding to q's dtype (HF's bf16 forward rounds each product and the sum: within a unit of it).

Dtypes: q and k alike; cos and sin alike, any float dtype; the result takes ``promote_types(q, cos)``, as HF's
``q * cos`` does (a float32 cos with bfloat16 q under autocast gives float32), the gradients q's dtype.

Layouts: q, k any strides with a unit-stride head dim (``transpose(1, 2)`` of a projection's output, HF's case, with
no copy); the outputs keep the inputs' layout (``empty_like``); cos / sin any strides with a unit last stride.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import rope_config as cfg
from ._common import (
    FusedDtypeError,
    FusedShapeError,
    check_float_dtype,
    check_same_device,
    check_tensor,
    concrete,
    is_compiling,
    next_power_of_2,
    override_epoch,
    use_fallback,
)
from ._library import FusedOp, Kernel

_OP = "fused_rope"


# ==================================================================================================
# Kernel
# ==================================================================================================
@triton.jit
def _rope_heads(
    X, XO,  # pointers to one tensor (q or k) and its output at (batch b, position s, head 0, column 0)
    H,  # heads of this tensor
    sxh, soh,  # head strides of X and XO (elements)
    cols, partner, rot, keep,  # [BLOCK_D] columns, their partners, "rotated", "written" masks
    c, coef,  # [BLOCK_D] float32 cos and sign * sin of each column (0 outside the rotated dims)
    BLOCK_H: tl.constexpr,
):
    """Rotate every head of one (batch, position): XO = X * c + X[partner] * coef, in tiles of BLOCK_H heads."""
    for h0 in range(0, H, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        hm = (heads < H)[:, None]
        # the columns (pass-through ones too when they are written) and their rotation partners, float32
        x = tl.load(X + (heads * sxh)[:, None] + cols[None, :], mask=hm & keep[None, :], other=0.0).to(tl.float32)
        xp = tl.load(X + (heads * sxh)[:, None] + partner[None, :], mask=hm & rot[None, :], other=0.0).to(tl.float32)
        y = tl.where(rot[None, :], x * c[None, :] + xp * coef[None, :], x)
        tl.store(XO + (heads * soh)[:, None] + cols[None, :], y.to(XO.dtype.element_ty), mask=hm & keep[None, :])


@triton.jit
def _rope_kernel(
    Q, K,  # pointers to q and k (forward) or to the gradients of the outputs (backward)
    QO, KO,  # pointers to the outputs (may equal Q / K: in place)
    COS, SIN,  # pointers to cos and sin, [B or 1, S, D_ROT], unit last stride, the same strides
    S,  # sequence length
    HQ, HK,  # heads of q and of k
    sqb, sqs, sqh,  # strides of Q: batch, position, head (the head dim has unit stride)
    skb, sks, skh,  # strides of K
    sob, sos, soh,  # strides of QO
    skob, skos, skoh,  # strides of KO
    scb, scs,  # strides of COS / SIN: batch (0 when broadcast), position
    D,  # head dim
    D_ROT,  # rotated dims (even, <= D)
    INTERLEAVED: tl.constexpr,  # pairs (2i, 2i + 1) instead of halves
    BACKWARD: tl.constexpr,  # the transpose: -sin at the partner's index
    WRITE_PASS: tl.constexpr,  # copy the columns past D_ROT (out of place); in place leaves them alone
    BLOCK_H: tl.constexpr,  # heads per tile
    BLOCK_D: tl.constexpr,  # next power of two >= D
):
    """RoPE of every head of q and k at one (batch, position) (module docstring)."""
    pid = tl.program_id(0).to(tl.int64)  # 64-bit offsets: tensors beyond 2^31 elements address correctly
    b = pid // S
    s = pid % S
    cols = tl.arange(0, BLOCK_D)
    rot = cols < D_ROT
    if WRITE_PASS:
        keep = cols < D
    else:
        keep = rot
    half = D_ROT // 2
    # Each column's rotation partner, sign and cos / sin index (module docstring).
    if INTERLEAVED:
        partner = cols ^ 1
        sign = tl.where(cols % 2 == 0, -1.0, 1.0)
        cidx = cols // 2
        sidx = cidx  # the partner's pair is the column's own
    else:
        partner = tl.where(cols < half, cols + half, cols - half)
        sign = tl.where(cols < half, -1.0, 1.0)
        cidx = cols
        if BACKWARD:
            sidx = partner
        else:
            sidx = cols
    cs = COS + b * scb + s * scs
    c = tl.load(cs + cidx, mask=rot, other=0.0).to(tl.float32)
    sn = tl.load(SIN + b * scb + s * scs + sidx, mask=rot, other=0.0).to(tl.float32)
    if BACKWARD:
        coef = -sign * sn
    else:
        coef = sign * sn
    _rope_heads(Q + b * sqb + s * sqs, QO + b * sob + s * sos, HQ, sqh, soh, cols, partner, rot, keep, c, coef,
                BLOCK_H)
    _rope_heads(K + b * skb + s * sks, KO + b * skob + s * skos, HK, skh, skoh, cols, partner, rot, keep, c, coef,
                BLOCK_H)


# ==================================================================================================
# PyTorch reference (tests, the fallback): HF's own formula
# ==================================================================================================
def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                   unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``apply_rotary_pos_emb`` (partial rotary: the first ``cos.shape[-1]`` dims; interleaved: GLM's) in
    float32 (float64 stays float64), returned in q's / k's dtypes."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    c = cos.to(acc).unsqueeze(unsqueeze_dim)
    s = sin.to(acc).unsqueeze(unsqueeze_dim)
    if interleaved:
        c = c[..., : c.shape[-1] // 2].repeat_interleave(2, dim=-1)
        s = s[..., : s.shape[-1] // 2].repeat_interleave(2, dim=-1)
    d = c.shape[-1]

    def one(x):
        xf = x.to(acc)
        r = xf[..., :d]
        return torch.cat([r * c + _rotate(r, interleaved) * s, xf[..., d:]], dim=-1).to(x.dtype)

    return one(q), one(k)


# ==================================================================================================
# Launch plans and launchers
# ==================================================================================================
class _Plan:
    __slots__ = ("kernel", "ints")


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096


def _bsh(t: torch.Tensor, layout: int) -> tuple[int, int, int]:
    """(batch, position, head) strides of a (B, H, S, D) tensor (``layout`` 1) or a (B, S, H, D) one (2)."""
    st = t.stride()
    return (st[0], st[2], st[1]) if layout == 1 else (st[0], st[1], st[2])


def _plan(q, k, qo, ko, cos, layout: int, interleaved: bool, backward: bool, write_pass: bool) -> _Plan:
    key = (q.shape, k.shape, cos.shape, q.stride(), k.stride(), qo.stride(), ko.stride(), cos.stride(), q.dtype,
           layout, interleaved, backward, write_pass, override_epoch())
    try:
        plan = _PLANS.get(key)
    except TypeError:  # symbolic sizes: plan for their values (the shapes and strides become ints)
        key = tuple(concrete(v) if isinstance(v, (tuple, torch.Size)) else v for v in key)
        plan = _PLANS.get(key)
    if plan is not None:
        return plan
    b, s, d = q.shape[0], q.shape[2 if layout == 1 else 1], q.shape[3]
    hq, hk = q.shape[1 if layout == 1 else 2], k.shape[1 if layout == 1 else 2]
    d_rot = cos.shape[-1]
    scb = 0 if cos.dim() == 2 or cos.shape[0] == 1 else cos.stride(0)
    block_d = next_power_of_2(d)
    block_h = max(1, min(next_power_of_2(max(hq, hk)), cfg.TILE // block_d))
    plan = _Plan()
    plan.ints = (s, hq, hk, *_bsh(q, layout), *_bsh(k, layout), *_bsh(qo, layout), *_bsh(ko, layout), scb,
                 cos.stride(-2), d, d_rot)
    plan.kernel = None
    if b * s > 0:
        plan.kernel = Kernel(_rope_kernel, (b * s,), check=(0, 1, 2, 3, 4, 5), INTERLEAVED=interleaved,
                             BACKWARD=backward, WRITE_PASS=write_pass, BLOCK_H=block_h, BLOCK_D=block_d,
                             num_warps=cfg.WARPS)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _unit_d(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _launch(q, k, cos, sin, layout, interleaved, backward, inplace):
    q, k = _unit_d(q), _unit_d(k)
    cos, sin = _unit_d(cos), _unit_d(sin)
    if sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    if inplace:
        qo, ko = q, k
    else:  # HF's q * cos promotes: a float32 cos (autocast) gives a float32 result, as it does there
        out = q.dtype if backward else torch.promote_types(q.dtype, cos.dtype)
        qo, ko = torch.empty_like(q, dtype=out), torch.empty_like(k, dtype=out)
    plan = _plan(q, k, qo, ko, cos, layout, interleaved, backward, not inplace)
    if plan.kernel is not None:
        plan.kernel(q, k, qo, ko, cos, sin, *plan.ints)
    return qo, ko


def rope_forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                 layout: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch RoPE out of place: (q_embed, k_embed) in q's / k's layouts."""
    return _launch(q, k, cos, sin, layout, interleaved, False, False)


def rope_backward(dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                  layout: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward (RoPE with -sin at the partner's index): (d q, d k)."""
    return _launch(dq, dk, cos, sin, layout, interleaved, True, False)


def _setup_context(ctx, inputs, outputs):
    q, k, cos, sin, interleaved, layout = inputs
    ctx.interleaved, ctx.layout = interleaved, layout
    ctx.shapes = (q.shape, k.shape)
    ctx.dtype = q.dtype
    ctx.save_for_backward(cos, sin)  # q and k are not needed: the backward is a rotation of the gradients


def _grads(ctx, backward, dq, dk):
    cos, sin = ctx.saved_tensors
    ref = dk if dq is None else dq
    if dq is None:  # an output no loss reached: its gradient is zero
        dq = ref.new_zeros(ctx.shapes[0])
    if dk is None:
        dk = ref.new_zeros(ctx.shapes[1])
    dq, dk = backward(dq, dk, cos, sin, ctx.interleaved, ctx.layout)
    if dq.dtype != ctx.dtype:  # (a float32 result of bfloat16 q and k: their gradients in their own dtype)
        dq, dk = dq.to(ctx.dtype), dk.to(ctx.dtype)
    return dq, dk, None, None, None, None


rope_op = FusedOp("rope", rope_forward, rope_backward, _setup_context, _grads, outputs=2)


def _validate(q, k, cos, sin, unsqueeze_dim) -> None:
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_tensor(_OP, name, t)
    check_float_dtype(_OP, "q", q, allow_float64=True)
    check_float_dtype(_OP, "cos", cos, allow_float64=True)
    check_same_device(_OP, "q", q, k=k, cos=cos, sin=sin)
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"{_OP}: argument 'unsqueeze_dim' must be 1 (q of shape (B, H, S, D)) or 2 ((B, S, H, D)), "
                         f"got {unsqueeze_dim!r}")
    if k.dtype != q.dtype:
        raise FusedDtypeError(f"{_OP}: arguments 'q' ({q.dtype}) and 'k' ({k.dtype}) must have the same dtype")
    if sin.dtype != cos.dtype:
        raise FusedDtypeError(f"{_OP}: arguments 'cos' ({cos.dtype}) and 'sin' ({sin.dtype}) must have the same dtype")
    if q.dim() != 4 or k.dim() != 4:
        raise FusedShapeError(f"{_OP}: arguments 'q' and 'k' must be 4-D, got shapes {list(q.shape)} and "
                              f"{list(k.shape)}")
    s_dim = 2 if unsqueeze_dim == 1 else 1
    if k.shape[0] != q.shape[0] or k.shape[s_dim] != q.shape[s_dim] or k.shape[3] != q.shape[3]:
        raise FusedShapeError(f"{_OP}: arguments 'q' {list(q.shape)} and 'k' {list(k.shape)} must agree in batch, "
                              "sequence and head dims")
    b, s, d = q.shape[0], q.shape[s_dim], q.shape[3]
    if cos.shape != sin.shape or cos.dim() not in (2, 3) or cos.shape[-2] != s or \
            (cos.dim() == 3 and cos.shape[0] not in (1, b)):
        raise FusedShapeError(f"{_OP}: arguments 'cos' and 'sin' must have the same shape (B or 1, S, D_rot) or "
                              f"(S, D_rot) with B = {b}, S = {s}; got {list(cos.shape)} and {list(sin.shape)}")
    if cos.shape[-1] % 2 or not 0 < cos.shape[-1] <= d:
        raise FusedShapeError(f"{_OP}: the rotated dims cos.shape[-1] = {cos.shape[-1]} must be even and in "
                              f"(0, {d}] (the head dim)")


def fused_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
               unsqueeze_dim: int = 1, inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of ``q`` and ``k``: HF's ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)``.

    Args:
        q, k: (B, Hq, S, D) and (B, Hk, S, D) (``unsqueeze_dim=2``: (B, S, H, D)), same dtype, any strides with a
            unit-stride head dim.
        cos, sin: (B or 1, S, D_rot) or (S, D_rot), as HF's rotary embedding returns them; the first D_rot (even,
            <= D) dims of each head rotate, the others pass through (partial rotary).
        interleaved: pairs (2i, 2i + 1) rotated by cos / sin[..., i] (GPT-J / GLM) instead of the halves
            (``rotate_half``: Llama).  cos / sin keep HF's layout (``cat(freqs, freqs)``, as GLM's function takes
            them): the first D_rot / 2 values are the pairs', the second half is not read.
        inplace: write the result into q and k where autograd allows it (neither needs a gradient: inference);
            otherwise new tensors in q's / k's layouts.

    Returns: (q_embed, k_embed).  The backward rotates the gradients by -sin; cos and sin get no gradient (where
    they require one, the PyTorch reference runs).  float64 and devices where Triton cannot run use
    ``rope_reference``.
    """
    _validate(q, k, cos, sin, unsqueeze_dim)
    grad_on = torch.is_grad_enabled()
    if (q.dtype == torch.float64 or (grad_on and (cos.requires_grad or sin.requires_grad))
            or use_fallback(_OP, q, k, cos, sin)):
        return rope_reference(q, k, cos, sin, interleaved, unsqueeze_dim)
    needs_grad = grad_on and (q.requires_grad or k.requires_grad)
    if inplace and not needs_grad and not is_compiling() and torch.promote_types(q.dtype, cos.dtype) == q.dtype:
        return _launch(q, k, cos, sin, unsqueeze_dim, bool(interleaved), False, True)
    return rope_op(q, k, cos, sin, bool(interleaved), int(unsqueeze_dim), needs_grad=needs_grad)
