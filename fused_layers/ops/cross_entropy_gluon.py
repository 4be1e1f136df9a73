r"""The cross-entropy of 16-bit rows of at most 32,768 classes in Gluon with TMA, the row held in shared memory: the
default of ops/cross_entropy.py for such rows on an sm_90 GPU (cross_entropy_config.TMA_HOLD).  GPU only (Gluon has
no interpreter).

Why.  The Triton kernels keep the bytes in flight in registers or in cp.async slots that the threads issue
themselves, and the persistent kernel exchanges every row's statistics between programs.  TMA moves a whole box per
instruction from one thread into shared memory and signals an mbarrier when it has landed: here a 64 KB ring (NBUF
chunks of SUB x BOX columns) holds a whole row of up to 32,768 bf16 classes, so one program reads its row once,
from HBM, and computes both passes from shared memory, three 4-warp CTAs an SM.

Schedule (one warpgroup a CTA, a persistent grid of a few CTAs an SM, each walking rows pid, pid + G, ...).  Each
row is cut into nc = cdiv(C, CHUNK) chunks of CHUNK = SUB x BOX columns, each one TMA box of (1, SUB, BOX) over the
(M, C / BOX, BOX) view of the logits into one buffer of the ring (one mbarrier each).  The program's loads form one
stream in the order it consumes them: row r's chunks, then row r + 1's.  Pass 1 waits for the row's chunks in place
(the ring holds them all); pass 2 reads each chunk again from shared memory, then refills its buffer with the next
row's chunk, so the next row streams in while this one's gradient is written.

Math (online softmax, base 2): pass 1 keeps a running max m (base-2 units, as rounded: m = fl(max(x) log2 e)) and
sum s for each group of VEC values a thread holds (no shuffle, no cross-warp reduction a chunk), over the chunks x_c,

    m' = max(m, fl(max(x_c) log2 e)),    s' = s * 2^(m - m') + sum 2^(x_c log2 e - m'),

the last exponent one FMA; m' = -inf is read as 0 in the exponents (a group that starts with -inf and turns finite
never makes -inf - -inf).  Once a row, the groups combine: M = max m_i, S = sum s_i 2^(m_i - M), and lse2 = M +
log2 S.  Keeping m as rounded makes the rescale 2^(m - m') exactly 1 where the max did not move; a fused
x log2 e - fl(m log2 e) drifts by the rounding of m at every chunk (one value 4 % off at logits near 4e4).  With w_t
the target's weight (1 without weights) and D the mean's denominator (1 for sum),

    loss = w_t (lse2 ln 2 - x_t) / D,    dx_j = w_t (2^(x_j log2 e - lse2) - [j = t]) / D,

an ignored row has loss 0 and gradient 0 * p (NaN where p is, as torch), an out-of-range target NaN (the caller
raises from launch_den's count).  The gradient chunks go out by TMA stores from NOUT output buffers.  Columns past C
in the last chunk: the TMA load fills zeros, which are masked to -inf; its store clips them.

Scope: a 2-D (M, C) view with unit column stride, rows 16-byte aligned, C a multiple of BOX; ``supported`` says
whether the tensor qualifies, ops/cross_entropy.py checks the rest.
"""

from __future__ import annotations

import torch

from ._library import Kernel

try:  # Gluon: Triton >= 3.5 with the NVIDIA Hopper dialect
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = True
except Exception:  # pragma: no cover - depends on the installed Triton
    HAS_GLUON = False

_LOG2E = gl.constexpr(1.4426950408889634) if HAS_GLUON else 1.4426950408889634
_LN2 = gl.constexpr(0.6931471805599453) if HAS_GLUON else 0.6931471805599453


