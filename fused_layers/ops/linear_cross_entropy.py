r"""Fused LM head + cross-entropy: ``F.cross_entropy(hidden @ weight.T + bias, target)`` without the
full (N, V) logits.

The N tokens are cut into chunks of ``n`` rows (``chunk_rows``: at most ``LINEAR_CHUNK_BYTES`` = 256 MiB of logits
per chunk, a multiple of 128 rows, at least ``LINEAR_MIN_ROWS`` = 512; 2,048 rows at GPT-2's V = 50,304 in bf16, 4
chunks for 8K tokens; 512 rows at Gemma's 256K; at least 1,024 rows under torch.compile and for a float32
weight-gradient sum; a weight that does not train has no gradient to sum, and takes 32 MiB / 256 rows instead;
``cross_entropy_config.py`` has the measurements).  Per chunk:

1. ``logits = hidden_chunk @ weight.T (+ bias)``: cuBLAS, in the compute dtype (the autocast dtype
   under autocast, else the inputs' dtype);
2. the cross-entropy kernel (``ops/cross_entropy.py``) writes the chunk's row losses and overwrites the
   logits with their gradient d(loss)/d(logits) in place (for ``mean`` scaled by 1/D, D computed once
   over all N targets on the device);
3. ``grad_hidden_chunk = dlogits @ weight`` and ``grad_weight += dlogits.T @ hidden_chunk`` (cuBLAS, in
   place; a single chunk writes it as one product, as unfused), ``grad_bias += dlogits.sum(0)``.
   grad_weight is summed across the chunks in the weight's own dtype when the weight is in the compute
   dtype (a bf16 model: cuBLAS accumulates each product in float32 and rounds the running sum once a
   chunk, as Liger and gradient accumulation do; 2 to 11 chunks at the models' sizes), else in float32
   (float32 weights under autocast: ``addmm(out_dtype=float32)`` where torch has it on CUDA).  A float32
   buffer beside a bf16 weight would hold 4 V H more bytes (1 GiB at Gemma's head) and move twice the
   bytes a chunk.  The sum reads and writes the (V, H) gradient once a chunk, which is why chunks keep a floor
   of rows.  A weight that does not train (LoRA, a frozen tied embedding) gets no gradient: two matmuls a chunk
   and no (V, H) buffer.

So the forward returns the loss and already holds every gradient (for an upstream gradient of 1); the
backward only scales them by grad_output (``_ce_scale_kernel``: no traffic when it is 1).  Peak extra
memory: one chunk of logits + grad_weight (where the weight trains) + grad_hidden, instead of the (N, V)
logits, their float32 copy and their gradient (about 5 GB at GPT-2-small, B16 x 1024 tokens).

``softcap`` = c caps the logits as Gemma 2 does, z = c tanh(logits / c), inside the cross-entropy kernel
(float32, on the chunk as it is read), whose gradient is then that of the raw logits: the head and its
matmuls are unchanged.

``reduction='none'`` needs a per-token upstream gradient that is only known in the backward, so there
the forward computes the losses only and the backward recomputes the chunks (one more head matmul)
with the per-row scale folded into the kernel.  Class weights are not supported here (use
``fused_cross_entropy`` on the logits).
"""

from __future__ import annotations

import torch

from . import compile_config
from . import cross_entropy_config as cfg
from ._common import autocast_dtype, check_tensor, get_override, is_compiling, use_fallback
from .cross_entropy import _REDUCTIONS, check_softcap, check_target_flag, cross_entropy_forward, launch_den, scale_grad_

_OP = "fused_linear_cross_entropy"


