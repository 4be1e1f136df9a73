r"""LayerNorm / RMSNorm backward for rows of up to 16,384 columns in Gluon (sm_90): issue 9's 16K backward.

The Triton kernels at 16K (ops/layer_norm.py) either read x and dy twice (the two-pass form, 0.47 of the copy ceiling)
or split each row across co-resident programs that exchange their partial row sums through global flags (the persistent
form, 0.65 LayerNorm / 0.78 RMSNorm; with no exchange at all, a wrong-answer diagnostic, 0.88-0.89: the exchange is the
cost).  A row does not fit one program's registers together with the dW / dB accumulators of its columns.

Here a row lives in shared memory instead.  One CTA of 16 warps an SM, persistent over rows pid, pid + G, ...:

  * each row's x and dy arrive whole by TMA (one (1, R, 256) box each over the (M, N / 256, 256) view) into a ring of
    STAGES row buffers, so the next rows are in flight while one is worked on (64 KB a stage at bf16 16K);
  * pass 1 reads the row from shared memory, a slice of W (num_warps, 256) at a time, and sums g * xc and g
    (g = w dy, xc = x - mean, mean / rstd saved by the forward; RMSNorm: xc = x) into per-thread partials, then one
    CTA-wide reduction gives c1 = sum(g xhat) / N = rstd sum(g xc) / N and c2 = sum(g) / N (RMSNorm: c2 = 0);
  * pass 2 reads it again and writes dx = rstd (g - xhat c1 - c2) = (g - xhat c1) rstd - c2 rstd (two FMAs) from
    registers (16-byte stores), xhat = xc rstd, and adds dy * xhat
    and dy into register accumulators of the thread's columns (REPS slices of (num_warps, 256): 8 values a thread and
    slice; named dw0..dw3 / db0..db3, since a register tensor cannot be indexed by a slice number);
  * W is loaded once into shared memory; at the end each CTA writes its dW / dB partial row, and layer_norm's
    fixed-order reduce (_norm_reduce_partials_kernel) sums the G rows: deterministic, no atomics, no exchange.

x and dy are read from DRAM once, dx written once.  Scope: bf16 / fp16 / fp32 x, N a multiple of 256 with R = N / 256
sub-rows a multiple of num_warps and at most 4 x num_warps (16K at 16 warps), 16-byte aligned rows, W in x's dtype or
float32, no CAST_BEFORE_W.

Variants (layer_norm_config.BWD_GLUON per width, config_override bwd_gluon_*): the ring's depth, dB accumulated in
shared memory, 32-warp CTAs, the weight held as float32, device-side TMA descriptors (DEVICE_DESC: the launch takes
pointers and ints only), the row sums' cross-warp step through one shared buffer (SMEM_SUMS) and the mean folded
into the row sums and xhat (FOLD_MEAN: pass 1 sums g x, c1 = rstd / N (sum(g x) - mean sum(g)) as aten's CUDA
LayerNorm backward does; pass 2 xhat = x rstd - mean rstd, one FMA).  LayerNorm 16K's default takes the last two.

Measured (H200, bf16, 2^26 elements; benchmarks/results/issue9/run25_c .. run26_h): graph replay LayerNorm 16K 0.81
(SMEM_SUMS + FOLD_MEAN; 0.77 with neither) against the persistent kernel's 0.65, RMSNorm 16K 0.87-0.90 against 0.79: the default at
bf16 16K.  ncu (run25_c): instruction-bound, ~0.45 issued a cycle per scheduler with 4 warps each.  At 4K / 8K it
loses to the Triton kernels (per-row synchronisation).  Eager calls go through the C++ fast path (ops/_cpp.py), which
encodes the three host descriptors at each launch (cuTensorMapEncodeTiled, as Triton's launcher does): do_bench of
fwd+bwd minus fwd LayerNorm 0.78-0.79, RMSNorm 0.86-0.87 (0.14-0.28 on the Python path).  DEVICE_DESC is slower by
graph replay (RMSNorm 0.81; not profiled: device-made descriptors carry no L2 promotion, the host ones 128 B, and
are read from global memory).
"""

from __future__ import annotations

import torch

from ._library import Kernel, ensure_triton_allocator

