r"""LayerNorm / RMSNorm backward for rows of 16,384 columns in Gluon (sm_90): a row in shared memory.

Why.  At 16K a row does not fit one program's registers together with the dW / dB accumulators of its columns.
The Triton kernels (ops/layer_norm.py) then either read x and dy twice (the two-pass form, 0.47 of the copy
bandwidth) or split each row across co-resident programs that exchange their partial row sums through global
flags (the persistent form, LayerNorm 0.65 / RMSNorm 0.79; the exchange is the cost).  Here a row lives in shared
memory instead, and one CTA of 16 warps an SM, persistent over rows pid, pid + G, ..., works on whole rows:

  * each row's x and dy arrive whole by TMA (R / B boxes of (1, B, 256) each over the (M, N / 256, 256) view, B =
    ``box_rows(R)``: R itself at 4K, 8K and 16K, 16 at 12K, as TMA boxes and shared buffers must be powers of two)
    into a ring of STAGES row buffers, so the next rows are in flight while one is worked on (64 KB a stage at bf16
    16K);
  * pass 1 reads the row from shared memory, a slice of W (num_warps, 256) at a time, and sums into per-thread
    partials; one CTA-wide reduction then gives c1 = sum(g xhat) / N and c2 = sum(g) / N (g = w dy; RMSNorm: c2 = 0);
  * pass 2 reads it again and writes dx = rstd (g - xhat c1 - c2) = (g - xhat c1) rstd - c2 rstd (two FMAs) from
    registers (16-byte stores), and adds dy * xhat and dy into register accumulators of the thread's columns (REPS
    slices of (num_warps, 256): 8 values a thread and slice; named dw0..dw3 / db0..db3, since a register tensor
    cannot be indexed by a slice number);
  * W is loaded once into shared memory; at the end each CTA writes its dW / dB partial row, and layer_norm's
    fixed-order reduce (_norm_reduce_partials_kernel) sums the G rows: deterministic, no atomics, no exchange.

x and dy are read from DRAM once, dx written once.  LayerNorm's row sums are the instruction-bound part (27
instructions a value against RMSNorm's 20), so its form differs:

  * the mean is folded into the row sums and xhat: pass 1 sums g x and c1 = rstd / N (sum(g x) - mean sum(g)), as
    aten's CUDA LayerNorm backward does; pass 2 takes xhat = x rstd - mean rstd (one FMA): 0.814 of copy against
    0.800 without;
  * the two row sums cross warps through one shared buffer, one barrier a row: 0.795 of copy against 0.769 with two
    CTA-wide reductions.  RMSNorm, one sum, keeps its CTA-wide reduction (0.873 against 0.815-0.820 with the buffer).

The kernel is launched as a programmatic dependent (it waits for the previous kernel on the device) and lets its
dW / dB reduce launch once its rows are done: LayerNorm 0.819 of copy against 0.792, RMSNorm 0.878 against 0.857
(do_bench of fwd+bwd minus fwd).  Eager calls go through the C++ fast path (ops/_cpp.py), which encodes the three
host descriptors at each launch (cuTensorMapEncodeTiled, as Triton's launcher does).

Scope: bf16 / fp16 / fp32 x, N a multiple of 256 with R = N / 256 sub-rows a multiple of 16 and at most 64, 16-byte
aligned rows, W in x's dtype or float32, no CAST_BEFORE_W; layer_norm_config.BWD_GLUON says where it is the default.
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

BOX = 256  # columns a TMA box row (TMA's limit)
WARPS = 16  # warps a CTA: one CTA an SM
STAGES = 2  # rows in the shared-memory ring
SMEM_BYTES = 227 * 1024 - 1024  # sm_90's shared memory a CTA, less the barriers and the reductions' scratch


if HAS_GLUON:

    @gluon.jit
    def _gdc_wait():
        """griddepcontrol.wait (triton.language.extra.cuda.gdc_wait, in Gluon): under a programmatic dependent launch,
        wait for the previous kernel and see its stores; a no-op otherwise."""
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _gdc_launch_dependents():
        """griddepcontrol.launch_dependents: the next kernel, a programmatic dependent, may launch (it still waits)."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _slice_terms(xs, dys, ws, layout: gl.constexpr, HAS_W: gl.constexpr):
        """One (num_warps, 256) slice of the row from shared memory: (dy, x, g = w dy) in float32."""
        x = xs.load(layout).to(gl.float32)
        dy = dys.load(layout).to(gl.float32)
        if HAS_W:
            g = dy * ws.load(layout).to(gl.float32)
        else:
            g = dy
        return dy, x, g

    @gluon.jit
    def _slice_sums(xs, dys, ws, s1, s2, layout: gl.constexpr, IS_RMS: gl.constexpr, HAS_W: gl.constexpr):
        """Pass 1 over one slice: s1 += g * x, and LayerNorm's s2 += g (per thread; rstd and the mean are applied to
        the row sums, once a row instead of once a value)."""
        dy, x, g = _slice_terms(xs, dys, ws, layout, HAS_W)
        if IS_RMS:
            return s1 + g * x, s2
        return s1 + g * x, s2 + g

    @gluon.jit
    def _slice_dx(xs, dys, ws, mean_rstd, rstd, c1, c2r, dw, db, DX, offs, layout: gl.constexpr,
                  IS_RMS: gl.constexpr, HAS_W: gl.constexpr, HAS_B: gl.constexpr):
        """Pass 2 over one slice: xhat = x rstd - mean rstd (LayerNorm; one FMA) or x rstd, dx = (g - xhat c1) rstd -
        c2 rstd (c2r = c2 rstd; two FMAs) stored at DX + offs; returns the slice's dW / dB accumulators plus dy xhat,
        dy."""
        dy, x, g = _slice_terms(xs, dys, ws, layout, HAS_W)
        if IS_RMS:
            xhat = x * rstd
        else:
            xhat = x * rstd - mean_rstd
        if IS_RMS:
            dx = (g - xhat * c1) * rstd
        else:
            dx = (g - xhat * c1) * rstd - c2r
        gl.store(DX + offs, dx.to(DX.dtype.element_ty))
        if HAS_W:
            dw = dw + dy * xhat
        if HAS_B:
            db = db + dy
        return dw, db

    @gluon.jit
    def _store_parts(DWP, DBP, pid, N, offs, dw, db, HAS_W: gl.constexpr, HAS_B: gl.constexpr):
        """One slice of this program's dW / dB partial rows."""
        if HAS_W:
            gl.store(DWP + pid.to(gl.int64) * N + offs, dw)
        if HAS_B:
            gl.store(DBP + pid.to(gl.int64) * N + offs, db)

    @gluon.jit
    def _sub_rows(ring, base, K: gl.constexpr, BOX_R: gl.constexpr, NW: gl.constexpr):
        """Sub-rows [K, K + NW) of a row held as boxes of BOX_R sub-rows at ring[base], ring[base + 1], ..., as an
        (NW, 256) view: within one box, as BOX_R is a multiple of NW."""
        return ring.index(base + K // BOX_R).reshape([BOX_R, 256]).slice(K % BOX_R, NW)

    @gluon.jit
    def _issue_row(x_desc, dy_desc, x_ring, dy_ring, bars, i, n_rows, pid, G, NB: gl.constexpr,
                   STAGES: gl.constexpr):
        """Row i of this program (row pid + i G), if it has one, into ring slot i % STAGES (its NB boxes at ring
        indices slot NB, ..., slot NB + NB - 1): x and dy on one mbarrier."""
        BOX_R: gl.constexpr = x_desc.block_type.shape[1]
        live = i < n_rows
        slot = i % STAGES
        row = pid + i * G
        bar = bars.index(slot)
        mbarrier.expect(bar, NB * (x_desc.block_type.nbytes + dy_desc.block_type.nbytes), pred=live)
        for j in gl.static_range(NB):
            tma.async_copy_global_to_shared(x_desc, [row, j * BOX_R, 0], bar, x_ring.index(slot * NB + j), pred=live)
            tma.async_copy_global_to_shared(dy_desc, [row, j * BOX_R, 0], bar, dy_ring.index(slot * NB + j), pred=live)

    @gluon.jit
    def _norm_bwd_rows_gluon_kernel(
        X,  # x, (M, N) rows of stride sx (unit column stride, 16-byte aligned rows): read by TMA
        DY,  # dy, (M, N) rows of stride sdy, the same
        DX,  # dx, (M, N) contiguous, x's dtype (written)
        W,  # weight [N] in x's dtype or float32 (HAS_W; else any pointer)
        STATS,  # float32 forward statistics: LayerNorm means at [0, M), 1/std at [M, 2M); RMSNorm 1/std at [0, M)
        PARTS,  # float32 partials: [G, N] dW rows (HAS_W), then [G, N] dB rows (HAS_B); G = the grid
        M,  # rows
        N,  # columns, R * 256
        sx,  # x's row stride (elements)
        sdy,  # dy's row stride (elements)
        x_desc,  # host TMA descriptor of x over its (M, N / 256, 256) view, box (1, BOX_R, 256): box_rows(R)
        dy_desc,  # host TMA descriptor of dy, the same
        w_desc,  # host TMA descriptor of the weight over (N / 256, 256), box (BOX_R, 256) (HAS_W; else x_desc)
        IS_RMS: gl.constexpr,
        HAS_W: gl.constexpr,
        HAS_B: gl.constexpr,
        R: gl.constexpr,  # sub-rows of 256 a row; REPS = R / num_warps slices of (num_warps, 256)
        VEC: gl.constexpr,  # elements a thread reads at once (16 bytes)
        STAGES: gl.constexpr,  # rows in the ring
        X_BITS: gl.constexpr,  # bits of an x element (16 / 32)
        W_BITS: gl.constexpr,  # bits of a weight element
        PDL_TRIGGER: gl.constexpr,  # let the dependent dW / dB reduce launch once this program's rows are done
        num_warps: gl.constexpr = 16,
    ):
        REPS: gl.constexpr = R // num_warps
        # A row arrives as NB TMA boxes of BOX_R sub-rows (box dims and shared buffers must be powers of two).
        BOX_R: gl.constexpr = x_desc.block_type.shape[1]
        NB: gl.constexpr = R // BOX_R
        gl.static_assert(NB * BOX_R == R and BOX_R % num_warps == 0, "BOX_R must divide R, num_warps divide BOX_R")
        _gdc_wait()  # (programmatic dependent launch) before any memory of the previous kernel's is read or written
        XL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=X_BITS, rank=3)
        WL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=W_BITS, rank=2)
        dtype: gl.constexpr = X.dtype.element_ty
        # A slice in registers: num_warps sub-rows of 256 columns, a warp a sub-row, VEC contiguous columns a thread.
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [num_warps, 1], [1, 0])
        if IS_RMS:
            RSTD = STATS
        else:
            RSTD = STATS + M
        if HAS_W:
            DBP = PARTS + gl.num_programs(0).to(gl.int64) * N
        else:
            DBP = PARTS

        # LayerNorm: the warps' row-sum partials, read whole by every thread (layout ALL: each thread all of them).
        ALL: gl.constexpr = gl.BlockedLayout([num_warps], [32], [num_warps], [0])
        if not IS_RMS:
            sums1 = gl.allocate_shared_memory(gl.float32, [num_warps], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
            sums2 = gl.allocate_shared_memory(gl.float32, [num_warps], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))

        # Shared memory: the row ring (x and dy, NB boxes and one mbarrier a slot) and the weight (NB boxes).
        x_ring = gl.allocate_shared_memory(dtype, [STAGES * NB, 1, BOX_R, 256], XL)
        dy_ring = gl.allocate_shared_memory(dtype, [STAGES * NB, 1, BOX_R, 256], XL)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        if HAS_W:
            w_smem = gl.allocate_shared_memory(W.dtype.element_ty, [NB, BOX_R, 256], WL)
            w_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(w_bar, count=1)
        fence_async_shared()

        pid = gl.program_id(0)
        G = gl.num_programs(0)
        n_rows = gl.cdiv(M - pid, G)  # rows pid, pid + G, ... (the grid has at most M programs)

        # Each thread's columns of slice k: k * num_warps * 256 + (its sub-row) * 256 + (its columns).
        offs = (gl.expand_dims(gl.arange(0, num_warps, layout=gl.SliceLayout(1, layout)), 1) * 256
                + gl.expand_dims(gl.arange(0, 256, layout=gl.SliceLayout(0, layout)), 0))
        SL: gl.constexpr = num_warps * 256  # columns a slice

        # Step 1: the weight once, the first STAGES rows.
        if HAS_W:
            gl.static_assert(w_desc.block_type.shape[0] == BOX_R, "the weight's box must have x's sub-rows")
            mbarrier.expect(w_bar, NB * w_desc.block_type.nbytes)
            for j in gl.static_range(NB):
                tma.async_copy_global_to_shared(w_desc, [j * BOX_R, 0], w_bar, w_smem.index(j))
        for s in gl.static_range(STAGES):
            _issue_row(x_desc, dy_desc, x_ring, dy_ring, bars, s, n_rows, pid, G, NB, STAGES)
        if HAS_W:
            mbarrier.wait(w_bar, phase=0)
            ws = w_smem
        else:
            ws = x_ring  # (never read: HAS_W is False)
        dw0 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
        dw1 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
        dw2 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
        dw3 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
        db0 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
        db1 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
        db2 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
        db3 = gl.zeros([num_warps, 256], gl.float32, layout=layout)

        for i in range(n_rows):
            row = pid + i * G
            slot = i % STAGES
            rstd = gl.load(RSTD + row)  # (issued before the wait: latency hidden)
            if IS_RMS:
                mean = 0.0
            else:
                mean = gl.load(STATS + row)
            mbarrier.wait(bars.index(slot), phase=(i // STAGES) & 1)
            box0 = slot * NB  # this row's first box in the ring

            # Step 2 (pass 1): the row sums s1 = sum(g x), s2 = sum(g).  0 is the identity of both.
            s1 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
            s2 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
            for k in gl.static_range(REPS):
                s1, s2 = _slice_sums(_sub_rows(x_ring, box0, k * num_warps, BOX_R, num_warps),
                                     _sub_rows(dy_ring, box0, k * num_warps, BOX_R, num_warps),
                                     _sub_rows(ws, 0, k * num_warps, BOX_R, num_warps), s1, s2, layout, IS_RMS, HAS_W)
            if IS_RMS:
                # c1 = sum(g xhat) / N = rstd sum(g x) / N
                c1 = gl.sum(gl.sum(s1, axis=1), axis=0) * (rstd / N)
                c2r = 0.0
            else:
                # Each warp's sums (a warp a sub-row: intra-warp shuffles), then one exchange for both: every warp
                # writes its two partials, one barrier, every thread reads all 2 x num_warps and adds them.  The
                # buffer is written again only after the next step-4 barrier, so no second barrier is needed.
                sums1.store(gl.sum(s1, axis=1))
                sums2.store(gl.sum(s2, axis=1))
                gl.thread_barrier()
                c1 = gl.sum(sums1.load(ALL), axis=0) * (rstd / N)
                c2r = gl.sum(sums2.load(ALL), axis=0) * (rstd / N)  # c2 rstd
                # s1 summed g x: rstd / N sum(g (x - mean)) = rstd / N (sum(g x) - mean sum(g)) = c1 - mean c2r.
                # Pass 2 then takes mean rstd for its xhat = x rstd - mean rstd.
                c1 = c1 - mean * c2r
                mean = mean * rstd

            # Step 3 (pass 2): dx, and the dW / dB accumulators of this thread's columns.
            dxp = DX + row.to(gl.int64) * N + offs
            dw0, db0 = _slice_dx(_sub_rows(x_ring, box0, 0, BOX_R, num_warps),
                                 _sub_rows(dy_ring, box0, 0, BOX_R, num_warps),
                                 _sub_rows(ws, 0, 0, BOX_R, num_warps), mean, rstd, c1, c2r, dw0, db0, dxp, 0, layout,
                                 IS_RMS, HAS_W, HAS_B)
            if REPS > 1:
                k1: gl.constexpr = num_warps
                dw1, db1 = _slice_dx(_sub_rows(x_ring, box0, k1, BOX_R, num_warps),
                                     _sub_rows(dy_ring, box0, k1, BOX_R, num_warps),
                                     _sub_rows(ws, 0, k1, BOX_R, num_warps), mean, rstd, c1, c2r, dw1, db1, dxp,
                                     SL, layout, IS_RMS, HAS_W, HAS_B)
            if REPS > 2:
                k2: gl.constexpr = 2 * num_warps
                dw2, db2 = _slice_dx(_sub_rows(x_ring, box0, k2, BOX_R, num_warps),
                                     _sub_rows(dy_ring, box0, k2, BOX_R, num_warps),
                                     _sub_rows(ws, 0, k2, BOX_R, num_warps), mean, rstd, c1, c2r, dw2, db2, dxp,
                                     2 * SL, layout, IS_RMS, HAS_W, HAS_B)
            if REPS > 3:
                k3: gl.constexpr = 3 * num_warps
                dw3, db3 = _slice_dx(_sub_rows(x_ring, box0, k3, BOX_R, num_warps),
                                     _sub_rows(dy_ring, box0, k3, BOX_R, num_warps),
                                     _sub_rows(ws, 0, k3, BOX_R, num_warps), mean, rstd, c1, c2r, dw3, db3, dxp,
                                     3 * SL, layout, IS_RMS, HAS_W, HAS_B)

            # Step 4: every warp has read the slot: fetch row i + STAGES into it.
            gl.thread_barrier()
            _issue_row(x_desc, dy_desc, x_ring, dy_ring, bars, i + STAGES, n_rows, pid, G, NB, STAGES)

        if PDL_TRIGGER:  # the reduce may launch now; it waits for this whole grid (and its stores) on the device
            _gdc_launch_dependents()
        # Step 5: this program's partial rows of dW and dB.
        for k in gl.static_range(REPS):  # (a static index: dw{k} / db{k} picked at compile time)
            dw = dw0 if k == 0 else (dw1 if k == 1 else (dw2 if k == 2 else dw3))
            db = db0 if k == 0 else (db1 if k == 1 else (db2 if k == 2 else db3))
            _store_parts(PARTS, DBP, pid, N, offs + k * SL, dw, db, HAS_W, HAS_B)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        if HAS_W:
            mbarrier.invalidate(w_bar)


def width_reason(N: int, dtype: torch.dtype, w_dtype: torch.dtype | None) -> str | None:
    """None when the kernel takes rows of N columns of ``dtype`` with a weight of ``w_dtype`` (None: no weight), by
    the rules that need no tensor (dtype, width, shared memory), else why not; ``supported`` adds the tensors'."""
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return "x and dy must share a dtype of bf16, fp16 or fp32"
    R = N // BOX
    if N % BOX or R % WARPS or not 0 < R <= 4 * WARPS:
        return f"width {N} must be a multiple of {BOX * WARPS} up to {4 * BOX * WARPS}"
    if w_dtype is not None and w_dtype not in (dtype, torch.float32):
        return "the weight must be contiguous, 16-byte aligned, in x's dtype or float32"
    ring = STAGES * 2 * N * dtype.itemsize + (0 if w_dtype is None else N * w_dtype.itemsize)
    if ring > SMEM_BYTES:
        return f"the ring and the weight ({ring} bytes) do not fit in shared memory"
    return None


def supported(x: torch.Tensor, dy: torch.Tensor, w: torch.Tensor | None, cast_before_w: bool = False) -> str | None:
    """None when the Gluon row backward takes (M, N) rows ``x`` / ``dy`` (unit column stride) with weight ``w``,
    else why not."""
    if not HAS_GLUON:
        return "no Gluon in this Triton"
    if not (x.is_cuda and torch.cuda.get_device_capability(x.device)[0] == 9):
        return "not an sm_90 GPU"
    if cast_before_w:
        return "CAST_BEFORE_W is not implemented here"
    if dy.dtype != x.dtype:
        return "x and dy must share a dtype of bf16, fp16 or fp32"
    M, N = x.shape
    why = width_reason(N, x.dtype, None if w is None else w.dtype)
    if why is not None or M == 0:
        return why or "no rows"
    for t in (x, dy):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return "rows must have unit column stride and 16-byte aligned starts"
    if w is not None and (not w.is_contiguous() or w.data_ptr() % 16):
        return "the weight must be contiguous, 16-byte aligned, in x's dtype or float32"
    return None


def _layout(dtype: torch.dtype, rank: int):
    bits = 32 if dtype == torch.float32 else 16
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=rank)


_KERNELS: dict = {}


def bwd_kernel(M: int, N: int, sx: int, sdy: int, dtype: torch.dtype, w_dtype: torch.dtype | None, has_b: bool,
               is_rms: bool, programs: int) -> Kernel:
    """The launch plan (a ``Kernel``: grid, constexprs) of the row backward of (M, N) rows of row strides sx / sdy
    over ``programs`` CTAs (at most one an SM; at most M), for rows ``supported`` took.  One object a plan; the launch
    passes host descriptors (``norm_backward_rows``; the C++ fast path encodes its own from ``cpp_descriptors``)."""
    G = max(1, min(programs, M))
    key = (M, N, sx, sdy, dtype, w_dtype, has_b, is_rms, G)
    kernel = _KERNELS.get(key)
    if kernel is None:
        if len(_KERNELS) > 256:
            _KERNELS.clear()
        bits = torch.finfo(dtype).bits
        kernel = _KERNELS[key] = Kernel(
            _norm_bwd_rows_gluon_kernel, (G,), launch_pdl=True, IS_RMS=is_rms, HAS_W=w_dtype is not None,
            HAS_B=has_b, R=N // BOX, VEC=16 * 8 // bits, STAGES=STAGES, X_BITS=bits,
            W_BITS=torch.finfo(w_dtype).bits if w_dtype is not None else bits,
            PDL_TRIGGER=w_dtype is not None or has_b, num_warps=WARPS)
    return kernel


_DESCS: dict = {}  # host descriptors a plan (their base pointer swapped in at each call)


def box_rows(R: int) -> int:
    """Sub-rows of 256 columns a TMA box holds for rows of R sub-rows: the largest power of two that divides R (R
    itself at 4K, 8K and 16K; 16 at 12K, whose row then arrives in 3 boxes), as every dimension of a TMA box (Gluon's
    TensorDescriptor and the kernel's block types) must be a power of two."""
    if R <= 0:
        raise ValueError(f"a row of {R} sub-rows of {BOX} columns has no TMA box")
    return min(R & -R, 256)


def descriptor_layouts(M: int, N: int, sx: int, sdy: int, has_w: bool) -> tuple:
    """The kernel's three host descriptors (x_desc, dy_desc, w_desc) over (M, N) rows of row strides sx / sdy: per
    descriptor (index of its base among the kernel's pointers X, DY, DX, W, ...; shape; strides; box), the box
    ``box_rows`` sub-rows of 256 (the kernel issues R / box of them a row).  Built into TensorDescriptors by
    ``norm_backward_rows``; the C++ fast path encodes the same shapes and strides (ops/_cpp.py ``register``), with
    the box from the compiled kernel's descriptor types.  Without a weight the third is x's again (never read: HAS_W
    is compiled in)."""
    R = N // BOX
    B = box_rows(R)
    x_l = (0, [M, R, BOX], [sx, BOX, 1], [1, B, BOX])
    return x_l, (1, [M, R, BOX], [sdy, BOX, 1], [1, B, BOX]), (3, [R, BOX], [BOX, 1], [B, BOX]) if has_w else x_l


def cpp_descriptors(M: int, N: int, has_w: bool) -> tuple:
    """``descriptor_layouts`` of contiguous rows as the C++ fast path takes them: (pointer index, shape, strides)."""
    return tuple(lay[:3] for lay in descriptor_layouts(M, N, N, N, has_w))


def host_descriptors(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, w: torch.Tensor | None) -> list:
    """The kernel's TensorDescriptors (x_desc, dy_desc, w_desc) over (M, N) rows ``x`` / ``dy`` and the weight ``w``
    (None: x's again), as ``descriptor_layouts`` lays them out; Gluon checks each box here (powers of two)."""
    M, N = x.shape
    ptrs = (x, dy, dx, x if w is None else w)
    return [TensorDescriptor(ptrs[i], shape, strides, box, _layout(ptrs[i].dtype, len(shape)))
            for i, shape, strides, box in descriptor_layouts(M, N, x.stride(0), dy.stride(0), w is not None)]


def norm_backward_rows(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, w: torch.Tensor | None, stats: torch.Tensor,
                       has_b: bool, is_rms: bool, programs: int) -> tuple[torch.Tensor, int]:
    """dx (written into ``dx``, (M, N) contiguous) and the float32 dW / dB partial rows of ``programs`` CTAs (at most
    one an SM; at most M), for rows ``supported`` took.  Returns (partials, G) for layer_norm's fixed-order reduce."""
    M, N = x.shape
    kernel = bwd_kernel(M, N, x.stride(0), dy.stride(0), x.dtype, None if w is None else w.dtype, has_b, is_rms,
                        programs)
    G = kernel.grid[0]
    nparts = (int(w is not None) + int(has_b)) * G * N
    parts = torch.empty((nparts,), dtype=torch.float32, device=x.device) if nparts else stats
    wp = x if w is None else w
    descs = _DESCS.get(kernel)
    if descs is None:
        descs = host_descriptors(x, dy, dx, w)
        if len(_DESCS) > 256:
            _DESCS.clear()
        _DESCS[kernel] = descs
    for d, t in zip(descs, (x, dy, wp)):
        d.base = t
    kernel(x, dy, dx, wp, stats, parts, M, N, x.stride(0), dy.stride(0), *descs)
    for d in descs:
        d.base = None
    return parts, G
