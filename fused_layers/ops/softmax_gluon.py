r"""The wide-row softmax forward in Gluon with TMA (issue 10): a candidate, opt-in (``config_override("softmax",
wide_mode=3)``) until the H200 says it wins.  GPU only (Gluon has no interpreter), sm_90.  Its cross-entropy with the
row held in the ring (HOLD) is the default of 16-bit rows of at most 32,768 classes since session 23
(``cross_entropy_config.TMA_HOLD``: 0.76 / 0.80 of copy by do_bench / graph replay at 32,000 against the persistent
kernel's 0.69 / 0.72).

Why.  The Triton wide-row kernels (ops/softmax.py) reach 0.69-0.80 of the copy ceiling in bf16.  ncu (session 9,
issue10/run13_ncu/): the register form keeps about 32 KB in flight per SM, 55% of the DRAM peak, and every byte in
flight costs registers or cp.async slots that the threads issue themselves.  TMA moves a whole box per instruction
from one thread into shared memory and signals an mbarrier when it has landed: the bytes in flight are bounded by
shared memory (here 64 KB a CTA, two CTAs an SM), not by registers.

Schedule (one warpgroup a CTA, a persistent grid of a few CTAs an SM, each walking rows pid, pid + G, ...).  Each
row is cut into C = cdiv(N, CHUNK) chunks of CHUNK = SUB x BOX columns; a chunk arrives as SUB TMA boxes of
(1, BOX) into one buffer of a ring of NBUF buffers (one mbarrier each).  The program's loads form one stream, in
the order it consumes them: row r's chunks 0..C-1 (pass 1), the same chunks again (pass 2), then row r + 1's.
The ring is refilled as soon as a buffer has been read into registers, so the next NBUF chunks are always in
flight, across pass and row boundaries (no bubble between rows).  Pass 2 re-reads a chunk read one row earlier by
this SM: from L2 while the SMs' rows in flight fit there (H200: 50 MB, 132 x 2 rows of 128 KB at 64K bf16).

Math (online softmax, base 2): pass 1 keeps a running max m (base-2 units, as rounded: m = fl(max(x) log2 e)) and
sum s for each group of VEC values a thread holds (no shuffle, no cross-warp reduction a chunk), over the chunks x_c,

    m' = max(m, fl(max(x_c) log2 e)),    s' = s * 2^(m - m') + sum 2^(x_c log2 e - m'),

the last exponent one FMA; m' = -inf is read as 0 in the exponents (a group that starts with -inf and turns finite
never makes -inf - -inf).  Once a row, the groups combine: M = max m_i, S = sum s_i 2^(m_i - M).  Pass 2 writes
y = 2^(x log2 e - b), b = M + log2 S (one FMA and one exp2 a value), through a ring of NOUT output buffers stored by
TMA.  Keeping m as rounded makes the rescale 2^(m - m') exactly 1 where the max did not move; a fused
x log2 e - fl(m log2 e) there drifts by the rounding of m at every chunk (one value 4 % off at logits near 4e4,
session 16).  (Also measured in session 16 and removed: three passes over a held row, max / sum / y, 0.72 of copy
against the online form's 0.77 at 32K.)  Special values as torch.softmax: an all -inf row gives NaN (S = 0); a NaN or +inf makes the row
NaN.  Columns beyond N in the last chunk: the TMA load fills zeros, which are masked to -inf; its store clips them.

Scope: a 2-D (M, N) view with unit column stride, rows 16-byte aligned (row stride x element size a multiple of
16), bf16 / fp16 / fp32.  ``supported`` says whether a call qualifies.
"""

from __future__ import annotations

import torch

from ._library import Kernel

try:  # Gluon: Triton >= 3.5 with the NVIDIA Hopper dialect
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = True
except Exception:  # pragma: no cover - depends on the installed Triton
    HAS_GLUON = False

LOG2E = 1.4426950408889634
_LOG2E = gl.constexpr(LOG2E) if HAS_GLUON else LOG2E
_LN2 = gl.constexpr(0.6931471805599453) if HAS_GLUON else 0.6931471805599453

# (element size) -> (SUB boxes a chunk, BOX columns a box, NBUF load buffers, NOUT output buffers, num_warps, CTAs an
# SM).  bf16: 16 x 256 = 4,096 columns (8 KB) a chunk, 8 in flight (64 KB) + 2 output (16 KB): two CTAs an SM.
CONFIGS = {2: (16, 256, 8, 2, 4, 2), 4: (8, 256, 8, 2, 4, 2)}


