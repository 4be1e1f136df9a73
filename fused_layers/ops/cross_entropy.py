r"""Cross-entropy on logits: one Triton kernel computes the loss AND the gradient (in the forward).

Semantics are those of ``F.cross_entropy(input, target, weight, ignore_index, reduction,
label_smoothing)``: class-index targets (int64 / uint8, like torch) or class-probability targets (same
shape as the input), inputs (C,), (N, C) or (N, C, d1, ...).

Derivation.  For one row x (C logits; rows are the positions (n, d1, ...)), with
lse = m + log(s), m = max_c x_c, s = sum_c exp(x_c - m) and p_c = exp(x_c - lse), every variant has the
form

    loss = A * lse - sum_c B_c x_c,        dloss/dx_j = A p_j - B_j,        A = sum_c B_c,

* class index t, weight w (w = 1 when absent), smoothing e:
  B_c = (1 - e) w_t [c = t] + (e / C) w_c, so
  loss = (1 - e) w_t (lse - x_t) + (e / C) (W lse - sum_c w_c x_c) with W = sum_c w_c
  (exactly torch's ``(1 - e) * nll + (e / C) * smooth``, LossNLL.cpp), and ignored rows give loss 0 and
  gradient 0 * p (0 for a finite row; NaN for a row holding NaN/inf, as torch's log_softmax backward);
* class probabilities q: q' = (1 - e) q + e / C and B_c = w_c q'_c (``ignore_index`` does not apply).

Reductions: ``none`` keeps the per-row loss; ``sum`` adds the rows; ``mean`` divides the sum by
D = sum over non-ignored rows of w_t for class indices (torch's weighted mean; 0 / 0 = NaN when every
row is ignored) and by the number of rows for probabilities.  D is computed on the device by a small
pre-pass (``_ce_den_kernel``) so the main kernel can scale the gradient by 1/D without a host sync.

Soft-capping (``softcap`` = c > 0, Gemma 2's final logits): the loss is that of z = c tanh(x / c), each
logit capped in float32 as it is loaded, and dloss/dx_j = dloss/dz_j (1 - (z_j / c)^2), from the capped
value held or re-read in pass 2, so neither the capped logits nor tanh are stored.  Only the main kernel
below caps (the persistent and TMA kernels do not take soft-capped rows).

The main kernel (``_ce_fwd_kernel``), one program per BLOCK_M rows:

1. statistics of the row: online softmax over chunks of BLOCK_N columns, running (m, s) with
   m' = max(m, max(chunk)), s' = s exp(m - m') + sum exp(chunk - m') (while only -inf was seen it
   subtracts 0 instead, so -inf - -inf never appears), plus the sums the loss needs (sum w x, sum w,
   sum w q', sum w q' x);
2. the loss of the row (scaled by 1/D for ``mean``) into a float32 row buffer (for ``none``: the loss
   itself, in its dtype), which ``_ce_sum_kernel`` reduces for ``mean`` / ``sum``;
3. when a gradient is wanted: dx_j = (A p_j - B_j) / D, written in the logits' dtype.

Rows by width (launch configurations: ``cross_entropy_config.py``):

* at most ``MAX_SINGLE`` (padded) columns: ``_ce_fwd_kernel`` loads the row once and keeps it in
  registers (one read, one write);
* wider 16-bit rows with a gradient and class-index targets without smoothing, in eager calls:
  ``_ce_fwd_persist_kernel``, persistent co-resident programs holding a piece of a row each and
  exchanging (m, s) words (ops/_rowsync.py, the wide softmax's scheme): one read at any width.  One row
  in registers, the next rows' pieces loaded ahead by cp.async while the program waits (the wait is a
  called function, so Triton pipelines the row loop).  Rows not 16-element aligned take its VEC8 form
  (ops/_rows.py) where the gradient shares their window, and stream where it does not;
* of those, rows of at most 32,768 classes (a multiple of 256) on an sm_90 GPU, 2-D, reduced to mean /
  sum with no given upstream gradient: ops/cross_entropy_gluon.py's TMA kernel, the row held in a
  shared-memory ring (one read), where it takes the call (else the persistent kernel runs);
* everything else wider (fp32, label smoothing, probabilities, traced calls): ``_ce_fwd_kernel``
  streaming one row per program in chunks of BLOCK_N, two passes.  Pass 1 keeps the running max per
  row and the sum of exponentials per lane (one block reduction a chunk, for the max), its chunk loads
  pipelined through shared memory (``STAGES`` > 1) or one chunk ahead in registers.  Pass 2 reads the row
  again -- from L2 while the rows in flight fit there (about 50 MB on an H200) -- walking the chunks
  last to first: the chunks read last are the likeliest still in L2, so rows too wide for that (262K
  columns: 67 MB in flight) still hit on their tail instead of missing on every chunk as a forward walk
  would under LRU;
* without a gradient: one streaming pass.

All math is float32; the logits are read in their own dtype (no float32 copy).  The target's logit is
read before its column's gradient is written (the streaming kernel: in the statistics pass; the persistent
kernel: by the program that writes that column), so the gradient may overwrite the logits in place (the
fused linear cross-entropy does).

Backward.  The saved gradient is that of the loss for an upstream gradient of 1; the backward scales
it by grad_output: in place, by ``_ce_scale_kernel``, whose programs read the scalar and return at
once when it is 1 (the usual ``loss.backward()``), so forward + backward is one read of the logits
and one write of the gradient; for ``reduction='none'`` by a broadcast in-place multiply.  Because the
scaling is in place, a second backward through the same graph (``retain_graph=True``) raises.  Under
torch.compile the backward op is functional (``grad * grad_output``, a new tensor: Inductor emits one
pointwise kernel, a read and a write of the gradient the eager path skips when grad_output is 1).

Registration (``ops/_library.py``): ``FusedOp("cross_entropy", ...)``: an eager autograd.Function fast
path, and ops ``fused_layers::cross_entropy_fwd`` / ``_bwd`` (``torch.library.triton_op`` on GPU
machines: Inductor traces into ``cross_entropy_forward`` and launches the kernels from its own code).
Launches go through ``Kernel`` objects bound in launch plans cached per (shape, strides, dtype, flags,
ignore_index): every integer a kernel receives is a function of that key.

Special values follow torch: +inf or NaN in a row gives NaN loss and gradient for that row, -inf
logits are fine (the target's -inf gives +inf loss), an all -inf row gives NaN.

Out-of-range targets (not ``ignore_index``, not in [0, C)): the kernel never reads out of bounds (it
reads column 0 instead) and writes NaN loss/gradient for the row.  The pre-pass ``_ce_den_kernel``
(which also computes D) counts them; the count is checked at once on the CPU (``IndexError``, as
torch's CPU kernel), and on CUDA without a host sync: it is copied to pinned memory asynchronously and
checked at the next call (or by ``check_cross_entropy_errors()``, which waits), raising ``IndexError``
there.  (torch's CUDA kernel asserts on the device, which kills the process.)  Under torch.compile no
host read can be traced: there the NaN loss is the only sign.

Layout.  A row is an (outer, inner) pair: for input (N, C, d1, ...), outer runs over N and inner over
d1..., element (o, i, c) at ``o * sxo + i * sxi + c * sxc``: (N, C) views with any strides and
contiguous (N, C, d...) inputs need no copy (the column stride is then d1*...: correct, but reads are
strided); layouts that do not merge that way are copied to contiguous first (ops/_rows.py).
The gradient is allocated contiguous in the input's shape.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import compile_config
from . import cross_entropy_config as cfg
from ._common import (
    INTERPRET,
    check_tensor,
    concrete,
    config_override,  # noqa: F401  (re-exported for tests: config_override("cross_entropy", ...))
    get_override,
    is_compiling,
    next_power_of_2,
    override_epoch,
    use_fallback,
)
from ._library import FusedOp, Kernel
from ._rows import contiguous_strides, row_strides, rows_misaligned, vec8_window
from ._rowsync import (
    balanced_pieces,
    bind_persistent,
    edge_load,
    exp_scaled,
    max_sum2,
    pack_pair,
    piece_ptrs,
    program_piece,
    publish,
    publish_max_sum,
    vec_step,
    vec_woff,
    wait_row_max_sum_call,
)

_OP = "fused_cross_entropy"
_REDUCTIONS = ("none", "mean", "sum")


# ==================================================================================================
# Kernels
# ==================================================================================================
@triton.jit
def _ce_stats_update(x, m, s):
    """Online softmax step: fold the chunk x [BLOCK_M, BLOCK_N] (float32, masked with -inf) into (m, s)."""
    m_new = tl.maximum(m, tl.max(x, axis=1))
    # While only -inf has been seen, subtract 0 instead (-inf - -inf would be NaN).
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    s = s * tl.exp2((m - m_safe) * 1.4426950408889634) + tl.sum(tl.exp2((x - m_safe[:, None]) * 1.4426950408889634),
                                                                 axis=1)
    return m_new, s


@triton.jit
def _ce_softcap(x, keep, cap):
    """z = cap * tanh(x / cap) where ``keep`` (the real columns), x elsewhere (masked lanes stay -inf).

    tanh(y) = 1 - 2 / (exp(2y) + 1): exact at both ends (exp overflows to inf: 1; underflows to 0: -1), so an
    infinite logit caps to +-cap as ``torch.tanh`` does; its absolute error near 0 is a float32 ulp."""
    e = tl.exp2(x * (2.0 * 1.4426950408889634 / cap))
    return tl.where(keep, cap * (1.0 - 2.0 / (e + 1.0)), x)


@triton.jit
def _ce_target_sums(x, tb, W, c, cm, lim, C, stc, smoothing, sum_w, sum_wx,
                    SOFT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, BLOCK_N: tl.constexpr):
    """The target side of one chunk x [BLOCK_M, BLOCK_N] (float32, -inf where masked; cm its mask):
    sum_w += sum_c w_c q_c and sum_wx += sum_c w_c q_c x_c, with q the (smoothed) target distribution
    (probabilities read from tb, or uniform for label smoothing of class-index targets) and w the class
    weights (1 without ``weight``).  Masked lanes add 0 (never 0 * -inf)."""
    if HAS_WEIGHT:
        w = tl.load(W + c, mask=c < lim, other=0.0).to(tl.float32)[None, :]
    else:
        w = tl.full([1, BLOCK_N], 1.0, tl.float32)
    if SOFT:
        q = tl.load(tb[:, None] + c[None, :].to(tl.int64) * stc, mask=cm, other=0.0).to(tl.float32)
        if SMOOTH:
            q = q * (1.0 - smoothing) + smoothing / (C * 1.0)
        wq = w * q
        sum_w += tl.sum(tl.where(cm, wq, 0.0), axis=1)
        sum_wx += tl.sum(tl.where(cm, wq * x, 0.0), axis=1)
    else:
        sum_wx += tl.sum(tl.where(cm, w * x, 0.0), axis=1)
        if HAS_WEIGHT:
            sum_w += tl.sum(tl.where(cm, w, 0.0), axis=1)
    return sum_w, sum_wx


@triton.jit
def _ce_stats_chunk(xb, tb, W, off, row_ok, lim, C, sxc, stc, smoothing, m, s, sum_w, sum_wx, softcap,
                    SOFT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, BLOCK_N: tl.constexpr,
                    SOFTCAP: tl.constexpr = False):
    """Pass 1 on the columns [off, min(off + BLOCK_N, lim)) of BLOCK_M rows (row bases xb / tb).

    Returns the chunk (float32, soft-capped when SOFTCAP) and the updated running (m, s, sum_w, sum_wx).
    """
    c = off + tl.arange(0, BLOCK_N)
    cm = row_ok[:, None] & (c < lim)[None, :]
    # -inf: the identity of max; exp(-inf - m) = 0 is then the identity of the sum.
    x = tl.load(xb[:, None] + c[None, :].to(tl.int64) * sxc, mask=cm, other=-float("inf")).to(tl.float32)
    if SOFTCAP:
        x = _ce_softcap(x, cm, softcap)
    m, s = _ce_stats_update(x, m, s)
    if SOFT or SMOOTH:
        sum_w, sum_wx = _ce_target_sums(x, tb, W, c, cm, lim, C, stc, smoothing, sum_w, sum_wx,
                                        SOFT, HAS_WEIGHT, SMOOTH, BLOCK_N)
    return x, m, s, sum_w, sum_wx


@triton.jit
def _ce_load_chunk(xb, c, row_ok, lim, sxc):
    """Raw chunk x[rows, c] (logits' dtype) for columns c in [0, lim); -inf elsewhere (the identity of max,
    and exp(-inf - m) = 0 is the identity of the sum).  Columns below 0 or past lim are not read, so the
    prefetch of the chunk after the last (or before the first) costs no traffic."""
    cm = row_ok[:, None] & ((c >= 0) & (c < lim))[None, :]
    return tl.load(xb[:, None] + c[None, :].to(tl.int64) * sxc, mask=cm, other=-float("inf"))


@triton.jit
def _ce_fold_chunk(x, tb, W, c, row_ok, lim, C, stc, smoothing, m, s_v, sum_w, sum_wx,
                   SOFT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pass 1 of the streaming kernel on one chunk x [BLOCK_M, BLOCK_N] (float32, -inf where masked).

    Like ``_ce_stats_chunk``, but the sum of exponentials stays per lane, s_v [BLOCK_M, BLOCK_N]:
    s_v' = s_v exp(m - m') + exp(x - m') with the row's running max m (one block reduction per chunk,
    for the max, instead of two; s = sum(s_v) once at the end).
    """
    m_new = tl.maximum(m, tl.max(x, axis=1))
    # While only -inf has been seen, subtract 0 instead (-inf - -inf would be NaN).
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2((m - m_safe) * 1.4426950408889634)  # [BLOCK_M]: 0 while m was -inf (s_v was 0)
    s_v = s_v * alpha[:, None] + tl.exp2((x - m_safe[:, None]) * 1.4426950408889634)
    if SOFT or SMOOTH:
        cm = row_ok[:, None] & (c < lim)[None, :]
        sum_w, sum_wx = _ce_target_sums(x, tb, W, c, cm, lim, C, stc, smoothing, sum_w, sum_wx,
                                        SOFT, HAS_WEIGHT, SMOOTH, BLOCK_N)
    return m_new, s_v, sum_w, sum_wx