if HAS_GLUON:

    @gluon.jit
    def _issue(x_desc, ring, bars, j, total, C, pid, G, SUB: gl.constexpr, BOX: gl.constexpr, NBUF: gl.constexpr):
        """Load j of this program's stream (if j < total) into ring buffer j % NBUF: row pid + (j // C) G, chunk
        j % C, as one (1, SUB, BOX) box over the (M, C / BOX, BOX) view (sub-rows past the row's end: zeros)."""
        live = j < total
        slot = j % NBUF
        r = j // C
        chunk = (j - r * C) % C
        row = pid + r * G
        col0 = chunk * (SUB * BOX)
        bar = bars.index(slot)
        mbarrier.expect(bar, x_desc.block_type.nbytes, pred=live)
        tma.async_copy_global_to_shared(x_desc, [row, col0 // BOX, 0], bar, ring.index(slot), pred=live)

    @gluon.jit
    def _chunk(buf):
        """A (1, SUB, BOX) ring / output buffer as (SUB, BOX)."""
        return buf.reshape([buf.shape[1], buf.shape[2]])

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
        log2 e), so that a rescale 2^(m - m') is exact (1 where the max did not move); each value's term
        2^(x log2 e - m') is one FMA.  A max of -inf is read as 0 in the exponents."""
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
        -inf read as 0 (an all -inf row: S = 0, and lse2 = -inf)."""
        m_row = gl.max(gl.max(m, axis=1), axis=0)
        m_use = gl.where(m_row == -float("inf"), 0.0, m_row)
        return m_row, gl.sum(gl.sum(s * gl.exp2(m - m_use), axis=1), axis=0)

    @gluon.jit
    def _buffers(desc, n: gl.constexpr, SUB: gl.constexpr, BOX: gl.constexpr):
        """``n`` chunk buffers of (1, SUB, BOX) for TMA through ``desc``."""
        return gl.allocate_shared_memory(desc.dtype, [n, 1, SUB, BOX], desc.layout)

    @gluon.jit
    def _ring_barriers(NBUF: gl.constexpr):
        """One initialized mbarrier per ring buffer."""
        bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NBUF):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        return bars

    @gluon.jit
    def _store_chunk(desc, ob, v, row, col0, BOX: gl.constexpr, NOUT: gl.constexpr):
        """Store the chunk ``v`` (SUB x BOX values, columns col0...) of ``row`` by TMA through output buffer ``ob``,
        once the stores that last read ``ob`` (NOUT chunks ago) are done with it."""
        tma.store_wait(pendings=NOUT - 1)
        gl.thread_barrier()
        _chunk(ob).store(v.to(desc.dtype))
        fence_async_shared()
        gl.thread_barrier()  # every warp's part is written before the stores read it
        tma.async_copy_shared_to_global(desc, [row, col0 // BOX, 0], ob)

    @gluon.jit
    def _ce_fwd_tma_kernel(
        X,  # logits (M, C), row stride sx: the target logits are read from it directly
        T,  # int64 [M] class-index targets
        W,  # [C] class weights, read when HAS_WEIGHT
        DEN,  # float32 [2] (ops/cross_entropy.launch_den): [0] the weighted mean's denominator D, read when MEAN
        LOSS,  # float32 [M] (written): each row's loss, divided by D when MEAN
        x_desc,  # TMA descriptor of the logits over (M, C / BOX, BOX), block (1, SUB, BOX)
        g_desc,  # TMA descriptor of the gradient (M, C) contiguous, the same view and block
        M,  # rows
        C,  # classes (the row width, a multiple of BOX)
        sx,  # the logits' row stride
        ignore_index,
        HAS_WEIGHT: gl.constexpr,
        MEAN: gl.constexpr,
        SUB: gl.constexpr,  # boxes' sub-rows a chunk
        BOX: gl.constexpr,  # columns a sub-row (<= 256, TMA's limit)
        NBUF: gl.constexpr,  # chunk buffers of the load ring: NBUF x SUB x BOX >= C (the row held)
        NOUT: gl.constexpr,  # chunk buffers of the gradient (stores in flight)
        VEC: gl.constexpr,  # elements a thread reads from shared memory at once (16 bytes)
        num_warps: gl.constexpr,
    ):
        """Cross-entropy with class-index targets (no label smoothing): loss and gradient, each row read once into
        the ring and held there for both passes (the module docstring has the math)."""
        CHUNK: gl.constexpr = SUB * BOX
        # A chunk in registers: SUB rows of BOX columns, each warp a few rows, VEC contiguous columns a thread.
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [num_warps, 1], [1, 0])
        # The same chunk as (SUB, BOX / VEC, VEC) groups of VEC values a thread (pass 1's running statistics).
        L3: gl.constexpr = gl.BlockedLayout([1, 1, VEC], [1, 32, 1], [num_warps, 1, 1], [2, 1, 0])
        # Shared memory: the load ring, the output buffers, one mbarrier per load buffer.
        ring = _buffers(x_desc, NBUF, SUB, BOX)
        outb = _buffers(g_desc, NOUT, SUB, BOX)
        bars = _ring_barriers(NBUF)

        pid = gl.program_id(0)
        G = gl.num_programs(0)
        nc = gl.cdiv(C, CHUNK)
        n_rows = gl.cdiv(M - pid, G)  # rows pid, pid + G, ... (the grid has at most M programs)
        total = n_rows * nc  # loads of this program: each chunk of each of its rows once
        # Step 1: fill the ring.
        for i in gl.static_range(NBUF):
            _issue(x_desc, ring, bars, i, total, nc, pid, G, SUB, BOX, NBUF)
        if MEAN:
            scale = 1.0 / gl.load(DEN)
        else:
            scale = 1.0

        cols = _chunk_cols(SUB, BOX, layout)
        j = 0  # the stream's load of the row's first chunk
        o = 0  # gradient chunks stored so far
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
            # Step 2 (pass 1): running max and sum (base 2, log2 e folded in); chunk c of the row sits in load
            # j + c, its buffer kept for pass 2.
            m, s = _group_stats(SUB, BOX // VEC, L3)
            for c in range(nc):
                jc = j + c
                slot = jc % NBUF
                mbarrier.wait(bars.index(slot), phase=(jc // NBUF) & 1)
                x = _chunk(ring.index(slot)).load(layout).to(gl.float32)
                m, s = _max_sum_chunk(x, m, s, c * CHUNK, cols, C, CHUNK, VEC, L3)
            m, s = _row_max_sum(m, s)
            lse2 = gl.where(m == -float("inf"), 0.0, m) + gl.log2(s)  # base-2 lse (an all -inf row: -inf)
            loss = gl.where(ign, 0.0, w_t * (lse2 * _LN2 - x_t))
            loss = gl.where(bad, float("nan"), loss) * scale
            gl.store(LOSS + row, loss)
            coef = gl.where(ign, 0.0, w_t * scale)
            coef = gl.where(bad, float("nan"), coef)
            # Step 3 (pass 2): dx = coef (p - [j = t]) from the held chunks, stored by TMA; each buffer, once read,
            # takes the next row's chunk.
            for c in range(nc):
                slot = j % NBUF
                x = _chunk(ring.index(slot)).load(layout).to(gl.float32)
                gl.thread_barrier()
                _issue(x_desc, ring, bars, j + NBUF, total, nc, pid, G, SUB, BOX, NBUF)
                j += 1
                p = gl.exp2(x * _LOG2E - lse2)
                g = coef * (p - gl.where(c * CHUNK + cols == tt, 1.0, 0.0))
                _store_chunk(g_desc, outb.index(o % NOUT), g, row, c * CHUNK, BOX, NOUT)
                o += 1
        tma.store_wait(pendings=0)
        for i in gl.static_range(NBUF):
            mbarrier.invalidate(bars.index(i))


def supported(x: torch.Tensor) -> str | None:
    """None when the TMA kernel takes ``x`` (2-D (M, C) rows), else why not."""
    if not HAS_GLUON:
        return "Gluon is not available in this Triton"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return "needs an sm_90 (Hopper) GPU"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {x.dtype} not bf16 / fp16"
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        return "needs a non-empty 2-D (rows, columns) view"
    if x.stride(1) != 1 or (x.stride(0) * x.element_size()) % 16 or x.data_ptr() % 16:
        return "rows must have unit column stride and start 16-byte aligned"
    return None


_LAUNCHES: dict = {}


def _desc(t: torch.Tensor, sub: int, box: int):
    """TMA descriptor of 2-D rows ``t`` (C % BOX == 0) as boxes of (1, SUB, BOX) over its (M, C / BOX, BOX) view."""
    M, C = t.shape
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8 * t.element_size(), rank=3)
    return TensorDescriptor(t, [M, C // box, box], [t.stride(0), box, 1], [1, sub, box], layout)


def ce_launch(x: torch.Tensor, t: torch.Tensor, weight: torch.Tensor | None, ignore_index: int, den: torch.Tensor,
              mean: bool, rows: torch.Tensor, grad: torch.Tensor, config) -> bool:
    """The TMA cross-entropy on checked arguments (ops/cross_entropy.py): per-row losses into ``rows`` (float32 (M,),
    divided by den[0] when ``mean``), the gradient into ``grad`` ((M, C) contiguous, x's dtype); ``t`` int64 (M,)
    contiguous, ``den`` launch_den's, ``config`` a ``cross_entropy_config.TmaHold`` that holds C.  False (nothing
    launched) where ``supported`` declines x."""
    if supported(x) is not None:
        return False
    M, C = x.shape
    key = (x.shape, x.stride(), x.dtype, x.device, config, weight is not None, bool(mean))
    plan = _LAUNCHES.get(key)
    if plan is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        kernel = Kernel(_ce_fwd_tma_kernel, (min(M, config.per_sm * sms),), HAS_WEIGHT=weight is not None,
                        MEAN=bool(mean), SUB=config.sub, BOX=config.box, NBUF=config.nbuf, NOUT=config.nout,
                        VEC=16 // x.element_size(), num_warps=config.num_warps)
        descs = [_desc(x, config.sub, config.box), _desc(grad, config.sub, config.box)]
        plan = (kernel, descs)
        if len(_LAUNCHES) >= 256:
            _LAUNCHES.clear()
        _LAUNCHES[key] = plan
    kernel, descs = plan
    descs[0].base, descs[1].base = x, grad
    kernel(x, t, weight if weight is not None else x, den, rows, *descs, M, C, x.stride(0), ignore_index)
    descs[0].base = descs[1].base = None
    return True