if HAS_GLUON:

    @gluon.jit
    def _issue(x_desc, ring, bars, j, total, C, pid, G, SUB: gl.constexpr, BOX: gl.constexpr, NBUF: gl.constexpr,
               PASSES: gl.constexpr = 2, col_base=0, FLAT: gl.constexpr = False):
        """Load j of this program's stream (if j < total) into ring buffer j % NBUF: row pid + (j // 2C) G, chunk
        (j % 2C) % C (pass 1 and pass 2 read the same chunks; PASSES = 1: each chunk once, HOLD), as SUB boxes of
        (1, BOX) on one mbarrier; ``col_base``: the first column of this program's segment (SPLIT)."""
        live = j < total
        slot = j % NBUF
        r = j // (PASSES * C)
        chunk = (j - r * PASSES * C) % C
        row = pid + r * G
        col0 = col_base + chunk * (SUB * BOX)
        bar = bars.index(slot)
        buf = ring.index(slot)
        if FLAT:  # one (1, SUB, BOX) box over the (M, N / BOX, BOX) view (N % BOX == 0; sub-rows past N: OOB)
            mbarrier.expect(bar, x_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(x_desc, [row, col0 // BOX, 0], bar, buf, pred=live)
        else:
            mbarrier.expect(bar, SUB * x_desc.block_type.nbytes, pred=live)
            for s in gl.static_range(SUB):
                tma.async_copy_global_to_shared(x_desc, [row, col0 + s * BOX], bar, buf.slice(s, 1), pred=live)

    @gluon.jit
    def _chunk(buf, FLAT: gl.constexpr):
        """A ring / output buffer as (SUB, BOX)."""
        if FLAT:
            return buf.reshape([buf.shape[1], buf.shape[2]])
        else:
            return buf

    @gluon.jit
    def _chunk_cols(SUB: gl.constexpr, BOX: gl.constexpr, layout: gl.constexpr):
        """The column of each value of a chunk in registers, relative to the chunk's first column."""
        return (gl.expand_dims(gl.arange(0, SUB, layout=gl.SliceLayout(1, layout)), 1) * BOX
                + gl.expand_dims(gl.arange(0, BOX, layout=gl.SliceLayout(0, layout)), 0))

    @gluon.jit
    def _groups(x, VEC: gl.constexpr, L3: gl.constexpr):
        """A chunk (SUB, BOX) in registers as (SUB, BOX / VEC, VEC): each thread's VEC contiguous values on the last
        axis (L3), so that a reduction over that axis stays inside the thread."""
        return gl.convert_layout(gl.reshape(x, [x.shape[0], x.shape[1] // VEC, VEC]), L3)

    @gluon.jit
    def _group_stats(SUB: gl.constexpr, G: gl.constexpr, L3: gl.constexpr):
        """Running (max, sum) a value group at the start of a row: (-inf, 0), shape (SUB, G) in SliceLayout(2, L3)."""
        lay: gl.constexpr = gl.SliceLayout(2, L3)
        return gl.full([SUB, G], -float("inf"), gl.float32, layout=lay), gl.zeros([SUB, G], gl.float32, layout=lay)

    @gluon.jit
    def _max_sum_step(x, m, s, VEC: gl.constexpr, L3: gl.constexpr):
        """The online softmax's step on a chunk ``x`` (SUB x BOX, natural units, masked columns -inf), per group of
        VEC values a thread holds: the running (max, sum) of each group, no shuffle and no cross-warp reduction (the
        groups are combined once a row, ``_row_max_sum``).  The max is kept in base-2 units as rounded, m = fl(max(x)
        log2 e), so that a rescale 2^(m - m') is exact (1 where the max did not move: a fused x log2 e - m' would
        drift by the rounding of m' at every chunk); each value's term 2^(x log2 e - m') is one FMA (pass 2 computes
        its numerator the same way).  A max of -inf is read as 0 in the exponents."""
        x3 = _groups(x, VEC, L3)
        m_new = gl.maximum(m, gl.max(x3, axis=2) * _LOG2E)
        m_use = gl.where(m_new == -float("inf"), 0.0, m_new)
        return m_new, s * gl.exp2(m - m_use) + gl.sum(gl.exp2(x3 * _LOG2E - gl.expand_dims(m_use, 2)), axis=2)

    @gluon.jit
    def _max_sum_chunk(x, m, s, col0, cols, N, CHUNK: gl.constexpr, VEC: gl.constexpr, L3: gl.constexpr):
        """``_max_sum_step`` on the chunk of columns col0.. (``cols`` relative to col0): a row's last chunk, reaching
        past N (loaded as zeros), is masked to -inf first; a whole chunk needs no mask."""
        if col0 + CHUNK > N:
            x = gl.where(col0 + cols < N, x, -float("inf"))
        return _max_sum_step(x, m, s, VEC, L3)

    @gluon.jit
    def _row_max_sum(m, s):
        """The row's (max, sum), base 2, from its groups' running ones: M = max m_i, S = sum s_i 2^(m_i - M), with M =
        -inf read as 0 (an all -inf row: S = 0, and y = 0 / 0 = NaN as torch)."""
        m_row = gl.max(gl.max(m, axis=1), axis=0)
        m_use = gl.where(m_row == -float("inf"), 0.0, m_row)
        return m_row, gl.sum(gl.sum(s * gl.exp2(m - m_use), axis=1), axis=0)

    @gluon.jit
    def _buffers(desc, n: gl.constexpr, SUB: gl.constexpr, BOX: gl.constexpr, FLAT: gl.constexpr):
        """``n`` chunk buffers of SUB x BOX for TMA through ``desc`` (FLAT: each one (1, SUB, BOX) box)."""
        if FLAT:
            return gl.allocate_shared_memory(desc.dtype, [n, 1, SUB, BOX], desc.layout)
        else:
            return gl.allocate_shared_memory(desc.dtype, [n, SUB, BOX], desc.layout)

    @gluon.jit
    def _ring_barriers(NBUF: gl.constexpr):
        """One initialized mbarrier per ring buffer."""
        bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NBUF):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        return bars

    @gluon.jit
    def _store_chunk(desc, ob, v, row, col0, SUB: gl.constexpr, BOX: gl.constexpr, NOUT: gl.constexpr,
                     FLAT: gl.constexpr = False):
        """Store the chunk ``v`` (SUB x BOX values, columns col0...) of ``row`` by TMA through output buffer ``ob``,
        once the stores that last read ``ob`` (NOUT chunks ago) are done with it."""
        if FLAT:
            tma.store_wait(pendings=NOUT - 1)
        else:
            tma.store_wait(pendings=(NOUT - 1) * SUB)
        gl.thread_barrier()
        _chunk(ob, FLAT).store(v.to(desc.dtype))
        fence_async_shared()
        gl.thread_barrier()  # every warp's part is written before the stores read it
        if FLAT:
            tma.async_copy_shared_to_global(desc, [row, col0 // BOX, 0], ob)
        else:
            for sb in gl.static_range(SUB):
                tma.async_copy_shared_to_global(desc, [row, col0 + sb * BOX], ob.slice(sb, 1))

    @gluon.jit
    def _softmax_fwd_tma_kernel(
        X,  # x's data (not read: the launch is bound on its dtype and alignment, ops/_library.Kernel)
        Y,  # y's data, (M, N) contiguous: written directly when not STORE_TMA (diagnostic)
        STATS,  # int64 [M * K], zeroed (SPLIT): each segment's packed (max, sum) word, its own flag
        x_desc,  # TMA descriptor of x, (M, N) with unit column stride, block (1, BOX)
        y_desc,  # TMA descriptor of y, (M, N) contiguous, block (1, BOX)
        M,  # rows
        N,  # columns (the softmax dim)
        K,  # segments a row (SPLIT; 1 otherwise)
        SEG,  # columns a segment, a multiple of SUB x BOX (SPLIT)
        SUB: gl.constexpr,  # boxes a chunk
        BOX: gl.constexpr,  # columns a box (<= 256, TMA's limit)
        NBUF: gl.constexpr,  # chunk buffers of the load ring (chunks in flight)
        NOUT: gl.constexpr,  # chunk buffers of output (stores in flight)
        VEC: gl.constexpr,  # elements a thread reads from shared memory at once (16 bytes)
        HOLD: gl.constexpr,  # the row stays in the ring between the passes (one read; needs NBUF >= chunks a row)
        SPLIT: gl.constexpr,  # a row split into K segments, one a program; the K programs exchange (max, sum)
        FLAT: gl.constexpr,  # descriptors over the (M, N / BOX, BOX) view, one (1, SUB, BOX) box a chunk
        STORE_TMA: gl.constexpr,  # y by TMA stores (else by plain stores from registers; diagnostic)
        num_warps: gl.constexpr,
    ):
        dtype: gl.constexpr = x_desc.dtype
        CHUNK: gl.constexpr = SUB * BOX
        # A chunk in registers: SUB rows of BOX columns, each warp a few rows, VEC contiguous columns a thread.
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [num_warps, 1], [1, 0])
        # The same chunk as (SUB, BOX / VEC, VEC) groups of VEC values a thread (pass 1's running statistics).
        L3: gl.constexpr = gl.BlockedLayout([1, 1, VEC], [1, 32, 1], [num_warps, 1, 1], [2, 1, 0])

        # Shared memory: the load ring, the output buffers, one mbarrier per load buffer.  FLAT: buffers of one
        # (1, SUB, BOX) box each.
        ring = _buffers(x_desc, NBUF, SUB, BOX, FLAT)
        outb = _buffers(y_desc, NOUT, SUB, BOX, FLAT)
        bars = _ring_barriers(NBUF)

        pid = gl.program_id(0)
        if SPLIT:  # program pid: segment pid % K of the rows of group pid // K (K co-resident programs a row)
            seg = pid % K
            g = pid // K
            G = gl.num_programs(0) // K
            col_base = seg * SEG
            C = gl.cdiv(gl.minimum(SEG, N - col_base), CHUNK)
        else:
            seg = 0
            g = pid
            G = gl.num_programs(0)
            col_base = 0
            C = gl.cdiv(N, CHUNK)
        n_rows = gl.cdiv(M - g, G)  # rows g, g + G, ... (the grid has at most M groups)
        PASSES: gl.constexpr = 1 if HOLD else 2
        total = n_rows * PASSES * C  # loads of this program: two passes over each of its rows (HOLD: one)

        # Step 1: fill the ring.
        for i in gl.static_range(NBUF):
            _issue(x_desc, ring, bars, i, total, C, g, G, SUB, BOX, NBUF, PASSES, col_base, FLAT)

        cols = _chunk_cols(SUB, BOX, layout)
        j = 0  # the next load of the stream to consume
        o = 0  # output chunks stored so far
        for r in range(n_rows):
            row = g + r * G
            # Step 2 (pass 1): the row's running max and sum, chunk by chunk.  HOLD (the row fits in the ring:
            # NBUF >= C): the buffers are kept for pass 2, released only there.
            m, s = _group_stats(SUB, BOX // VEC, L3)
            for c in range(C):
                slot = (j + c * HOLD) % NBUF
                mbarrier.wait(bars.index(slot), phase=((j + c * HOLD) // NBUF) & 1)
                x = _chunk(ring.index(slot), FLAT).load(layout).to(gl.float32)
                if not HOLD:
                    gl.thread_barrier()  # every warp has read the buffer: refill it
                    _issue(x_desc, ring, bars, j + NBUF, total, C, g, G, SUB, BOX, NBUF, PASSES, col_base, FLAT)
                    j += 1
                m, s = _max_sum_chunk(x, m, s, col_base + c * CHUNK, cols, N, CHUNK, VEC, L3)
            m, s = _row_max_sum(m, s)
            if SPLIT:
                # Publish this segment's (max, sum) as one int64 word (bits of m high, of s low: never 0, since s >= 1
                # where m is finite and m = -inf has bits), then combine the row's K words as they arrive.  The ring
                # keeps loading pass 2's chunks meanwhile.
                word = ((m.to(gl.uint32, bitcast=True).to(gl.uint64) << 32)
                        | s.to(gl.uint32, bitcast=True).to(gl.uint64))
                base = STATS + row.to(gl.int64) * K
                gl.store(base + seg, word.to(gl.int64, bitcast=True))
                m = gl.to_tensor(-float("inf"))
                s = gl.to_tensor(0.0)
                for k2 in range(K):
                    w = gl.load(base + k2, volatile=True)
                    while w == 0:
                        w = gl.load(base + k2, volatile=True)
                    u = w.to(gl.uint64, bitcast=True)
                    mk = (u >> 32).to(gl.uint32).to(gl.float32, bitcast=True)
                    sk = (u & 0xFFFFFFFF).to(gl.uint32).to(gl.float32, bitcast=True)
                    m_new = gl.maximum(m, mk)
                    m_use = gl.where(m_new == -float("inf"), 0.0, m_new)
                    s = s * gl.exp2(m - m_use) + sk * gl.exp2(mk - m_use)
                    m = m_new
            # y = 2^(x log2 e - b), b = m + log2 s (one FMA and one exp2 a value); an all -inf row (s = 0): NaN, as
            # 0 / 0.
            b = gl.where(m == -float("inf"), 0.0, m) + gl.log2(s)
            b = gl.where(s == 0.0, float("nan"), b)
            # Step 3 (pass 2): y = 2^(x log2 e - b), stored by TMA from the output buffers.
            for c in range(C):
                slot = j % NBUF
                if not HOLD:
                    mbarrier.wait(bars.index(slot), phase=(j // NBUF) & 1)
                x = _chunk(ring.index(slot), FLAT).load(layout).to(gl.float32)
                gl.thread_barrier()
                _issue(x_desc, ring, bars, j + NBUF, total, C, g, G, SUB, BOX, NBUF, PASSES, col_base, FLAT)
                j += 1
                y = gl.exp2(x * _LOG2E - b)
                if STORE_TMA:
                    _store_chunk(y_desc, outb.index(o % NOUT), y, row, col_base + c * CHUNK, SUB, BOX, NOUT, FLAT)
                    o += 1
                else:
                    cc = col_base + c * CHUNK + cols
                    gl.store(Y + row.to(gl.int64) * N + cc, y.to(dtype), mask=cc < N)
        tma.store_wait(pendings=0)
        for i in gl.static_range(NBUF):
            mbarrier.invalidate(bars.index(i))


    @gluon.jit
    def _ce_fwd_tma_kernel(
        X,  # logits (M, C), row stride sx: the target logits are read from it directly
        T,  # int64 [M] class-index targets
        W,  # [C] class weights, read when HAS_WEIGHT
        DEN,  # float32 [2] (ops/cross_entropy.launch_den): [0] the weighted mean's denominator D, read when MEAN
        LOSS,  # float32 [M] (written): each row's loss, divided by D when MEAN
        x_desc,  # TMA descriptor of the logits, block (1, BOX)
        g_desc,  # TMA descriptor of the gradient (M, C) contiguous, block (1, BOX)
        M,  # rows
        C,  # classes (the row width)
        sx,  # the logits' row stride
        ignore_index,
        HAS_WEIGHT: gl.constexpr,
        MEAN: gl.constexpr,
        SUB: gl.constexpr,  # boxes a chunk
        BOX: gl.constexpr,  # columns a box
        NBUF: gl.constexpr,  # chunk buffers of the load ring
        NOUT: gl.constexpr,  # chunk buffers of the gradient
        VEC: gl.constexpr,  # elements a thread reads from shared memory at once
        FLAT: gl.constexpr,  # one (1, SUB, BOX) box a chunk over (M, C / BOX, BOX) (the forward's FLAT)
        HOLD: gl.constexpr,  # the row stays in the ring between the passes (one read; needs NBUF >= chunks a row)
        num_warps: gl.constexpr,
    ):
        """Cross-entropy with class-index targets (no label smoothing): loss and gradient in one stream, the
        softmax forward's schedule (pass 1 the row's max and sum, pass 2 the gradient; HOLD as the forward's).  With
        lse = m + ln s, w_t the target's weight (1 without weights) and D the mean's denominator (1 for sum):
        loss = w_t (lse - x_t) / D and dx_j = w_t (p_j - [j = t]) / D, p_j = exp(x_j - lse); an ignored row
        has loss 0 and gradient 0 * p (NaN where p is, as torch); an out-of-range target NaN (the caller raises
        from launch_den's count)."""
        dtype: gl.constexpr = x_desc.dtype
        CHUNK: gl.constexpr = SUB * BOX
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [num_warps, 1], [1, 0])
        L3: gl.constexpr = gl.BlockedLayout([1, 1, VEC], [1, 32, 1], [num_warps, 1, 1], [2, 1, 0])
        ring = _buffers(x_desc, NBUF, SUB, BOX, FLAT)
        outb = _buffers(g_desc, NOUT, SUB, BOX, FLAT)
        bars = _ring_barriers(NBUF)

        pid = gl.program_id(0)
        G = gl.num_programs(0)
        nc = gl.cdiv(C, CHUNK)
        n_rows = gl.cdiv(M - pid, G)
        PASSES: gl.constexpr = 1 if HOLD else 2
        total = n_rows * PASSES * nc
        for i in gl.static_range(NBUF):
            _issue(x_desc, ring, bars, i, total, nc, pid, G, SUB, BOX, NBUF, PASSES, 0, FLAT)
        if MEAN:
            scale = 1.0 / gl.load(DEN)
        else:
            scale = 1.0

        cols = _chunk_cols(SUB, BOX, layout)
        j = 0
        o = 0
        for r in range(n_rows):
            row = pid + r * G
            # The row's target, its weight and logit (read before any gradient of the row is written).
            t = gl.load(T + row)
            ign = t == ignore_index
            bad = (t != ignore_index) & ((t < 0) | (t >= C))
            tt = gl.where(ign | bad, 0, t)
            x_t = gl.load(X + row.to(gl.int64) * sx + tt).to(gl.float32)
            if HAS_WEIGHT:
                w_t = gl.load(W + tt).to(gl.float32)
            else:
                w_t = 1.0
            # Pass 1: running max and sum (base 2, log2 e folded in).
            m, s = _group_stats(SUB, BOX // VEC, L3)
            for c in range(nc):
                if HOLD:  # chunk c of the row sits in load j + c (its buffers are kept for pass 2, released there)
                    jc = j + c
                else:
                    jc = j
                slot = jc % NBUF
                mbarrier.wait(bars.index(slot), phase=(jc // NBUF) & 1)
                x = _chunk(ring.index(slot), FLAT).load(layout).to(gl.float32)
                if not HOLD:
                    gl.thread_barrier()
                    _issue(x_desc, ring, bars, j + NBUF, total, nc, pid, G, SUB, BOX, NBUF, PASSES, 0, FLAT)
                    j += 1
                m, s = _max_sum_chunk(x, m, s, c * CHUNK, cols, C, CHUNK, VEC, L3)
            m, s = _row_max_sum(m, s)
            lse2 = gl.where(m == -float("inf"), 0.0, m) + gl.log2(s)  # base-2 lse (an all -inf row: -inf)
            loss = gl.where(ign, 0.0, w_t * (lse2 * _LN2 - x_t))
            loss = gl.where(bad, float("nan"), loss) * scale
            gl.store(LOSS + row, loss)
            coef = gl.where(ign, 0.0, w_t * scale)
            coef = gl.where(bad, float("nan"), coef)
            # Pass 2: dx = coef (p - [j = t]), stored by TMA.
            for c in range(nc):
                slot = j % NBUF
                if not HOLD:
                    mbarrier.wait(bars.index(slot), phase=(j // NBUF) & 1)
                x = _chunk(ring.index(slot), FLAT).load(layout).to(gl.float32)
                gl.thread_barrier()
                _issue(x_desc, ring, bars, j + NBUF, total, nc, pid, G, SUB, BOX, NBUF, PASSES, 0, FLAT)
                j += 1
                p = gl.exp2(x * _LOG2E - lse2)
                g = coef * (p - gl.where(c * CHUNK + cols == tt, 1.0, 0.0))
                _store_chunk(g_desc, outb.index(o % NOUT), g, row, c * CHUNK, SUB, BOX, NOUT, FLAT)
                o += 1
        tma.store_wait(pendings=0)
        for i in gl.static_range(NBUF):
            mbarrier.invalidate(bars.index(i))


    @gluon.jit
    def _issue2(a_desc, b_desc, ring_a, ring_b, bars, j, total, C, pid, G, SUB: gl.constexpr, BOX: gl.constexpr,
                NBUF: gl.constexpr, FLAT: gl.constexpr = False):
        """_issue for two streams read side by side (the backward's y and dy): one mbarrier for both chunks."""
        live = j < total
        slot = j % NBUF
        r = j // (2 * C)
        chunk = (j - r * 2 * C) % C
        row = pid + r * G
        col0 = chunk * (SUB * BOX)
        bar = bars.index(slot)
        buf_a = ring_a.index(slot)
        buf_b = ring_b.index(slot)
        if FLAT:
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(a_desc, [row, col0 // BOX, 0], bar, buf_a, pred=live)
            tma.async_copy_global_to_shared(b_desc, [row, col0 // BOX, 0], bar, buf_b, pred=live)
        else:
            mbarrier.expect(bar, SUB * (a_desc.block_type.nbytes + b_desc.block_type.nbytes), pred=live)
            for s in gl.static_range(SUB):
                tma.async_copy_global_to_shared(a_desc, [row, col0 + s * BOX], bar, buf_a.slice(s, 1), pred=live)
                tma.async_copy_global_to_shared(b_desc, [row, col0 + s * BOX], bar, buf_b.slice(s, 1), pred=live)

    @gluon.jit
    def _softmax_bwd_tma_kernel(
        Y,  # y's data (not read: the launch is bound on its dtype and alignment, ops/_library.Kernel)
        y_desc,  # TMA descriptor of the forward's output y, (M, N) unit column stride, block (1, BOX)
        dy_desc,  # TMA descriptor of the incoming gradient dy, (M, N) unit column stride, block (1, BOX)
        dx_desc,  # TMA descriptor of dx, (M, N) contiguous, block (1, BOX)
        M,  # rows
        N,  # columns
        SUB: gl.constexpr,
        BOX: gl.constexpr,
        NBUF: gl.constexpr,
        NOUT: gl.constexpr,
        VEC: gl.constexpr,
        FLAT: gl.constexpr,  # one (1, SUB, BOX) box a chunk and stream (the forward's FLAT)
        num_warps: gl.constexpr,
    ):
        """dx = y (dy - sum(y dy)) on the forward's schedule: pass 1 the row's dot, pass 2 dx (y and dy re-read)."""
        dtype: gl.constexpr = y_desc.dtype
        CHUNK: gl.constexpr = SUB * BOX
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [num_warps, 1], [1, 0])
        L3: gl.constexpr = gl.BlockedLayout([1, 1, VEC], [1, 32, 1], [num_warps, 1, 1], [2, 1, 0])
        ring_y = _buffers(y_desc, NBUF, SUB, BOX, FLAT)
        ring_d = _buffers(dy_desc, NBUF, SUB, BOX, FLAT)
        outb = _buffers(dx_desc, NOUT, SUB, BOX, FLAT)
        bars = _ring_barriers(NBUF)

        pid = gl.program_id(0)
        G = gl.num_programs(0)
        C = gl.cdiv(N, CHUNK)
        n_rows = gl.cdiv(M - pid, G)
        total = n_rows * 2 * C
        for i in gl.static_range(NBUF):
            _issue2(y_desc, dy_desc, ring_y, ring_d, bars, i, total, C, pid, G, SUB, BOX, NBUF, FLAT)
        j = 0
        o = 0
        for r in range(n_rows):
            row = pid + r * G
            dot = gl.zeros([SUB, BOX // VEC], gl.float32, layout=gl.SliceLayout(2, L3))  # per group, as the forward's
            for c in range(C):  # pass 1 (columns past N load as zeros: they add nothing)
                slot = j % NBUF
                mbarrier.wait(bars.index(slot), phase=(j // NBUF) & 1)
                y = _chunk(ring_y.index(slot), FLAT).load(layout).to(gl.float32)
                dy = _chunk(ring_d.index(slot), FLAT).load(layout).to(gl.float32)
                gl.thread_barrier()
                _issue2(y_desc, dy_desc, ring_y, ring_d, bars, j + NBUF, total, C, pid, G, SUB, BOX, NBUF, FLAT)
                j += 1
                dot += gl.sum(_groups(y * dy, VEC, L3), axis=2)
            dot = gl.sum(gl.sum(dot, axis=1), axis=0)
            for c in range(C):  # pass 2
                slot = j % NBUF
                mbarrier.wait(bars.index(slot), phase=(j // NBUF) & 1)
                y = _chunk(ring_y.index(slot), FLAT).load(layout).to(gl.float32)
                dy = _chunk(ring_d.index(slot), FLAT).load(layout).to(gl.float32)
                gl.thread_barrier()
                _issue2(y_desc, dy_desc, ring_y, ring_d, bars, j + NBUF, total, C, pid, G, SUB, BOX, NBUF, FLAT)
                j += 1
                dx = y * (dy - dot)
                _store_chunk(dx_desc, outb.index(o % NOUT), dx, row, c * CHUNK, SUB, BOX, NOUT, FLAT)
                o += 1
        tma.store_wait(pendings=0)
        for i in gl.static_range(NBUF):
            mbarrier.invalidate(bars.index(i))


def supported(x: torch.Tensor) -> str | None:
    """None when the TMA forward takes ``x`` (2-D (M, N) rows), else why not."""
    if not HAS_GLUON:
        return "Gluon is not available in this Triton"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return "needs an sm_90 (Hopper) GPU"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {x.dtype} not bf16 / fp16 / fp32"
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        return "needs a non-empty 2-D (rows, columns) view"
    if x.stride(1) != 1 or (x.stride(0) * x.element_size()) % 16 or x.data_ptr() % 16:
        return "rows must have unit column stride and start 16-byte aligned"
    return None


_LAUNCHES: dict = {}


def _layout(dtype: torch.dtype, rank: int = 2):
    bits = 32 if dtype == torch.float32 else 16
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=rank)


def _desc(t: torch.Tensor, sub: int, box: int, flat: bool):
    """TMA descriptor of 2-D rows ``t``: boxes of (1, BOX) over (M, N), or FLAT boxes of (1, SUB, BOX) over the
    (M, N / BOX, BOX) view (N % BOX == 0)."""
    M, N = t.shape
    if flat:
        return TensorDescriptor(t, [M, N // box, box], [t.stride(0), box, 1], [1, sub, box], _layout(t.dtype, 3))
    return TensorDescriptor(t, [M, N], [t.stride(0), 1], [1, box], _layout(t.dtype))


def _plan(x: torch.Tensor, config: tuple, ce: tuple | None = None, split: tuple = (1, 0), hold: bool = False,
          diag: tuple = (False, True)):
    """(bound kernel, [x descriptor, output descriptor]) for this shape: the softmax forward (``split`` = (K segments a
    row, SEG columns a segment), ``hold``), or with ``ce`` = (has weight, mean) the cross-entropy."""
    key = (x.shape, x.stride(), x.dtype, x.device, config, ce, split, hold, diag)
    plan = _LAUNCHES.get(key)
    if plan is not None:
        return plan
    M, N = x.shape
    sub, box, nbuf, nout, warps, per_sm = config[:6]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    descs = [_desc(x, sub, box, diag[0]), _desc(y, sub, box, diag[0])]  # (FLAT: N % BOX == 0, checked by the caller)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    meta = dict(SUB=sub, BOX=box, NBUF=nbuf, NOUT=nout, VEC=16 // x.element_size(), FLAT=diag[0], num_warps=warps)
    if ce is None:
        meta.update(STORE_TMA=diag[1])
        K = split[0]
        grid = min(M, per_sm * sms // K) * K  # whole groups of K programs, all co-resident (checked by the caller)
        kernel = Kernel(_softmax_fwd_tma_kernel, (grid,), HOLD=hold, SPLIT=K > 1, **meta)
    else:
        kernel = Kernel(_ce_fwd_tma_kernel, (min(M, per_sm * sms),), HAS_WEIGHT=ce[0], MEAN=ce[1], HOLD=hold, **meta)
    plan = (kernel, descs)
    if len(_LAUNCHES) >= 256:
        _LAUNCHES.clear()
    _LAUNCHES[key] = plan
    return plan


# The most shared memory an SM gives its CTAs (H100 / H200: 228 KB, 1 KB of it reserved per CTA).
_SMEM_PER_SM = 228 * 1024


def softmax_forward_tma(x: torch.Tensor, config: tuple | None = None) -> torch.Tensor:
    """y = softmax(x, dim=1) for a 2-D ``x`` that ``supported`` takes; y contiguous.  ``config``: (SUB, BOX, NBUF,
    NOUT, num_warps, CTAs an SM[, HOLD[, K]]): HOLD 1 keeps a row (segment) in the ring between the passes where it
    fits; K > 1 splits each row into K segments streamed by K co-resident programs that exchange their (max, sum)."""
    why = supported(x)
    if why is not None:
        raise ValueError(f"softmax_forward_tma: {why}")
    config = tuple(config or CONFIGS[x.element_size()])
    sub, box, nbuf, nout, warps, per_sm = config[:6]
    if box > 256 or (box * x.element_size()) % 16 or nbuf < 1 or nout < 1:
        raise ValueError(f"softmax_forward_tma: config {config}: BOX <= 256 with 16-byte boxes, NBUF, NOUT >= 1")
    M, N = x.shape
    chunk = sub * box
    k_req = config[7] if len(config) > 7 else 1
    seg = triton.cdiv(triton.cdiv(N, max(1, k_req)), chunk) * chunk
    K = triton.cdiv(N, seg)  # every segment non-empty
    if K > 1:
        # The K programs of a row wait for each other: all must be resident at once.  Shared memory per CTA (ring,
        # output buffers, about 2 KB of barriers and reduction scratch) and registers (<= 255 a thread) must fit
        # per_sm CTAs an SM, and the grid is at most per_sm CTAs an SM.
        smem = (nbuf + nout) * chunk * x.element_size() + 2048
        if per_sm * (smem + 1024) > _SMEM_PER_SM or per_sm * warps > 8:
            raise ValueError(f"softmax_forward_tma: config {config}: {per_sm} CTAs an SM do not fit for a split row")
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        if per_sm * sms < K:
            raise ValueError(f"softmax_forward_tma: {K} segments a row need {K} co-resident programs")
    hold = len(config) > 6 and bool(config[6]) and nbuf * chunk >= seg  # (else streamed: the row is too wide)
    # (session 15: a 9th entry 1 = FLAT, one (1, SUB, BOX) box a chunk where N % BOX == 0; a 10th 0 = plain stores of
    # y instead of TMA stores, a diagnostic)
    flat = len(config) > 8 and bool(config[8]) and N % box == 0
    store_tma = not (len(config) > 9 and not config[9])
    kernel, descs = _plan(x, config, None, (K, seg), hold, (flat, store_tma))
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    stats = torch.zeros(M * K if K > 1 else 1, dtype=torch.int64, device=x.device)
    descs[0].base, descs[1].base = x, y
    kernel(x, y, stats, *descs, M, N, K, seg)
    descs[0].base = descs[1].base = None
    return y


def ce_launch(x: torch.Tensor, t: torch.Tensor, weight: torch.Tensor | None, ignore_index: int, den: torch.Tensor,
              mean: bool, rows: torch.Tensor, grad: torch.Tensor, config: tuple | None = None) -> bool:
    """The TMA cross-entropy on checked arguments (ops/cross_entropy.py, WIDE_MODE 4): per-row losses into ``rows``
    (float32 (M,), divided by den[0] when ``mean``), the gradient into ``grad`` ((M, C) contiguous, x's dtype); ``t``
    int64 (M,) contiguous, ``den`` launch_den's.  False (nothing launched) where ``supported`` declines x."""
    if supported(x) is not None:
        return False
    M, C = x.shape
    config = tuple(config or CONFIGS[x.element_size()])
    flat = len(config) > 8 and bool(config[8]) and C % config[1] == 0  # (FLAT as the forward's)
    # HOLD (a 7th entry 1, as the forward's): the row kept in the ring between the passes where it fits, else streamed
    hold = len(config) > 6 and bool(config[6]) and config[2] * config[0] * config[1] >= C
    kernel, descs = _plan(x, config, (weight is not None, bool(mean)), hold=hold, diag=(flat, True))
    descs[0].base, descs[1].base = x, grad
    kernel(x, t, weight if weight is not None else x, den, rows, *descs, M, C, x.stride(0), ignore_index)
    descs[0].base = descs[1].base = None
    return True


def cross_entropy_tma(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                      ignore_index: int = -100, reduction: str = "mean", config: tuple | None = None):
    """(loss, grad) of F.cross_entropy(x, target, weight, ignore_index, reduction) for 2-D logits ``x`` that
    ``supported`` takes, class-index ``target`` (M,), reduction 'mean' or 'sum': the loss as a 0-d tensor in x's dtype,
    the gradient of the loss (upstream gradient 1) contiguous in x's dtype."""
    why = supported(x)
    if why is None and (target.dim() != 1 or target.shape[0] != x.shape[0] or target.is_floating_point()):
        why = "target must be (rows,) class indices"
    if why is None and reduction not in ("mean", "sum"):
        why = f"reduction {reduction!r} not 'mean' / 'sum'"
    if why is not None:
        raise ValueError(f"cross_entropy_tma: {why}")
    from .cross_entropy import _sum_kernel, check_target_flag, launch_den

    M, C = x.shape
    t = target.contiguous().to(torch.int64)
    den = launch_den(t, weight, M, C, ignore_index)
    check_target_flag(den, C)
    grad = torch.empty((M, C), dtype=x.dtype, device=x.device)
    rows = torch.empty(M, dtype=torch.float32, device=x.device)
    ce_launch(x, t, weight, ignore_index, den, reduction == "mean", rows, grad, config)
    loss = torch.empty((), dtype=x.dtype, device=x.device)
    _sum_kernel()(rows, loss, M)
    return loss, grad


BWD_CONFIGS = {2: (16, 256, 4, 2, 4, 2), 4: (8, 256, 4, 2, 4, 2)}


def softmax_backward_tma(y: torch.Tensor, dy: torch.Tensor, config: tuple | None = None) -> torch.Tensor:
    """dx = y * (dy - sum(y * dy, dim=1)) for 2-D ``y``, ``dy`` of one shape and dtype that ``supported`` takes."""
    why = supported(y) or supported(dy)
    if why is None and (dy.shape != y.shape or dy.dtype != y.dtype):
        why = "y and dy must have one shape and dtype"
    if why is not None:
        raise ValueError(f"softmax_backward_tma: {why}")
    M, N = y.shape
    config = tuple(config or BWD_CONFIGS[y.element_size()])
    sub, box, nbuf, nout, warps, per_sm = config[:6]
    flat = len(config) > 8 and bool(config[8]) and N % box == 0  # (FLAT as the forward's)
    key = ("bwd", y.shape, y.stride(), dy.stride(), y.dtype, y.device, config, flat)
    plan = _LAUNCHES.get(key)
    if plan is None:
        dx = torch.empty((M, N), dtype=y.dtype, device=y.device)
        descs = [_desc(y, sub, box, flat), _desc(dy, sub, box, flat), _desc(dx, sub, box, flat)]
        sms = torch.cuda.get_device_properties(y.device).multi_processor_count
        kernel = Kernel(_softmax_bwd_tma_kernel, (min(M, per_sm * sms),), SUB=sub, BOX=box, NBUF=nbuf, NOUT=nout,
                        VEC=16 // y.element_size(), FLAT=flat, num_warps=warps)
        plan = _LAUNCHES[key] = (kernel, descs)
    kernel, descs = plan
    dx = torch.empty((M, N), dtype=y.dtype, device=y.device)
    descs[0].base, descs[1].base, descs[2].base = y, dy, dx
    kernel(y, *descs, M, N)
    descs[0].base = descs[1].base = descs[2].base = None
    return dx
