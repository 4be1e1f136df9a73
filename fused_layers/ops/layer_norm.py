r"""LayerNorm and RMSNorm over the last k dims: Triton forward and backward, for any width.

The input is viewed as M rows of width N = prod(normalized_shape).  One set of kernels serves both
norms; the constexpr ``IS_RMS`` removes the mean (and the bias) for RMSNorm.  Which kernel and what
shape a width gets is data: ops/layer_norm_config.py.

Forward.  For a row x of width N,

    LayerNorm:  mu = sum(x) / N,   var = sum((x - mu)^2) / N,   rstd = 1 / sqrt(var + eps)
                y = (x - mu) * rstd * w + b
    RMSNorm:    rstd = 1 / sqrt(sum(x^2) / N + eps),            y = x * rstd * w

mu and rstd are saved in float32 (mu only for LayerNorm).

*Single block* (the row fits in registers): a program loads a tile of BLOCK_M rows x BLOCK_N columns
once, computes mu, then the corrected two-pass term c = sum(x - mu) / N, which removes the rounding
error of the first sum when |mu| >> std, then var from the centred values held in registers (no
E[x^2] - E[x]^2 cancellation), and writes y: the fewest bytes (read x, write y).

*Wide rows* (``N`` above the single-block limit, no width cap): one program per row streams the row in
chunks of BLOCK_N twice.  Pass 1 keeps per-lane Welford statistics (count, mean, M2) of x - x_0 (shifted
by the row's first element, so that a large mean does not eat float32 precision); every chunk but
the last is full, so a live lane's count after chunk t is t + 1 and the update needs one scalar
reciprocal per chunk:

    d = x - mean_l,   mean_l += d / (t + 1),   M2_l += d * (x - mean_l)

The lanes are then merged with Chan's formula, mu = sum(c_l mean_l) / N,
var = (sum(M2_l) + sum(c_l (mean_l - mu)^2)) / N.  Pass 2 re-reads the chunk (mostly from L2) and
writes y.  RMSNorm needs no centring: pass 1 sums x^2.

Backward.  With xhat = (x - mu) * rstd (RMSNorm: x * rstd), g = w * dy (g = dy without weight):

    dx = rstd * (g - xhat * c1 - c2),   c1 = sum(g * xhat) / N,   c2 = sum(g) / N   (RMSNorm: c2 = 0)
    dw = sum over rows of dy * xhat,    db = sum over rows of dy

(derivation: y = xhat w + b and d xhat_j / d x_k = rstd (delta_jk - 1/N - xhat_j xhat_k / N); RMSNorm
drops the 1/N term because it has no mean).

*Single block*: G programs (a few per SM); program p owns a contiguous group of rows and walks it in
tiles of BLOCK_M rows.  Per tile it reads x and dy once, writes dx (one pass per row) and adds
dy * xhat and dy into float32 register accumulators; at the end it writes one partial row of dW and dB
into float32 [G, N] buffers.  A second kernel sums the G partial rows column by column in a fixed
order.  No atomics and no locks: the gradients are bitwise identical from run to run.  On sm_90 and
newer, eager calls launch both kernels as programmatic dependents: the reduce's launch overlaps the row
kernel's tail (``_use_pdl``).

*Wide rows, two passes*: the row no longer fits in registers together with the dW/dB accumulators, so a
row-sums kernel computes (c1, c2) per row first (reads x, dy), then each of the G programs loops over
column chunks outside and its rows inside, writing dx and accumulating dW/dB per chunk (reads x, dy
again): 5 N elements a row instead of 3 N.  Traced calls (torch.compile) and float32 take these.

*Wide rows, one read* (eager calls, bf16 / fp16, layer_norm_config.BWD_PERSIST): ``_norm_bwd_persist_kernel``
holds a row's pieces in co-resident programs (ops/_rowsync.py, the wide softmax's scheme).  Each
publishes its piece's partials of sum(g * xhat) and sum(g) as one flagged word, waits for the row's
words (a called wait, so the row loop is software-pipelined: the next rows' pieces load by cp.async
meanwhile), combines them in a fixed order and writes its piece of dx; dW / dB of its columns
accumulate over its row group's rows and are written once as that group's partial row (then the same
fixed-order reduce).  3 N elements per row, deterministic.  At 16K on sm_90 the Gluon row backward
(ops/layer_norm_gluon.py: a row in shared memory, one CTA an SM) takes the rows it supports instead.

Layout.  The normalized dims must form a unit-stride row and the leading dims must merge into one row
stride; that covers contiguous tensors and row-strided views (slices, transposes of leading dims) with
no copy.  Any other layout (e.g. a strided last dim) is copied to contiguous first (``_as_rows``).
Outputs are contiguous in the input's shape, like ``torch.nn.functional.layer_norm``.

Host cost.  At large sizes a kernel takes tens of microseconds, about what a Python call costs, so
the per-call path is short: cheap argument checks, one dict lookup for a cached launch plan (grid,
constexprs, num_warps, the integer arguments; keyed on shape, strides, dtype, k, which parameters
exist, the norm, the config-override epoch and, for the backward, the device), output allocation,
launch.  No buffer is zero-filled: every output element and every partial row is written.  Eager
calls of registered shapes go through the C++ fast path (ops/_cpp.py) instead.

Dtypes.  x in float32, float16 or bfloat16; weight and bias in x's dtype or float32 (mixed, as under
AMP).  y and dx take x's dtype, dw / db their parameter's dtype, as ``nn.LayerNorm`` gives.  Under
``torch.autocast`` the functions do what the installed torch's autocast does for ``layer_norm`` /
``rms_norm``: torch itself is asked once per (op, device type, autocast dtype) by running its own op on
a tiny tensor (``autocast_runs_in_float32``); float32 out means the inputs are cast to float32.  Seen:
layer_norm on CUDA runs in float32, rms_norm on CUDA keeps bfloat16 (torch 2.11, H200), CPU autocast
leaves both alone.  float64 runs the PyTorch reference.

Weight order.  ``CAST_BEFORE_W`` (a constexpr, off by default) rounds xhat to x's dtype *before* the
weight multiply, the order of Hugging Face's Llama-family RMSNorm (``weight * xhat.to(input_dtype)``),
with y in a dtype the caller picks (there: the promotion of x and the weight); dW then sums dy times
the rounded xhat, dx is unchanged (the rounding passes gradients through).  Its only user is
``ops/norm_variants.py`` (the third-party look-alikes).
"""

from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _cpp, compile_config
from . import layer_norm_config as cfg
from ._common import (
    INTERPRET,
    SUPPORTED_DTYPES,
    FusedShapeError,
    check_float_dtype,
    check_same_device,
    check_tensor,
    concrete,
    config_override,  # noqa: F401  (re-exported for tests: config_override("layer_norm", ...))
    is_compiling,
    next_power_of_2,
    override_epoch,
    use_fallback,
)
from ._library import _PLAIN, FusedOp, Kernel
from ._rowsync import (
    balanced_pieces,
    bind_persistent,
    pack_flagged,
    pack_sums,
    program_piece,
    publish,
    wait_row_pair_sums_call,
    wait_row_sum_call,
)

_LN = "fused_layer_norm"
_RMS = "fused_rms_norm"


# ==================================================================================================
# Forward kernels
# ==================================================================================================
@triton.jit
def _stats_ptrs(STATS, M, IS_RMS: tl.constexpr):
    """(MEAN, RSTD) inside the one float32 statistics buffer: means at [0, M), 1/std at [M, 2M); RMSNorm
    stores 1/std only, at [0, M).  One pointer per buffer, never two aliases: torch.compile clones each
    mutated kernel argument separately."""
    if IS_RMS:
        RSTD = STATS
    else:
        RSTD = STATS + M
    return STATS, RSTD


@triton.jit
def _parts_ptrs(PARTS, G, N, HAS_W: tl.constexpr):
    """(DWP, DBP) inside the one float32 partials buffer: G rows of dW partials, then G rows of dB."""
    if HAS_W:
        DBP = PARTS + G * N
    else:
        DBP = PARTS
    return PARTS, DBP


@triton.jit
def _add_pair(a0, a1, b0, b1):
    """Combine function of a reduction of two values at once (tl.reduce over a tuple)."""
    return a0 + b0, a1 + b1


