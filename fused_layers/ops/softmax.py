r"""Softmax along any dim: Triton forward and backward, for any width.

Forward.  For a row x of width N,

    y_j = exp(x_j - m) / s,   m = max_j x_j,   s = sum_j exp(x_j - m).

*Single block* (the row fits in registers): a program loads a tile of BLOCK_M rows x BLOCK_N columns
once, reduces max and sum in float32 and writes y: the fewest bytes (read x, write y).

*Streaming (online softmax)* for wide rows, with no width cap.  Each row is cut into SPLITS pieces, one
program per (row, piece), so that even a few very wide rows fill the GPU.  Pass 1 streams its piece in
chunks of BLOCK_N, keeping per-lane running statistics (m_i, s_i): for a new chunk value x,

    m' = max(m, x),    s' = s * exp(m - m') + exp(x - m'),

(with m' = -inf handled so that -inf - -inf never produces NaN for a row that later turns finite), then
combines the lanes into the piece's (m_p, s_p) and stores them.  Pass 2 (a second kernel) combines the
SPLITS pieces of its row, M = max_p m_p, S = sum_p s_p * exp(m_p - M), and writes y = exp(x - M) / S
for its own piece.  It reads x twice: 3 passes over memory instead of 2.

Backward.  From the saved output y and the incoming gradient dy:

    dx_j = y_j * (dy_j - sum_k y_k dy_k).

Single block: one pass (read y and dy, write dx).  Streaming: pass 1 computes partial dots per piece,
pass 2 sums them and writes dx.

Special values follow ``torch.softmax``: a row of all -inf gives NaN (0/0), a +inf or a NaN anywhere in
a row makes the whole row NaN, huge finite logits are exact thanks to the max subtraction.

Layout.  Rows are addressed as (outer, inner) pairs: for ``dim`` d of a tensor of shape
(A..., N, C...), ``outer`` runs over A... and ``inner`` over C...; element (o, i, n) of x lives at
``o * sxo + i * sxi + n * sxn``.  This covers the last dim, any other dim of a contiguous tensor and
most strided views with no copy; other layouts are copied to contiguous first (``_row_view``).
Outputs are allocated contiguous in the input's shape, like ``torch.softmax``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    check_float_dtype,
    check_tensor,
    config_override,  # noqa: F401  (re-exported for tests: config_override("softmax", ...))
    get_override,
    is_compiling,
    next_power_of_2,
    normalize_dim,
    use_fallback,
)

_OP = "fused_softmax"


# ==================================================================================================
# Forward kernels
# ==================================================================================================
@triton.jit
def _softmax_fwd_kernel(
    X,  # pointer to the input; element (o, i, n) at X + o*sxo + i*sxi + n*sxn
    Y,  # pointer to the output, same logical shape as X
    M,  # number of rows = OUTER * INNER
    N,  # row width (the softmax dim)
    INNER,  # size of the inner (trailing) row index
    sxo, sxi, sxn,  # strides of X for (outer, inner, column)
    syo, syi, syn,  # strides of Y for (outer, inner, column)
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N: the whole row in one tile
):
    """Single-block softmax: each program normalizes BLOCK_M full rows held in registers."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    # Row -> (outer, inner); 64-bit offsets so tensors beyond 2^31 elements address correctly.
    r64 = rows.to(tl.int64)
    o = r64 // INNER
    i = r64 % INNER
    mask = row_ok[:, None] & (cols[None, :] < N)
    x_ptrs = X + (o * sxo + i * sxi)[:, None] + cols[None, :] * sxn
    # -inf is the identity of max; exp(-inf - m) = 0 is then the identity of the sum.
    x = tl.load(x_ptrs, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=1)
    e = tl.exp2((x - m[:, None]) * 1.4426950408889634)
    s = tl.sum(e, axis=1)
    y = e * (1.0 / s)[:, None]
    y_ptrs = Y + (o * syo + i * syi)[:, None] + cols[None, :] * syn
    tl.store(y_ptrs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_stats_kernel(
    X,  # pointer to the input (see _softmax_fwd_kernel)
    STATS,  # float32 [M, SPLITS, 2]: per-piece (max, sum of exp(x - max)), contiguous
    N, INNER,
    sxo, sxi, sxn,
    SPLITS,  # pieces per row
    PIECE,  # columns per piece (a multiple of BLOCK_N)
    BLOCK_N: tl.constexpr,  # chunk streamed per loop iteration
):
    """Streaming pass 1: online (max, sum) over one piece of one row."""
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    base = X + (row // INNER) * sxo + (row % INNER) * sxi
    cols = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_N], -float("inf"), tl.float32)  # per-lane running max
    s_i = tl.zeros([BLOCK_N], tl.float32)  # per-lane running sum of exp(x - m_i)
    start = piece * PIECE
    end = tl.minimum(start + PIECE, N)
    for off in range(start, end, BLOCK_N):
        c = off + cols
        x = tl.load(base + c.to(tl.int64) * sxn, mask=c < end, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m_i, x)
        # While a lane has seen only -inf, subtract 0 instead of -inf (avoids -inf - -inf = NaN).
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        s_i = s_i * tl.exp2((m_i - m_safe) * 1.4426950408889634) + tl.exp2((x - m_safe) * 1.4426950408889634)
        m_i = m_new
    # Combine the lanes into the piece's statistics.
    m_p = tl.max(m_i, axis=0)
    m_p_safe = tl.where(m_p == -float("inf"), 0.0, m_p)
    s_p = tl.sum(s_i * tl.exp2((m_i - m_p_safe) * 1.4426950408889634), axis=0)
    out = STATS + (row * SPLITS + piece) * 2
    tl.store(out, m_p)
    tl.store(out + 1, s_p)