try:  # Gluon: Triton >= 3.5 with the NVIDIA Hopper dialect
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = True
except Exception:  # pragma: no cover - depends on the installed Triton
    HAS_GLUON = False

BOX = 256  # columns a TMA box row (TMA's limit)
WARPS = 16
STAGES = 2  # rows in the ring by default (layer_norm_config.BWD_GLUON gives each width its own)
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
    def _add_pair(a0, a1, b0, b1):
        """Combine function of a reduction of two values at once (gl.reduce over a tuple): one cross-warp exchange."""
        return a0 + b0, a1 + b1

    @gluon.jit
    def _slice_terms(xs, dys, ws, mean, layout: gl.constexpr, IS_RMS: gl.constexpr, HAS_W: gl.constexpr,
                     CENTER: gl.constexpr = True):
        """One (num_warps, 256) slice of the row from shared memory: (dy, xc = x - mean, g = w dy) in float32
        (CENTER False: x itself, the mean folded in by the caller)."""
        x = xs.load(layout).to(gl.float32)
        dy = dys.load(layout).to(gl.float32)
        if IS_RMS or not CENTER:
            xc = x
        else:
            xc = x - mean
        if HAS_W:
            g = dy * ws.load(layout).to(gl.float32)
        else:
            g = dy
        return dy, xc, g

    @gluon.jit
    def _slice_sums(xs, dys, ws, mean, s1, s2, layout: gl.constexpr, IS_RMS: gl.constexpr, HAS_W: gl.constexpr,
                    FOLD_MEAN: gl.constexpr = False):
        """Pass 1 over one slice: s1 += g * xc, s2 += g (per thread; rstd is applied to the row sum, one multiply a
        row instead of one a value).  FOLD_MEAN: s1 += g * x (the caller subtracts mean * sum(g), as aten's CUDA
        LayerNorm backward does): one subtraction a value fewer."""
        dy, xc, g = _slice_terms(xs, dys, ws, mean, layout, IS_RMS, HAS_W, not FOLD_MEAN)
        if IS_RMS:
            return s1 + g * xc, s2
        return s1 + g * xc, s2 + g

    @gluon.jit
    def _slice_dx(xs, dys, ws, mean, rstd, c1, c2r, dw, db, dbs, DX, offs, layout: gl.constexpr,
                  IS_RMS: gl.constexpr, HAS_W: gl.constexpr, HAS_B: gl.constexpr, DB_SMEM: gl.constexpr,
                  FOLD_MEAN: gl.constexpr = False):
        """Pass 2 over one slice: dx = (g - xhat c1) rstd - c2 rstd (c2r = c2 rstd; two FMAs) stored at DX + offs;
        returns the slice's dW / dB accumulators plus dy xhat, dy (DB_SMEM: dB accumulates in the shared-memory slice
        ``dbs`` instead, each thread its own elements).  FOLD_MEAN: ``mean`` is mean * rstd and xhat = x rstd - it
        (one FMA)."""
        dy, xc, g = _slice_terms(xs, dys, ws, mean, layout, IS_RMS, HAS_W, not FOLD_MEAN)
        if FOLD_MEAN and not IS_RMS:
            xhat = xc * rstd - mean
        else:
            xhat = xc * rstd
        if IS_RMS:
            dx = (g - xhat * c1) * rstd
        else:
            dx = (g - xhat * c1) * rstd - c2r
        gl.store(DX + offs, dx.to(DX.dtype.element_ty))
        if HAS_W:
            dw = dw + dy * xhat
        if HAS_B:
            if DB_SMEM:
                dbs.store(dbs.load(layout) + dy)
            else:
                db = db + dy
        return dw, db

    @gluon.jit
    def _store_parts(DWP, DBP, pid, N, offs, dw, db, dbs, layout: gl.constexpr, HAS_W: gl.constexpr,
                     HAS_B: gl.constexpr, DB_SMEM: gl.constexpr, EVICT: gl.constexpr = ""):
        """One slice of this program's dW / dB partial rows (EVICT: their L2 eviction policy)."""
        if HAS_W:
            gl.store(DWP + pid.to(gl.int64) * N + offs, dw, eviction_policy=EVICT)
        if HAS_B:
            if DB_SMEM:
                db = dbs.load(layout)
            gl.store(DBP + pid.to(gl.int64) * N + offs, db, eviction_policy=EVICT)

    @gluon.jit
    def _issue_row(x_desc, dy_desc, x_ring, dy_ring, bars, i, n_rows, pid, G, STAGES: gl.constexpr):
        """Row i of this program (row pid + i G), if it has one, into ring slot i % STAGES: x and dy on one mbarrier."""
        live = i < n_rows
        slot = i % STAGES
        row = pid + i * G
        bar = bars.index(slot)
        mbarrier.expect(bar, x_desc.block_type.nbytes + dy_desc.block_type.nbytes, pred=live)
        tma.async_copy_global_to_shared(x_desc, [row, 0, 0], bar, x_ring.index(slot), pred=live)
        tma.async_copy_global_to_shared(dy_desc, [row, 0, 0], bar, dy_ring.index(slot), pred=live)

    @gluon.jit
    def _norm_bwd_rows_gluon_kernel(
        X,  # x, (M, N) rows of stride sx (unit column stride, 16-byte aligned rows): read by TMA
        DY,  # dy, (M, N) rows of stride sdy, the same
        DX,  # dx, (M, N) contiguous, x's dtype (written)
        W,  # weight [N] in x's dtype or float32 (HAS_W; else any pointer)
        STATS,  # float32 statistics of the forward: LayerNorm means at [0, M) and 1/std at [M, 2M); RMSNorm 1/std at [0, M)
        PARTS,  # float32 partials: [G, N] dW rows (HAS_W), then [G, N] dB rows (HAS_B); G = the grid
        M,  # rows
        N,  # columns, R * 256
        sx,  # x's row stride (elements)
        sdy,  # dy's row stride (elements)
        x_desc,  # host TMA descriptor of x over its (M, N / 256, 256) view, box (1, R, 256) (None: DEVICE_DESC)
        dy_desc,  # host TMA descriptor of dy, the same (None: DEVICE_DESC)
        w_desc,  # host TMA descriptor of the weight over (N / 256, 256), box (R, 256) (HAS_W; else x_desc;
        #          None: DEVICE_DESC)
        IS_RMS: gl.constexpr,
        HAS_W: gl.constexpr,
        HAS_B: gl.constexpr,
        R: gl.constexpr,  # sub-rows of 256 a row; REPS = R / num_warps slices of (num_warps, 256)
        VEC: gl.constexpr,  # elements a thread reads at once (16 bytes)
        STAGES: gl.constexpr,  # rows in the ring
        DB_SMEM: gl.constexpr,  # dB accumulates in shared memory (R, 256) float32, not registers (HAS_B)
        W_F32: gl.constexpr,  # the weight held in shared memory as float32 (converted once, not at every read; HAS_W)
        X_BITS: gl.constexpr,  # bits of an x element (16 / 32)
        W_BITS: gl.constexpr,  # bits of a weight element
        DEVICE_DESC: gl.constexpr,  # make the TMA descriptors here from X / DY / W (x_desc, dy_desc, w_desc None)
        SMEM_SUMS: gl.constexpr,  # the row sums' cross-warp step through one shared buffer and one barrier a row
        FOLD_MEAN: gl.constexpr,  # LayerNorm: the mean folded into the row sums and xhat (one op a value fewer a pass)
        PDL_WAIT: gl.constexpr,  # launched as a programmatic dependent: wait for the previous kernel first
        PDL_TRIGGER: gl.constexpr,  # let the dependent dW / dB reduce launch once this program's rows are done
        PARTS_EVICT: gl.constexpr = False,  # the partial rows stored with L2 policy evict_last (the reduce reads them)
        num_warps: gl.constexpr = 16,
    ):
        REPS: gl.constexpr = R // num_warps
        if PDL_WAIT:  # (programmatic dependent launch) before any memory of the previous kernel's is read or written
            _gdc_wait()
        XL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=X_BITS, rank=3)
        WL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=W_BITS, rank=2)
        if DEVICE_DESC:
            # Descriptors made on the device (one a CTA, in Triton's global scratch): the launch takes pointers and
            # ints only, so the C++ fast path (ops/_cpp.py) launches it as it does the Triton kernels.
            x_desc = tma.make_tensor_descriptor(X, [M, R, 256], [sx, 256, 1], [1, R, 256], XL)
            dy_desc = tma.make_tensor_descriptor(DY, [M, R, 256], [sdy, 256, 1], [1, R, 256], XL)
            if HAS_W and not W_F32:
                w_desc = tma.make_tensor_descriptor(W, [R, 256], [256, 1], [R, 256], WL)
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

        # SMEM_SUMS: the warps' row-sum partials, read whole by every thread (layout ALL: each thread all of them).
        ALL: gl.constexpr = gl.BlockedLayout([num_warps], [32], [num_warps], [0])
        if SMEM_SUMS:
            sums1 = gl.allocate_shared_memory(gl.float32, [num_warps], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
            sums2 = gl.allocate_shared_memory(gl.float32, [num_warps], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))

        # Shared memory: the row ring (x and dy, one mbarrier a slot) and the weight.
        x_ring = gl.allocate_shared_memory(dtype, [STAGES, 1, R, 256], XL)
        dy_ring = gl.allocate_shared_memory(dtype, [STAGES, 1, R, 256], XL)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        if HAS_W and not W_F32:
            w_smem = gl.allocate_shared_memory(W.dtype.element_ty, [R, 256], WL)
            w_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(w_bar, count=1)
        if HAS_B and DB_SMEM:
            db_smem = gl.allocate_shared_memory(gl.float32, [R, 256],
                                                gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
            for k in gl.static_range(REPS):
                db_smem.slice(k * num_warps, num_warps).store(gl.zeros([num_warps, 256], gl.float32, layout=layout))
        else:
            db_smem = x_ring.index(0).reshape([R, 256])  # (never read: no dB in shared memory)
        fence_async_shared()

        pid = gl.program_id(0)
        G = gl.num_programs(0)
        n_rows = gl.cdiv(M - pid, G)  # rows pid, pid + G, ... (the grid has at most M programs)

        # Each thread's columns of slice k: k * num_warps * 256 + (its sub-row) * 256 + (its columns).
        offs = (gl.expand_dims(gl.arange(0, num_warps, layout=gl.SliceLayout(1, layout)), 1) * 256
                + gl.expand_dims(gl.arange(0, 256, layout=gl.SliceLayout(0, layout)), 0))
        SL: gl.constexpr = num_warps * 256  # columns a slice

        # Step 1: the weight once, the first STAGES rows.
        if HAS_W and not W_F32:
            mbarrier.expect(w_bar, w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(w_desc, [0, 0], w_bar, w_smem)
        for s in gl.static_range(STAGES):
            _issue_row(x_desc, dy_desc, x_ring, dy_ring, bars, s, n_rows, pid, G, STAGES)
        if HAS_W and W_F32:  # each thread converts the columns it reads later: no exchange between threads
            ws = gl.allocate_shared_memory(gl.float32, [R, 256], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
            for k in gl.static_range(REPS):
                ws.slice(k * num_warps, num_warps).store(gl.load(W + k * SL + offs).to(gl.float32))
        elif HAS_W:
            mbarrier.wait(w_bar, phase=0)
            ws = w_smem
        else:
            ws = x_ring.index(0).reshape([R, 256])  # (never read: HAS_W is False)
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
            xb = x_ring.index(slot).reshape([R, 256])
            dyb = dy_ring.index(slot).reshape([R, 256])

            # Step 2 (pass 1): the row sums.  0 is the identity of both.
            s1 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
            s2 = gl.zeros([num_warps, 256], gl.float32, layout=layout)
            for k in gl.static_range(REPS):
                s1, s2 = _slice_sums(xb.slice(k * num_warps, num_warps), dyb.slice(k * num_warps, num_warps),
                                     ws.slice(k * num_warps, num_warps), mean, s1, s2, layout, IS_RMS, HAS_W,
                                     FOLD_MEAN)
            # c1 = sum(g xhat) / N = rstd sum(g xc) / N; c2r = rstd sum(g) / N (LayerNorm)
            if SMEM_SUMS:
                # Each warp's sums (a warp a sub-row: intra-warp shuffles), then one exchange for both: every warp
                # writes its two partials, one barrier, every thread reads all 2 x num_warps and adds them.  The
                # buffer is written again only after the next step-4 barrier, so no second barrier is needed.
                sums1.store(gl.sum(s1, axis=1))
                if not IS_RMS:
                    sums2.store(gl.sum(s2, axis=1))
                gl.thread_barrier()
                c1 = gl.sum(sums1.load(ALL), axis=0) * (rstd / N)
                if IS_RMS:
                    c2r = 0.0
                else:
                    c2r = gl.sum(sums2.load(ALL), axis=0) * (rstd / N)
            elif IS_RMS:
                c1 = gl.sum(gl.sum(s1, axis=1), axis=0) * (rstd / N)
                c2r = 0.0
            elif not DB_SMEM:  # (two reductions: the paired one spills with dB in registers, sm_90 scan)
                c1 = gl.sum(gl.sum(s1, axis=1), axis=0) * (rstd / N)
                c2r = gl.sum(gl.sum(s2, axis=1), axis=0) * (rstd / N)
            else:  # both sums in one reduction: one cross-warp exchange (and barrier) a row, not two
                s1, s2 = gl.reduce((s1, s2), 1, _add_pair)
                s1, s2 = gl.reduce((s1, s2), 0, _add_pair)
                c1 = s1 * (rstd / N)
                c2r = s2 * (rstd / N)
            if FOLD_MEAN and not IS_RMS:
                # s1 summed g x: rstd / N sum(g xc) = rstd / N (sum(g x) - mean sum(g)) = c1 - mean c2r.  Pass 2 then
                # takes mean rstd for its xhat = x rstd - mean rstd.
                c1 = c1 - mean * c2r
                mean = mean * rstd

            # Step 3 (pass 2): dx, and the dW / dB accumulators of this thread's columns.
            dxp = DX + row.to(gl.int64) * N + offs
            dw0, db0 = _slice_dx(xb.slice(0, num_warps), dyb.slice(0, num_warps), ws.slice(0, num_warps), mean, rstd,
                                 c1, c2r, dw0, db0, db_smem.slice(0, num_warps), dxp, 0, layout, IS_RMS, HAS_W,
                                 HAS_B, DB_SMEM, FOLD_MEAN)
            if REPS > 1:
                k1: gl.constexpr = num_warps
                dw1, db1 = _slice_dx(xb.slice(k1, num_warps), dyb.slice(k1, num_warps), ws.slice(k1, num_warps), mean,
                                     rstd, c1, c2r, dw1, db1, db_smem.slice(k1, num_warps), dxp, SL, layout, IS_RMS,
                                     HAS_W, HAS_B, DB_SMEM, FOLD_MEAN)
            if REPS > 2:
                k2: gl.constexpr = 2 * num_warps
                dw2, db2 = _slice_dx(xb.slice(k2, num_warps), dyb.slice(k2, num_warps), ws.slice(k2, num_warps), mean,
                                     rstd, c1, c2r, dw2, db2, db_smem.slice(k2, num_warps), dxp, 2 * SL, layout, IS_RMS,
                                     HAS_W, HAS_B, DB_SMEM, FOLD_MEAN)
            if REPS > 3:
                k3: gl.constexpr = 3 * num_warps
                dw3, db3 = _slice_dx(xb.slice(k3, num_warps), dyb.slice(k3, num_warps), ws.slice(k3, num_warps), mean,
                                     rstd, c1, c2r, dw3, db3, db_smem.slice(k3, num_warps), dxp, 3 * SL, layout, IS_RMS,
                                     HAS_W, HAS_B, DB_SMEM, FOLD_MEAN)

            # Step 4: every warp has read the slot: fetch row i + STAGES into it.
            gl.thread_barrier()
            _issue_row(x_desc, dy_desc, x_ring, dy_ring, bars, i + STAGES, n_rows, pid, G, STAGES)

        if PDL_TRIGGER:  # the reduce may launch now; it waits for this whole grid (and its stores) on the device
            _gdc_launch_dependents()
        # Step 5: this program's partial rows of dW and dB.
        for k in gl.static_range(REPS):  # (a static index: dw{k} / db{k} picked at compile time)
            dw = dw0 if k == 0 else (dw1 if k == 1 else (dw2 if k == 2 else dw3))
            db = db0 if k == 0 else (db1 if k == 1 else (db2 if k == 2 else db3))
            _store_parts(PARTS, DBP, pid, N, offs + k * SL, dw, db, db_smem.slice(k * num_warps, num_warps), layout,
                         HAS_W, HAS_B, DB_SMEM, "evict_last" if PARTS_EVICT else "")
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        if HAS_W and not W_F32:
            mbarrier.invalidate(w_bar)


def supported(x: torch.Tensor, dy: torch.Tensor, w: torch.Tensor | None, cast_before_w: bool = False,
              stages: int = STAGES, db_smem: bool = False, warps: int = WARPS, w_f32: bool = False) -> str | None:
    """None when the Gluon row backward takes (M, N) rows ``x`` / ``dy`` (unit column stride) with a ring of
    ``stages`` rows, dB in shared memory (``db_smem``), CTAs of ``warps`` warps and the weight held as float32
    (``w_f32``), else why not."""
    if not HAS_GLUON:
        return "no Gluon in this Triton"
    if not (x.is_cuda and torch.cuda.get_device_capability(x.device)[0] == 9):
        return "not an sm_90 GPU"
    if cast_before_w:
        return "CAST_BEFORE_W is not implemented here"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or dy.dtype != x.dtype:
        return "x and dy must share a dtype of bf16, fp16 or fp32"
    M, N = x.shape
    R = N // BOX
    if M == 0 or N % BOX or R % warps or R > 4 * warps:
        return f"width {N} must be a multiple of {BOX * warps} up to {4 * BOX * warps}"
    for t in (x, dy):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return "rows must have unit column stride and 16-byte aligned starts"
    if w is not None and (w.dtype not in (x.dtype, torch.float32) or not w.is_contiguous() or w.data_ptr() % 16):
        return "the weight must be contiguous, 16-byte aligned, in x's dtype or float32"
    w_bytes = 0 if w is None else N * (4 if w_f32 else w.element_size())
    ring = stages * 2 * N * x.element_size() + w_bytes + (4 * N if db_smem else 0)
    if ring > SMEM_BYTES:
        return f"the ring and the weight ({ring} bytes) do not fit in shared memory"
    return None


def _layout(dtype: torch.dtype, rank: int):
    bits = 32 if dtype == torch.float32 else 16
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=rank)


_KERNELS: dict = {}


def bwd_kernel(M: int, N: int, sx: int, sdy: int, dtype: torch.dtype, w_dtype: torch.dtype | None, has_b: bool,
               is_rms: bool, programs: int, stages: int = STAGES, db_smem: bool = False, warps: int = WARPS,
               w_f32: bool = False, device_desc: bool = False, smem_sums: bool = False, fold_mean: bool = False,
               pdl: int = 0, parts_evict: bool = False) -> Kernel:
    """The launch plan (a ``Kernel``: grid, constexprs) of the row backward of (M, N) rows of row strides sx / sdy
    over ``programs`` CTAs (at most one an SM; at most M), for rows ``supported`` took with the same variant.  One
    object a plan.  ``device_desc``: the kernel makes its TMA descriptors and takes pointers and ints only (then the
    C++ fast path can register its binary); else the launch passes host descriptors (``norm_backward_rows``).
    ``pdl``: 1 the kernel lets its dW / dB reduce (a programmatic dependent) launch after its rows; 2 it is a
    programmatic dependent itself too (layer_norm_config.GluonVariant.pdl).  ``parts_evict``: the dW / dB partial rows
    stored with L2 policy evict_last (the reduce reads them next)."""
    G = max(1, min(programs, M))
    db_smem = bool(db_smem and has_b)
    w_f32 = bool(w_f32 and w_dtype is not None)
    fold_mean = bool(fold_mean and not is_rms)
    key = (M, N, sx, sdy, dtype, w_dtype, has_b, is_rms, G, stages, db_smem, warps, w_f32, device_desc, smem_sums,
           fold_mean, pdl, parts_evict)
    kernel = _KERNELS.get(key)
    if kernel is None:
        if len(_KERNELS) > 256:
            _KERNELS.clear()
        bits = torch.finfo(dtype).bits
        descs = dict(x_desc=None, dy_desc=None, w_desc=None) if device_desc else {}
        if pdl >= 2:
            descs["launch_pdl"] = True
        kernel = _KERNELS[key] = Kernel(
            _norm_bwd_rows_gluon_kernel, (G,), **descs, IS_RMS=is_rms, HAS_W=w_dtype is not None, HAS_B=has_b,
            R=N // BOX, VEC=16 * 8 // bits, STAGES=stages, DB_SMEM=db_smem, W_F32=w_f32, X_BITS=bits,
            W_BITS=torch.finfo(w_dtype).bits if w_dtype is not None else bits, DEVICE_DESC=device_desc,
            SMEM_SUMS=smem_sums, FOLD_MEAN=fold_mean, PDL_WAIT=pdl >= 2, PDL_TRIGGER=pdl >= 1 and (w_dtype is not None or has_b),
            PARTS_EVICT=parts_evict, num_warps=warps)
    return kernel


_DESCS: dict = {}  # host descriptors a plan (their base pointer swapped in at each call)


def descriptor_layouts(M: int, N: int, sx: int, sdy: int, has_w: bool) -> tuple:
    """The kernel's three host descriptors (x_desc, dy_desc, w_desc) over (M, N) rows of row strides sx / sdy: per
    descriptor (index of its base among the kernel's pointers X, DY, DX, W, ...; shape; strides; box).  Built into
    TensorDescriptors by ``norm_backward_rows``, encoded by the C++ fast path from the same layouts (ops/_cpp.py
    ``register``).  Without a weight the third is x's again (never read: HAS_W is compiled in)."""
    R = N // BOX
    x_l = (0, [M, R, BOX], [sx, BOX, 1], [1, R, BOX])
    return x_l, (1, [M, R, BOX], [sdy, BOX, 1], [1, R, BOX]), (3, [R, BOX], [BOX, 1], [R, BOX]) if has_w else x_l


def cpp_descriptors(M: int, N: int, has_w: bool) -> tuple:
    """``descriptor_layouts`` of contiguous rows as the C++ fast path takes them: (pointer index, shape, strides)."""
    return tuple(lay[:3] for lay in descriptor_layouts(M, N, N, N, has_w))


def norm_backward_rows(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, w: torch.Tensor | None, stats: torch.Tensor,
                       has_b: bool, is_rms: bool, programs: int, stages: int = STAGES, db_smem: bool = False,
                       warps: int = WARPS, w_f32: bool = False, device_desc: bool = False,
                       smem_sums: bool = False, fold_mean: bool = False, pdl: int = 0,
                       parts_evict: bool = False) -> tuple[torch.Tensor, int]:
    """dx (written into ``dx``, (M, N) contiguous) and the float32 dW / dB partial rows of ``programs`` CTAs (at most
    one an SM; at most M), for rows ``supported`` took (with the same ``stages``, ``db_smem``, ``warps``, ``w_f32``;
    the fields of layer_norm_config.GluonVariant in order).
    Returns (partials, G) for layer_norm's fixed-order reduce."""
    M, N = x.shape
    kernel = bwd_kernel(M, N, x.stride(0), dy.stride(0), x.dtype, None if w is None else w.dtype, has_b, is_rms,
                        programs, stages, db_smem, warps, w_f32, device_desc, smem_sums, fold_mean, pdl, parts_evict)
    G = kernel.grid[0]
    nparts = (int(w is not None) + int(has_b)) * G * N
    parts = torch.empty((nparts,), dtype=torch.float32, device=x.device) if nparts else stats
    wp = x if w is None else w
    if device_desc:
        ensure_triton_allocator()
        kernel(x, dy, dx, wp, stats, parts, M, N, x.stride(0), dy.stride(0))
        return parts, G
    descs = _DESCS.get(kernel)
    if descs is None:
        ptrs = (x, dy, dx, wp)
        descs = [TensorDescriptor(ptrs[i], shape, strides, box, _layout(ptrs[i].dtype, len(shape)))
                 for i, shape, strides, box in descriptor_layouts(M, N, x.stride(0), dy.stride(0), w is not None)]
        if len(_DESCS) > 256:
            _DESCS.clear()
        _DESCS[kernel] = descs
    for d, t in zip(descs, (x, dy, wp)):
        d.base = t
    kernel(x, dy, dx, wp, stats, parts, M, N, x.stride(0), dy.stride(0), *descs)
    for d in descs:
        d.base = None
    return parts, G