@triton.jit
def _ce_target_logit(T, xb, r64, row_ok, lo, hi, C, sxc, softcap=1.0, SOFTCAP: tl.constexpr = False):
    """x[t] of each row whose class index t lies in [lo, hi) (0 otherwise: ignored, out of range, elsewhere),
    soft-capped when SOFTCAP.

    Read during the statistics pass, before any program writes its gradient (the gradient may be written
    over the logits in place, as the fused linear cross-entropy does).
    """
    t = tl.load(T + r64, mask=row_ok, other=-1).to(tl.int64)
    inside = row_ok & (t >= lo) & (t < hi) & (t >= 0) & (t < C)
    x_t = tl.load(xb + tl.where(inside, t, 0) * sxc, mask=inside, other=0.0).to(tl.float32)
    if SOFTCAP:
        x_t = _ce_softcap(x_t, inside, softcap)
    return x_t


@triton.jit
def _ce_row(T, W, x_t, r64, row_ok, C, ignore_index, smoothing, m, s, sum_w, sum_wx, DEN, inv_den, RS,
            SOFT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, DEN_ON_DEVICE: tl.constexpr,
            HAS_ROW_SCALE: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per-row terms from the row statistics: the (scaled) loss, lse, the gradient coefficients.

    ``x_t`` is the target's logit (``_ce_target_logit``).
    Returns (loss * scale, lse, coef_a, coef_b, coef_t, t, bad): dx_j = coef_a p_j - B_j with
    B_j = coef_t [j == t] + coef_b (e / C) w_j (class indices) or coef_b w_j q'_j (probabilities).
    """
    lse = m + tl.log(s)  # an all -inf row: -inf + log(0) = -inf, then NaN below as torch
    Cf = C * 1.0
    if DEN_ON_DEVICE:
        scale = 1.0 / tl.load(DEN)
    else:
        scale = inv_den
    if SOFT:
        ign = r64 < 0  # all False: no ignore_index for probabilities
        bad = ign
        t = r64 * 0
        a = sum_w
        loss = a * lse - sum_wx
    else:
        t = tl.load(T + r64, mask=row_ok, other=ignore_index).to(tl.int64)
        ign = t == ignore_index
        bad = row_ok & (~ign) & ((t < 0) | (t >= C))
        t = tl.where(ign | bad, 0, t)  # never read out of bounds
        if HAS_WEIGHT:
            w_t = tl.load(W + t, mask=row_ok, other=0.0).to(tl.float32)
        else:
            w_t = tl.full([BLOCK_M], 1.0, tl.float32)
        loss = (1.0 - smoothing) * w_t * (lse - x_t)
        if SMOOTH:
            if HAS_WEIGHT:
                w_all = sum_w
            else:
                w_all = tl.full([BLOCK_M], 1.0, tl.float32) * Cf
            loss += (smoothing / Cf) * (w_all * lse - sum_wx)
            a = (1.0 - smoothing) * w_t + (smoothing / Cf) * w_all
        else:
            a = w_t
        loss = tl.where(ign, 0.0, loss)
        loss = tl.where(bad, float("nan"), loss)
    loss = loss * scale
    if HAS_ROW_SCALE:
        scale = scale * tl.load(RS + r64, mask=row_ok, other=0.0).to(tl.float32)
    scale = tl.where(bad, float("nan"), scale)
    # Ignored rows: 0 * p (0, or NaN where p is NaN, as torch); not divided by D (D may be 0).
    coef_a = tl.where(ign, 0.0, a * scale)
    coef_b = tl.where(ign, 0.0, scale)
    if SOFT:
        coef_t = coef_b  # unused
    else:
        coef_t = coef_b * (1.0 - smoothing) * w_t
    return loss, lse, coef_a, coef_b, coef_t, t, bad


@triton.jit
def _ce_grad_chunk(x, db, tb, W, off, row_ok, lim, C, sdc, stc, smoothing, lse, coef_a, coef_b, coef_t, t,
                   softcap, SOFT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr,
                   BLOCK_N: tl.constexpr, SOFTCAP: tl.constexpr = False):
    """Pass 2 on one chunk: dx = coef_a * p - B, stored at db (row bases) in DX's dtype.

    With SOFTCAP, x holds the capped logits z = cap tanh(x_raw / cap), and the stored gradient is that of the
    raw logits: dz * (1 - (z / cap)^2)."""
    c = off + tl.arange(0, BLOCK_N)
    cm = row_ok[:, None] & (c < lim)[None, :]
    c64 = c[None, :].to(tl.int64)
    p = tl.exp2((x - lse[:, None]) * 1.4426950408889634)
    g = coef_a[:, None] * p
    if HAS_WEIGHT:
        w = tl.load(W + c, mask=c < lim, other=0.0).to(tl.float32)[None, :]
    else:
        w = tl.full([1, BLOCK_N], 1.0, tl.float32)
    if SOFT:
        q = tl.load(tb[:, None] + c64 * stc, mask=cm, other=0.0).to(tl.float32)
        if SMOOTH:
            q = q * (1.0 - smoothing) + smoothing / (C * 1.0)
        g -= coef_b[:, None] * (w * q)
    else:
        g -= tl.where(c[None, :] == t[:, None], coef_t[:, None], 0.0)
        if SMOOTH:
            g -= (coef_b * (smoothing / (C * 1.0)))[:, None] * w
    if SOFTCAP:
        u = x / softcap  # tanh(x_raw / cap)
        g = g * (1.0 - u * u)
    tl.store(db[:, None] + c64 * sdc, g.to(db.dtype.element_ty), mask=cm)


@triton.jit(do_not_specialize=["M", "C", "ignore_index"])
def _ce_den_kernel(
    T,  # int64/uint8 [M]: class-index targets (flat, contiguous)
    W,  # [C] class weights (float), read only when HAS_WEIGHT
    DEN,  # float32 [2] (written): [0] D = sum over non-ignored, in-range rows of w_t (1 without weights),
          # [1] the number of out-of-range targets (not ignore_index, not in [0, C))
    M, C,  # rows, classes
    ignore_index,
    HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program, before the main kernel: the denominator of the weighted mean and the out-of-range
    count, on the device (no host sync; nothing to zero beforehand)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    nbad = tl.zeros([BLOCK], tl.float32)
    for start in range(0, M, BLOCK):
        r = start + offs
        t = tl.load(T + r, mask=r < M, other=ignore_index).to(tl.int64)
        live = (r < M) & (t != ignore_index)
        ok = live & (t >= 0) & (t < C)
        if HAS_WEIGHT:
            w = tl.load(W + tl.where(ok, t, 0), mask=ok, other=0.0).to(tl.float32)
        else:
            w = ok.to(tl.float32)
        acc += tl.where(ok, w, 0.0)
        nbad += (live & ~ok).to(tl.float32)
    tl.store(DEN, tl.sum(acc, axis=0))
    tl.store(DEN + 1, tl.sum(nbad, axis=0))


@triton.jit(do_not_specialize=["M"])
def _ce_sum_kernel(
    LOSS,  # float32 [M]: per-row losses (already divided by D for 'mean')
    OUT,  # [] (written): their sum, in the loss dtype
    M,  # rows
    BLOCK: tl.constexpr,
):
    """One program: the reduced loss, summed in a fixed order (deterministic) and cast in one launch."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, M, BLOCK):
        r = start + offs
        acc += tl.load(LOSS + r, mask=r < M, other=0.0)
    tl.store(OUT, tl.sum(acc, axis=0).to(OUT.dtype.element_ty))


@triton.jit
def _ce_fwd_kernel(
    X,  # logits; element (row (o, i), class c) at X + o*sxo + i*sxi + c*sxc (bf16/fp16/fp32)
    T,  # class indices: int64/uint8 [M] flat; probabilities: same layout as X with strides (sto, sti, stc)
    W,  # [C] class weights (read when HAS_WEIGHT)
    LOSS,  # [M] (written; float32, or the loss dtype for reduction='none'): loss of each row, / D for 'mean'
    DX,  # gradient (written when HAS_GRAD; may be X itself); element (o, i, c) at DX + o*sdo + i*sdi + c*sdc
    DEN,  # float32 [2] from _ce_den_kernel: D for reduction='mean' with class indices (read when DEN_ON_DEVICE)
    RS,  # float [M]: per-row scale of the gradient (read when HAS_ROW_SCALE)
    M, C, INNER,  # rows, classes, size of the inner row index (d1 * ...)
    sxo, sxi, sxc,  # strides of X
    sto, sti, stc,  # strides of T (probabilities only)
    sdo, sdi, sdc,  # strides of DX
    ignore_index,  # class index whose rows are ignored
    smoothing,  # label_smoothing e (float)
    inv_den,  # 1/D when not DEN_ON_DEVICE (1.0 for sum/none, 1/M for the mean of probabilities)
    softcap,  # cap of the logits' soft-capping z = cap * tanh(x / cap) (read when SOFTCAP)
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # columns per chunk
    SINGLE: tl.constexpr,  # the row fits in one chunk: load once, keep it in registers
    SOFT: tl.constexpr,  # targets are class probabilities
    HAS_WEIGHT: tl.constexpr,
    SMOOTH: tl.constexpr,  # smoothing > 0
    HAS_GRAD: tl.constexpr,  # write the gradient
    DEN_ON_DEVICE: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    STAGES: tl.constexpr,  # streaming: > 1 software-pipelines both chunk loops this deep; 1 prefetches one chunk
    SOFTCAP: tl.constexpr = False,  # the loss of the soft-capped logits (Gemma 2's final_logit_softcapping)
):
    """One program per BLOCK_M rows: statistics (one or more chunks), loss, then the gradient.

    Streaming (not SINGLE): with STAGES > 1 Triton pipelines the chunk loads of ``tl.range(num_stages=STAGES)``
    through shared memory (cp.async), so STAGES - 1 chunks are in flight while one is reduced, at no register cost
    (a plain loop is not pipelined for loads that do not feed a dot); with STAGES = 1 chunk k + 1 is loaded into
    registers before chunk k is reduced."""
    smoothing = tl.cast(smoothing, tl.float32)  # floats may arrive as float64 (Inductor's launches)
    inv_den = tl.cast(inv_den, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    r64 = rows.to(tl.int64)
    xb = X + (r64 // INNER) * sxo + (r64 % INNER) * sxi  # [BLOCK_M] row bases
    if SOFT:
        tb = T + (r64 // INNER) * sto + (r64 % INNER) * sti
    else:
        tb = xb  # unused

    # ---- pass 1: statistics ----------------------------------------------------------------------
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    sum_wx = tl.zeros([BLOCK_M], tl.float32)  # hard + smoothing: sum w_c x_c;  soft: sum w_c q'_c x_c
    sum_w = tl.zeros([BLOCK_M], tl.float32)  # hard + smoothing + weight: sum w_c;  soft: sum w_c q'_c
    if SINGLE:  # the whole row in one tile, kept in registers for pass 2
        x, m, s, sum_w, sum_wx = _ce_stats_chunk(xb, tb, W, 0, row_ok, C, C, sxc, stc, smoothing, m, s, sum_w,
                                                 sum_wx, softcap, SOFT, HAS_WEIGHT, SMOOTH, BLOCK_N, SOFTCAP)
    else:
        cols = tl.arange(0, BLOCK_N)
        s_v = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        m_v = m
        if STAGES == 1:
            x_next = _ce_load_chunk(xb, cols, row_ok, C, sxc)
        for off in tl.range(0, C, BLOCK_N, num_stages=STAGES):
            c = off + cols
            if STAGES == 1:  # chunk k + 1 is in flight while chunk k is reduced
                x_raw = x_next
                x_next = _ce_load_chunk(xb, c + BLOCK_N, row_ok, C, sxc)
            else:
                x_raw = _ce_load_chunk(xb, c, row_ok, C, sxc)
            x_f = x_raw.to(tl.float32)
            if SOFTCAP:
                x_f = _ce_softcap(x_f, row_ok[:, None] & (c < C)[None, :], softcap)
            m_v, s_v, sum_w, sum_wx = _ce_fold_chunk(x_f, tb, W, c, row_ok, C, C, stc, smoothing,
                                                     m_v, s_v, sum_w, sum_wx, SOFT, HAS_WEIGHT, SMOOTH, BLOCK_N)
        m = m_v
        s = tl.sum(s_v, axis=1)

    # ---- loss of the row -------------------------------------------------------------------------
    if SOFT:
        x_t = tl.zeros([BLOCK_M], tl.float32)  # unused
    else:
        x_t = _ce_target_logit(T, xb, r64, row_ok, 0, C, C, sxc, softcap, SOFTCAP)
    loss, lse, coef_a, coef_b, coef_t, t, bad = _ce_row(
        T, W, x_t, r64, row_ok, C, ignore_index, smoothing, m, s, sum_w, sum_wx, DEN, inv_den, RS,
        SOFT, HAS_WEIGHT, SMOOTH, DEN_ON_DEVICE, HAS_ROW_SCALE, BLOCK_M)
    tl.store(LOSS + r64, loss.to(LOSS.dtype.element_ty), mask=row_ok)

    # ---- pass 2: gradient dx = (A p - B) / D -----------------------------------------------------
    if HAS_GRAD:
        db = DX + (r64 // INNER) * sdo + (r64 % INNER) * sdi
        if SINGLE:
            _ce_grad_chunk(x, db, tb, W, 0, row_ok, C, C, sdc, stc, smoothing, lse, coef_a, coef_b, coef_t, t,
                           softcap, SOFT, HAS_WEIGHT, SMOOTH, BLOCK_N, SOFTCAP)
        else:
            # Second read of the row (from L2 while it is still there), last chunk first: the chunks read last
            # in pass 1 (the likeliest to still be in L2) are re-read first; with more rows in flight than L2
            # holds (262K-wide rows) a forward re-read would miss on every chunk under LRU, the reverse one hits
            # on the row's tail.
            cols = tl.arange(0, BLOCK_N)
            n_chunks = tl.cdiv(C, BLOCK_N)
            first = (n_chunks - 1) * BLOCK_N
            step = -BLOCK_N
            if STAGES == 1:
                x_next = _ce_load_chunk(xb, first + cols, row_ok, C, sxc)
            for i in tl.range(0, n_chunks, num_stages=STAGES):
                off = first + i * step
                c = off + cols
                # (the chunk loaded ahead is never the one written below: in-place gradients are safe)
                if STAGES == 1:
                    x_raw = x_next
                    x_next = _ce_load_chunk(xb, c + step, row_ok, C, sxc)
                else:
                    x_raw = _ce_load_chunk(xb, c, row_ok, C, sxc)
                x_f = x_raw.to(tl.float32)
                if SOFTCAP:
                    x_f = _ce_softcap(x_f, row_ok[:, None] & (c < C)[None, :], softcap)
                _ce_grad_chunk(x_f, db, tb, W, off, row_ok, C, C, sdc, stc, smoothing, lse, coef_a,
                               coef_b, coef_t, t, softcap, SOFT, HAS_WEIGHT, SMOOTH, BLOCK_N, SOFTCAP)


@triton.jit
def _ce_persist_row(X, W, LOSS, DX, DEN, RS, SLOTS, x_p, t, rp, piece, start, cm, c64, C, INNER, sxo, sxi, sxc, sdo,
                    sdi, sdc, ignore_index, inv_den, SPLITS, PIECE, BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                    DEN_ON_DEVICE: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, VEC_WIN: tl.constexpr, d):
    """Row rp of ``_ce_fwd_persist_kernel`` once its piece x_p is published: wait for the row's statistics, lse,
    the loss (written by the program owning the target t) and this piece's gradient.  VEC_WIN > 0: the piece is on
    the row's window (c64 the window positions, d the row's phase: ops/_rowsync.py), the gradient written through
    DX's.  Returns (lse, coef, t) for the caller's edge lanes: their gradient is coef p - coef [c = t]."""
    # What the row needs besides its statistics, loaded before the wait (their latency hides there).
    ign = t == ignore_index
    bad = (~ign) & ((t < 0) | (t >= C))
    t = tl.where(ign | bad, 0, t)  # never read out of bounds
    if HAS_WEIGHT:
        w_t = tl.load(W + t).to(tl.float32)
    else:
        w_t = 1.0
    if DEN_ON_DEVICE:
        scale = 1.0 / tl.load(DEN)
    else:
        scale = inv_den
    if HAS_ROW_SCALE:
        rs = tl.load(RS + rp).to(tl.float32)
    # The program that writes column t (column 0 for ignored / bad rows) reads x_t and writes the loss: no other
    # program writes that column, and this one only after the read (DX may be X: the linear cross-entropy).
    if VEC_WIN > 0:  # column t is window position t + d: in a piece's whole vectors, or an edge column (the first's)
        w = (t + d).to(tl.int32)
        k = w - start  # (the position within this piece, compared in 32 bits)
        in_body = (w >= ((d + 7) >> 3 << 3).to(tl.int32)) & (w < ((d + C) >> 3 << 3).to(tl.int32))
        owner = tl.where(in_body, (k >= 0) & (k < PIECE), piece == 0)
    else:
        owner = t // PIECE == piece
    x_t = tl.load(piece_ptrs(X, rp, INNER, sxo, sxi, sxc, t), mask=owner, other=0.0).to(tl.float32)
    # (a call: the SMEM-pipelined row loop stays pipelined, see _rowsync.wait_row_max_sum_call)
    m, s = wait_row_max_sum_call(SLOTS + rp * SPLITS, SPLITS)
    lse = m + tl.log(s)  # an all -inf row: -inf + log(0) = -inf, then NaN below, as torch
    loss = tl.where(ign, 0.0, w_t * (lse - x_t))
    loss = tl.where(bad, float("nan"), loss) * scale
    tl.store(LOSS + rp, loss.to(LOSS.dtype.element_ty), mask=owner)
    if HAS_ROW_SCALE:
        scale = scale * rs
    scale = tl.where(bad, float("nan"), scale)
    # Ignored rows: 0 * p (0, or NaN where p is NaN, as torch); not divided by D (D may be 0).
    coef = tl.where(ign, 0.0, w_t * scale)
    # (the target's column within the piece compared in 32 bits)
    # Where the store's pointers are computed moves ptxas's schedule (bf16, 8,192 rows): the aligned kernel computes
    # them in the store (0.699 against 0.643 of copy at 50,304 with the pointers first), VEC8 before dx (0.613
    # against 0.573 at 50,257 with them in the store).
    if VEC_WIN > 0:  # column t is window position t + d; DX's rows share X's d (the host checks)
        hit = tl.arange(0, BLOCK_N) == k
        dptrs = DX + vec_woff((rp // INNER) * sdo + (rp % INNER) * sdi, d, VEC_WIN) + c64
        dx = exp_scaled(x_p, lse, coef) - tl.where(hit, coef, 0.0)  # coef p - B
        tl.store(dptrs, dx.to(DX.dtype.element_ty), mask=cm)
    else:
        hit = tl.arange(0, BLOCK_N) == (t - start).to(tl.int32)
        dx = exp_scaled(x_p, lse, coef) - tl.where(hit, coef, 0.0)  # coef p - B
        tl.store(piece_ptrs(DX, rp, INNER, sdo, sdi, sdc, c64), dx.to(DX.dtype.element_ty), mask=cm)
    return lse, coef, t


@triton.jit(do_not_specialize=["GROUPS"])
def _ce_fwd_persist_kernel(
    X,  # logits; element (row (o, i), class c) at X + o*sxo + i*sxi + c*sxc (bf16/fp16)
    T,  # int64/uint8 [M]: class-index targets (flat, contiguous)
    W,  # [C] class weights (read when HAS_WEIGHT)
    LOSS,  # [M] (written): each row's loss (/ D for 'mean'), written by the program holding its target
    DX,  # gradient (written; may be X itself); element (o, i, c) at DX + o*sdo + i*sdi + c*sdc
    DEN,  # float32 [2] from _ce_den_kernel (read when DEN_ON_DEVICE)
    RS,  # float [M]: per-row scale of the gradient (read when HAS_ROW_SCALE)
    SLOTS,  # int64 [M * SPLITS], zeroed: each piece's published (max, sum of exp(x - max)) (ops/_rowsync.py)
    M, C, INNER,  # rows, classes, size of the inner row index
    sxo, sxi, sxc,  # strides of X
    sdo, sdi, sdc,  # strides of DX
    ignore_index,
    inv_den,  # 1/D when not DEN_ON_DEVICE (1.0 for 'sum' / 'none')
    SPLITS,  # pieces per row
    PIECE,  # columns per piece (<= BLOCK_N; the last piece of a row may be shorter)
    GROUPS,  # row groups: program g holds piece g % SPLITS of rows g // SPLITS, + GROUPS, + 2 GROUPS, ...
    BLOCK_N: tl.constexpr,  # power of two >= PIECE: a piece is one register tile
    HAS_WEIGHT: tl.constexpr, DEN_ON_DEVICE: tl.constexpr, HAS_ROW_SCALE: tl.constexpr,
    PHASE: tl.constexpr,  # 2: one launch (GPU); 0 then 1: two launches (the interpreter), see _rowsync
    STAGES: tl.constexpr,  # > 1: rows whose piece loads are in flight by cp.async (the SMEM-pipelined form)
    VEC_WIN: tl.constexpr,  # > 0: the VEC8 form on a window of VEC_WIN elements (16-bit rows at any alignment,
                            # sxc = 1; SPLITS * PIECE >= C + VEC_WIN - 1; DX's row offsets = X's mod VEC_WIN)
):
    """Wide rows with class-index targets, one read: persistent co-resident programs, each holding one piece
    of a row in registers (ops/_rowsync.py), in the SMEM-pipelined form of ``_softmax_fwd_persist_kernel``.

    Iteration k: load row k's piece (the loads of the next STAGES - 1 rows are in flight), publish its (m_p, s_p),
    wait for the row's other pieces, combine them into lse and write this piece's gradient
    dx = (w_t p - w_t [c = t]) / D from the registers; the program whose piece holds the target (the first
    piece for ignored and out-of-range rows) writes the row's loss w_t (lse - x_t) / D.  Label smoothing
    and probability targets take the streaming kernel (their extra row sums would need a second exchange).
    """
    inv_den = tl.cast(inv_den, tl.float32)  # floats may arrive as float64
    piece, group, start, cm, c64 = program_piece(SPLITS, PIECE, C, BLOCK_N)
    if VEC_WIN > 0:
        in_piece = tl.arange(0, BLOCK_N) < PIECE
        # -inf where masked: the identity of max, and exp(-inf - m) = 0 is the identity of the sum.
        # The edge lanes (the row's first piece) are loaded a row ahead, in registers, off the row's critical path.
        ec_n, em_n, xe_n = edge_load(X, tl.cast(group, tl.int64), M, INNER, sxo, sxi, C, piece, -float("inf"), VEC_WIN)
        for row in tl.range(group, M, GROUPS, num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            # row r's piece and edge lanes (those loaded an iteration ago); the next row's edge lanes in flight
            off, d, body, x, ec, em, xe, ec_n, em_n, xe_n = vec_step(
                X, r, GROUPS, M, INNER, sxo, sxi, C, start, piece, in_piece, c64, ec_n, em_n, xe_n, -float("inf"),
                BLOCK_N, VEC_WIN)
            t = tl.load(T + r).to(tl.int64)
            if PHASE != 1:
                m_p, s_p = max_sum2(x.to(tl.float32), xe)
                publish(SLOTS + r * SPLITS + piece, pack_pair(m_p, s_p), r < M)
            if PHASE != 0:
                lse, coef, tt = _ce_persist_row(
                    X, W, LOSS, DX, DEN, RS, SLOTS, x, t, r, piece, start, body, c64, C, INNER, sxo, sxi, sxc,
                    sdo, sdi, sdc, ignore_index, inv_den, SPLITS, PIECE, BLOCK_N, HAS_WEIGHT, DEN_ON_DEVICE,
                    HAS_ROW_SCALE, VEC_WIN, d)
                dxe = tl.exp2((xe - lse) * 1.4426950408889634) * coef - tl.where(ec == tt, coef, 0.0)
                tl.store(DX + ((r // INNER) * sdo + (r % INNER) * sdi) + ec, dxe.to(DX.dtype.element_ty), mask=em)
        return
    for row in tl.range(group, M, GROUPS, num_stages=STAGES):
        r = tl.cast(row, tl.int64)
        # -inf where masked: the identity of max, and exp(-inf - m) = 0 is the identity of the sum.
        x = tl.load(piece_ptrs(X, r, INNER, sxo, sxi, sxc, c64), mask=cm, other=-float("inf"))
        t = tl.load(T + r).to(tl.int64)
        if PHASE != 1:
            publish_max_sum(x.to(tl.float32), SLOTS + r * SPLITS + piece, r < M)
        if PHASE != 0:
            _ce_persist_row(X, W, LOSS, DX, DEN, RS, SLOTS, x, t, r, piece, start, cm, c64, C, INNER, sxo, sxi, sxc,
                            sdo, sdi, sdc, ignore_index, inv_den, SPLITS, PIECE, BLOCK_N, HAS_WEIGHT, DEN_ON_DEVICE,
                            HAS_ROW_SCALE, 0, 0)


@triton.jit(do_not_specialize=["N"])
def _ce_scale_kernel(
    G,  # flat contiguous gradient [N] (scaled in place)
    GO,  # the scalar grad_output (any float dtype)
    N,  # number of elements
    BLOCK: tl.constexpr,
):
    """G *= grad_output, in place; every program returns at once when grad_output == 1 (no traffic)."""
    go = tl.load(GO).to(tl.float32)
    if go != 1.0:
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, BLOCK)
        for start in range(pid * BLOCK, N, nprog * BLOCK):
            o = start + offs.to(tl.int64)
            g = tl.load(G + o, mask=o < N, other=0.0).to(tl.float32)
            tl.store(G + o, (g * go).to(G.dtype.element_ty), mask=o < N)


# ==================================================================================================
# PyTorch references
# ==================================================================================================
def cross_entropy_reference(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                            softcap=None):
    """``F.cross_entropy`` in float32 (float64 stays float64), result in the dtype torch would give; with
    ``softcap``, of ``softcap * tanh(input / softcap)``."""
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    out_dtype = _out_dtype(input)
    w = None if weight is None else weight.to(acc)
    tgt = target.to(acc) if target.is_floating_point() else target
    x = input.to(acc)
    if softcap:
        x = torch.tanh(x / softcap) * softcap
    loss = torch.nn.functional.cross_entropy(x, tgt, weight=w, ignore_index=ignore_index,
                                             reduction=reduction, label_smoothing=label_smoothing)
    return loss.to(out_dtype)


def cross_entropy_rows_reference(x, target, weight=None, ignore_index=-100, label_smoothing=0.0):
    """What ``_ce_fwd_kernel`` computes, in PyTorch: per-row loss and the gradient of their sum.

    ``x`` is (M, C) (float64 in the tests), ``target`` (M,) class indices or (M, C) probabilities.
    Returns (loss (M,), dx (M, C)) from the A/B form of the module docstring.
    """
    M, C = x.shape
    e = label_smoothing
    w = torch.ones(C, dtype=x.dtype, device=x.device) if weight is None else weight.to(x.dtype)
    lse = torch.logsumexp(x, 1)
    p = torch.exp(x - lse[:, None])
    if target.is_floating_point():
        B = w[None, :] * (target.to(x.dtype) * (1 - e) + e / C)
        ign = torch.zeros(M, dtype=torch.bool, device=x.device)
    else:
        ign = target == ignore_index
        t = torch.where(ign, 0, target)
        B = (e / C) * w[None, :].expand(M, C).clone()
        B[torch.arange(M), t] += (1 - e) * w[t]
        B[ign] = 0
    A = B.sum(1)
    if e == 0 and not target.is_floating_point():
        loss = A * (lse - x[torch.arange(M), t])  # avoids 0 * -inf on the other classes
    else:
        loss = A * lse - (B * x).sum(1)
    loss = torch.where(ign, 0.0, loss)
    return loss, A[:, None] * p - B


# ==================================================================================================
# Launchers
# ==================================================================================================
def _out_dtype(x: torch.Tensor) -> torch.dtype:
    """Loss dtype: the input's, or float32 under autocast (torch autocasts cross_entropy to float32)."""
    try:
        if x.dtype != torch.float64 and torch.is_autocast_enabled(x.device.type):
            return torch.float32
    except (TypeError, RuntimeError):  # torch < 2.4 or a device without autocast
        pass
    return x.dtype


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{_OP}: argument 'reduction' is {reduction!r}; allowed: 'none', 'mean', 'sum'")


def validate(input, target, weight, ignore_index, reduction, label_smoothing) -> bool:
    """Check the arguments like torch does (same exception types); returns True for probability targets."""
    input = check_tensor(_OP, "input", input)
    target = check_tensor(_OP, "target", target)
    _check_reduction(reduction)
    if not input.is_floating_point():
        raise RuntimeError(f"{_OP}: argument 'input' must be a floating tensor, got {input.dtype}")
    if input.dim() == 0:
        raise IndexError(f"{_OP}: argument 'input' must have at least 1 dimension (the classes), got a 0-d tensor")
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= float(label_smoothing) <= 1.0:
        raise RuntimeError(f"{_OP}: argument 'label_smoothing' must be between 0.0 and 1.0. Got: {label_smoothing}")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"{_OP}: argument 'ignore_index' must be an int, got {type(ignore_index).__name__}")
    C = input.shape[1] if input.dim() >= 2 else input.shape[0]
    if weight is not None:
        check_tensor(_OP, "weight", weight)
        if weight.dim() != 1 or weight.numel() != C:
            raise RuntimeError(f"{_OP}: argument 'weight' should be defined either for all {C} classes or no classes "
                               f"but got weight tensor of shape: {list(weight.shape)}")
        if weight.dtype != input.dtype:
            raise RuntimeError(f"{_OP}: argument 'weight' has dtype {weight.dtype}; it must match the input's "
                               f"{input.dtype}")
    devs = {t.device for t in (input, target, weight) if t is not None}
    if len(devs) > 1:
        raise ValueError(f"{_OP}: 'input', 'target' and 'weight' must be on one device, got {sorted(map(str, devs))}")
    if target.is_floating_point():
        if target.shape != input.shape:
            raise RuntimeError(f"{_OP}: argument 'target' holds class probabilities (floating) so it must have the "
                               f"input's shape {list(input.shape)}, got {list(target.shape)}")
        return True
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"{_OP}: argument 'target' must be class indices of dtype int64 (Long) or uint8 (Byte), "
                           f"or class probabilities of a floating dtype; got {target.dtype}")
    exp = (input.shape[:1] + input.shape[2:]) if input.dim() >= 2 else torch.Size([])
    if target.shape != exp:
        if input.dim() >= 2 and target.dim() >= 1 and target.shape[0] != input.shape[0]:
            raise ValueError(f"{_OP}: Expected input batch_size ({input.shape[0]}) to match target batch_size "
                             f"({target.shape[0]}).")
        raise RuntimeError(f"{_OP}: argument 'target' has shape {list(target.shape)}; expected {list(exp)} for an "
                           f"input of shape {list(input.shape)}")
    return False


class _Plan:
    """Everything a launch needs that depends only on the plan key (shapes, strides, dtype, flags):
    the bound kernels (``_library.Kernel``) and their integer arguments."""

    __slots__ = ("copy_x", "copy_t", "ints", "M", "C", "splits", "piece", "kernel", "den_kernel", "persist",
                 "groups", "fallback", "tma")


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096  # a workload with ever-changing shapes re-plans instead of growing without bound


def _plan(shape, xstride, tstride, dtype: torch.dtype, soft: bool, has_weight: bool, smooth: bool,
          ignore_index: int, den_on_device: bool, has_row_scale: bool, has_grad: bool,
          persist_ok: bool = False, softcap: bool = False, gstride=None) -> _Plan:
    """Launch plan for an input of ``shape`` (ndim >= 2, classes on dim 1); cached per key.  The gradient is
    contiguous, or has the strides ``gstride`` (a given buffer: the fused linear cross-entropy's padded logits).

    Every integer a kernel receives (sizes, strides, ``ignore_index``, pieces) is a function of the key:
    the bound kernels' compiled binaries are specialized on them (``_library.Kernel``).

    Routes: rows up to ``MAX_SINGLE`` (padded) columns take the single-block kernel.  Wider 16-bit rows with a
    gradient and class-index targets without smoothing, in eager calls (``persist_ok``), take the persistent
    kernel (bound at the first call: its grid comes from the compiled binary's occupancy) -- in its VEC8 form where
    they are not 16-element aligned and the gradient shares their window, and behind the TMA kernel (``tma``) where
    that one's ring holds them; misaligned rows without a shared window stream.  Everything else streams
    (soft-capped logits included: only ``_ce_fwd_kernel`` caps them).
    """
    key = (shape, xstride, tstride, dtype, soft, has_weight, smooth, ignore_index, den_on_device, has_row_scale,
           has_grad, persist_ok, softcap, gstride, override_epoch())
    try:
        plan = _PLANS.get(key)
    except TypeError:  # symbolic sizes (tracing with dynamic shapes): plan for their values
        return _plan(concrete(shape), concrete(xstride), None if tstride is None else concrete(tstride), dtype, soft,
                     has_weight, smooth, ignore_index, den_on_device, has_row_scale, has_grad, persist_ok, softcap,
                     None if gstride is None else concrete(gstride))
    if plan is not None:
        return plan
    plan = _Plan()
    elem = dtype.itemsize
    v = row_strides(shape, xstride, 1)
    plan.copy_x = v is None
    outer, inner, sxo, sxi, sxc = v if v is not None else contiguous_strides(shape, 1)
    if soft:
        vt = row_strides(shape, tstride, 1)
        plan.copy_t = vt is None
        st = (vt if vt is not None else contiguous_strides(shape, 1))[2:]
    else:
        plan.copy_t = False
        st = (0, 0, 0)
    vg = contiguous_strides(shape, 1) if gstride is None else row_strides(shape, gstride, 1)
    if vg is None:
        raise ValueError(f"{_OP}: gradient buffer strides {tuple(gstride)} do not describe rows of {tuple(shape)}")
    sd = vg[2:]
    C = shape[1]
    M = outer * inner
    plan.M, plan.C = M, C
    flags = dict(SOFT=soft, HAS_WEIGHT=has_weight, SMOOTH=smooth, DEN_ON_DEVICE=den_on_device,
                 HAS_ROW_SCALE=has_row_scale)
    plan.den_kernel = _den_kernel(has_weight) if den_on_device else None
    plan.splits = 0
    plan.persist = plan.groups = plan.fallback = None
    plan.tma = False
    if M == 0 or C == 0:
        plan.kernel, plan.ints = None, ()
    else:
        c_pow2 = next_power_of_2(C)
        single = c_pow2 <= get_override("cross_entropy", "max_single", cfg.MAX_SINGLE)
        misaligned = rows_misaligned(shape, (xstride,), 1, elem)
        win = vec8_window(shape, (xstride,), 1, elem)
        # (VEC8 windows are worked out against a contiguous gradient: a given misaligned buffer streams)
        persistent = (not single and elem == 2 and has_grad and persist_ok and not (soft or smooth or softcap)
                      and (not misaligned or (win > 0 and gstride is None)))
        if persistent:
            # Pieces of at most BLOCK_N columns, balanced, 64-aligned starts (VEC8: over the row's window, C + d);
            # the streaming plan is the fallback where not even one row group fits the GPU.
            p = cfg.persistent(elem, c_pow2)
            block = get_override("cross_entropy", "persist_block", p.block_n)
            splits, piece = balanced_pieces(C + win - 1 if win else C, block)
            plan.splits, plan.piece = splits, piece
            plan.ints = (M, C, inner, sxo, sxi, sxc) + tuple(sd) + (ignore_index,)  # the kernel's, no T strides
            plan.kernel = None
            plan.persist = dict(BLOCK_N=block, HAS_WEIGHT=has_weight, DEN_ON_DEVICE=den_on_device,
                                HAS_ROW_SCALE=has_row_scale, STAGES=p.stages, VEC_WIN=win, num_warps=p.num_warps,
                                per_sm=p.per_sm)
            # the TMA kernel where its ring holds the row (it checks the GPU and the alignment per call)
            plan.tma = (not misaligned and not has_row_scale and inner == 1 and cfg.tma_hold(C, elem) is not None)
            plan.fallback = _plan(shape, xstride, tstride, dtype, soft, has_weight, smooth, ignore_index,
                                  den_on_device, has_row_scale, has_grad, False, gstride=gstride)
        else:
            if single:
                sb = cfg.single_block(c_pow2)
                block_m, block_n, warps, stages = min(sb.block_m, next_power_of_2(M)), c_pow2, sb.num_warps, 1
            else:
                stream = cfg.STREAM[elem]
                block_m, warps, stages = 1, stream.num_warps, stream.stages
                block_n = get_override("cross_entropy", "block_n", stream.block_n)
            plan.ints = (M, C, inner, sxo, sxi, sxc) + tuple(st) + tuple(sd) + (ignore_index,)
            plan.kernel = Kernel(_ce_fwd_kernel, (triton.cdiv(M, block_m),), check=None, BLOCK_M=block_m,
                                 BLOCK_N=block_n, SINGLE=single, **flags, HAS_GRAD=has_grad, STAGES=stages,
                                 SOFTCAP=softcap, num_warps=warps)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _persist_kernels(plan: _Plan, pargs: tuple) -> tuple[Kernel, ...] | None:
    """The bound launches of a persistent plan (made at its first call, ``_rowsync.bind_persistent``: the
    grid is what the GPU holds at once, a cooperative launch), or None when no row group fits."""
    if plan.kernel is None:
        meta = dict(plan.persist)
        bound = bind_persistent(_ce_fwd_persist_kernel, pargs, plan.splits, plan.M, meta.pop("per_sm"), **meta)
        if bound is None:
            return None
        plan.kernel, plan.groups = bound
    return plan.kernel


_DEN_KERNELS: dict[bool, Kernel] = {}
_SCALE_KERNELS: dict[int, Kernel] = {}


def _den_kernel(has_weight: bool) -> Kernel:
    """``_ce_den_kernel`` bound (one program; M, C and ignore_index are runtime integers of it, so it is
    not bound through a plan: ``do_not_specialize`` keeps its binary valid for any of them)."""
    k = _DEN_KERNELS.get(has_weight)
    if k is None:
        k = _DEN_KERNELS[has_weight] = Kernel(_ce_den_kernel, (1,), check=None, HAS_WEIGHT=has_weight, BLOCK=1024,
                                              num_warps=4)
    return k


def launch_den(t: torch.Tensor, weight: torch.Tensor | None, M: int, C: int, ignore_index: int) -> torch.Tensor:
    """float32 [2] on the device: [0] D of the weighted mean (sum over non-ignored in-range rows of w_t),
    [1] the number of out-of-range targets (``check_target_flag`` reads it without a sync)."""
    den = torch.empty(2, dtype=torch.float32, device=t.device)
    _den_kernel(weight is not None)(t, weight if weight is not None else t, den, M, C, ignore_index)
    return den


def _sum_kernel() -> Kernel:
    k = _SUM_KERNELS.get(0)
    if k is None:
        k = _SUM_KERNELS[0] = Kernel(_ce_sum_kernel, (1,), check=None, BLOCK=1024, num_warps=4)
    return k


_SUM_KERNELS: dict[int, Kernel] = {}


# Out-of-range targets on CUDA: flags copied to pinned memory without a sync, checked at the next call.
_PENDING: list[tuple] = []


def _raise_target_error(C: int) -> None:
    raise IndexError(f"{_OP}: argument 'target' has a class index out of range: not ignore_index and not in "
                     f"[0, {C - 1}] (Target is out of bounds.)")


def check_cross_entropy_errors(wait: bool = True) -> None:
    """Raise ``IndexError`` if an earlier CUDA call of the fused cross-entropy saw an out-of-range target.

    With ``wait=False`` only the flags whose copy has already landed are checked (no sync).
    """
    keep = []
    for event, host, C in _PENDING:
        if wait:
            event.synchronize()
        elif not event.query():
            keep.append((event, host, C))
            continue
        if int(host[0]):
            _PENDING.clear()
            _raise_target_error(C)
    _PENDING[:] = keep


def check_target_flag(den: torch.Tensor, C: int) -> None:
    """The out-of-range check on ``launch_den``'s count ``den[1]``: at once on the CPU, deferred on CUDA.

    Eager only.

    Skipped while tracing (``torch.compile``: Dynamo, or Inductor tracing into the ``triton_op``, where
    the tensors are FakeTensor / FunctionalTensor): no host read, pinned copy or event can be traced.
    There an out-of-range target shows as a NaN loss (the kernel writes NaN for that row).
    """
    if type(den) is not torch.Tensor or is_compiling():
        return
    err = den[1:2]
    if err.device.type != "cuda":
        if float(err[0]):
            _raise_target_error(C)
        return
    if torch.cuda.is_current_stream_capturing():
        return  # a captured graph cannot copy to a host buffer it does not own; the loss shows NaN
    check_cross_entropy_errors(wait=False)
    host = torch.empty(1, dtype=torch.float32, pin_memory=True)
    host.copy_(err, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    _PENDING.append((event, host, C))


def check_softcap(op: str, softcap) -> float:
    """``softcap`` as a float, 0.0 for None; a clear error for anything but a positive finite number."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"{op}: argument 'softcap' must be a positive float or None, got {type(softcap).__name__}")
    if not (0.0 < float(softcap) < float("inf")):
        raise ValueError(f"{op}: argument 'softcap' must be a positive finite float or None, got {softcap}")
    return float(softcap)


def _loss_shape(input: torch.Tensor) -> torch.Size:
    return input.shape[:1] + input.shape[2:] if input.dim() >= 2 else torch.Size([])


def cross_entropy_forward(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    compute_grad: bool = True,
    grad_out: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    den: torch.Tensor | None = None,
    loss_out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    softcap: float | None = None,
):
    """Launch the fused cross-entropy on validated arguments.

    Returns ``(loss, grad)``: ``loss`` reduced as asked (``out_dtype``, default the input's or float32
    under autocast), ``grad`` the gradient of ``loss`` w.r.t. ``input`` for an upstream gradient of 1
    (contiguous, input's dtype), or ``None`` when ``compute_grad`` is False.

    Advanced (the fused linear cross-entropy): ``grad_out`` is written instead of a new gradient buffer, in its
    own row layout (it may be ``input`` itself, a view with padded rows: the logits are overwritten by their
    gradient); ``row_scale`` (M,) multiplies each row's gradient; ``den`` is ``launch_den``'s result for all the
    rows, computed and checked (``check_target_flag``) by the caller; ``loss_out`` (M,) float32 receives the
    per-row losses (then ``loss`` is None); ``softcap`` > 0 computes the loss of ``softcap * tanh(input /
    softcap)`` and the gradient w.r.t. ``input``.

    Launches: ``_ce_den_kernel`` (class indices, unless ``den`` is given), the main kernel, and for
    'mean' / 'sum' ``_ce_sum_kernel``; nothing is zero-filled.

    Traceable (the body of the ``triton_op``): launches go through bound ``Kernel`` objects, no host
    read happens on the traced path (``check_target_flag`` skips itself there).
    """
    soft = target.is_floating_point()
    if input.dim() == 1:  # (C,) with a 0-d target: one row
        input = input.unsqueeze(0)
        target = target.unsqueeze(0)
        squeeze = True
    else:
        squeeze = False
    out_dtype = out_dtype or _out_dtype(input)
    shape = input.shape
    dev = input.device
    if compute_grad and grad_out is None:
        grad = torch.empty(shape, dtype=input.dtype, device=dev)
    else:
        grad = grad_out
    mean_hard = reduction == "mean" and not soft
    # The persistent kernel runs in eager (real tensors) only: under torch.compile the traced launch
    # (fake tensors) takes the streaming kernel, which Inductor emits in its own code.
    persist_ok = type(input) in (torch.Tensor, torch.nn.Parameter) and (INTERPRET or input.is_cuda)
    cap = float(softcap) if softcap else 0.0
    gstride = None if grad is None or grad.is_contiguous() else grad.stride()
    plan = _plan(shape, input.stride(), target.stride() if soft else None, input.dtype, soft, weight is not None,
                 label_smoothing > 0, ignore_index, mean_hard, row_scale is not None, grad is not None, persist_ok,
                 cap > 0, gstride)
    M, C = plan.M, plan.C
    if plan.kernel is None and plan.persist is None:  # M == 0 or C == 0
        if grad is not None:
            grad.zero_()
        if loss_out is not None:
            return None, grad
        if reduction == "none":
            return torch.empty(_loss_shape(input) if not squeeze else (), dtype=out_dtype, device=dev), grad
        val = float("nan") if reduction == "mean" else 0.0
        return torch.full((), val, dtype=out_dtype, device=dev), grad
    if plan.copy_x:
        input = input.contiguous()  # a layout the (outer, inner) form cannot express: one copy
    if soft:
        t = target.contiguous() if plan.copy_t else target
    else:
        # The kernels read class indices at T + row: a flat contiguous view.  reshape(-1) alone keeps a
        # strided 1-D view (target[::2]) as it is, so force the copy (M integers) for strided targets.
        t = target.reshape(-1).contiguous()
    if not soft and den is None:
        den = launch_den(t, weight, M, C, ignore_index)
        check_target_flag(den, C)
    inv_den = 1.0 / M if (reduction == "mean" and soft) else 1.0
    if loss_out is not None:
        loss_rows = loss_out
    elif reduction == "none":  # written by the kernel in the loss dtype, in the loss's shape
        loss_rows = torch.empty(_loss_shape(input) if not squeeze else (), dtype=out_dtype, device=dev)
    else:
        loss_rows = torch.empty(M, dtype=torch.float32, device=dev)
    # Pointers the flags leave unread: the (read-only) input does; constexpr-False branches never
    # dereference them, and no mutated buffer is passed twice (what torch.compile's analysis of the
    # kernel's writes sees).
    args = (input, t, weight if weight is not None else input, loss_rows, grad if grad is not None else input,
            den if mean_hard else input, row_scale if row_scale is not None else input)
    tma_done = (plan.tma and input.is_cuda and grad is not None and grad_out is None and loss_out is None
                and reduction != "none"
                and _tma_launch(input, t, weight, ignore_index, den, mean_hard, loss_rows, grad))
    if tma_done:
        pass  # (loss rows and gradient written)
    elif plan.persist is not None:
        slots = torch.zeros(M * plan.splits, dtype=torch.int64, device=dev)
        pargs = (*args, slots, *plan.ints, inv_den, plan.splits, plan.piece)
        kernels = _persist_kernels(plan, pargs)
        if kernels is None:  # not even one row group fits on this GPU: stream
            plan.fallback.kernel(*args, *plan.fallback.ints, float(label_smoothing), inv_den, 1.0)
        else:
            for k in kernels:  # one launch on the GPU; phases 0 and 1 under the interpreter
                k(*pargs, plan.groups)
    else:
        plan.kernel(*args, *plan.ints, float(label_smoothing), inv_den, cap if cap > 0 else 1.0)
    if loss_out is not None:
        return None, grad
    if reduction == "none":
        loss = loss_rows
    else:
        loss = torch.empty((), dtype=out_dtype, device=dev)
        _sum_kernel()(loss_rows, loss, M)
    if squeeze and grad is not None and grad_out is None:
        grad = grad.squeeze(0)
    return loss, grad


def _tma_launch(x, t, weight, ignore_index, den, mean, loss_rows, grad) -> bool:
    """The TMA kernel (ops/cross_entropy_gluon.py) on 2-D logits; False where it declines them (the caller runs
    the persistent kernel)."""
    from . import cross_entropy_gluon  # (imported on first use: Gluon's import is not free)

    if x.dim() != 2 or t.dtype != torch.int64:
        return False
    return cross_entropy_gluon.ce_launch(x, t, weight, ignore_index, den, mean, loss_rows, grad,
                                         cfg.TMA_HOLD[x.element_size()])


def scale_grad_(grad: torch.Tensor, grad_output: torch.Tensor, reduction: str) -> torch.Tensor:
    """grad *= grad_output in place (grad_output broadcast over the class dim for reduction='none').

    Eager only: the scalar case reads grad_output on the device and returns at once when it is 1 (the
    usual ``loss.backward()``), so forward + backward stays one read and one write of the logits.
    """
    if reduction == "none":
        go = grad_output.unsqueeze(1) if grad.dim() >= 2 else grad_output
        return grad.mul_(go.to(grad.dtype))
    n = grad.numel()
    if n == 0:
        return grad
    k = _SCALE_KERNELS.get(n)
    if k is None:
        if len(_SCALE_KERNELS) >= _MAX_PLANS:
            _SCALE_KERNELS.clear()
        block = 4096
        k = _SCALE_KERNELS[n] = Kernel(_ce_scale_kernel, (max(1, min(triton.cdiv(n, block), 1024)),), check=None,
                                       BLOCK=block, num_warps=8)
    k(grad, grad_output, n)
    return grad


# ==================================================================================================
# Registration (ops/_library.py): custom ops for torch.compile, autograd, the eager direct path
# ==================================================================================================
def _ce_fwd(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
            reduction: str, label_smoothing: float, compute_grad: bool, out_dtype: torch.dtype,
            softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward as an op: (loss, gradient of the loss for an upstream gradient of 1; empty without)."""
    loss, grad = cross_entropy_forward(input, target, weight, ignore_index, reduction, label_smoothing,
                                       compute_grad, out_dtype=out_dtype, softcap=softcap)
    return loss, (grad if grad is not None else input.new_empty(0))


def _ce_bwd(grad: torch.Tensor, grad_loss: torch.Tensor, reduction: str) -> torch.Tensor:
    """The backward as an op (functional): grad * grad_loss, a new tensor (broadcast over the classes
    for reduction='none').  Under torch.compile Inductor emits it as one pointwise kernel (a read and a
    write of the gradient that the eager path skips when grad_loss is 1)."""
    if reduction == "none" and grad.dim() >= 2:
        grad_loss = grad_loss.unsqueeze(1)
    return grad * grad_loss.to(grad.dtype)


def _ce_bwd_eager(grad: torch.Tensor, grad_loss: torch.Tensor, reduction: str) -> torch.Tensor:
    """Eager backward: the gradient computed in the forward, scaled in place (no traffic when 1)."""
    return scale_grad_(grad, grad_loss, reduction)


def _setup_context(ctx, inputs, outputs):
    ctx.reduction = inputs[4]
    ctx.used = False
    ctx.save_for_backward(outputs[1])


def _grads(ctx, backward, grad_loss):
    (grad,) = ctx.saved_tensors
    if backward is _ce_bwd_eager:
        if ctx.used:
            raise RuntimeError(f"{_OP}: backward ran twice through the same graph; the gradient computed in the "
                               "forward is scaled in place, so retain_graph=True double backward is not supported")
        ctx.used = True
    return backward(grad, grad_loss, ctx.reduction), None, None, None, None, None, None, None, None


cross_entropy_op = FusedOp("cross_entropy", _ce_fwd, _ce_bwd, _setup_context, _grads, eager_backward=_ce_bwd_eager)


def fused_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    softcap: float | None = None,
) -> torch.Tensor:
    """``F.cross_entropy`` with one fused Triton kernel (loss and gradient in one pass over the logits).

    Same signature and semantics as ``torch.nn.functional.cross_entropy`` (class indices or class
    probabilities, ``weight``, ``ignore_index``, ``reduction``, ``label_smoothing``); bf16/fp16/fp32 logits
    are read in their own dtype with float32 math. float64 inputs, probability targets that require a
    gradient, and devices where Triton cannot run use PyTorch (``F.cross_entropy``).

    ``softcap`` (a positive float, or None): the loss of the soft-capped logits ``softcap * tanh(input / softcap)``
    (Gemma 2's ``final_logit_softcapping``), capped in float32 inside the kernel, with the gradient w.r.t. ``input``:
    no capped copy of the logits is kept.
    """
    if size_average is not None or reduce is not None:
        from torch.nn.modules.loss import _Reduction

        reduction = _Reduction.legacy_get_string(size_average, reduce)
    soft = validate(input, target, weight, ignore_index, reduction, label_smoothing)
    cap = check_softcap(_OP, softcap)
    if (input.dtype == torch.float64 or (soft and target.requires_grad) or use_fallback(_OP, input, target, weight)
            or (is_compiling() and compile_config.COMPILED.cross_entropy == "inductor")):  # (see compile_config)
        if cap:
            input = torch.tanh(input / cap) * cap
        return torch.nn.functional.cross_entropy(input, target, weight=weight, ignore_index=ignore_index,
                                                 reduction=reduction, label_smoothing=label_smoothing)
    out_dtype = _out_dtype(input)
    need_grad = input.requires_grad and torch.is_grad_enabled()
    return cross_entropy_op(input, target, weight, ignore_index, reduction, float(label_smoothing), need_grad,
                            out_dtype, cap, needs_grad=need_grad)