@triton.jit
def _softmax_fwd_apply_kernel(
    X,  # pointer to the input (see _softmax_fwd_kernel)
    Y,  # pointer to the output
    STATS,  # float32 [M, SPLITS, 2] from _softmax_fwd_stats_kernel
    N, INNER,
    sxo, sxi, sxn,
    syo, syi, syn,
    SPLITS, PIECE,
    SPLITS_P2: tl.constexpr,  # next power of two >= SPLITS
    BLOCK_N: tl.constexpr,
):
    """Streaming pass 2: combine the row's pieces, then write y = exp(x - M) / S for one piece."""
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    p = tl.arange(0, SPLITS_P2)
    st = STATS + row * SPLITS * 2 + p * 2
    m_p = tl.load(st, mask=p < SPLITS, other=-float("inf"))
    s_p = tl.load(st + 1, mask=p < SPLITS, other=0.0)
    m = tl.max(m_p, axis=0)
    # A row of all -inf keeps m = -inf: exp(-inf - -inf) = NaN below, as torch.softmax gives.
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    s = tl.sum(s_p * tl.exp2((m_p - m_safe) * 1.4426950408889634), axis=0)
    inv_s = 1.0 / s
    xb = X + (row // INNER) * sxo + (row % INNER) * sxi
    yb = Y + (row // INNER) * syo + (row % INNER) * syi
    cols = tl.arange(0, BLOCK_N)
    start = piece * PIECE
    end = tl.minimum(start + PIECE, N)
    for off in range(start, end, BLOCK_N):
        c = off + cols
        cm = c < end
        c64 = c.to(tl.int64)
        x = tl.load(xb + c64 * sxn, mask=cm, other=-float("inf")).to(tl.float32)
        y = tl.exp2((x - m) * 1.4426950408889634) * inv_s
        tl.store(yb + c64 * syn, y.to(Y.dtype.element_ty), mask=cm)


# ==================================================================================================
# Backward kernels: dx = y * (dy - sum(y * dy))
# ==================================================================================================
@triton.jit
def _softmax_bwd_kernel(
    Y,  # pointer to the saved output, contiguous [M, N] in (outer, inner, col) form: strides syo, syi, syn
    DY,  # pointer to the incoming gradient, strides sdo, sdi, sdn
    DX,  # pointer to the input gradient (written), strides sgo, sgi, sgn
    M, N, INNER,
    syo, syi, syn,
    sdo, sdi, sdn,
    sgo, sgi, sgn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Single-block backward: one pass per row (read y and dy, write dx)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    r64 = rows.to(tl.int64)
    o = r64 // INNER
    i = r64 % INNER
    mask = (rows < M)[:, None] & (cols[None, :] < N)
    # 0 is the identity of the sum that follows.
    y = tl.load(Y + (o * syo + i * syi)[:, None] + cols[None, :] * syn, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + (o * sdo + i * sdi)[:, None] + cols[None, :] * sdn, mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    dx = y * (dy - dot[:, None])
    tl.store(DX + (o * sgo + i * sgi)[:, None] + cols[None, :] * sgn, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_dot_kernel(
    Y, DY,  # saved output and incoming gradient (strides below)
    DOT,  # float32 [M, SPLITS]: partial sum(y * dy) per piece
    N, INNER,
    syo, syi, syn,
    sdo, sdi, sdn,
    SPLITS, PIECE,
    BLOCK_N: tl.constexpr,
):
    """Streaming backward pass 1: partial dot products sum(y * dy) per (row, piece)."""
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    yb = Y + (row // INNER) * syo + (row % INNER) * syi
    db = DY + (row // INNER) * sdo + (row % INNER) * sdi
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    start = piece * PIECE
    end = tl.minimum(start + PIECE, N)
    for off in range(start, end, BLOCK_N):
        c = off + cols
        cm = c < end
        c64 = c.to(tl.int64)
        y = tl.load(yb + c64 * syn, mask=cm, other=0.0).to(tl.float32)
        dy = tl.load(db + c64 * sdn, mask=cm, other=0.0).to(tl.float32)
        acc += y * dy
    tl.store(DOT + row * SPLITS + piece, tl.sum(acc, axis=0))


@triton.jit
def _softmax_bwd_apply_kernel(
    Y, DY, DX,  # saved output, incoming gradient, input gradient (written)
    DOT,  # float32 [M, SPLITS] from _softmax_bwd_dot_kernel
    N, INNER,
    syo, syi, syn,
    sdo, sdi, sdn,
    sgo, sgi, sgn,
    SPLITS, PIECE,
    SPLITS_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Streaming backward pass 2: dx = y * (dy - dot) for one piece."""
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    p = tl.arange(0, SPLITS_P2)
    dot = tl.sum(tl.load(DOT + row * SPLITS + p, mask=p < SPLITS, other=0.0), axis=0)
    o = row // INNER
    i = row % INNER
    yb = Y + o * syo + i * syi
    db = DY + o * sdo + i * sdi
    gb = DX + o * sgo + i * sgi
    cols = tl.arange(0, BLOCK_N)
    start = piece * PIECE
    end = tl.minimum(start + PIECE, N)
    for off in range(start, end, BLOCK_N):
        c = off + cols
        cm = c < end
        c64 = c.to(tl.int64)
        y = tl.load(yb + c64 * syn, mask=cm, other=0.0).to(tl.float32)
        dy = tl.load(db + c64 * sdn, mask=cm, other=0.0).to(tl.float32)
        tl.store(gb + c64 * sgn, (y * (dy - dot)).to(DX.dtype.element_ty), mask=cm)


# ==================================================================================================
# PyTorch reference (tests, CPU fallback, the callback's ledger)
# ==================================================================================================
def softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax computed by PyTorch in float32 (float64 stays float64), returned in x's dtype."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.softmax(x.to(acc), dim=dim).to(x.dtype)


def softmax_backward_reference(y: torch.Tensor, dy: torch.Tensor, dim: int = -1) -> torch.Tensor:
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    y32, dy32 = y.to(acc), dy.to(acc)
    return (y32 * (dy32 - (y32 * dy32).sum(dim, keepdim=True))).to(y.dtype)


# ==================================================================================================
# Launchers
# ==================================================================================================
# One table: configs per width bucket (next power of two of N) and element size. A bucket never
# re-tunes for a new row count, so the first call on a new bucket costs one compile (about 0.5-2 s
# per kernel on the GPU, cached on disk by Triton afterwards) and nothing after that.
#
# single-block widths: (elements per program tile, num_warps) by bucket; beyond MAX_SINGLE_BLOCK the
# streaming kernels take over with chunks of STREAM_BLOCK.
MAX_SINGLE_BLOCK = {2: 32768, 4: 16384}  # by element size (bytes): fp16/bf16, fp32
STREAM_BLOCK = 4096
STREAM_WARPS = 8


def _single_block_config(n_pow2: int, elem: int) -> tuple[int, int]:
    """(BLOCK_M rows per program, num_warps) for a single-block tile of width n_pow2."""
    tile = 4096 if elem == 4 else 8192  # elements per program for narrow rows
    block_m = max(1, tile // n_pow2)
    if n_pow2 <= 1024:
        warps = 4
    elif n_pow2 <= 4096:
        warps = 8
    elif n_pow2 <= 8192:
        warps = 16
    else:
        warps = 32 if n_pow2 * elem >= 65536 else 16
    return get_override("softmax", "block_m", block_m), get_override("softmax", "num_warps", warps)


def _stream_config(m: int, n: int) -> tuple[int, int, int, int]:
    """(BLOCK_N chunk, SPLITS pieces per row, PIECE columns per piece, num_warps) for streaming."""
    block = get_override("softmax", "stream_block", STREAM_BLOCK)
    chunks = triton.cdiv(n, block)
    # Enough programs to fill the GPU several times over (132 SMs on an H200), pieces >= 4 chunks.
    want = max(1, min(triton.cdiv(4 * 132, max(m, 1)), chunks // 4 if chunks >= 4 else 1))
    want = get_override("softmax", "splits", want)
    piece = triton.cdiv(chunks, want) * block
    splits = triton.cdiv(n, piece)
    return block, splits, piece, get_override("softmax", "stream_warps", STREAM_WARPS)


def _row_view(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple[int, int, int, int, int, int]]:
    """(t or a contiguous copy, (OUTER, INNER, N, s_outer, s_inner, s_col)) for rows along ``dim``.

    Dims before ``dim`` must merge into one stride and dims after it into another; otherwise a
    contiguous copy is made (only for layouts such as a 3-D permute that mixes both sides).
    """
    for attempt in (t, None):
        if attempt is None:
            t = t.contiguous()
        shape, stride = t.shape, t.stride()
        groups = []
        for lo, hi in ((0, dim), (dim + 1, t.dim())):
            size, st, ok = 1, 0, True
            for k in range(hi - 1, lo - 1, -1):  # merge from the innermost dim outwards
                if shape[k] == 1:
                    continue
                if size == 1:
                    st = stride[k]
                elif stride[k] != st * size:
                    ok = False
                    break
                size *= shape[k]
            if not ok:
                break
            groups.append((size, st))
        else:
            (outer, so), (inner, si) = groups
            n = shape[dim] if t.dim() else 1
            sn = stride[dim] if t.dim() else 1
            return t, (outer, inner, n, so, si if inner > 1 else 0, sn)
    raise AssertionError("unreachable: a contiguous tensor always has a row view")


def _contig_strides(outer: int, inner: int, n: int) -> tuple[int, int, int]:
    """(s_outer, s_inner, s_col) of a contiguous tensor viewed as (outer, n, inner)."""
    return n * inner, 1, inner


def _validate(x: object, dim: int) -> tuple[torch.Tensor, int]:
    x = check_tensor(_OP, "input", x)
    check_float_dtype(_OP, "input", x, allow_float64=True)
    return x, normalize_dim(_OP, dim, x.dim())


def softmax_forward(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Launch the softmax forward of ``x`` along ``dim`` (already normalized); returns a contiguous y."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    xv, (outer, inner, n, sxo, sxi, sxn) = _row_view(x, dim)
    syo, syi, syn = _contig_strides(outer, inner, n)
    m = outer * inner
    elem = x.element_size()
    n_pow2 = next_power_of_2(n)
    if n_pow2 <= get_override("softmax", "max_single_block", MAX_SINGLE_BLOCK[elem]):
        block_m, warps = _single_block_config(n_pow2, elem)
        grid = (triton.cdiv(m, block_m),)
        _softmax_fwd_kernel[grid](
            xv, y, m, n, inner, sxo, sxi, sxn, syo, syi, syn, BLOCK_M=block_m, BLOCK_N=n_pow2, num_warps=warps
        )
        return y
    block, splits, piece, warps = _stream_config(m, n)
    stats = torch.empty((m, splits, 2), dtype=torch.float32, device=x.device)
    grid = (m, splits)
    _softmax_fwd_stats_kernel[grid](
        xv, stats, n, inner, sxo, sxi, sxn, splits, piece, BLOCK_N=block, num_warps=warps
    )
    _softmax_fwd_apply_kernel[grid](
        xv, y, stats, n, inner, sxo, sxi, sxn, syo, syi, syn, splits, piece,
        SPLITS_P2=next_power_of_2(splits), BLOCK_N=block, num_warps=warps,
    )
    return y


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    """Launch the softmax backward: dx = y * (dy - sum(y * dy)) along ``dim``; returns a contiguous dx."""
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if y.numel() == 0:
        return dx
    if dy.dtype != y.dtype:
        dy = dy.to(y.dtype)
    yv, (outer, inner, n, syo, syi, syn) = _row_view(y, dim)
    dyv, (_, _, _, sdo, sdi, sdn) = _row_view(dy, dim)
    sgo, sgi, sgn = _contig_strides(outer, inner, n)
    m = outer * inner
    elem = y.element_size()
    n_pow2 = next_power_of_2(n)
    if n_pow2 <= get_override("softmax", "max_single_block", MAX_SINGLE_BLOCK[elem]):
        block_m, warps = _single_block_config(n_pow2, elem)
        grid = (triton.cdiv(m, block_m),)
        _softmax_bwd_kernel[grid](
            yv, dyv, dx, m, n, inner, syo, syi, syn, sdo, sdi, sdn, sgo, sgi, sgn,
            BLOCK_M=block_m, BLOCK_N=n_pow2, num_warps=warps,
        )
        return dx
    block, splits, piece, warps = _stream_config(m, n)
    dot = torch.empty((m, splits), dtype=torch.float32, device=y.device)
    grid = (m, splits)
    _softmax_bwd_dot_kernel[grid](
        yv, dyv, dot, n, inner, syo, syi, syn, sdo, sdi, sdn, splits, piece, BLOCK_N=block, num_warps=warps
    )
    _softmax_bwd_apply_kernel[grid](
        yv, dyv, dx, dot, n, inner, syo, syi, syn, sdo, sdi, sdn, sgo, sgi, sgn, splits, piece,
        SPLITS_P2=next_power_of_2(splits), BLOCK_N=block, num_warps=warps,
    )
    return dx


# ==================================================================================================
# Registration: custom ops (torch.compile) and the eager direct path
# ==================================================================================================
@torch.library.custom_op("fused_layers::softmax_fwd", mutates_args=())
def _softmax_fwd_op(x: torch.Tensor, dim: int) -> torch.Tensor:
    return softmax_forward(x, dim)


@_softmax_fwd_op.register_fake
def _(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("fused_layers::softmax_bwd", mutates_args=())
def _softmax_bwd_op(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    return softmax_backward(y, dy, dim)


@_softmax_bwd_op.register_fake
def _(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _setup_context(ctx, inputs, output):
    ctx.dim = inputs[1]
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _softmax_bwd_op(y, dy, ctx.dim), None


_softmax_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _SoftmaxFunction(torch.autograd.Function):
    """Eager direct path: the same launchers without the custom-op dispatcher's per-call cost."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        y = softmax_forward(x, dim)
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        return softmax_backward(y, dy, ctx.dim), None


def fused_softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``input`` along ``dim`` with Triton forward and backward kernels.

    Same semantics as ``torch.softmax(input, dim)`` for float16, bfloat16 and float32 inputs (float32
    accumulation, output in the input's dtype, contiguous). float64 inputs, and devices where Triton
    cannot run, use the PyTorch reference.
    """
    x, d = _validate(input, dim)
    if x.dtype == torch.float64 or use_fallback("fused_softmax", x):
        return torch.softmax(x, d)
    if is_compiling():
        return _softmax_fwd_op(x, d)
    if x.requires_grad and torch.is_grad_enabled():
        return _SoftmaxFunction.apply(x, d)
    return softmax_forward(x, d)