@triton.jit
def _norm_fwd_kernel(
    X,  # pointer to the input, [M, N] with row stride sx and unit column stride
    Y,  # pointer to the output, [M, N] contiguous (row stride N)
    W,  # pointer to the weight [N] (unused unless HAS_W)
    B,  # pointer to the bias [N] (unused unless HAS_B)
    STATS,  # pointer to the float32 statistics: row means at [0, M) (unless IS_RMS), then row 1/std
    #         at [M, 2M) (RMSNorm: at [0, M)); written when STORE_STATS.  One pointer, never two aliases
    #         of one buffer: torch.compile clones each mutated argument separately.
    M,  # number of rows
    N,  # row width
    sx,  # row stride of X (elements)
    eps,  # added to the variance
    IS_RMS: tl.constexpr,  # RMSNorm: no mean, no bias
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    STORE_STATS: tl.constexpr,  # write mean / rstd (False: a forward without autograd)
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N: the whole row in one tile
    CAST_BEFORE_W: tl.constexpr = False,  # round xhat to X's dtype before the weight (HF Llama-family order)
):
    """Single-block forward: each program normalizes BLOCK_M full rows held in registers."""
    eps = tl.cast(eps, tl.float32)  # a float argument may arrive as fp64 (Inductor's launch)
    MEAN, RSTD = _stats_ptrs(STATS, M, IS_RMS)
    # The program's tile: BLOCK_M rows, every column (masked past N).
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    r64 = rows.to(tl.int64)  # 64-bit offsets: tensors beyond 2^31 elements address correctly
    # Load x once, in float32; 0 is the identity of the sums below.
    x = tl.load(X + (r64 * sx)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=1) / N
        # Padding must stay 0 after centring so that it adds nothing to the variance.
        xc = tl.where(mask, x - mean[:, None], 0.0)
        # Corrected two-pass: the rounding error of the first sum (large when |mean| >> std) is what
        # the centred values still sum to; remove it (registers only, no extra memory traffic).
        corr = tl.sum(xc, axis=1) / N
        xc = tl.where(mask, xc - corr[:, None], 0.0)
        mean = mean + corr
        if STORE_STATS:  # the backward needs them; an inference forward does not
            tl.store(MEAN + rows, mean, mask=row_ok)
    # The variance from the centred values in registers: no E[x^2] - E[x]^2 cancellation.
    var = tl.sum(xc * xc, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    if STORE_STATS:  # the backward needs them; an inference forward does not
        tl.store(RSTD + rows, rstd, mask=row_ok)
    # y = xhat * w + b, stored in Y's dtype.
    y = xc * rstd[:, None]
    if HAS_W:
        if CAST_BEFORE_W:
            y = y.to(X.dtype.element_ty).to(tl.float32)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_B:
        b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y + b[None, :]
    tl.store(Y + (r64 * N)[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_fwd_loop_kernel(
    X, Y, W, B, STATS,  # as in _norm_fwd_kernel
    M, N, sx, eps,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    STORE_STATS: tl.constexpr,  # write mean / rstd (False: a forward without autograd)
    BLOCK_N: tl.constexpr,  # chunk streamed per loop iteration
    CAST_BEFORE_W: tl.constexpr = False,  # as in _norm_fwd_kernel
    STAGES: tl.constexpr = 1,  # software pipelining of both chunk loops (tl.range num_stages)
):
    """Wide-row forward: one program per row; Welford pass over chunks, then a normalize pass."""
    eps = tl.cast(eps, tl.float32)  # a float argument may arrive as fp64 (Inductor's launch)
    MEAN, RSTD = _stats_ptrs(STATS, M, IS_RMS)
    row = tl.program_id(0).to(tl.int64)
    xb = X + row * sx
    yb = Y + row * N
    cols = tl.arange(0, BLOCK_N)
    # ---- pass 1: statistics ----
    if IS_RMS:
        acc = tl.zeros([BLOCK_N], tl.float32)  # per-lane sum of x^2
        for off in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            c = off + cols
            x = tl.load(xb + c, mask=c < N, other=0.0).to(tl.float32)
            acc += x * x
        var = tl.sum(acc, axis=0) / N
        shift = 0.0
        mean = 0.0
    else:
        # Shift by the row's first element so the running statistics see values of the row's spread,
        # not its magnitude (x - shift is exact for nearby values); mean below is relative to shift.
        shift = tl.load(xb).to(tl.float32)
        mean_l = tl.zeros([BLOCK_N], tl.float32)  # per-lane running mean
        m2_l = tl.zeros([BLOCK_N], tl.float32)  # per-lane sum of squared deviations
        cnt_l = tl.zeros([BLOCK_N], tl.float32)  # per-lane count
        t = 0
        for off in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            c = off + cols
            live = c < N
            x = tl.load(xb + c, mask=live, other=0.0).to(tl.float32) - shift
            # Only the last chunk is partial, so a live lane has seen exactly t + 1 values now.
            inv = 1.0 / (t + 1.0)
            d = tl.where(live, x - mean_l, 0.0)
            mean_l += d * inv
            m2_l += d * (x - mean_l)  # d = 0 on dead lanes
            cnt_l += live.to(tl.float32)
            t += 1
        # Chan's merge of the lanes.
        mean = tl.sum(mean_l * cnt_l, axis=0) / N
        dm = mean_l - mean
        var = (tl.sum(m2_l, axis=0) + tl.sum(cnt_l * dm * dm, axis=0)) / N
        if STORE_STATS:  # the backward needs them; an inference forward does not
            tl.store(MEAN + row, shift + mean)
    rstd = 1.0 / tl.sqrt(var + eps)
    if STORE_STATS:  # the backward needs them; an inference forward does not
        tl.store(RSTD + row, rstd)
    # ---- pass 2: normalize and write ----
    for off in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        c = off + cols
        cm = c < N
        x = tl.load(xb + c, mask=cm, other=0.0).to(tl.float32)
        y = ((x - shift) - mean) * rstd
        if HAS_W:
            if CAST_BEFORE_W:
                y = y.to(X.dtype.element_ty).to(tl.float32)
            y = y * tl.load(W + c, mask=cm, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(B + c, mask=cm, other=0.0).to(tl.float32)
        tl.store(yb + c, y.to(Y.dtype.element_ty), mask=cm)


# ==================================================================================================
# Backward kernels
# ==================================================================================================
@triton.jit
def _norm_bwd_kernel(
    X,  # pointer to the saved input, [M, N], row stride sx, unit column stride
    DY,  # pointer to the incoming gradient, [M, N], row stride sdy, unit column stride
    DX,  # pointer to the input gradient (written), [M, N] contiguous
    W,  # pointer to the weight [N] (unused unless HAS_W)
    STATS,  # pointer to the float32 statistics of the forward (layout as in _norm_fwd_kernel)
    PARTS,  # pointer to the float32 partials: [G, N] dW rows (written if HAS_W), then [G, N] dB rows (if HAS_B)
    M, N, sx, sdy,
    ROWS_PER_PROG,  # rows owned by each program (contiguous group)
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,  # next power of two >= N
    CAST_BEFORE_W: tl.constexpr = False,  # the forward rounded xhat to X's dtype before the weight: dW uses that
    STAGES: tl.constexpr = 1,  # software pipelining of the row loop (tl.range num_stages)
    ACC_ROWS: tl.constexpr = False,  # dW/dB accumulators of one row [BLOCK_N]: each tile summed over its rows first
    PAIR_SUM: tl.constexpr = False,  # LayerNorm: c1 and c2 from one two-value reduction, not two
    PDL_WAIT: tl.constexpr = False,  # launched as a programmatic dependent: wait for the previous kernel first
    PDL_TRIGGER: tl.constexpr = False,  # let the dependent reduce launch once this program's rows are done
):
    """Single-block backward: dx per row in one pass; dW/dB partial sums over this program's rows.

    ACC_ROWS: the column accumulators hold one row (BLOCK_N floats) instead of a tile (BLOCK_M x BLOCK_N);
    a tile's rows are summed into them (inside each thread where a thread holds whole columns of the tile),
    which frees registers for more rows in flight.  PAIR_SUM: LayerNorm's two row sums in one tl.reduce
    over a pair, one shared-memory round trip per tile where a row spans several warps.

    STAGES > 1: Triton loads the next row tiles of x and dy into shared memory by cp.async while one tile
    is reduced.  (The launch option num_stages alone does not pipeline a plain ``range`` loop whose loads
    feed no dot: ``tl.range(num_stages=...)`` does.)"""
    if PDL_WAIT:  # (programmatic dependent launch) nothing of the previous kernel's is read or overwritten before this
        tl.extra.cuda.gdc_wait()
    MEAN, RSTD = _stats_ptrs(STATS, M, IS_RMS)
    DWP, DBP = _parts_ptrs(PARTS, tl.num_programs(0), N, HAS_W)
    # This program's rows: [row_start, row_end), walked in tiles of BLOCK_M rows.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    row_start = pid * ROWS_PER_PROG
    row_end = tl.minimum(row_start + ROWS_PER_PROG, M)
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    # float32 accumulators of dW = sum(dy * xhat) and dB = sum(dy) over the program's rows.
    if ACC_ROWS:
        dw_acc = tl.zeros([BLOCK_N], tl.float32)
        db_acc = tl.zeros([BLOCK_N], tl.float32)
    else:
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for r0 in tl.range(row_start, row_end, BLOCK_M, num_stages=STAGES):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        r64 = rows.to(tl.int64)
        # Load the tile of x and dy; 0 is the identity of the row sums and of the column accumulators.
        x = tl.load(X + (r64 * sx)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + (r64 * sdy)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        if IS_RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_W:
            g = dy * w[None, :]
        else:
            g = dy
        # The row sums c1 = sum(g xhat) / N, c2 = sum(g) / N, then dx = rstd (g - xhat c1 - c2).
        if IS_RMS:
            c1 = tl.sum(g * xhat, axis=1) / N
            dx = (g - xhat * c1[:, None]) * rstd[:, None]
        else:
            if PAIR_SUM:
                s1, s2 = tl.reduce((g * xhat, g), 1, _add_pair)
                c1 = s1 / N
                c2 = s2 / N
            else:
                c1 = tl.sum(g * xhat, axis=1) / N
                c2 = tl.sum(g, axis=1) / N
            dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(DX + (r64 * N)[:, None] + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        # Accumulate this tile's share of dW and dB.
        if HAS_W:
            if CAST_BEFORE_W:  # dx above uses the exact xhat (the rounding passes gradients through)
                xhat = xhat.to(X.dtype.element_ty).to(tl.float32)
            if ACC_ROWS:
                dw_acc += tl.sum(dy * xhat, axis=0)
            else:
                dw_acc += dy * xhat
        if HAS_B:
            if ACC_ROWS:
                db_acc += tl.sum(dy, axis=0)
            else:
                db_acc += dy
    if PDL_TRIGGER:  # the reduce may launch now; it still waits for this whole grid (and its stores) to finish
        tl.extra.cuda.gdc_launch_dependents()
    # One partial row of dW and dB per program; _norm_reduce_partials_kernel sums them.
    if ACC_ROWS:
        dw_row = dw_acc
        db_row = db_acc
    else:
        dw_row = tl.sum(dw_acc, axis=0)
        db_row = tl.sum(db_acc, axis=0)
    if HAS_W:
        tl.store(DWP + pid.to(tl.int64) * N + cols, dw_row, mask=col_ok)
    if HAS_B:
        tl.store(DBP + pid.to(tl.int64) * N + cols, db_row, mask=col_ok)


@triton.jit
def _norm_bwd_rowstats_kernel(
    X, DY, W, STATS,  # as in _norm_bwd_kernel
    C,  # pointer to float32 [M, 2]: (c1, c2) per row (written)
    M,  # number of rows (locates RSTD in the statistics buffer)
    N, sx, sdy,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    BLOCK_N: tl.constexpr,  # chunk streamed per loop iteration
):
    """Wide-row backward pass 1: c1 = sum(g * xhat) / N and c2 = sum(g) / N for one row."""
    MEAN, RSTD = _stats_ptrs(STATS, M, IS_RMS)
    row = tl.program_id(0).to(tl.int64)
    xb = X + row * sx
    db = DY + row * sdy
    rstd = tl.load(RSTD + row)
    if IS_RMS:
        mean = 0.0
    else:
        mean = tl.load(MEAN + row)
    cols = tl.arange(0, BLOCK_N)
    # Per-lane partial sums over the row's chunks, reduced once at the end.
    a1 = tl.zeros([BLOCK_N], tl.float32)
    a2 = tl.zeros([BLOCK_N], tl.float32)
    for off in tl.range(0, N, BLOCK_N, num_stages=1):  # (one chunk in flight: no cp.async ring)
        c = off + cols
        cm = c < N
        x = tl.load(xb + c, mask=cm, other=0.0).to(tl.float32)
        g = tl.load(db + c, mask=cm, other=0.0).to(tl.float32)
        if HAS_W:
            g = g * tl.load(W + c, mask=cm, other=0.0).to(tl.float32)
        xhat = tl.where(cm, (x - mean) * rstd, 0.0)
        a1 += g * xhat
        a2 += g
    tl.store(C + row * 2, tl.sum(a1, axis=0) / N)
    tl.store(C + row * 2 + 1, tl.sum(a2, axis=0) / N)


@triton.jit
def _piece_xhat_g(X, DY, MEAN, RSTD, r, sx, sdy, c, cm, w, IS_RMS: tl.constexpr, HAS_W: tl.constexpr):
    """Columns ``c`` (mask ``cm``) of row ``r`` for the wide-row backward kernels: (dy, xhat, g = w * dy, rstd), in
    float32, 0 where masked (the identity of the row sums and of the column accumulators)."""
    x = tl.load(X + r * sx + c, mask=cm, other=0.0)
    dy = tl.load(DY + r * sdy + c, mask=cm, other=0.0)
    return _xhat_g(x, dy, MEAN, RSTD, r, cm, w, IS_RMS, HAS_W)


@triton.jit
def _xhat_g(x, dy, MEAN, RSTD, r, cm, w, IS_RMS: tl.constexpr, HAS_W: tl.constexpr):
    """(dy, xhat, g = w * dy, rstd) in float32 of a loaded piece (x, dy in the input's dtype, 0 where masked) of row
    ``r`` (< M: its statistics are read)."""
    x = x.to(tl.float32)
    dy = dy.to(tl.float32)
    rstd = tl.load(RSTD + r)
    if IS_RMS:
        xhat = x * rstd
    else:
        mean = tl.load(MEAN + r)
        xhat = tl.where(cm, (x - mean) * rstd, 0.0)
    if HAS_W:
        g = dy * w
    else:
        g = dy
    return dy, xhat, g, rstd


@triton.jit
def _persist_publish(SLOTS, r, SPLITS, piece, g, xhat, live, IS_RMS: tl.constexpr):
    """Publish this piece's partial row sums of row ``r`` when ``live``, as one flagged word: sum(g * xhat) alone
    (RMSNorm), or packed with sum(g) (LayerNorm: one atomic and one polled word a piece instead of two)."""
    if IS_RMS:
        publish(SLOTS + r * SPLITS + piece, pack_flagged(tl.sum(g * xhat, axis=0)), live)
    else:
        publish(SLOTS + r * SPLITS + piece, pack_sums(tl.sum(g * xhat, axis=0), tl.sum(g, axis=0)), live)


@triton.jit
def _persist_wait(SLOTS, r, SPLITS, N, IS_RMS: tl.constexpr):
    """(c1, c2) = (sum(g * xhat) / N, sum(g) / N) of row ``r`` once every piece has published (c2 = 0: RMSNorm)."""
    if IS_RMS:
        c1 = wait_row_sum_call(SLOTS + r * SPLITS, SPLITS) / N
        c2 = 0.0
    else:
        s1, s2 = wait_row_pair_sums_call(SLOTS + r * SPLITS, SPLITS)
        c1 = s1 / N
        c2 = s2 / N
    return c1, c2


@triton.jit
def _norm_bwd_loop_kernel(
    X, DY, DX, W, STATS, PARTS,  # as in _norm_bwd_kernel
    C,  # pointer to float32 [M, 2] from _norm_bwd_rowstats_kernel
    M, N, sx, sdy,
    ROWS_PER_PROG,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_N: tl.constexpr,  # column chunk
    CAST_BEFORE_W: tl.constexpr = False,  # as in _norm_bwd_kernel
):
    """Wide-row backward pass 2: column chunks outside, the program's rows inside; dx + dW/dB partials."""
    MEAN, RSTD = _stats_ptrs(STATS, M, IS_RMS)
    DWP, DBP = _parts_ptrs(PARTS, tl.num_programs(0), N, HAS_W)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    row_start = pid.to(tl.int64) * ROWS_PER_PROG  # 64-bit: the row index below is used in offsets
    row_end = tl.minimum(row_start + ROWS_PER_PROG, M)
    for off in range(0, N, BLOCK_N):
        c = off + cols
        cm = c < N
        if HAS_W:
            w = tl.load(W + c, mask=cm, other=0.0).to(tl.float32)
        else:
            w = 0.0  # (unread)
        # This chunk's dW / dB over the program's rows.
        dw_acc = tl.zeros([BLOCK_N], tl.float32)
        db_acc = tl.zeros([BLOCK_N], tl.float32)
        for r64 in tl.range(row_start, row_end, num_stages=1):  # (one row in flight: no cp.async ring)
            c1 = tl.load(C + r64 * 2)
            dy, xhat, g, rstd = _piece_xhat_g(X, DY, MEAN, RSTD, r64, sx, sdy, c, cm, w, IS_RMS, HAS_W)
            if IS_RMS:
                dx = (g - xhat * c1) * rstd
            else:
                c2 = tl.load(C + r64 * 2 + 1)
                dx = (g - xhat * c1 - c2) * rstd
            tl.store(DX + r64 * N + c, dx.to(DX.dtype.element_ty), mask=cm)
            if HAS_W:
                if CAST_BEFORE_W:
                    xhat = xhat.to(X.dtype.element_ty).to(tl.float32)
                dw_acc += dy * xhat
            if HAS_B:
                db_acc += dy
        if HAS_W:
            tl.store(DWP + pid.to(tl.int64) * N + c, dw_acc, mask=cm)
        if HAS_B:
            tl.store(DBP + pid.to(tl.int64) * N + c, db_acc, mask=cm)


@triton.jit(do_not_specialize=["GROUPS"])
def _norm_bwd_persist_kernel(
    X, DY, DX, W, STATS,  # as in _norm_bwd_kernel
    PARTS,  # pointer to the float32 partials: [GROUPS, N] dW rows (if HAS_W), then [GROUPS, N] dB rows (if HAS_B)
    SLOTS,  # pointer to int64 [M, SPLITS], zeroed: each piece's published partial row sums (one word)
    M, N, sx, sdy,
    SPLITS, PIECE,  # pieces per row, columns per piece (the last piece may be shorter)
    GROUPS,  # row groups: program g holds piece g % SPLITS of rows g // SPLITS, + GROUPS, ... (_rowsync.program_piece)
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_N: tl.constexpr,  # >= PIECE, a power of two
    PHASE: tl.constexpr,  # 2 on the GPU; 0 (publish) then 1 (wait, write) under the interpreter (_rowsync)
    CAST_BEFORE_W: tl.constexpr = False,  # as in _norm_bwd_kernel
    STAGES: tl.constexpr = 1,  # software pipelining of the row loop (the wait is a call, so the pipeliner takes it)
    HOLD: tl.constexpr = False,  # row k - 1's pieces held in registers: publish row k, then wait for row k - 1 and
                                 # write it (see below)
):
    """Wide-row backward in one read of x and dy: the pieces of a row are held by co-resident programs
    (ops/_rowsync.py, the wide softmax's scheme) that exchange their partial row sums.

    Per row: the piece's partials of sum(g * xhat) (and LayerNorm's sum(g)) are published as one flagged word;
    the program waits for the row's words (a called wait: with STAGES > 1 the next rows' x / dy pieces are
    loaded by cp.async while it waits), combines them in a fixed order -- every program of the row gets the
    same c1, c2 -- and writes its piece of dx = rstd (g - xhat c1 - c2).  dW / dB of the piece's columns are
    accumulated over the group's rows in registers and written once as partial row ``group``; the reduce
    kernel sums the GROUPS rows in a fixed order.  Deterministic, no atomics on the gradients.

    HOLD takes the wait off the critical path (without an exchange the same loads and math would run 0.87-0.88
    of copy where the exchanging kernel runs 0.64-0.65 at 16K-64K: a third of the time is the publish + wait of
    each row).  Iteration k loads and publishes row k, then waits for row k - 1 -- which every sibling
    published an iteration ago -- and writes row k - 1's dx from its x / dy pieces, held in registers in the
    input's dtype since the last iteration (no re-read).  One iteration runs past the last row (its loads
    masked, nothing published); iteration 0 waits for its own row and writes nothing."""
    MEAN, RSTD = _stats_ptrs(STATS, M, IS_RMS)
    DWP, DBP = _parts_ptrs(PARTS, GROUPS, N, HAS_W)
    # This program's piece of the row and its row group.
    piece, group, start, cm, c64 = program_piece(SPLITS, PIECE, N, BLOCK_N)
    if HAS_W:
        w = tl.load(W + c64, mask=cm, other=0.0).to(tl.float32)
    else:
        w = 0.0  # (unread)
    # dW / dB of the piece's columns over the group's rows.
    dw_acc = tl.zeros([BLOCK_N], tl.float32)
    db_acc = tl.zeros([BLOCK_N], tl.float32)
    if HOLD:
        xp = tl.zeros([BLOCK_N], X.dtype.element_ty)  # row k - 1's pieces (iteration 0: zeros, nothing written)
        dyp = tl.zeros([BLOCK_N], DY.dtype.element_ty)
        for row in tl.range(group, M + GROUPS, GROUPS, num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            live = r < M  # (the iteration past the last row loads nothing, publishes nothing)
            lm = cm & (c64 * 0 + r < M)
            # 0 where masked: the identity of the row sums and of the column accumulators
            x_raw = tl.load(X + r * sx + c64, mask=lm, other=0.0)
            dy_raw = tl.load(DY + r * sdy + c64, mask=lm, other=0.0)
            if PHASE != 1:  # publish row k
                # (past the last row: the last row's statistics on zero pieces, nothing published)
                _dy, xhat, g, _rstd = _xhat_g(x_raw, dy_raw, MEAN, RSTD, tl.minimum(r, M - 1), cm, w, IS_RMS, HAS_W)
                _persist_publish(SLOTS, r, SPLITS, piece, g, xhat, live, IS_RMS)
            if PHASE != 0:  # wait for row k - 1 (iteration 0: row k itself) and write its dx from the held pieces
                rp = tl.maximum(r - GROUPS, tl.cast(group, tl.int64))
                c1, c2 = _persist_wait(SLOTS, rp, SPLITS, N, IS_RMS)
                dy, xhat, g, rstd = _xhat_g(xp, dyp, MEAN, RSTD, rp, cm, w, IS_RMS, HAS_W)
                dx = (g - xhat * c1 - c2) * rstd
                tl.store(DX + rp * N + c64, dx.to(DX.dtype.element_ty), mask=cm & (c64 * 0 + row > group))
                if HAS_W:  # (iteration 0: dy = 0 adds nothing)
                    if CAST_BEFORE_W:
                        xhat = xhat.to(X.dtype.element_ty).to(tl.float32)
                    dw_acc += dy * xhat
                if HAS_B:
                    db_acc += dy
            xp = x_raw
            dyp = dy_raw
        if PHASE != 0:
            if HAS_W:
                tl.store(DWP + group.to(tl.int64) * N + c64, dw_acc, mask=cm)
            if HAS_B:
                tl.store(DBP + group.to(tl.int64) * N + c64, db_acc, mask=cm)
        return
    for row in tl.range(group, M, GROUPS, num_stages=STAGES):
        r = tl.cast(row, tl.int64)
        dy, xhat, g, rstd = _piece_xhat_g(X, DY, MEAN, RSTD, r, sx, sdy, c64, cm, w, IS_RMS, HAS_W)
        if PHASE != 1:  # publish this piece's partial sums
            _persist_publish(SLOTS, r, SPLITS, piece, g, xhat, r < M, IS_RMS)
        if PHASE != 0:  # wait for the row's other pieces, write this piece of dx, accumulate dW / dB
            c1, c2 = _persist_wait(SLOTS, r, SPLITS, N, IS_RMS)
            dx = (g - xhat * c1 - c2) * rstd
            tl.store(DX + r * N + c64, dx.to(DX.dtype.element_ty), mask=cm)
            if HAS_W:
                if CAST_BEFORE_W:  # dx above uses the exact xhat (the rounding passes gradients through)
                    xhat = xhat.to(X.dtype.element_ty).to(tl.float32)
                dw_acc += dy * xhat
            if HAS_B:
                db_acc += dy
    if PHASE != 0:  # every group has >= 1 row (GROUPS <= M): every partial row is written
        if HAS_W:
            tl.store(DWP + group.to(tl.int64) * N + c64, dw_acc, mask=cm)
        if HAS_B:
            tl.store(DBP + group.to(tl.int64) * N + c64, db_acc, mask=cm)


@triton.jit
def _norm_reduce_partials_kernel(
    PARTS,  # pointer to the float32 partials: [G, N] dW rows (if HAS_W), then [G, N] dB rows (if HAS_B)
    DW, DB,  # pointers to dW [N], dB [N] in the parameters' dtypes (written)
    G, N,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_G: tl.constexpr,  # partial rows per loop iteration
    BLOCK_N: tl.constexpr,  # columns per program
    STAGES: tl.constexpr = 1,  # software pipelining of the loop over G (tl.range num_stages: the next tiles in flight)
    PDL_WAIT: tl.constexpr = False,  # launched as a programmatic dependent of the backward kernel
):
    """Sum the G partial rows column-wise in a fixed order (deterministic), cast, store.

    The partials were just written (L2-resident) and are small, so this kernel is latency-bound: the grid is a
    strip of BLOCK_N columns per program, narrow enough that most SMs take part (``_reduce_kernel``)."""
    if PDL_WAIT:  # the partials are the backward kernel's: wait for its whole grid
        tl.extra.cuda.gdc_wait()
    DWP, DBP = _parts_ptrs(PARTS, G, N, HAS_W)
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    gs = tl.arange(0, BLOCK_G)
    # [BLOCK_G, BLOCK_N] accumulators, summed over their rows at the end: the order is fixed.
    dw = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    db = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    for g0 in tl.range(0, G, BLOCK_G, num_stages=STAGES):
        g = g0 + gs
        mask = (g < G)[:, None] & col_ok[None, :]
        offs = g.to(tl.int64)[:, None] * N + cols[None, :]
        # 0 is the identity of the sum
        if HAS_W:
            dw += tl.load(DWP + offs, mask=mask, other=0.0)
        if HAS_B:
            db += tl.load(DBP + offs, mask=mask, other=0.0)
    if HAS_W:
        tl.store(DW + cols, tl.sum(dw, axis=0).to(DW.dtype.element_ty), mask=col_ok)
    if HAS_B:
        tl.store(DB + cols, tl.sum(db, axis=0).to(DB.dtype.element_ty), mask=col_ok)


# ==================================================================================================
# PyTorch reference (tests, CPU fallback)
# ==================================================================================================
def layer_norm_reference(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """LayerNorm computed by PyTorch in float64, returned in x's dtype (tests compare against this)."""
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    x64 = x.double()
    mu = x64.mean(dims, keepdim=True)
    var = ((x64 - mu) ** 2).mean(dims, keepdim=True)
    y = (x64 - mu) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)


def rms_norm_reference(x, normalized_shape, weight=None, eps=None):
    """RMSNorm computed by PyTorch in float64 (eps=None: machine epsilon of x's dtype), in x's dtype."""
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    x64 = x.double()
    y = x64 * torch.rsqrt((x64 * x64).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    return y.to(x.dtype)


# ==================================================================================================
# Launchers
# ==================================================================================================
def _row_layout(shape: Sequence[int], stride: Sequence[int], k: int) -> tuple[int, int, Optional[int]]:
    """(M, N, row stride) viewing a tensor as M rows of its last k dims; row stride None if a copy is needed.

    No copy when the last k dims form one unit-stride row and the leading dims merge into one stride
    (contiguous tensors, slices along leading dims, transposes of leading dims).
    """
    nd = len(shape)
    n = math.prod(shape[nd - k:])
    m = math.prod(shape[: nd - k])
    expect = 1
    for d in range(nd - 1, nd - k - 1, -1):  # the row: innermost dims outwards, unit stride overall
        if shape[d] == 1:
            continue
        if stride[d] != expect:
            return m, n, None
        expect *= shape[d]
    row_stride, size = n, 1
    for d in range(nd - k - 1, -1, -1):  # leading dims must merge into one stride
        if shape[d] == 1:
            continue
        if size == 1:
            row_stride = stride[d]
        elif stride[d] != row_stride * size:
            return m, n, None
        size *= shape[d]
    return m, n, row_stride


def _as_rows(t: torch.Tensor, k: int) -> tuple[torch.Tensor, int, int, int]:
    """(t or a contiguous copy, M, N, row stride) viewing t as M rows of its last k dims."""
    m, n, row_stride = _row_layout(t.shape, t.stride(), k)
    if row_stride is None:
        return t.contiguous(), m, n, n
    return t, m, n, row_stride


# --------------------------------------------------------------------------------------------------
# Launch plans.  Everything a launch needs that depends only on (shape, strides, dtype, k, which
# parameters exist, the norm, the config overrides and, for the backward, the device's SM count) is
# computed once and cached with its bound kernels (ops/_library.Kernel), so that a call is: cheap
# checks, one dict lookup, allocate outputs, launch.
# --------------------------------------------------------------------------------------------------
_MAX_PLANS = 4096  # a workload with ever-changing shapes re-plans instead of growing without bound


class _FwdPlan:
    __slots__ = ("m", "nstats", "copy", "kernel", "ints", "cpp")


class _BwdPlan:
    __slots__ = ("m", "n", "g", "copy_x", "copy_dy", "kernel", "ints", "nparts", "stats_kernel", "reduce_kernel",
                 "persist", "fallback", "gluon", "eager_kernel", "eager_reduce")


_FWD_PLANS: dict[tuple, _FwdPlan] = {}
_BWD_PLANS: dict[tuple, _BwdPlan] = {}


def _fwd_plan(shape: torch.Size, stride: tuple[int, ...], dtype: torch.dtype, k: int,
              has_w: bool, has_b: bool, is_rms: bool, store_stats: bool = True,
              cast_before_w: bool = False) -> _FwdPlan:
    key = (shape, stride, dtype, k, has_w, has_b, is_rms, store_stats, cast_before_w, override_epoch())
    try:
        plan = _FWD_PLANS.get(key)
    except TypeError:  # symbolic sizes (tracing with dynamic shapes): plan for their values
        return _fwd_plan(concrete(shape), concrete(stride), dtype, k, has_w, has_b, is_rms, store_stats, cast_before_w)
    if plan is not None:
        return plan
    m, n, sx = _row_layout(shape, stride, k)
    plan = _FwdPlan()
    plan.cpp = {}  # (device, weight dtype, bias dtype) -> C++ fast-path plan id, or False (ops/_cpp.py)
    plan.m, plan.copy = m, sx is None
    plan.nstats = (m if is_rms else 2 * m) if store_stats else 0
    plan.kernel = plan.ints = None
    if m * n > 0:  # empty tensors launch nothing
        n_pow2 = next_power_of_2(n)
        c = cfg.fwd_config(n, n_pow2, dtype.itemsize, is_rms)
        plan.ints = (m, n, n if sx is None else sx)
        # CAST_BEFORE_W always passed: Kernel binds its fast launch only when every constexpr is in meta.
        meta = dict(IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_b, STORE_STATS=store_stats, CAST_BEFORE_W=cast_before_w,
                    num_warps=c.warps)
        if isinstance(c, cfg.FwdTile):
            plan.kernel = Kernel(_norm_fwd_kernel, (triton.cdiv(m, c.block_m),), check=(0, 1, 2, 3),
                                 BLOCK_M=c.block_m, BLOCK_N=n_pow2, **meta)
        else:
            plan.kernel = Kernel(_norm_fwd_loop_kernel, (m,), check=(0, 1, 2, 3), BLOCK_N=min(c.chunk, n_pow2),
                                 STAGES=c.stages, **meta)
    if len(_FWD_PLANS) >= _MAX_PLANS:
        _FWD_PLANS.clear()
    _FWD_PLANS[key] = plan
    return plan


def _bwd_plan(shape: torch.Size, x_stride: tuple[int, ...], dy_stride: tuple[int, ...], dtype: torch.dtype,
              k: int, has_w: bool, has_b: bool, is_rms: bool, device_index: int, cast_before_w: bool = False,
              persist_ok: bool = False) -> _BwdPlan:
    """Backward launch plan; cached per key.  ``persist_ok``: real tensors (eager), where wide rows may take the
    persistent one-read kernel (``layer_norm_config.persist_config``; its grid comes from the compiled binary's
    occupancy at the first call, ``plan.persist``); traced calls take the two-pass kernels."""
    key = (shape, x_stride, dy_stride, dtype, k, has_w, has_b, is_rms, device_index, cast_before_w, persist_ok,
           override_epoch())
    try:
        plan = _BWD_PLANS.get(key)
    except TypeError:  # symbolic sizes: plan for their values
        return _bwd_plan(concrete(shape), concrete(x_stride), concrete(dy_stride), dtype, k, has_w, has_b, is_rms,
                         device_index, cast_before_w, persist_ok)
    if plan is not None:
        return plan
    m, n, sx = _row_layout(shape, x_stride, k)
    _, _, sdy = _row_layout(shape, dy_stride, k)
    plan = _BwdPlan()
    plan.gluon = None  # the Gluon row backward: decided at the first eager call (False, or (G, its reduce kernel))
    plan.m, plan.n, plan.copy_x, plan.copy_dy = m, n, sx is None, sdy is None
    sx = n if sx is None else sx
    sdy = n if sdy is None else sdy
    n_pow2 = next_power_of_2(n)
    c = cfg.bwd_config(n, n_pow2, dtype.itemsize, is_rms)
    single = isinstance(c, cfg.BwdTile)
    # G programs, each over a contiguous group of rows (whole tiles of BLOCK_M rows for the single-block kernel).
    rows_unit = c.block_m if single else 1
    g = max(1, min(c.progs_per_sm * cfg.sm_count(device_index), triton.cdiv(m, rows_unit)))
    g = cfg.bwd_programs(g)
    rows_per_prog = triton.cdiv(m, g)
    if single:  # round up so every program's tiles start on its own rows
        rows_per_prog = triton.cdiv(rows_per_prog, c.block_m) * c.block_m
    g = triton.cdiv(m, rows_per_prog)  # every program owns >= 1 row, so every partial row is written
    plan.g = g
    plan.nparts = (int(has_w) + int(has_b)) * g * n
    plan.ints = (m, n, sx, sdy, rows_per_prog)
    meta = dict(IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_b, CAST_BEFORE_W=cast_before_w, num_warps=c.warps)
    if single and c.stages > 1:
        meta["num_stages"] = c.stages
    plan.stats_kernel = None
    plan.persist = plan.fallback = None
    pcfg = None if single or not persist_ok else cfg.persist_config(n, n_pow2, dtype.itemsize, is_rms)
    if persist_ok and pcfg is None:
        # No persistent kernel for this row: one plan whatever ``persist_ok`` says, so the kernels the Python path
        # compiles are the ones the C++ fast path registers (``_cpp_register`` asks with persist_ok=False; with
        # two plans its kernels were never compiled and every backward paid a registration attempt).
        plan = _bwd_plan(shape, x_stride, dy_stride, dtype, k, has_w, has_b, is_rms, device_index, cast_before_w)
        _BWD_PLANS[key] = plan
        return plan
    if pcfg is not None:  # the one-read persistent kernel; the two-pass plan is its fallback
        pblock = next_power_of_2(pcfg.block)
        splits, piece = balanced_pieces(n, pblock)
        plan.persist = dict(splits=splits, piece=piece, kernel=None, groups=0, reduce=None,
                            meta=dict(IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_b, BLOCK_N=pblock,
                                      CAST_BEFORE_W=cast_before_w, STAGES=cfg.PERSIST_STAGES, HOLD=pcfg.hold,
                                      num_warps=pcfg.warps))
        plan.fallback = _bwd_plan(shape, x_stride, dy_stride, dtype, k, has_w, has_b, is_rms, device_index,
                                  cast_before_w)
    pdl = _use_pdl(device_index)
    has_reduce = has_w or has_b
    if single:
        base = dict(BLOCK_M=c.block_m, BLOCK_N=n_pow2, STAGES=c.stages, ACC_ROWS=c.acc_rows,
                    PAIR_SUM=c.pair_sum and not is_rms, **meta)
        plan.kernel = Kernel(_norm_bwd_kernel, (g,), check=(0, 1, 3, 4), PDL_WAIT=False, PDL_TRIGGER=False, **base)
        plan.eager_kernel = plan.kernel
        if pdl:  # eager launches only: Inductor cannot analyse the griddepcontrol instructions (it then takes every
            # argument for mutated), so traced launches keep plan.kernel
            plan.eager_kernel = Kernel(_norm_bwd_kernel, (g,), check=(0, 1, 3, 4), PDL_WAIT=True,
                                       PDL_TRIGGER=has_reduce, launch_pdl=True, **base)
    else:
        chunk = min(c.chunk, n_pow2)
        plan.kernel = Kernel(_norm_bwd_loop_kernel, (g,), check=(0, 1, 3, 4), BLOCK_N=chunk, **meta)
        plan.eager_kernel = plan.kernel
        plan.stats_kernel = Kernel(_norm_bwd_rowstats_kernel, (m,), check=(0, 1, 2, 3), IS_RMS=is_rms, HAS_W=has_w,
                                   BLOCK_N=chunk, num_warps=c.warps)
    plan.reduce_kernel = _reduce_kernel(n, g, has_w, has_b) if has_reduce else None
    plan.eager_reduce = plan.reduce_kernel
    if has_reduce and single and pdl:
        plan.eager_reduce = _reduce_kernel(n, g, has_w, has_b, True)
    if len(_BWD_PLANS) >= _MAX_PLANS:
        _BWD_PLANS.clear()
    _BWD_PLANS[key] = plan
    return plan


def _use_pdl(device_index: int) -> bool:
    """Programmatic dependent launch of the single-block backward's eager launches: the row kernel waits for
    whatever precedes it on the device (griddepcontrol.wait) and lets the dW / dB reduce launch after its rows, so
    the reduce's launch overlaps the row kernel's tail instead of following it (LayerNorm 768: 0.870 of copy
    against 0.841, do_bench of fwd+bwd minus fwd).  sm_90 and newer; the C++ fast path launches these with
    cuLaunchKernelEx; traced launches (torch.compile) are plain."""
    return not INTERPRET and device_index >= 0 and torch.cuda.get_device_capability(device_index)[0] >= 9


def _reduce_kernel(n: int, g: int, has_w: bool, has_b: bool, pdl: bool = False) -> Kernel:
    """The fixed-order sum of G partial rows of dW / dB (``_norm_reduce_partials_kernel``); its shape from
    ``layer_norm_config.reduce_config`` (16-column strips: many programs for a latency-bound sum).  ``pdl``:
    launched as a programmatic dependent of the backward kernel (its launch overlaps that kernel's tail)."""
    block_n, block_g = cfg.reduce_config(n, g)
    extra = dict(launch_pdl=True) if pdl else {}
    return Kernel(_norm_reduce_partials_kernel, (triton.cdiv(n, block_n),), check=(1, 2), HAS_W=has_w, HAS_B=has_b,
                  BLOCK_G=block_g, BLOCK_N=block_n, STAGES=cfg.REDUCE_STAGES, PDL_WAIT=pdl,
                  num_warps=cfg.REDUCE_WARPS, **extra)


def _bwd_persist_launch(plan: _BwdPlan, x, dy, dx, w, stats, has_w: bool, has_b: bool):
    """Run the persistent backward of ``plan`` (binding it at its first call, ``_rowsync.bind_persistent``);
    returns (partials buffer, G, reduce kernel), or None when not even one row group fits (the caller then
    takes ``plan.fallback``)."""
    p = plan.persist
    if p.get("unfit"):
        return None
    m, n, sx, sdy = plan.m, plan.n, plan.ints[2], plan.ints[3]
    slots = torch.zeros((m * p["splits"],), dtype=torch.int64, device=x.device)  # one word a piece
    if p["kernel"] is None:
        # the partials' size depends on GROUPS: bind with the statistics buffer (float32) in their place
        args = (x, dy, dx, w, stats, stats, slots, m, n, sx, sdy, p["splits"], p["piece"])
        bound = bind_persistent(_norm_bwd_persist_kernel, args, p["splits"], m, cfg.PERSIST_MAX_PER_SM, **p["meta"])
        if bound is None:
            p["unfit"] = True  # decided once per plan: later calls go straight to the fallback
            return None
        p["kernel"], p["groups"] = bound
        if has_w or has_b:
            p["reduce"] = _reduce_kernel(n, p["groups"], has_w, has_b)
    groups = p["groups"]
    nparts = (int(has_w) + int(has_b)) * groups * n
    parts = torch.empty((nparts,), dtype=torch.float32, device=x.device) if nparts else stats
    for kern in p["kernel"]:  # one launch on the GPU; phases 0 and 1 under the interpreter
        kern(x, dy, dx, w, stats, parts, slots, m, n, sx, sdy, p["splits"], p["piece"], groups)
    return parts, groups, p["reduce"]


def _gluon_plan(plan: _BwdPlan, x: torch.Tensor, has_w: bool, has_b: bool):
    """The Gluon row backward's part of a backward plan, decided once per plan (plans are keyed on the
    config-override epoch): False where the width / dtype is not its (``layer_norm_config.gluon_config``), else
    (G, its reduce kernel: a programmatic dependent, as the Gluon kernel always launches on sm_90)."""
    if plan.gluon is None:
        plan.gluon = False
        if not INTERPRET and x.is_cuda and cfg.gluon_config(plan.n, x.element_size()):
            g = min(cfg.sm_count(x.get_device()), plan.m)
            plan.gluon = (g, _reduce_kernel(plan.n, g, has_w, has_b, True) if has_w or has_b else None)
    return plan.gluon


def _gluon_take(plan: _BwdPlan, x, x2, dy2, weight, has_w: bool, has_b: bool, cast_before_w: bool):
    """(G, reduce kernel, flat weight) where the Gluon row backward takes the (M, N) rows ``x2`` / ``dy2`` of
    ``plan``, else None: its plan (``_gluon_plan``), then what ``layer_norm_gluon.supported`` checks."""
    from . import layer_norm_gluon as lg

    gplan = _gluon_plan(plan, x, has_w, has_b)
    if gplan is False:
        return None
    g, reduce_kernel = gplan
    w = weight.contiguous().view(-1) if has_w else None
    if lg.supported(x2, dy2, w, cast_before_w) is not None:
        return None
    return g, reduce_kernel, w


def _bwd_gluon_launch(plan: _BwdPlan, x, dy, dx, weight, stats, has_w: bool, has_b: bool, is_rms: bool,
                      cast_before_w: bool):
    """The Gluon row backward (ops/layer_norm_gluon.py, one CTA an SM) where it takes the call: (partials, G, reduce
    kernel) as ``_bwd_persist_launch``; None where it does not (the caller then runs the Triton kernels)."""
    from . import layer_norm_gluon as lg

    m, n = plan.m, plan.n
    if not (x.is_contiguous() and dy.is_contiguous()):
        return None
    x2, dy2 = x.view(m, n), dy.view(m, n)
    took = _gluon_take(plan, x, x2, dy2, weight, has_w, has_b, cast_before_w)
    if took is None:
        return None
    g, reduce_kernel, w = took
    parts, _ = lg.norm_backward_rows(x2, dy2, dx.view(m, n), w, stats, has_b, is_rms, g)
    return parts, g, reduce_kernel


def norm_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    k: int,
    eps: float,
    is_rms: bool,
    store_stats: bool = True,
    cast_before_w: bool = False,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Launch the forward over the last ``k`` dims.

    Returns (y contiguous, stats): stats is one float32 buffer holding the row means [0, M) then the row
    1/std [M, 2M) (RMSNorm: 1/std only, [M]); the backward takes it as is.  ``store_stats=False`` (a
    forward no backward will follow) writes no statistics and returns None for them.  ``cast_before_w``:
    round the normalized row to x's dtype before multiplying by the weight (the order of Hugging Face's
    Llama-family RMSNorm); ``out_dtype``: y's dtype (default x's).
    """
    plan = _fwd_plan(x.shape, x.stride(), x.dtype, k, weight is not None, bias is not None, is_rms, store_stats,
                     cast_before_w)
    y_dtype = x.dtype if out_dtype is None else out_dtype
    if x.is_contiguous():
        y = torch.empty_like(x, dtype=y_dtype)
    else:
        y = torch.empty(x.shape, dtype=y_dtype, device=x.device)
    stats = torch.empty((plan.nstats,), dtype=torch.float32, device=x.device) if store_stats else x
    if plan.kernel is None:
        return y, (stats if store_stats else None)
    if plan.copy:
        x = x.contiguous()
    # Missing parameters: any pointer does (HAS_W / HAS_B are constexpr False, never dereferenced).
    w = x if weight is None else weight.contiguous()
    b = x if bias is None else bias.contiguous()
    plan.kernel(x, y, w, b, stats, *plan.ints, eps)  # (no stats: x, never written)
    return y, (stats if store_stats else None)


def norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    stats: torch.Tensor,
    k: int,
    is_rms: bool,
    cast_before_w: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Launch the backward; returns (dx, dw, db), dw / db None when there is no weight / bias.

    Allocations: dx, dw, db (no fill: every element is written), one float32 buffer of the G partial
    rows of dW then dB (no fill: each of the G programs writes its rows) and, for wide rows, the [M, 2]
    row terms or the persistent kernel's zeroed slots.  Launches: the dx + partials kernel(s) and the
    fixed-order reduction of the partials.  ``cast_before_w`` as in ``norm_forward`` (dW then sums dy
    times the rounded xhat).
    """
    has_w, has_b = weight is not None, bias is not None
    dx = torch.empty_like(x) if x.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:  # no rows: the parameter gradients are sums over nothing
        dw = torch.zeros_like(weight, memory_format=torch.contiguous_format) if has_w else None
        db = torch.zeros_like(bias, memory_format=torch.contiguous_format) if has_b else None
        return dx, dw, db
    if dy.dtype != x.dtype:
        dy = dy.to(x.dtype)
    persist_ok = type(x) in _PLAIN and type(dy) in _PLAIN and (INTERPRET or x.is_cuda)
    plan = _bwd_plan(x.shape, x.stride(), dy.stride(), x.dtype, k, has_w, has_b, is_rms, x.get_device(), cast_before_w,
                     persist_ok)
    if plan.copy_x:
        x = x.contiguous()
    if plan.copy_dy:
        dy = dy.contiguous()
    w = x if weight is None else weight.contiguous()
    # Eager calls: the Gluon row backward, else the persistent kernel, where they take the rows.
    ran = None
    if persist_ok and plan.gluon is not False:
        ran = _bwd_gluon_launch(plan, x, dy, dx, weight, stats, has_w, has_b, is_rms, cast_before_w)
    if ran is None and plan.persist is not None:
        ran = _bwd_persist_launch(plan, x, dy, dx, w, stats, has_w, has_b)
    if ran is not None:
        parts, g, reduce_kernel = ran
    else:
        plan = plan.fallback if plan.persist is not None else plan
        # Buffers of missing gradients are never dereferenced (constexpr HAS_W / HAS_B): pass stats.
        parts = torch.empty((plan.nparts,), dtype=torch.float32, device=x.device) if plan.nparts else stats
        if plan.stats_kernel is None:
            (plan.eager_kernel if persist_ok else plan.kernel)(x, dy, dx, w, stats, parts, *plan.ints)
        else:
            m, n, sx, sdy, _ = plan.ints
            cbuf = torch.empty((m, 2), dtype=torch.float32, device=x.device)
            plan.stats_kernel(x, dy, w, stats, cbuf, m, n, sx, sdy)
            plan.kernel(x, dy, dx, w, stats, parts, cbuf, *plan.ints)
        g, reduce_kernel = plan.g, (plan.eager_reduce if persist_ok else plan.reduce_kernel)
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=x.device) if has_w else None
    db = torch.empty(bias.shape, dtype=bias.dtype, device=x.device) if has_b else None
    if reduce_kernel is not None:
        reduce_kernel(parts, dx if dw is None else dw, dx if db is None else db, g, plan.n)
    return dx, dw, db


# ==================================================================================================
# Registration (ops/_library.py): custom ops for torch.compile, autograd, the eager direct path
# ==================================================================================================
def _norm_fwd(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], k: int, eps: float, is_rms: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return norm_forward(x, weight, bias, k, eps, is_rms)


def _empty_f32(x: torch.Tensor) -> torch.Tensor:
    return torch.empty((0,), dtype=torch.float32, device=x.device)


def _norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    stats: torch.Tensor,
    k: int,
    is_rms: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward as an op (its outputs must be tensors: a missing parameter gets an empty one)."""
    dx, dw, db = norm_backward(dy, x, weight, bias, stats, k, is_rms)
    return dx, (_empty_f32(x) if dw is None else dw), (_empty_f32(x) if db is None else db)


def _setup_context(ctx, inputs, outputs):
    x, weight, bias, k, _eps, is_rms = inputs
    ctx.k, ctx.is_rms = k, is_rms
    ctx.has_w, ctx.has_b = weight is not None, bias is not None
    ctx.save_for_backward(x, weight, bias, outputs[1])


def _grads(ctx, backward, dy):
    x, weight, bias, stats = ctx.saved_tensors
    dx, dw, db = backward(dy, x, weight, bias, stats, ctx.k, ctx.is_rms)
    return dx, (dw if ctx.has_w else None), (db if ctx.has_b else None), None, None, None


norm_op = FusedOp("norm", _norm_fwd, _norm_bwd, _setup_context, _grads, eager_backward=norm_backward)


# --------------------------------------------------------------------------------------------------
# Autocast.  What torch.autocast does to layer_norm / rms_norm depends on the device type and the torch
# version (CUDA: layer_norm runs in float32 on every version, rms_norm returns bfloat16 on torch 2.11;
# CPU: both untouched), and a dispatcher-registration lookup does not tell the policy (torch 2.11
# registers an AutocastCUDA kernel for rms_norm that keeps the input dtype).  So ask torch: once per
# (op, device type, autocast dtype), run its own F.layer_norm / F.rms_norm on a tiny half-precision
# tensor of that device under autocast and read the output dtype; float32 out means "cast the inputs
# to float32" (what autocast's float32 policy does), anything else means "leave them alone".
# --------------------------------------------------------------------------------------------------
_HALF = (torch.float16, torch.bfloat16)
_AUTOCAST_PROBES = {"layer_norm": F.layer_norm, "rms_norm": F.rms_norm}
_AUTOCAST_FP32: dict[tuple[str, str, torch.dtype], bool] = {}
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)


def _autocast_default(op: str, device_type: str) -> bool:
    """Used only when the probe cannot run (while Dynamo traces before any eager call, or when it fails):
    layer_norm in float32 off the CPU (torch's documented CUDA policy on every version), rms_norm as is
    (torch 2.11 on CUDA)."""
    return op == "layer_norm" and device_type != "cpu"


def autocast_runs_in_float32(op: str, device: torch.device | str, autocast_dtype: torch.dtype) -> bool:
    """True when torch's ``op`` ("layer_norm" / "rms_norm") under ``torch.autocast(device.type,
    dtype=autocast_dtype)`` returns float32 for a half-precision input (probed once, then cached).

    While Dynamo traces only the cache is read; a miss gives ``_autocast_default``.
    """
    device = torch.device(device)
    key = (op, device.type, autocast_dtype)
    hit = _AUTOCAST_FP32.get(key)
    if hit is not None:
        return hit
    if is_compiling():
        return _autocast_default(op, device.type)
    probe_dtype = autocast_dtype if autocast_dtype in _HALF else torch.bfloat16
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = torch.ones((1, 2), dtype=probe_dtype, device=device)
            with torch.autocast(device.type, dtype=autocast_dtype):
                out_dtype = _AUTOCAST_PROBES[op](t, (2,)).dtype
        result = out_dtype == torch.float32
    except Exception:  # pragma: no cover - autocast unsupported for this device type / dtype
        result = _autocast_default(op, device.type)
    _AUTOCAST_FP32[key] = result
    return result


# The CPU answers cost nothing: fill them at import (CUDA is probed on first use, not to initialize it here).
for _op in _AUTOCAST_PROBES:
    for _dt in _HALF:
        autocast_runs_in_float32(_op, "cpu", _dt)


def _autocast_cast(op: str, x, weight, bias):
    """Cast half-precision inputs to float32 when torch's ``op`` would run in float32 under the active autocast."""
    dt = x.device.type
    if not torch.is_autocast_enabled(dt) or not autocast_runs_in_float32(op, x.device, torch.get_autocast_dtype(dt)):
        return x, weight, bias

    def up(t):
        return t.float() if t is not None and t.dtype in _HALF else t

    return up(x), up(weight), up(bias)


def _probe_rms_default_eps(dtype: torch.dtype) -> float:
    """The eps ``torch.nn.functional.rms_norm`` uses when given ``eps=None`` for ``dtype`` inputs.

    PyTorch documents ``torch.finfo(input.dtype).eps``, but its kernels take the epsilon of the
    computation type (float32 for float16 / bfloat16 inputs).  Ask PyTorch once, on a tiny CPU tensor
    where the two candidates give clearly different answers.
    """
    small, big = torch.finfo(torch.float32).eps, torch.finfo(dtype).eps
    if small == big:
        return big
    x = torch.full((1, 2), 1e-2, dtype=dtype)  # mean square 1e-4: eps of 2^-7 (bf16) or 2^-10 (fp16) shows
    y = F.rms_norm(x, (2,), None, None).float()[0, 0].item()
    return big if y < 0.5 else small


_RMS_DEFAULT_EPS = {dt: _probe_rms_default_eps(dt) for dt in SUPPORTED_DTYPES}


# --------------------------------------------------------------------------------------------------
# Argument checks: every one of them on every call, written so that the common case (a tuple of ints
# from the module, parameters of the right shape, dtype and device) costs a few comparisons.
# --------------------------------------------------------------------------------------------------
_KERNEL_DTYPES = frozenset(SUPPORTED_DTYPES)


def _normalized_shape_slow(op: str, normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, (int, torch.SymInt)) and not isinstance(normalized_shape, bool):
        return (int(normalized_shape),)
    if isinstance(normalized_shape, (tuple, list, torch.Size)) and all(
        isinstance(s, (int, torch.SymInt)) and not isinstance(s, bool) for s in normalized_shape
    ):
        return tuple(int(s) for s in normalized_shape)
    raise TypeError(f"{op}: argument 'normalized_shape' must be an int or a sequence of ints, got {normalized_shape!r}")


def _check_param(op: str, name: str, p, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if p is None:
        return
    check_tensor(op, name, p)
    if tuple(p.shape) != shape:  # (a torch.Size compared with a tuple goes through sym_eq: slow)
        raise FusedShapeError(
            f"{op}: argument '{name}' must have shape {list(shape)} (normalized_shape), got {list(p.shape)}"
        )
    if p.dtype != x.dtype and p.dtype != torch.float32 and x.dtype in _KERNEL_DTYPES:
        raise TypeError(
            f"{op}: argument '{name}' has dtype {p.dtype}; with a {x.dtype} input it must be {x.dtype} or torch.float32"
        )
    if p.device != x.device:
        check_same_device(op, "input", x, **{name: p})


def _validate(op: str, x, normalized_shape, weight, bias) -> tuple[tuple[int, ...], int]:
    """Check every argument (errors name it); returns (normalized shape, k = its number of dims)."""
    check_tensor(op, "input", x)
    if x.dtype not in _KERNEL_DTYPES:
        check_float_dtype(op, "input", x, allow_float64=True)
    ns = normalized_shape
    if type(ns) is tuple and all(type(s) is int for s in ns):
        shape = ns
    elif type(ns) is int:
        shape = (ns,)
    else:
        shape = _normalized_shape_slow(op, ns)
    k = len(shape)
    if k == 0 or tuple(x.shape[-k:]) != shape:  # also catches k > x.dim() (the slice is shorter)
        raise FusedShapeError(
            f"{op}: argument 'normalized_shape' {list(shape)} must be non-empty and match the input's last "
            f"dims; expected input of shape [*, {', '.join(map(str, shape))}], got {list(x.shape)}"
        )
    _check_param(op, "weight", weight, x, shape)
    _check_param(op, "bias", bias, x, shape)
    return shape, k


_SCALAR_TYPE = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}  # c10::ScalarType codes


def _gluon_cpp_spec(bplan, x, weight, has_w, has_b, is_rms, cast_before_w):
    """(kernel, G, reduce kernel, TMA descriptors) of the Gluon row backward where it takes this plan's contiguous,
    aligned rows (what the C++ fast path passes: dy made contiguous there), else None.  The descriptors: the
    (pointer index, shape, strides) of x, dy and w that the C++ launch encodes at each call (``_cpp.register``)."""
    from . import layer_norm_gluon as lg

    m, n = bplan.m, bplan.n
    x2 = x.view(m, n)
    took = _gluon_take(bplan, x, x2, x2, weight, has_w, has_b, cast_before_w)
    if took is None:
        return None
    g, reduce_kernel, w = took
    kernel = lg.bwd_kernel(m, n, n, n, x.dtype, None if w is None else w.dtype, has_b, is_rms, g)
    return kernel, kernel.grid[0], reduce_kernel, lg.cpp_descriptors(m, n, has_w)


def _cpp_register(plan, x, weight, bias, k, is_rms, grad, cast_before_w=False, out_dtype=None):
    """Register the plan's kernels with the C++ fast path (the forward; with ``grad`` also the backward and
    the dW/dB reduce): the norm plan id, None while a kernel has not been compiled for these dtypes yet,
    False if unsupported.  ``cast_before_w`` / ``out_dtype``: the RMSNorm variants of ops/norm_variants.py."""
    has_w, has_b = weight is not None, bias is not None
    dev = x.get_device()
    xd, f32 = x.dtype, torch.float32
    yd = xd if out_dtype is None else out_dtype
    wd = weight.dtype if has_w else xd
    bd = bias.dtype if has_b else xd
    ycode = -1 if yd == xd else _SCALAR_TYPE.get(yd)
    if ycode is None:
        return False
    # The forward's statistics pointer is a float32 buffer, or x itself when no statistics are stored.
    specs = [(plan.kernel, (xd, yd, wd, bd, f32 if grad else xd), plan.ints, _cpp.roles(5, len(plan.ints), 1))]
    nparts = 0
    if grad:
        bplan = _bwd_plan(x.shape, x.stride(), x.stride(), x.dtype, k, has_w, has_b, is_rms, dev, cast_before_w)
        # The Gluon launch is decided on the eager (persist_ok) plan: the one whose reduce kernel the Python
        # path compiled (a plan of its own per key: the other plan's reduce Kernel is never launched).
        gspec = _gluon_cpp_spec(_bwd_plan(x.shape, x.stride(), x.stride(), x.dtype, k, has_w, has_b, is_rms, dev,
                                          cast_before_w, True), x, weight, has_w, has_b, is_rms, cast_before_w)
        if gspec is not None:  # the Gluon row backward (its kernel takes the Triton kernels' arguments)
            kernel, g, reduce_kernel, tmas = gspec
            m, n = bplan.m, bplan.n
            specs.append((kernel, (xd, xd, xd, wd, f32, f32), (m, n, n, n), _cpp.roles(6, 4, descs=len(tmas)), tmas))
            if reduce_kernel is not None:
                specs.append((reduce_kernel, (f32, wd, bd), (g, n), _cpp.roles(3, 2)))
            nparts = (int(has_w) + int(has_b)) * g * n
        elif bplan.stats_kernel is not None or bplan.copy_x or bplan.copy_dy:  # wide rows: the Python path
            return False
        else:
            # the eager launches (the ones the Python path compiled: programmatic dependents on sm_90 and newer)
            specs.append((bplan.eager_kernel, (xd, xd, xd, wd, f32, f32), bplan.ints, _cpp.roles(6, len(bplan.ints))))
            if bplan.eager_reduce is not None:
                specs.append((bplan.eager_reduce, (f32, wd, bd), (bplan.g, bplan.n), _cpp.roles(3, 2)))
            nparts = bplan.nparts
    handles = _cpp.register_all(dev, *specs)
    if not handles:
        return handles
    if not grad:
        nid = _cpp.register_plan("register_norm", handles[0], -1, -1, 0, 0, ycode)
    else:
        red = handles[2] if len(handles) > 2 else -1
        nid = _cpp.register_plan("register_norm", handles[0], handles[1], red, plan.nstats, nparts, ycode)
    if type(nid) is int and (out_dtype is None or out_dtype == torch.float32):
        # The F.layer_norm / F.rms_norm call of this shape (or fused_rms_norm_variant's: flags 4 / 8) now runs
        # in one C++ call (norm_fast, rms_variant_fast).
        ext = _cpp.extension()
        ext.set_rms_default_eps(*(_RMS_DEFAULT_EPS[d] for d in (torch.float16, torch.bfloat16, torch.float32)))
        n = math.prod(x.shape[x.dim() - k:])
        ext.bind_norm([x.numel() // n, n, _SCALAR_TYPE[xd], _SCALAR_TYPE[wd] if has_w else -1,
                       _SCALAR_TYPE[bd] if has_b else -1, dev,
                       int(is_rms) | (2 if grad else 0) | (4 if cast_before_w else 0)
                       | (8 if out_dtype is not None else 0)], nid)
    return nid


def _cpp_norm(x, weight, bias, k, eps, is_rms, grad, cast_before_w=False, out_dtype=None):
    """An eager call through the C++ fast path (ops/_cpp.py): with ``grad`` a C++ autograd node, else a
    forward without statistics; None: the Python path runs.  ``cast_before_w`` / ``out_dtype`` as in
    ``norm_forward`` (the RMSNorm variants).

    Contiguous, 16-byte aligned CUDA tensors with single-block rows only (the kernels were bound for those)."""
    if not x.is_cuda or not x.is_contiguous() or x.data_ptr() & 15:
        return None
    for p in (weight, bias):
        if p is not None and (not p.is_contiguous() or p.data_ptr() & 15):
            return None
    plan = _fwd_plan(x.shape, x.stride(), x.dtype, k, weight is not None, bias is not None, is_rms, grad, cast_before_w)
    if plan.kernel is None or plan.copy:
        return None
    wkey = (x.get_device(), None if weight is None else weight.dtype, None if bias is None else bias.dtype, out_dtype)
    nid = _cpp.plan_id(plan.cpp, wkey, _cpp_register, plan, x, weight, bias, k, is_rms, grad, cast_before_w, out_dtype)
    if nid is None:
        return None
    ext = _cpp.extension()
    return ext.norm_apply(x, weight, bias, eps, nid) if grad else ext.norm_infer(x, weight, bias, eps, nid)


def _dispatch(x, weight, bias, k, eps, is_rms):
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or (weight is not None and weight.requires_grad) or (bias is not None and bias.requires_grad)
    )
    if _cpp.ENABLED and _cpp.eager_ok():
        y = _cpp_norm(x, weight, bias, k, eps, is_rms, needs_grad)
        if y is not None:
            return y
    if needs_grad or is_compiling():
        return norm_op(x, weight, bias, k, eps, is_rms, needs_grad=needs_grad)
    return norm_forward(x, weight, bias, k, eps, is_rms, False)[0]  # inference: no statistics


# Under torch.compile the norms take their route from compile_config.COMPILED ("inductor" by default: Inductor's
# LayerNorm fuses the residual add and the casts around it; the number is there).  Eager calls always run the kernels.


def fused_layer_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Layer normalization over the last ``len(normalized_shape)`` dims, with Triton forward and backward.

    Same semantics as ``torch.nn.functional.layer_norm``: float32 statistics, output in the input's
    dtype (contiguous), weight / bias in the input's dtype or float32, autocast handled like
    ``layer_norm``.  float64 inputs, and devices where Triton cannot run, use PyTorch.
    """
    if _cpp.ENABLED:  # a registered shape: one C++ call
        shape = (normalized_shape,) if type(normalized_shape) is int else normalized_shape
        y = _cpp.fast_call("norm_fast", input, shape, weight, bias, eps, False)
        if y is not None:
            return y
    shape, k = _validate(_LN, input, normalized_shape, weight, bias)
    if is_compiling() and compile_config.COMPILED.layer_norm == "inductor":
        return F.layer_norm(input, shape, weight, bias, eps)
    x = input
    if _any_autocast():
        x, weight, bias = _autocast_cast("layer_norm", x, weight, bias)
    if x.dtype == torch.float64 or ((not x.is_cuda or type(x) not in _PLAIN) and use_fallback(_LN, x, weight)):
        return F.layer_norm(x, shape, weight, bias, eps)
    return _dispatch(x, weight, bias, k, float(eps), False)


def fused_rms_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
) -> torch.Tensor:
    """RMS normalization over the last ``len(normalized_shape)`` dims, with Triton forward and backward.

    Same semantics as ``torch.nn.functional.rms_norm``: ``eps=None`` means the eps PyTorch uses then
    (documented as ``torch.finfo(input.dtype).eps``; PyTorch 2.x kernels take float32's epsilon for
    half-precision inputs, and this follows whatever the installed PyTorch does), output in the input's
    dtype, autocast handled like ``rms_norm``.
    """
    if _cpp.ENABLED:  # a registered shape: one C++ call
        shape = (normalized_shape,) if type(normalized_shape) is int else normalized_shape
        y = _cpp.fast_call("norm_fast", input, shape, weight, None, eps, True)
        if y is not None:
            return y
    shape, k = _validate(_RMS, input, normalized_shape, weight, None)
    if is_compiling() and compile_config.COMPILED.rms_norm == "inductor":
        return F.rms_norm(input, shape, weight, eps)
    x = input
    if _any_autocast():
        x, weight, _ = _autocast_cast("rms_norm", x, weight, None)
    if x.dtype == torch.float64 or ((not x.is_cuda or type(x) not in _PLAIN) and use_fallback(_RMS, x, weight)):
        return F.rms_norm(x, shape, weight, eps)
    if eps is None:
        eps = _RMS_DEFAULT_EPS[x.dtype]
    return _dispatch(x, weight, None, k, float(eps), True)
