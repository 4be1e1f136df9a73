r"""A prototype, measured and not adopted (session 23, issue10/run30_a/: 0.28-0.72 of copy against the default's 0.69-0.93).

The wide-row softmax forward over a thread-block cluster (issue 10): one row per cluster of K CTAs, each CTA
holding a P-column piece of the row in registers, the row's statistics exchanged through distributed shared memory.

Why.  The single-block forward (one row per CTA, held in registers) reaches 0.91-0.95 of the copy ceiling at 16K
bf16 columns; wider rows do not fit one CTA's registers, and the split-row forms that exchange statistics through
global memory (ops/softmax.py's persistent kernels) stop at 0.80.  On Hopper the K CTAs of a cluster are
co-scheduled by the hardware (no persistent grid needed to avoid a deadlock) and can read each other's shared
memory: the exchange is one ``gl.convert_layout`` from a layout split over the cluster's CTAs to one replicated in
every CTA, which Triton lowers to ``mapa`` + ``ld.shared::cluster`` between two cluster barriers.

Math (one pass over the data, the row kept in registers).  CTA k holds x_k (P columns, masked to -inf past N):

    m_k = max x_k,    s_k = sum exp(x_k - m_k)                        (local, within the CTA)
    M = max_k m_k,    S = sum_k s_k exp(m_k - M)                      (after the exchange, in every CTA)
    y = exp(x - M - log S)                                            (one FMA and one exp2 a value, base 2)

A piece wholly past N has m_k = -inf and s_k = 0 (read as 0 in the exponent).  Special values as torch.softmax: an
all -inf row gives S = 0 and NaN; a NaN or +inf makes the row NaN.

Requires Triton with cross-CTA ``convert_layout`` (3.8 and later; Triton 3.6 fails to lower ``nvvm.mapa`` for it)
and sm_90 (clusters).  ``supported`` says whether this Triton and device qualify.
"""

from __future__ import annotations

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAS_GLUON = True
except Exception:  # pragma: no cover - depends on the installed Triton
    HAS_GLUON = False

LOG2E = 1.4426950408889634


def triton_has_cluster_exchange() -> bool:
    """Triton >= 3.8 lowers a cross-CTA ``convert_layout`` through distributed shared memory."""
    if not HAS_GLUON:
        return False
    major, minor = (int(v) for v in triton.__version__.split(".")[:2])
    return (major, minor) >= (3, 8)


if HAS_GLUON:
    _LOG2E = gl.constexpr(LOG2E)

    @gluon.constexpr_function
    def _piece_layout(K, VEC, num_warps):
        # [K, P]: dim 0 (the piece) split over the K CTAs of the cluster; dim 1 (the columns) over one CTA's threads,
        # VEC contiguous values a thread (16-byte loads).
        bases = [[1 << i, 0] for i in range(K.bit_length() - 1)]
        return gl.BlockedLayout([1, VEC], [1, 32], [1, num_warps], [1, 0], cga_layout=bases)

    @gluon.constexpr_function
    def _replicated_layout(K, num_warps):
        # [K] held whole by every thread of every CTA (the cluster bases map to 0: a broadcast over the CTAs).
        bases = [[0] for _ in range(K.bit_length() - 1)]
        return gl.BlockedLayout([K], [32], [num_warps], [0], cga_layout=bases)

    @gluon.constexpr_function
    def _replicated_pair_layout(K, num_warps):
        # [K, 2] (m, s) pairs held whole by every thread of every CTA.
        bases = [[0, 0] for _ in range(K.bit_length() - 1)]
        return gl.BlockedLayout([K, 2], [32, 1], [num_warps, 1], [1, 0], cga_layout=bases)

    @gluon.jit
    def _max16(a, b):
        return gl.where(a.to(gl.float32) > b.to(gl.float32), a, b)

    @gluon.jit
    def _bits_to_f32(x):
        if x.dtype == gl.bfloat16:
            return (x.to(gl.uint16, bitcast=True).to(gl.uint32) << 16).to(gl.float32, bitcast=True)
        else:
            return x.to(gl.float32)

    @gluon.jit
    def _softmax_fwd_cluster_kernel(
        x_ptr,  # *T: input rows (M, N), row stride stride_x, unit column stride
        y_ptr,  # *T: output rows (M, N), row stride stride_y
        N,  # i32: columns
        stride_x,  # i32: elements between input rows
        stride_y,  # i32: elements between output rows
        K: gl.constexpr,  # CTAs a cluster = pieces a row (a power of two, <= 8)
        P: gl.constexpr,  # columns a piece (a power of two; K * P >= N)
        VEC: gl.constexpr,  # contiguous values a thread (16 bytes)
        HOLD_RAW: gl.constexpr,  # hold the piece as loaded (16-bit) and convert in each pass
        JOIN: gl.constexpr = True,  # exchange m and s as pairs
        DIAG: gl.constexpr = 0,  # timing diagnostic, wrong output by design: 1 = no exchange (each piece normalized
        # by its own statistics), still launched as a cluster
    ):
        L: gl.constexpr = _piece_layout(K, VEC, gl.num_warps())
        R: gl.constexpr = _replicated_layout(K, gl.num_warps())
        R2: gl.constexpr = _replicated_pair_layout(K, gl.num_warps())
        row = gl.program_id(0).to(gl.int64)  # one row a cluster
        piece = gl.arange(0, K, layout=gl.SliceLayout(1, L))
        cols = gl.arange(0, P, layout=gl.SliceLayout(0, L))
        offs = piece[:, None] * P + cols[None, :]  # [K, P]: this CTA's piece of the row (the others' rows are not its)
        mask = offs < N

        # Step 1: load the piece (masked columns -inf: the identity of the max; exp of them is 0 for the sum).
        raw = gl.load(x_ptr + row * stride_x + offs, mask=mask, other=float("-inf"))

        # Step 2: the piece's max and sum of exp (base 2), within the CTA.
        if HOLD_RAW:  # 16-bit row held as loaded (two values a register): max in its dtype (exact), converted per pass
            m = gl.reduce(raw, 1, _max16).to(gl.float32)
        else:
            raw = raw.to(gl.float32)
            m = gl.max(raw, axis=1)  # [K], this CTA's entry only
        m_z = gl.where(m == float("-inf"), 0.0, m)
        s = gl.sum(gl.exp2((raw.to(gl.float32) - m_z[:, None]) * _LOG2E), axis=1)

        # Step 3: exchange (m_k, s_k) over the cluster (distributed shared memory), combine in every CTA.
        if DIAG == 1:  # no exchange: each piece normalized by its own statistics
            M_z = m_z[:, None]
            ls = gl.log2(s)[:, None]
        else:
            if JOIN:  # one exchange of (m, s) pairs: two cluster barriers instead of four
                mr, sr = gl.split(gl.convert_layout(gl.join(m, s), R2))
            else:
                mr = gl.convert_layout(m, R)
                sr = gl.convert_layout(s, R)
            M = gl.max(mr, axis=0)
            M_z = gl.where(M == float("-inf"), 0.0, M)
            S = gl.sum(sr * gl.exp2((mr - M_z) * _LOG2E), axis=0)
            ls = gl.log2(S)  # y = 2^((x - M) log2 e - log2 S)

        # Step 4: write y (a held 16-bit row converted again, through its bits: not merged with step 2's conversion).
        xf = _bits_to_f32(raw) if HOLD_RAW else raw
        y = gl.exp2((xf - M_z) * _LOG2E - ls)
        gl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