def linear_cross_entropy_reference(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                                   label_smoothing=0.0, softcap=None):
    """The unfused computation: logits in the compute dtype, cross-entropy in float32 (of the logits capped in
    float32 with ``softcap``)."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    if softcap:
        logits = torch.tanh(logits.float() / softcap) * softcap
    return torch.nn.functional.cross_entropy(logits.float(), target, ignore_index=ignore_index,
                                             reduction=reduction, label_smoothing=label_smoothing)


def chunk_rows(n: int, v: int, elem: int, weight_grad: bool = True, sum_bound: bool = False) -> int:
    """Rows per chunk: at most LINEAR_CHUNK_BYTES of logits but at least LINEAR_MIN_ROWS (LINEAR_SUM_MIN_ROWS where
    ``sum_bound``: a float32 weight-gradient sum, or a compiled step; without a weight gradient:
    LINEAR_FROZEN_CHUNK_BYTES, LINEAR_FROZEN_MIN_ROWS), a multiple of 128 rows, chunks of even size; all ``n`` rows
    when that covers them."""
    budget = cfg.LINEAR_CHUNK_BYTES if weight_grad else cfg.LINEAR_FROZEN_CHUNK_BYTES
    least = cfg.LINEAR_FROZEN_MIN_ROWS if not weight_grad else (
        cfg.LINEAR_SUM_MIN_ROWS if sum_bound else cfg.LINEAR_MIN_ROWS)
    budget = get_override("linear_cross_entropy", "chunk_bytes", budget)
    least = get_override("linear_cross_entropy", "min_rows", least)
    rows = max(128, least, (budget // max(v * elem, 1)) // 128 * 128)
    if rows >= n:
        return max(n, 1)
    chunks = -(-n // rows)
    return -(-(-(-n // chunks)) // 128) * 128  # spread evenly, rounded up to 128


def padded_vocab(v: int, elem: int) -> int:
    """Classes the head's matmuls run over: ``v``, or ``v`` rounded up to LOGITS_ROW_ALIGN where a row of ``v``
    elements is not a multiple of 16 bytes (GPT-2's 50,257).  The weight gets zero rows up to it, so that all three
    matmuls have aligned sizes and leading dimensions (cuBLAS's fast tensor-core kernels need both)."""
    return v if (v * elem) % 16 == 0 else -(-v // cfg.LOGITS_ROW_ALIGN) * cfg.LOGITS_ROW_ALIGN


_ADDMM_FP32_OUT = [True]  # cuBLAS bf16/fp16 x bf16/fp16 -> fp32 accumulate in place (torch >= 2.8, CUDA)


def _accumulate_grad_weight(gw: torch.Tensor, dlogits: torch.Tensor, hc: torch.Tensor, first: bool) -> None:
    """gw (the compute dtype, or float32) += dlogits.T @ hc (``first``: gw = dlogits.T @ hc, gw not read), in
    place, without a (V, H) temporary when cuBLAS can write fp32 from bf16/fp16."""
    beta = 0.0 if first else 1.0  # addmm ignores the input at beta 0 (NaN in an empty buffer included)
    if dlogits.dtype == gw.dtype:
        torch.addmm(gw, dlogits.t(), hc, beta=beta, out=gw)
        return
    if gw.is_cuda and _ADDMM_FP32_OUT[0]:
        try:
            torch.addmm(gw, dlogits.t(), hc, beta=beta, out_dtype=torch.float32, out=gw)
            return
        except (RuntimeError, TypeError, NotImplementedError):  # this torch has no addmm(out_dtype=)
            _ADDMM_FP32_OUT[0] = False
    prod = dlogits.t() @ hc  # the product in the compute dtype (fp32 accumulation inside cuBLAS)
    if first:
        gw.copy_(prod)
    else:
        gw.add_(prod)


def linear_cross_entropy_forward(hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                                 compute_grad, cdtype, out_dtype, row_scale=None, softcap=0.0,
                                 grads=(True, True, True), compiled=False):
    """Launch the chunked head + loss on validated 2-D ``hidden`` (N, H), ``weight`` (V, H), ``target`` (N,).

    Returns ``(loss, grad_hidden, grad_weight, grad_bias)``; the gradients (for an upstream gradient of
    1, or per-row ``row_scale``) are None when ``compute_grad`` is False, and each one whose flag in ``grads``
    (hidden, weight, bias) is False is None too: a frozen head (LoRA, a tied embedding that does not train)
    costs no (V, H) buffer and a third fewer matmul FLOPs.  ``loss`` is per row (N,) float32 when ``row_scale``
    is given.  ``compiled``: called by the torch.compile ops (the chunk plan's floor, ``chunk_rows``).
    """
    need_h, need_w, need_b = (bool(g) and compute_grad for g in grads)
    need_b = need_b and bias is not None
    compute_grad = need_h or need_w or need_b  # the kernel writes d(loss)/d(logits) for these only
    N, H = hidden.shape
    V = weight.shape[0]
    dev = hidden.device
    with torch.autocast(dev.type, enabled=False):
        h = hidden.to(cdtype)
        w = weight.to(cdtype)
        b = bias.to(cdtype) if bias is not None else None
        Vp = padded_vocab(V, h.element_size())
        if Vp != V:
            # Zero classes appended: their logits are exactly 0 and the loss never writes their gradient, so they
            # add nothing to grad_hidden, and their rows of grad_weight are dropped.
            w = torch.nn.functional.pad(w, (0, 0, 0, Vp - V))
            b = torch.nn.functional.pad(b, (0, Vp - V)) if b is not None else None
        t = target.reshape(-1).contiguous()  # the kernels read T + row (a strided 1-D view is kept by reshape)
        den = None
        if N > 0:  # D for 'mean' and the out-of-range count, once for all the chunks
            den = launch_den(t, None, N, V, ignore_index)
            check_target_flag(den, V)
        loss_rows = torch.empty(N, dtype=torch.float32, device=dev)
        gh = gw = gb = None
        sum_dtype = cdtype if weight.dtype == cdtype else torch.float32  # grad_weight's sum over the chunks
        n = chunk_rows(N, V, h.element_size(), need_w, compiled or sum_dtype == torch.float32)
        one_chunk = n >= N
        if need_h:
            gh = torch.empty(N, H, dtype=cdtype, device=dev)
        if need_w and not one_chunk:
            # One chunk: grad_weight is one cuBLAS product, as unfused.  Several: summed over the chunks in the
            # weight's dtype where it is the compute dtype, else in float32 (module docstring), the first chunk's
            # product written without reading the buffer.
            gw = torch.empty(Vp, H, dtype=sum_dtype, device=dev)
        if need_b:
            gb = torch.zeros(Vp, dtype=torch.float32, device=dev)
        buf = torch.empty(min(n, N), Vp, dtype=cdtype, device=dev)  # one logits buffer for all the chunks
        for s in range(0, N, n):
            e = min(s + n, N)
            hc = h[s:e]
            full = buf[: e - s]  # (n, Vp): what the matmuls read and write
            if b is not None:
                torch.addmm(b, hc, w.t(), out=full)
            else:
                torch.mm(hc, w.t(), out=full)
            # Loss rows of the chunk's V classes; with a gradient, the logits are overwritten by it (in place).
            logits = full[:, :V]
            cross_entropy_forward(
                logits, t[s:e], None, ignore_index, reduction, label_smoothing, compute_grad,
                grad_out=logits if compute_grad else None, den=den, loss_out=loss_rows[s:e],
                row_scale=row_scale[s:e] if row_scale is not None else None, softcap=softcap,
            )
            if need_h:
                torch.mm(full, w, out=gh[s:e])
            if need_w:
                if one_chunk:
                    gw = full.t() @ hc
                else:
                    _accumulate_grad_weight(gw, full, hc, first=s == 0)
            if gb is not None:
                gb.add_(full.sum(0, dtype=torch.float32))
            del logits, full
        del buf
        if Vp != V:  # the real classes' gradients
            gw = gw[:V] if gw is not None else None
            gb = gb[:V] if gb is not None else None
        if row_scale is not None:
            loss = loss_rows
        elif N == 0:
            loss = torch.full((), float("nan") if reduction == "mean" else 0.0, dtype=out_dtype, device=dev)
            loss = loss if reduction != "none" else torch.empty(0, dtype=out_dtype, device=dev)
        elif reduction == "none":
            loss = loss_rows.to(out_dtype)
        else:
            loss = loss_rows.sum().to(out_dtype)
    gh = gh.to(hidden.dtype) if gh is not None else None
    if need_w:
        gw = gw.to(weight.dtype) if gw is not None else torch.zeros_like(weight)  # (N = 0: no chunk ran)
    gb = gb.to(bias.dtype) if gb is not None else None
    return loss, gh, gw, gb


def _validate(hidden, weight, target, bias, ignore_index, reduction, label_smoothing):
    for name, t in (("hidden", hidden), ("weight", weight), ("target", target)):
        check_tensor(_OP, name, t)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{_OP}: argument 'reduction' is {reduction!r}; allowed: 'none', 'mean', 'sum'")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise RuntimeError(f"{_OP}: argument 'label_smoothing' must be between 0.0 and 1.0. Got: {label_smoothing}")
    if weight.dim() != 2 or hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"{_OP}: 'hidden' {list(hidden.shape)} and 'weight' {list(weight.shape)} do not match: "
                           "expected hidden (..., H) and weight (V, H)")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise RuntimeError(f"{_OP}: argument 'bias' must have shape [{weight.shape[0]}], got {list(bias.shape)}")
    if target.is_floating_point() or target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"{_OP}: argument 'target' must be class indices of dtype int64 (Long) or uint8 (Byte), "
                           f"got {target.dtype}")
    if target.shape != hidden.shape[:-1]:
        raise ValueError(f"{_OP}: argument 'target' has shape {list(target.shape)}; expected {list(hidden.shape[:-1])}")
    for t in (hidden, weight, bias):
        if t is not None and not t.is_floating_point():
            raise RuntimeError(f"{_OP}: 'hidden', 'weight' and 'bias' must be floating tensors, got {t.dtype}")


# ==================================================================================================
# Registration: custom ops (torch.compile) and the eager direct path
# ==================================================================================================
def _empty_or(t, like):
    return t if t is not None else like.new_empty(0)


@torch.library.custom_op("fused_layers::linear_cross_entropy_fwd", mutates_args=())
def _lce_fwd_op(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
                ignore_index: int, reduction: str, label_smoothing: float, grads: list[bool],
                cdtype: torch.dtype, out_dtype: torch.dtype,
                softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``grads``: which of (hidden, weight, bias) get a gradient; one not needed comes back empty."""
    loss, gh, gw, gb = linear_cross_entropy_forward(hidden, weight, target, bias, ignore_index, reduction,
                                                    label_smoothing, any(grads), cdtype, out_dtype,
                                                    softcap=softcap, grads=grads, compiled=True)
    return loss, _empty_or(gh, hidden), _empty_or(gw, weight), _empty_or(gb, hidden)


@_lce_fwd_op.register_fake
def _(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, grads, cdtype, out_dtype, softcap):
    loss = hidden.new_empty(hidden.shape[:1] if reduction == "none" else (), dtype=out_dtype)
    gh = hidden.new_empty(hidden.shape if grads[0] else (0,))
    gw = weight.new_empty(weight.shape if grads[1] else (0,))
    gb = bias.new_empty(bias.shape) if bias is not None and grads[2] else hidden.new_empty(0)
    return loss, gh, gw, gb


@torch.library.custom_op("fused_layers::linear_cross_entropy_bwd_rows", mutates_args=())
def _lce_bwd_rows_op(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
                     grad_loss: torch.Tensor, ignore_index: int, label_smoothing: float,
                     cdtype: torch.dtype, softcap: float,
                     grads: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, gh, gw, gb = linear_cross_entropy_forward(hidden, weight, target, bias, ignore_index, "none", label_smoothing,
                                                 True, cdtype, torch.float32, row_scale=grad_loss.float().contiguous(),
                                                 softcap=softcap, grads=grads, compiled=True)
    return _empty_or(gh, hidden), _empty_or(gw, weight), _empty_or(gb, hidden)


@_lce_bwd_rows_op.register_fake
def _(hidden, weight, target, bias, grad_loss, ignore_index, label_smoothing, cdtype, softcap, grads):
    gb = bias.new_empty(bias.shape) if bias is not None and grads[2] else hidden.new_empty(0)
    return (hidden.new_empty(hidden.shape if grads[0] else (0,)), weight.new_empty(weight.shape if grads[1] else (0,)),
            gb)


def _lce_setup_context(ctx, inputs, output):
    hidden, weight, target, bias, ignore_index, reduction, label_smoothing, grads, cdtype, _, softcap = inputs
    ctx.reduction, ctx.ignore_index, ctx.label_smoothing, ctx.cdtype = reduction, ignore_index, label_smoothing, cdtype
    ctx.softcap = softcap
    ctx.grads = [bool(grads[0]), bool(grads[1]), bias is not None and bool(grads[2])]
    if reduction == "none":
        ctx.save_for_backward(hidden, weight, target, bias)
    else:
        ctx.save_for_backward(output[1], output[2], output[3])


def _lce_backward(ctx, grad_loss, *_):
    if ctx.reduction == "none":
        hidden, weight, target, bias = ctx.saved_tensors
        gh, gw, gb = _lce_bwd_rows_op(hidden, weight, target, bias, grad_loss, ctx.ignore_index, ctx.label_smoothing,
                                      ctx.cdtype, ctx.softcap, ctx.grads)
    else:
        gh, gw, gb = (g * grad_loss.to(g.dtype) for g in ctx.saved_tensors)
    gh, gw, gb = (g if need else None for g, need in zip((gh, gw, gb), ctx.grads))
    return gh, gw, None, gb, None, None, None, None, None, None, None


_lce_fwd_op.register_autograd(_lce_backward, setup_context=_lce_setup_context)


class _LinearCrossEntropyFunction(torch.autograd.Function):
    """Eager direct path: gradients computed in the forward, scaled in place in the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, target, bias, ignore_index, reduction, label_smoothing, cdtype, out_dtype,
                softcap):
        ctx.reduction, ctx.ignore_index = reduction, ignore_index
        ctx.label_smoothing, ctx.cdtype, ctx.softcap = label_smoothing, cdtype, softcap
        need = ctx.needs_input_grad
        ctx.grads = (need[0], need[1], need[3])  # hidden, weight, bias: a frozen one gets no gradient computed
        ctx.used = False
        if reduction == "none":
            loss, *_ = linear_cross_entropy_forward(hidden, weight, target, bias, ignore_index, reduction,
                                                    label_smoothing, False, cdtype, out_dtype, softcap=softcap)
            ctx.save_for_backward(hidden, weight, target, bias)
        else:
            loss, gh, gw, gb = linear_cross_entropy_forward(hidden, weight, target, bias, ignore_index, reduction,
                                                            label_smoothing, True, cdtype, out_dtype, softcap=softcap,
                                                            grads=ctx.grads)
            ctx.save_for_backward(gh, gw, gb)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        if ctx.reduction == "none":
            hidden, weight, target, bias = ctx.saved_tensors
            _, gh, gw, gb = linear_cross_entropy_forward(hidden, weight, target, bias, ctx.ignore_index, "none",
                                                         ctx.label_smoothing, True, ctx.cdtype, torch.float32,
                                                         row_scale=grad_loss.float().contiguous(),
                                                         softcap=ctx.softcap, grads=ctx.grads)
        else:
            if ctx.used:
                raise RuntimeError(f"{_OP}: backward ran twice through the same graph; the gradients computed in "
                                   "the forward are scaled in place, so retain_graph=True double backward is not "
                                   "supported")
            ctx.used = True
            gh, gw, gb = ctx.saved_tensors
            for g in (gh, gw, gb):
                if g is not None:
                    scale_grad_(g, grad_loss, "sum")
        return gh, gw, None, gb, None, None, None, None, None, None


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    softcap: float | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias), target, ...)`` without materializing the logits.

    ``hidden`` (..., H), ``weight`` (V, H), ``bias`` (V,) or None, ``target`` (...) class indices.
    The logits are computed chunk by chunk in the compute dtype (the autocast dtype under autocast, else
    the inputs' dtype) and the loss in float32; the loss is float32 under autocast, else in the compute
    dtype (as ``F.cross_entropy`` of the logits).  Gradients flow to ``hidden``, ``weight`` and ``bias``.
    ``softcap`` (a positive float, or None): the loss of ``softcap * tanh(logits / softcap)``, as Gemma 2's
    ``final_logit_softcapping``.
    """
    _validate(hidden, weight, target, bias, ignore_index, reduction, label_smoothing)
    cap = check_softcap(_OP, softcap)
    adt = autocast_dtype(hidden)
    cdtype = adt if adt is not None else hidden.dtype
    if (cdtype == torch.float64 or use_fallback(_OP, hidden, weight, bias) or target.requires_grad
            or (is_compiling() and compile_config.COMPILED.linear_cross_entropy == "inductor")):
        logits = torch.nn.functional.linear(hidden, weight, bias)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                 ignore_index=ignore_index, reduction=reduction,
                                                 label_smoothing=label_smoothing).reshape(
            target.shape if reduction == "none" else ())
    autocast = adt is not None
    out_dtype = torch.float32 if autocast else cdtype
    if not autocast and (hidden.dtype != weight.dtype or (bias is not None and bias.dtype != hidden.dtype)):
        raise RuntimeError(f"{_OP}: 'hidden' ({hidden.dtype}), 'weight' ({weight.dtype}) and 'bias' must have one "
                           "dtype outside autocast (as F.linear)")
    shape = target.shape
    h2 = hidden.reshape(-1, hidden.shape[-1])
    t1 = target.reshape(-1)
    grads = [torch.is_grad_enabled() and t is not None and t.requires_grad for t in (hidden, weight, bias)]
    need_grad = any(grads)
    if is_compiling():
        loss = _lce_fwd_op(h2, weight, t1, bias, ignore_index, reduction, float(label_smoothing), grads,
                           cdtype, out_dtype, cap)[0]
    elif need_grad:
        loss = _LinearCrossEntropyFunction.apply(h2, weight, t1, bias, ignore_index, reduction, float(label_smoothing),
                                                 cdtype, out_dtype, cap)
    else:
        loss = linear_cross_entropy_forward(h2, weight, t1, bias, ignore_index, reduction, float(label_smoothing),
                                            False, cdtype, out_dtype, softcap=cap)[0]
    return loss.reshape(shape) if reduction == "none" else loss
