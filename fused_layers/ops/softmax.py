r"""Softmax along any dim: Triton forward and backward, for any width.

Forward.  For a row x of width N,

    y_j = exp(x_j - m) / s,   m = max_j x_j,   s = sum_j exp(x_j - m).

Backward, from the saved output y and the incoming gradient dy,

    dx_j = y_j * (dy_j - sum_k y_k dy_k).

Both need a statistic of the whole row before any element can be written: (m, s) in the forward, the dot
sum(y * dy) in the backward.  The kernels differ in where the row lives while that statistic is formed.

*Single block* (rows up to ``MAX_SINGLE_BLOCK`` columns, padded): a program loads a tile of BLOCK_M rows x BLOCK_N
columns once into registers, reduces in float32 and writes: the fewest bytes (read x, write y; read y and dy,
write dx).  The eager bf16 forward of the 16K bucket holds the row PACKED in bf16 (half the registers) under a
register cap, so that three programs share an SM.

*Wide rows, eager calls: persistent* (ops/_rowsync.py).  A row is cut into SPLITS pieces of at most BLOCK_N
columns, each held in registers by its own program; the programs of a row are co-resident (one cooperative launch
sized from the compiled kernel's occupancy), publish their piece's partials as one 64-bit word ((m_p, s_p), or the
partial dot) and combine the row's words themselves, with

    M = max_p m_p,   S = sum_p s_p exp(m_p - M),

so every element is read once at any width.  Two forms:

* register form (fp32, but for the forward's 128K bucket): pipelined one row deep, rows k - 1, k, k + 1 in
  registers: publish row k, load row k + 1, wait for row k - 1 and write it;
* SMEM-pipelined form (16-bit, and that bucket; ``STAGES`` > 1): one row in registers, the next rows' loads in
  flight by cp.async (the wait is a called function, so Triton pipelines the row loop); the 16-bit backward past
  ``HOLD_MIN_N`` HOLDs row k - 1 in registers and writes it after publishing row k, so the wait leaves the critical
  path.

16-bit rows whose width or row stride is not a multiple of 16 elements cannot be loaded as 16-byte vectors
(ops/_rows.py); the persistent kernels take them in the VEC8 form (``VEC_WIN`` > 0: pieces on a window of whole
vectors, the ragged head and tail as separate lanes) where every tensor of the launch shares the window, and the
forward takes the piece-wise kernels below where they do not.

*Wide rows, traced calls: piece-wise, one launch* (what Inductor emits under torch.compile).  Each piece's
statistics come from streaming it in chunks of BLOCK_N with running values: for a new chunk c,

    m' = max(m, max(c)),    s' = s * exp(m - m') + sum(exp(c - m'))

(with m' = -inf read as 0 in the exponents, so -inf - -inf never appears): one exp per element.  Program g
publishes the statistics of piece g (a release atomic on a per-row counter), then waits (acquire) until every
piece of the row of piece g - SPLITS is published and writes that piece.  Those pieces belong to programs < g only,
which the GPU dispatches first (the forward-progress assumption of decoupled look-back scans), so the wait cannot
deadlock; and piece g - SPLITS was read a moment ago, so its second read comes from L2.  The backward does the same
with partial dots.

Special values follow ``torch.softmax``: a row of all -inf gives NaN (0/0), a +inf or a NaN anywhere in a row makes
the whole row NaN, huge finite logits are exact thanks to the max subtraction.

Layout.  Rows are (outer, inner) pairs (ops/_rows.py): element (o, i, n) of x lives at ``o * sxo + i * sxi +
n * sxn``, which covers the last dim, any other dim of a contiguous tensor and most strided views with no copy;
other layouts are copied to contiguous first.  Outputs are allocated contiguous in the input's shape, like
``torch.softmax``.  Launch configurations: ops/softmax_config.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _cpp, compile_config
from . import softmax_config as cfg
from ._common import (
    bits_to_f32,
    check_float_dtype,
    check_tensor,
    concrete,
    config_override,  # noqa: F401  (re-exported for tests: config_override("softmax", ...))
    get_override,
    is_compiling,
    next_power_of_2,
    normalize_dim,
    override_epoch,
    use_fallback,
)
from ._library import _PLAIN, FusedOp, Kernel
from ._rows import contiguous_strides, row_strides, rows_misaligned, vec8_window
from ._rowsync import (
    balanced_pieces,
    bind_persistent,
    edge_load,
    exp_scaled,
    load_piece,
    max_sum2,
    pack_flagged,
    pack_pair,
    piece_ptrs,
    program_piece,
    publish,
    publish_max_sum,
    unpack_pair,
    vec_load,
    vec_step,
    vec_woff,
    wait_row,
    wait_row_max_sum,
    wait_row_max_sum_call,
    wait_row_sum_call,
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
    PACKED: tl.constexpr,  # 16-bit x: hold the row in its own dtype, converted again at each pass
):
    """Single-block softmax: each program normalizes BLOCK_M full rows held in registers.

    PACKED (16-bit inputs): the row stays in registers as loaded, two values a register, and each pass converts
    what it reads (max in x's dtype, exact; sum and output in float32), so a thread holds half the registers of
    the float32 row: with ptxas's register cap, bf16 16K takes three 16-warp programs an SM instead of two
    (softmax_config.PACKED).  The output is exp2((x - m) log2 e - log2 s), the same float32 math as e / s up to
    exp2 / log2 rounding."""
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
    if PACKED:
        xs = tl.load(x_ptrs, mask=mask, other=-float("inf"))  # held in x's 16-bit dtype
        m = tl.reduce(xs, 1, _max16).to(tl.float32)  # max is exact in x's dtype: no float32 copy of the row
        s = tl.sum(tl.exp2((xs.to(tl.float32) - m[:, None]) * 1.4426950408889634), axis=1)
        ls = tl.log2(s)
        # a second conversion, written differently so that the compiler does not keep the first one alive
        xf = bits_to_f32(xs)
        y = tl.exp2((xf - m[:, None]) * 1.4426950408889634 - ls[:, None])
    else:
        x = tl.load(x_ptrs, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=1)
        e = tl.exp2((x - m[:, None]) * 1.4426950408889634)
        s = tl.sum(e, axis=1)
        y = e * (1.0 / s)[:, None]
    y_ptrs = Y + (o * syo + i * syi)[:, None] + cols[None, :] * syn
    tl.store(y_ptrs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _max16(a, b):
    """max of two 16-bit floats in their own dtype (exact).  A NaN may or may not win here; either way the row's
    sum of exponentials is NaN, so the whole row is, as in torch.softmax."""
    return tl.where(a.to(tl.float32) > b.to(tl.float32), a, b)  # (compared in float32: the interpreter)


@triton.jit
def _softmax_fwd_wide_kernel(
    X,  # pointer to the input (see _softmax_fwd_kernel)
    Y,  # pointer to the output
    STATS,  # float32 [M * SPLITS, 2]: per-piece (max, sum of exp(x - max))
    COUNT,  # int32 [M], zeroed: pieces of each row whose statistics are published
    M, N, INNER,
    sxo, sxi, sxn,
    syo, syi, syn,
    SPLITS,  # pieces per row
    PIECE,  # columns per piece (a multiple of BLOCK_N)
    SPLITS_P2: tl.constexpr,  # next power of two >= SPLITS
    BLOCK_N: tl.constexpr,  # chunk streamed per loop iteration
):
    """Wide rows in one launch: program g computes the statistics of piece g, then writes piece g - SPLITS.

    The pieces of the row of piece g - SPLITS all belong to programs < g, so a program only ever waits
    for earlier programs (which the GPU dispatches first, and the interpreter runs first): no deadlock.
    Piece g - SPLITS was read moments ago by a resident program, so its second read hits L2.
    """
    g = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    # ---- phase 1: online (max, sum) over piece g -------------------------------------------------
    if g < M * SPLITS:
        row = (g // SPLITS).to(tl.int64)
        start = (g % SPLITS) * PIECE
        end = tl.minimum(start + PIECE, N)
        base = X + (row // INNER) * sxo + (row % INNER) * sxi
        m_p = -float("inf")  # running max of the piece
        s_p = 0.0  # running sum of exp(x - m_p)
        for off in tl.range(start, end, BLOCK_N, num_stages=1):
            c = off + cols
            x = tl.load(base + c.to(tl.int64) * sxn, mask=c < end, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m_p, tl.max(x, axis=0))
            # While only -inf has been seen, subtract 0 instead (-inf - -inf would be NaN).
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            # One exp per element (plus one per chunk): the special-function unit is not the bottleneck.
            s_p = s_p * tl.exp2((m_p - m_safe) * 1.4426950408889634) + tl.sum(
                tl.exp2((x - m_safe) * 1.4426950408889634), axis=0
            )
            m_p = m_new
        tl.store(STATS + g * 2, m_p)
        tl.store(STATS + g * 2 + 1, s_p)
        tl.debug_barrier()  # the statistics are written before the count says so
        tl.atomic_add(COUNT + row, 1, sem="release")
    # ---- phase 2: y for piece h = g - SPLITS -----------------------------------------------------
    h = g - SPLITS
    if h >= 0:
        row = (h // SPLITS).to(tl.int64)
        cnt = tl.atomic_add(COUNT + row, 0, sem="acquire")
        while cnt < SPLITS:  # wait for the (earlier) programs of this row
            cnt = tl.atomic_add(COUNT + row, 0, sem="acquire")
        p = tl.arange(0, SPLITS_P2)
        st = STATS + (row * SPLITS + p) * 2
        m_p = tl.load(st, mask=p < SPLITS, other=-float("inf"), volatile=True)
        s_p = tl.load(st + 1, mask=p < SPLITS, other=0.0, volatile=True)
        m = tl.max(m_p, axis=0)
        # A row of all -inf keeps m = -inf: exp(-inf - -inf) = NaN below, as torch.softmax gives.
        m_safe = tl.where(m == -float("inf"), 0.0, m)
        inv_s = 1.0 / tl.sum(s_p * tl.exp2((m_p - m_safe) * 1.4426950408889634), axis=0)
        start = (h % SPLITS) * PIECE
        end = tl.minimum(start + PIECE, N)
        xb = X + (row // INNER) * sxo + (row % INNER) * sxi
        yb = Y + (row // INNER) * syo + (row % INNER) * syi
        for off in tl.range(start, end, BLOCK_N, num_stages=1):
            c = off + cols
            cm = c < end
            c64 = c.to(tl.int64)
            x = tl.load(xb + c64 * sxn, mask=cm, other=-float("inf")).to(tl.float32)
            y = tl.exp2((x - m) * 1.4426950408889634) * inv_s
            tl.store(yb + c64 * syn, y.to(Y.dtype.element_ty), mask=cm)


@triton.jit(do_not_specialize=["GROUPS"])
def _softmax_fwd_persist_kernel(
    X, Y,  # input / output (see _softmax_fwd_kernel)
    M, N, INNER,
    sxo, sxi, sxn,
    syo, syi, syn,
    SPLITS,  # pieces per row: program g holds piece g % SPLITS of rows g // SPLITS, + GROUPS, + 2 GROUPS, ...
    PIECE,  # columns per piece (<= BLOCK_N; the last piece of a row may be shorter)
    SLOTS,  # int64 [M * SPLITS], zeroed: each piece's published (max, sum of exp(x - max)) (ops/_rowsync.py)
    GROUPS,  # row groups (the grid is GROUPS * SPLITS co-resident programs)
    SPLITS_P2: tl.constexpr,  # next power of two >= SPLITS
    BLOCK_N: tl.constexpr,  # power of two >= PIECE: a piece is one register tile
    PHASE: tl.constexpr,  # 2: one launch (GPU); 0 then 1: two launches (the interpreter)
    STAGES: tl.constexpr,  # 1: the register form; > 1: the SMEM-pipelined form
    VEC_WIN: tl.constexpr,  # > 0 (SMEM form only): the VEC8 form on a window of VEC_WIN elements (16-bit rows at
                            # any alignment, unit column stride; SPLITS * PIECE >= N + VEC_WIN - 1; Y's row offsets
                            # congruent to X's mod VEC_WIN)
):
    """Wide rows, one read, persistent (ops/_rowsync.py).

    Register form (STAGES 1), pipelined one row deep: iteration k publishes the (max, sum) of its piece of row k,
    issues the load of row k + 1's piece, then waits for row k - 1 (published by every sibling one iteration ago,
    so the wait rarely spins) and writes its y from the registers.  Three pieces in registers (rows k - 1, k,
    k + 1), kept in the input's dtype.

    SMEM-pipelined form (STAGES > 1): iteration k loads row k's piece, publishes, waits for row k and writes it;
    ``tl.range(num_stages=STAGES)`` has Triton issue the piece loads of rows k + 1 .. k + STAGES - 1 ahead by
    cp.async into shared memory, so the loads stay in flight while the program waits, without the registers of the
    rows held ahead.

    VEC8 (VEC_WIN > 0): the SMEM form with pieces on the row's window (``_rowsync.vec_step``), the head and tail
    columns as edge lanes loaded a row ahead.
    """
    piece, group, start, cm, c64 = program_piece(SPLITS, PIECE, N, BLOCK_N)
    if VEC_WIN > 0:
        in_piece = tl.arange(0, BLOCK_N) < PIECE
        # -inf where masked: the identity of max, and exp(-inf - m) = 0 is the identity of the sum.
        # The edge lanes (the row's first piece) are loaded a row ahead, in registers, off the row's critical path.
        ec_n, em_n, xe_n = edge_load(X, tl.cast(group, tl.int64), M, INNER, sxo, sxi, N, piece, -float("inf"), VEC_WIN)
        for row in tl.range(group, M, GROUPS, num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            # row r's piece and edge lanes (those loaded an iteration ago); the next row's edge lanes in flight
            off, d, body, x, ec, em, xe, ec_n, em_n, xe_n = vec_step(
                X, r, GROUPS, M, INNER, sxo, sxi, N, start, piece, in_piece, c64, ec_n, em_n, xe_n, -float("inf"),
                BLOCK_N, VEC_WIN)
            if PHASE != 1:
                m_p, s_p = max_sum2(x.to(tl.float32), xe)
                publish(SLOTS + r * SPLITS + piece, pack_pair(m_p, s_p), r < M)
            if PHASE != 0:
                # (a call, so that the loop stays pipelined; all -inf row: m = -inf, NaN below as torch)
                m, s = wait_row_max_sum_call(SLOTS + r * SPLITS, SPLITS)
                offy = (r // INNER) * syo + (r % INNER) * syi
                y = exp_scaled(x, m, 1.0 / s)
                tl.store(Y + vec_woff(offy, d, VEC_WIN) + c64, y.to(Y.dtype.element_ty), mask=body)
                ye = exp_scaled(xe, m, 1.0 / s)
                tl.store(Y + offy + ec, ye.to(Y.dtype.element_ty), mask=em)
        return
    if STAGES > 1:
        for row in tl.range(group, M, GROUPS, num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            # -inf where masked: the identity of max, and exp(-inf - m) = 0 is the identity of the sum.
            x = tl.load(piece_ptrs(X, r, INNER, sxo, sxi, sxn, c64), mask=cm, other=-float("inf"))
            if PHASE != 1:
                publish_max_sum(x.to(tl.float32), SLOTS + r * SPLITS + piece, r < M)
            if PHASE != 0:
                # (a call, so that the loop stays pipelined; all -inf row: m = -inf, NaN below as torch)
                m, s = wait_row_max_sum_call(SLOTS + r * SPLITS, SPLITS)
                y = exp_scaled(x, m, 1.0 / s)
                tl.store(piece_ptrs(Y, r, INNER, syo, syi, syn, c64), y.to(Y.dtype.element_ty), mask=cm)
        return
    r = tl.cast(group, tl.int64)
    # -inf where masked: the identity of max, and exp(-inf - m) = 0 is the identity of the sum.
    # Row k = 0 (peeled: nothing to write yet): publish, and load row 1.
    x_prev = load_piece(X, r, M, INNER, sxo, sxi, sxn, c64, cm, -float("inf"))
    if PHASE != 1:
        publish_max_sum(x_prev.to(tl.float32), SLOTS + r * SPLITS + piece, r < M)
    r = r + GROUPS
    x_cur = load_piece(X, r, M, INNER, sxo, sxi, sxn, c64, cm, -float("inf"))
    # Rows k = 1, 2, ...: one iteration past the last row, for its output.
    for row in tl.range(group + GROUPS, M + GROUPS, GROUPS, num_stages=1):
        r = tl.cast(row, tl.int64)
        if PHASE != 1:
            publish_max_sum(x_cur.to(tl.float32), SLOTS + r * SPLITS + piece, r < M)
        rn = r + GROUPS  # row k + 1's piece is in flight from here on
        x_next = load_piece(X, rn, M, INNER, sxo, sxi, sxn, c64, cm, -float("inf"))
        if PHASE != 0:  # the output of row k - 1
            rp = r - GROUPS
            # A row of all -inf keeps m = -inf: exp(-inf - -inf) = NaN below, as torch.softmax gives.
            m, s = wait_row_max_sum(SLOTS + rp * SPLITS, SPLITS, SPLITS_P2)
            y = exp_scaled(x_prev, m, 1.0 / s)
            tl.store(piece_ptrs(Y, rp, INNER, syo, syi, syn, c64), y.to(Y.dtype.element_ty), mask=cm)
        x_prev = x_cur
        x_cur = x_next


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
def _softmax_bwd_wide_kernel(
    Y, DY, DX,  # saved output, incoming gradient, input gradient (written); strides below
    DOT,  # float32 [M * SPLITS]: partial sum(y * dy) per piece
    COUNT,  # int32 [M], zeroed: pieces of each row whose partial dot is published
    M, N, INNER,
    syo, syi, syn,
    sdo, sdi, sdn,
    sgo, sgi, sgn,
    SPLITS, PIECE,
    SPLITS_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Wide-row backward in one launch, ordered like _softmax_fwd_wide_kernel: program g computes the
    partial dot of piece g, then writes dx = y * (dy - dot) for piece g - SPLITS."""
    g = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    if g < M * SPLITS:
        row = (g // SPLITS).to(tl.int64)
        start = (g % SPLITS) * PIECE
        end = tl.minimum(start + PIECE, N)
        yb = Y + (row // INNER) * syo + (row % INNER) * syi
        db = DY + (row // INNER) * sdo + (row % INNER) * sdi
        acc = tl.zeros([BLOCK_N], tl.float32)
        for off in tl.range(start, end, BLOCK_N, num_stages=1):
            c = off + cols
            cm = c < end
            c64 = c.to(tl.int64)
            y = tl.load(yb + c64 * syn, mask=cm, other=0.0).to(tl.float32)
            dy = tl.load(db + c64 * sdn, mask=cm, other=0.0).to(tl.float32)
            acc += y * dy
        tl.store(DOT + g, tl.sum(acc, axis=0))
        tl.debug_barrier()
        tl.atomic_add(COUNT + row, 1, sem="release")
    h = g - SPLITS
    if h >= 0:
        row = (h // SPLITS).to(tl.int64)
        cnt = tl.atomic_add(COUNT + row, 0, sem="acquire")
        while cnt < SPLITS:
            cnt = tl.atomic_add(COUNT + row, 0, sem="acquire")
        p = tl.arange(0, SPLITS_P2)
        dot = tl.sum(tl.load(DOT + row * SPLITS + p, mask=p < SPLITS, other=0.0, volatile=True), axis=0)
        start = (h % SPLITS) * PIECE
        end = tl.minimum(start + PIECE, N)
        yb = Y + (row // INNER) * syo + (row % INNER) * syi
        db = DY + (row // INNER) * sdo + (row % INNER) * sdi
        gb = DX + (row // INNER) * sgo + (row % INNER) * sgi
        for off in tl.range(start, end, BLOCK_N, num_stages=1):
            c = off + cols
            cm = c < end
            c64 = c.to(tl.int64)
            y = tl.load(yb + c64 * syn, mask=cm, other=0.0).to(tl.float32)
            dy = tl.load(db + c64 * sdn, mask=cm, other=0.0).to(tl.float32)
            tl.store(gb + c64 * sgn, (y * (dy - dot)).to(DX.dtype.element_ty), mask=cm)


@triton.jit(do_not_specialize=["GROUPS"])
def _softmax_bwd_persist_kernel(
    Y, DY, DX,  # saved output, incoming gradient, input gradient (written); strides below
    M, N, INNER,
    syo, syi, syn,
    sdo, sdi, sdn,
    sgo, sgi, sgn,
    SPLITS, PIECE,
    SLOTS,  # int64 [M * SPLITS], zeroed: each piece's published partial sum(y * dy)
    GROUPS,
    SPLITS_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PHASE: tl.constexpr,
    STAGES: tl.constexpr,  # 1: the register form; > 1: the SMEM-pipelined form (as _softmax_fwd_persist_kernel)
    HOLD: tl.constexpr,  # with STAGES > 1: write row k - 1 after publishing row k, from registers (below)
    VEC_WIN: tl.constexpr,  # > 0 (SMEM form only): the VEC8 form, as _softmax_fwd_persist_kernel (Y's, DY's and
                            # DX's row offsets congruent mod VEC_WIN)
):
    """Wide-row backward, one read of y and dy, in the forms of _softmax_fwd_persist_kernel: publish a row's partial
    dot, wait for the row's other pieces, write dx = y * (dy - dot).

    HOLD: iteration k publishes row k's partial dot, then waits for row k - 1 -- published by every sibling an
    iteration ago, so the wait rarely spins -- and writes row k - 1 from the pieces of y and dy it kept in registers
    (one more piece of registers, no second read).  One iteration runs past the last row (for its output); iteration
    0 waits for its own row and writes nothing."""
    piece, group, start, cm, c64 = program_piece(SPLITS, PIECE, N, BLOCK_N)
    if VEC_WIN > 0:
        in_piece = tl.arange(0, BLOCK_N) < PIECE
        # 0 where masked: the identity of the sum.  y's window phase d is dy's and dx's (the host checks).
        # The edge lanes (the row's first piece) are loaded a row ahead, in registers, off the row's critical path.
        rn = tl.cast(group, tl.int64)
        ec_n, em_n, ye_n = edge_load(Y, rn, M, INNER, syo, syi, N, piece, 0.0, VEC_WIN)
        dye_n = tl.load(DY + (rn // INNER) * sdo + (rn % INNER) * sdi + ec_n, mask=em_n, other=0.0)  # (y's columns)
        for row in tl.range(group, M, GROUPS, num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            off, d, body, y = vec_load(Y, r, INNER, syo, syi, N, start, in_piece, c64, 0.0, BLOCK_N, VEC_WIN)
            y = y.to(tl.float32)
            dy = tl.load(DY + vec_woff((r // INNER) * sdo + (r % INNER) * sdi, d, VEC_WIN) + c64, mask=body,
                         other=0.0).to(tl.float32)
            ec = ec_n  # row r's edge lanes, loaded an iteration ago
            em = em_n
            ye = ye_n.to(tl.float32)
            dye = dye_n.to(tl.float32)
            rn = r + GROUPS
            ec_n, em_n, ye_n = edge_load(Y, rn, M, INNER, syo, syi, N, piece, 0.0, VEC_WIN)
            dye_n = tl.load(DY + (rn // INNER) * sdo + (rn % INNER) * sdi + ec_n, mask=em_n, other=0.0)
            if PHASE != 1:
                publish(SLOTS + r * SPLITS + piece, pack_flagged(tl.sum(y * dy, axis=0) + tl.sum(ye * dye, axis=0)),
                        r < M)
            if PHASE != 0:
                dot = wait_row_sum_call(SLOTS + r * SPLITS, SPLITS)
                offg = (r // INNER) * sgo + (r % INNER) * sgi
                tl.store(DX + vec_woff(offg, d, VEC_WIN) + c64, (y * (dy - dot)).to(DX.dtype.element_ty), mask=body)
                tl.store(DX + offg + ec, (ye * (dye - dot)).to(DX.dtype.element_ty), mask=em)
        return
    if STAGES > 1 and HOLD:
        yh = tl.zeros([BLOCK_N], Y.dtype.element_ty)  # row k - 1's pieces (iteration 0: nothing written)
        dyh = tl.zeros([BLOCK_N], DY.dtype.element_ty)
        for row in tl.range(group, M + GROUPS, GROUPS, num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            # 0 where masked (and for the row past the end): the identity of the sum.
            y = load_piece(Y, r, M, INNER, syo, syi, syn, c64, cm, 0.0)
            dy = load_piece(DY, r, M, INNER, sdo, sdi, sdn, c64, cm, 0.0)
            if PHASE != 1:
                publish(SLOTS + r * SPLITS + piece, pack_flagged(tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=0)),
                        r < M)
            if PHASE != 0:
                rp = tl.maximum(r - GROUPS, tl.cast(group, tl.int64))  # row k - 1 (iteration 0: row k, unwritten)
                dot = wait_row_sum_call(SLOTS + rp * SPLITS, SPLITS)
                live = cm & (c64 * 0 + row > group)
                dx = yh.to(tl.float32) * (dyh.to(tl.float32) - dot)
                tl.store(piece_ptrs(DX, rp, INNER, sgo, sgi, sgn, c64), dx.to(DX.dtype.element_ty), mask=live)
            yh = y
            dyh = dy
        return
    if STAGES > 1:  # one row in registers, the next rows' loads in flight in shared memory
        for row in tl.range(group, M, GROUPS, num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            # 0 where masked: the identity of the sum.
            y = tl.load(piece_ptrs(Y, r, INNER, syo, syi, syn, c64), mask=cm, other=0.0).to(tl.float32)
            dy = tl.load(piece_ptrs(DY, r, INNER, sdo, sdi, sdn, c64), mask=cm, other=0.0).to(tl.float32)
            if PHASE != 1:
                publish(SLOTS + r * SPLITS + piece, pack_flagged(tl.sum(y * dy, axis=0)), r < M)
            if PHASE != 0:
                dot = wait_row_sum_call(SLOTS + r * SPLITS, SPLITS)
                tl.store(piece_ptrs(DX, r, INNER, sgo, sgi, sgn, c64), (y * (dy - dot)).to(DX.dtype.element_ty),
                         mask=cm)
        return
    r = tl.cast(group, tl.int64)
    # 0 where masked: the identity of the sum.
    y_prev = load_piece(Y, r, M, INNER, syo, syi, syn, c64, cm, 0.0)
    dy_prev = load_piece(DY, r, M, INNER, sdo, sdi, sdn, c64, cm, 0.0)
    if PHASE != 1:  # row 0, peeled
        publish(SLOTS + r * SPLITS + piece,
                pack_flagged(tl.sum(y_prev.to(tl.float32) * dy_prev.to(tl.float32), axis=0)), r < M)
    r = r + GROUPS
    y_cur = load_piece(Y, r, M, INNER, syo, syi, syn, c64, cm, 0.0)
    dy_cur = load_piece(DY, r, M, INNER, sdo, sdi, sdn, c64, cm, 0.0)
    for row in tl.range(group + GROUPS, M + GROUPS, GROUPS, num_stages=1):
        r = tl.cast(row, tl.int64)
        if PHASE != 1:  # (rows past the end publish nothing)
            publish(SLOTS + r * SPLITS + piece,
                    pack_flagged(tl.sum(y_cur.to(tl.float32) * dy_cur.to(tl.float32), axis=0)), r < M)
        rn = r + GROUPS
        y_next = load_piece(Y, rn, M, INNER, syo, syi, syn, c64, cm, 0.0)
        dy_next = load_piece(DY, rn, M, INNER, sdo, sdi, sdn, c64, cm, 0.0)
        if PHASE != 0:  # the output of row k - 1
            rp = r - GROUPS
            words, pm = wait_row(SLOTS + rp * SPLITS, SPLITS, SPLITS_P2)
            _flag, dots = unpack_pair(words)
            dot = tl.sum(tl.where(pm, dots, 0.0), axis=0)
            y = y_prev.to(tl.float32)
            dx = y * (dy_prev.to(tl.float32) - dot)
            tl.store(piece_ptrs(DX, rp, INNER, sgo, sgi, sgn, c64), dx.to(DX.dtype.element_ty), mask=cm)
        y_prev = y_cur
        dy_prev = dy_cur
        y_cur = y_next
        dy_cur = dy_next


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
# Launch plans
# ==================================================================================================
class _Plan:
    """Everything a launch needs that depends only on shapes, strides, dtype and dim (cached)."""

    __slots__ = ("copy", "wide", "kernel", "m", "splits", "ints", "cpp", "persist", "groups", "fallback", "packed")


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096  # a workload with ever-changing shapes re-plans instead of growing without bound


def _max_single_block(elem: int, direction: str, persistent: bool) -> int:
    """The widest row (padded) a single-block program takes: MAX_SINGLE_BLOCK, or less where wide rows go
    persistent (eager calls) and that beats the single block (softmax_config.EAGER_MAX_SINGLE_BLOCK)."""
    limit = get_override("softmax", "max_single_block", cfg.MAX_SINGLE_BLOCK)
    if persistent:
        limit = min(limit, get_override("softmax", "eager_max_single_block",
                                        cfg.EAGER_MAX_SINGLE_BLOCK.get((direction, elem), limit)))
    return limit


def _plan(shape: torch.Size, strides: tuple[tuple[int, ...], ...], dtype: torch.dtype, dim: int,
          persist_ok: bool = False) -> _Plan:
    """Launch plan for inputs with ``strides`` (x; or y and dy) and a contiguous output.

    Cached, with the bound kernel: the per-call host cost is a dict lookup and one direct launch.
    ``persist_ok``: real tensors (eager), where wide rows take the persistent kernels (their grid comes from the
    compiled binary's occupancy, at the first call); traced calls take the one-launch piece-wise kernels, which
    Inductor emits in its own code.  A row that is not wide has one plan whatever ``persist_ok`` says (cached under
    both keys): its bound kernels, and the C++ fast path's registration of them, are shared by every caller.
    """
    key = (shape, strides, dtype, dim, persist_ok, override_epoch())
    try:
        plan = _PLANS.get(key)
    except TypeError:  # symbolic sizes (tracing with dynamic shapes): plan for their values
        return _plan(concrete(shape), tuple(concrete(s) for s in strides), dtype, dim, persist_ok)
    if plan is not None:
        return plan
    elem = dtype.itemsize
    direction = "fwd" if len(strides) == 1 else "bwd"
    n = shape[dim] if len(shape) else 1
    n_pow2 = next_power_of_2(n)
    packed = cfg.PACKED.get(n_pow2) if direction == "fwd" and persist_ok and dtype == torch.bfloat16 else None
    # Eager 16-bit rows not 16-element aligned: the persistent kernels' VEC8 form where every tensor shares a window
    # (ops/_rows.py); the forward's other such rows take the piece-wise kernels, as traced calls do.
    win = vec8_window(shape, strides, dim, elem) if persist_ok else 0
    persistent = persist_ok and not (direction == "fwd" and not win and rows_misaligned(shape, strides, dim, elem))
    wide = n_pow2 > _max_single_block(elem, direction, persistent) and packed is None
    twin_key = key[:4] + (not persist_ok,) + key[5:]
    twin = _PLANS.get(twin_key)
    if twin is not None and not twin.wide and not wide and packed is None and not twin.packed:
        _PLANS[key] = twin
        return twin
    plan = _Plan()
    plan.cpp = {}  # (device, with backward) -> C++ fast-path handles, or False (ops/_cpp.py)
    plan.persist = plan.groups = plan.fallback = None
    views, plan.copy = [], []
    for st in strides:
        v = row_strides(shape, st, dim)
        plan.copy.append(v is None)
        views.append(v if v is not None else contiguous_strides(shape, dim))
    outer, inner, *_ = views[0]
    m = outer * inner
    out = contiguous_strides(shape, dim)[2:]
    ins = tuple(x for v in views for x in v[2:])
    plan.m = m
    plan.wide = wide
    plan.packed = packed is not None
    check = (0,) if direction == "fwd" else (0, 1)
    if not wide:
        sb = cfg.single_block(direction, elem, n_pow2)
        plan.ints = (m, n, inner) + ins + out
        plan.splits = 0
        if direction == "fwd":
            extra = dict(PACKED=packed is not None)
            if packed is not None:  # one row a program, its warps, ptxas's register cap (eager plans only)
                sb = cfg.SingleBlock(1, packed.num_warps)
                extra["maxnreg"] = packed.maxnreg
            plan.kernel = Kernel(_softmax_fwd_kernel, (triton.cdiv(m, sb.block_m),), check=check, BLOCK_M=sb.block_m,
                                 BLOCK_N=n_pow2, num_warps=sb.num_warps, **extra)
        else:
            plan.kernel = Kernel(_softmax_bwd_kernel, (triton.cdiv(m, sb.block_m),), check=check, BLOCK_M=sb.block_m,
                                 BLOCK_N=n_pow2, num_warps=sb.num_warps)
    elif persistent:  # pieces held in registers by co-resident programs: bound at the first call
        p = cfg.persistent(direction, elem, n_pow2)
        block = get_override("softmax", "persist_block", p.block_n)
        splits, piece = balanced_pieces(n + win - 1 if win else n, block)  # (VEC8: the row's window, n + d)
        plan.ints = (m, n, inner) + ins + out + (splits, piece)
        plan.splits = splits
        plan.kernel = None
        # (VEC8 exists in the SMEM form only: every 16-bit entry of the table is one)
        meta = dict(SPLITS_P2=next_power_of_2(splits), BLOCK_N=block, STAGES=max(p.stages, 2) if win else p.stages,
                    VEC_WIN=win, num_warps=p.num_warps)
        if direction == "bwd":
            hold_min = get_override("softmax", "hold_min_n", cfg.HOLD_MIN_N.get((direction, elem)))
            meta["HOLD"] = p.stages > 1 and not win and hold_min is not None and n >= hold_min
        plan.persist = (_softmax_fwd_persist_kernel if direction == "fwd" else _softmax_bwd_persist_kernel, p.per_sm,
                        meta)
        plan.fallback = _plan(shape, strides, dtype, dim, False)
    else:  # piece-wise, one launch
        pw = cfg.PIECEWISE[(direction, elem)]
        block = get_override("softmax", "wide_block", pw.block_n)
        piece = triton.cdiv(get_override("softmax", "wide_piece", pw.piece), block) * block
        piece = min(piece, triton.cdiv(n, block) * block)
        splits = triton.cdiv(n, piece)
        plan.ints = (m, n, inner) + ins + out + (splits, piece)
        plan.splits = splits
        fn = _softmax_fwd_wide_kernel if direction == "fwd" else _softmax_bwd_wide_kernel
        # grid + SPLITS: the last row's phase 2
        plan.kernel = Kernel(fn, (m * splits + splits,), check=check, SPLITS_P2=next_power_of_2(splits), BLOCK_N=block,
                             num_warps=pw.num_warps)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    if not plan.wide and not plan.packed and n_pow2 <= _max_single_block(elem, direction, not persist_ok):
        _PLANS[twin_key] = plan  # single block for either caller: one plan
    return plan


# ==================================================================================================
# Launchers
# ==================================================================================================
def _validate(x: object, dim: int) -> tuple[torch.Tensor, int]:
    x = check_tensor(_OP, "input", x)
    check_float_dtype(_OP, "input", x, allow_float64=True)
    return x, normalize_dim(_OP, dim, x.dim())


def _persist_launch(plan: _Plan, tensors: tuple) -> bool:
    """Launch a persistent plan (binding it at its first call, ``_rowsync.bind_persistent``); False when
    not even one row group fits on this GPU (the caller takes ``plan.fallback``)."""
    slots = torch.zeros(plan.m * plan.splits, dtype=torch.int64, device=tensors[0].device)
    args = (*tensors, *plan.ints, slots)
    if plan.kernel is None:
        fn, per_sm, meta = plan.persist
        bound = bind_persistent(fn, args, plan.splits, plan.m, per_sm, **meta)
        if bound is None:
            return False
        plan.kernel, plan.groups = bound
    for k in plan.kernel:  # one launch on the GPU; phases 0 and 1 under the interpreter
        k(*args, plan.groups)
    return True


def softmax_forward(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Launch the softmax forward of ``x`` along ``dim`` (already normalized); returns a contiguous y.

    Layouts that ``row_strides`` cannot express (e.g. a 4-D permute mixing both sides of ``dim``) are
    copied to contiguous first: one extra read and write of x.
    """
    return _forward(x, dim, type(x) in _PLAIN)


def _forward(x: torch.Tensor, dim: int, persist_ok: bool) -> torch.Tensor:
    """``softmax_forward`` on the route of an eager (``persist_ok``) or a traced call."""
    y = torch.empty_like(x) if x.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    plan = _plan(x.shape, (x.stride(),), x.dtype, dim, persist_ok)
    if plan.copy[0]:
        x = x.contiguous()
    if plan.persist is not None and _persist_launch(plan, (x, y)):
        return y
    if plan.persist is not None:
        plan = plan.fallback
    if plan.wide:
        stats = torch.empty(plan.m * plan.splits * 2, dtype=torch.float32, device=x.device)
        count = torch.zeros(plan.m, dtype=torch.int32, device=x.device)
        plan.kernel(x, y, stats, count, *plan.ints)
    else:
        plan.kernel(x, y, *plan.ints)
    return y


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    """Launch the softmax backward: dx = y * (dy - sum(y * dy)) along ``dim``; returns a contiguous dx."""
    return _backward(y, dy, dim, type(y) in _PLAIN and type(dy) in _PLAIN)


def _backward(y: torch.Tensor, dy: torch.Tensor, dim: int, persist_ok: bool) -> torch.Tensor:
    """``softmax_backward`` on the route of an eager (``persist_ok``) or a traced call."""
    dx = torch.empty_like(y) if y.is_contiguous() else torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if y.numel() == 0:
        return dx
    if dy.dtype != y.dtype:
        dy = dy.to(y.dtype)
    plan = _plan(y.shape, (y.stride(), dy.stride()), y.dtype, dim, persist_ok)
    if plan.copy[0]:
        y = y.contiguous()
    if plan.copy[1]:
        dy = dy.contiguous()
    if plan.persist is not None and _persist_launch(plan, (y, dy, dx)):
        return dx
    if plan.persist is not None:
        plan = plan.fallback
    if plan.wide:
        dot = torch.empty(plan.m * plan.splits, dtype=torch.float32, device=y.device)
        count = torch.zeros(plan.m, dtype=torch.int32, device=y.device)
        plan.kernel(y, dy, dx, dot, count, *plan.ints)
    else:
        plan.kernel(y, dy, dx, *plan.ints)
    return dx


# ==================================================================================================
# Registration (ops/_library.py): custom ops for torch.compile, autograd, the eager direct path
# ==================================================================================================
def _setup_context(ctx, inputs, outputs):
    ctx.dim = inputs[1]
    ctx.save_for_backward(outputs[0])


def _grads(ctx, backward, dy):
    (y,) = ctx.saved_tensors
    return backward(y, dy, ctx.dim), None


softmax_op = FusedOp("softmax", softmax_forward, softmax_backward, _setup_context, _grads)


def fused_softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``input`` along ``dim`` with Triton forward and backward kernels.

    Same semantics as ``torch.softmax(input, dim)`` for float16, bfloat16 and float32 inputs (float32
    accumulation, output in the input's dtype, contiguous). float64 inputs, and devices where Triton
    cannot run, use the PyTorch reference.
    """
    if _cpp.ENABLED and type(dim) is int:
        y = _cpp.fast_call("softmax_fast", input, dim)  # a registered shape: one C++ call
        if y is not None:
            return y
    x, d = _validate(input, dim)
    if x.dtype == torch.float64 or ((not x.is_cuda or type(x) not in _PLAIN) and use_fallback("fused_softmax", x)):
        return torch.softmax(x, d)
    if is_compiling() and compile_config.COMPILED.softmax == "inductor":  # Inductor writes it (compile_config)
        return torch.softmax(x, d)
    needs_grad = x.requires_grad and torch.is_grad_enabled()
    if _cpp.ENABLED and _cpp.eager_ok():
        y = _cpp_softmax(x, d, needs_grad)
        if y is not None:
            return y
    return softmax_op(x, d, needs_grad=needs_grad)


_SCALAR_TYPE = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}  # c10::ScalarType codes


def _cpp_softmax_register(plan: "_Plan", x: torch.Tensor, dim: int, grad: bool) -> list | bool | None:
    """Register the forward kernel (and with ``grad`` the backward's) with the C++ fast path: the launch
    handles, None while one is not compiled for these dtypes yet, False if unsupported."""
    specs = [(plan.kernel, (x.dtype, x.dtype), plan.ints, _cpp.roles(2, len(plan.ints)))]
    if grad:
        bplan = _plan(x.shape, (x.stride(), x.stride()), x.dtype, dim, type(x) in _PLAIN)  # y and a contiguous dy
        if bplan.wide or any(bplan.copy):
            return False
        specs.append((bplan.kernel, (x.dtype,) * 3, bplan.ints, _cpp.roles(3, len(bplan.ints))))
    handles = _cpp.register_all(x.get_device(), *specs)
    ext = _cpp.extension()
    if handles and dim == x.dim() - 1 and ext is not None:  # the last dim: softmax_fast takes this shape from now on
        n = x.shape[-1]
        ext.bind_softmax([x.numel() // n, n, _SCALAR_TYPE[x.dtype], -1, -1, x.get_device(), 2 if grad else 0],
                         handles[0], handles[1] if grad else -1)
    return handles


def _cpp_softmax(x: torch.Tensor, dim: int, grad: bool) -> torch.Tensor | None:
    """An eager call through the C++ fast path (ops/_cpp.py): with ``grad`` a C++ autograd node; None: the
    Python path runs (not compiled yet, wide rows, a layout or alignment the bound kernels do not take)."""
    if not x.is_cuda or not x.is_contiguous() or x.data_ptr() & 15 or x.numel() == 0:
        return None
    plan = _plan(x.shape, (x.stride(),), x.dtype, dim, type(x) in _PLAIN)  # (eager: wide rows as the Python path)
    if plan.wide or plan.copy[0]:
        return None
    handles = _cpp.plan_id(plan.cpp, (x.get_device(), grad), _cpp_softmax_register, plan, x, dim, grad)
    if handles is None:
        return None
    ext = _cpp.extension()
    return ext.softmax_apply(x, handles[0], handles[1]) if grad else ext.softmax_infer(x, handles[0])
