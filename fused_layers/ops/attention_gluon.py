"""Hopper attention kernels in Gluon (Triton's explicit layout / shared-memory / barrier language), sm_90 only
(Gluon has no interpreter).  ops/attention.py runs them on large eager dense calls they take (``supported``,
``auto_ok``; the thresholds are in ops/attention_config.py):

  * the forward, FlashAttention-3's warp-specialized ping-pong (``_attn_fwd_gluon_ws_kernel``): two consumer
    warpgroups of 64 query rows take turns at the tensor cores while a producer warp keeps a ring of K / V tiles full
    by TMA; at D128, and at D64 causal; on a persistent grid (one program an SM) for short rows;
  * the one-warpgroup forward (``_attn_fwd_gluon_kernel``: 64 rows a CTA, two CTAs an SM): at D64 non-causal, and
    where S is not a multiple of the ping-pong's 128-row tiles;
  * the backward's dK / dV kernel (``_attn_bwd_dkdv_gluon_kernel``), followed by the Triton dQ kernel.

Why Gluon.  The Triton forward reaches 0.67-0.93 of cuDNN's.  Profiled on the H200 (Nsight Compute), cuDNN runs 3
warpgroups at 73 % SM busy, the Triton forward 2 at 48 %: Triton's pipeliner loads K / V with cp.async and waits for
each Q K^T before its softmax, so a warpgroup's tensor cores idle while it exponentiates.  Gluon states the
schedule directly:

  * Q, K, V tiles arrive by TMA into an NVMMA-swizzled ring of STAGES K / V buffers, one mbarrier per buffer and
    operand (a Q K^T can start when its K has landed, before its V);
  * intra-warpgroup overlap (FlashAttention-3, section 3.2): iteration j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}
    as two asynchronous wgmma groups, waits for the first only (groups retire in order), and computes the softmax
    of S_j while the tensor cores run P_{j-1} V_{j-1};
  * P is the A operand of the second wgmma straight from registers (no shared-memory round trip);
  * the epilogue reuses Q's buffer for O and stores it by TMA;
  * causal: query blocks are launched heaviest first (the last block of each head first).

Math (ops/attention.py's derivation): base 2 with the scale folded in, c = scale * log2(e);
m_j = max(m_{j-1}, rowmax(S_j) c), alpha = exp2(m_{j-1} - m_j), P_j = exp2(S_j c - m_j), l_j = l_{j-1} alpha +
rowsum(P_j), O_j = O_{j-1} alpha + P_j V_j; O = O_n / l_n and the base-2 log-sum-exp L = m_n + log2(l_n) (the Triton
backward's LSE, so the Triton backward can follow a Gluon forward).

Layouts.  q, k, v are read in place in two layouts (``_layout``): contiguous (B, H, S, D), and sequence-major
((B, S, H, D) memory, also slices of one packed (B, S, 3, H, D) projection); k and v may have a layout of their own
and fewer heads than q (grouped-query attention).  ``_head_origin`` maps a (batch, head) to its first row and column
in the 2-D view a TMA descriptor sees.  Launches go through ops/_library.Kernel (bound once per call shape, then
Triton's launcher directly), the descriptors made once per shape with their ``base`` set per call.

Scope: (B, H, S, D) inputs in those layouts, Sq == Sk, S a multiple of the tiles, D in {64, 128}, bf16 / fp16, no
mask, no dropout.  ``supported`` says whether a call qualifies; the caller runs the Triton kernels otherwise.
"""

from __future__ import annotations

import math

import torch

from ._library import Kernel
from .attention_config import (
    GLUON_DKDV_MAX_S,
    GLUON_DKDV_TILES,
    GLUON_FWD_KERNEL,
    GLUON_FWD_PERSISTENT_MAX_S,
    GLUON_FWD_TILES,
    GLUON_MIN_WORK,
    GLUON_PINGPONG_TILES,
)

try:  # Gluon: Triton >= 3.5 with the NVIDIA Hopper dialect
    import triton  # noqa: F401
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = True
except Exception:  # pragma: no cover - depends on the installed Triton
    HAS_GLUON = False

LOG2E = 1.4426950408889634


if HAS_GLUON:

    @gluon.jit
    def _head_origin(bh, H, RB, RH, CH):
        """(first row, column) of head bh = b * H + h in the 2-D views the TMA descriptors see: row b * RB + h * RH,
        column h * CH.  Head-major (B, H, S, D) contiguous: RB = H * S, RH = S, CH = 0 (rows B*H*S, D columns);
        sequence-major ((B, S, H, D) memory, or q / k / v sliced from one packed projection): RB = S, RH = 0, CH = D
        (rows B*S, a row holding every head)."""
        h = bh % H
        return (bh // H) * RB + h * RH, h * CH

    @gluon.jit
    def _kv_origin(bh, H, G, RBk, RHk, CHk):
        """(first row, column) of the key / value head that query head bh = b * H + h reads: b * (H / G) + h / G
        (G query heads a key / value head: grouped-query attention; 1 otherwise), in K's and V's own 2-D views."""
        hkv = H // G
        return _head_origin((bh // H) * hkv + (bh % H) // G, hkv, RBk, RHk, CHk)

    @gluon.jit
    def _scores_masked(s, q0, k0, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """-inf where the key index k0 + c exceeds the query index q0 + r (causal, the diagonal block)."""
        rows = q0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        cols = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        keep = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        return gl.where(keep, s, -float("inf"))

    @gluon.jit
    def _softmax_first(s, qk_scale):
        """Block 0 of the online softmax (base 2, the scale folded in): (m, P, l)."""
        m_i = gl.max(s, axis=1) * qk_scale
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
        return m_i, p, gl.sum(p, axis=1)

    @gluon.jit
    def _softmax_next(s, m_i, l_i, qk_scale):
        """Block j > 0: (m_j, alpha = exp2(m_{j-1} - m_j), P_j, l_j)."""
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        return m_new, alpha, p, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _store_out(acc, m_i, l_i, LSE, bh, S, q0, q_row, col0, o_smem, o_desc, BLOCK_M: gl.constexpr,
                   row_s: gl.constexpr, row_o: gl.constexpr, DRAIN: gl.constexpr = True):
        """O = acc / l by TMA through ``o_smem`` (Q's buffer, every wgmma reading it retired, or a buffer of its own);
        L = m + log2(l) for rows q0...  DRAIN: wait for the store here (before a next tile's Q lands in Q's buffer);
        else the caller waits before it writes ``o_smem`` again (the store runs under the next tile)."""
        out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
        rows = q0 + gl.arange(0, BLOCK_M, layout=row_s)
        gl.store(LSE + bh.to(gl.int64) * S + rows, m_i + gl.log2(l_i))
        o_smem.store(out.to(o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_row, col0], o_smem)
        if DRAIN:
            tma.store_wait(pendings=0)

    @gluon.jit
    def _attn_fwd_gluon_kernel(
        LSE,  # fp32 (B*H, S) base-2 log-sum-exp, contiguous
        q_desc,  # TMA descriptor of Q in its 2-D view (_head_origin), block (BLOCK_M, D)
        k_desc,  # TMA descriptor of K in its 2-D view (_head_origin), block (BLOCK_N, D)
        v_desc,  # TMA descriptor of V in its 2-D view (_head_origin), block (BLOCK_N, D)
        o_desc,  # TMA descriptor of O in its 2-D view (_head_origin), block (BLOCK_M, D) (Q's layout)
        qk_scale,  # scale * log2(e)
        S,  # sequence length (queries = keys), a multiple of BLOCK_M and BLOCK_N
        H,  # query heads
        RB, RH, CH,  # head origins in the descriptors' 2-D views (_head_origin)
        G,  # query heads a key / value head (grouped-query attention; 1 otherwise)
        RBk, RHk, CHk,  # the key / value heads' origins in K's and V's views
        BLOCK_M: gl.constexpr,  # query rows of the program: 16 a warp
        BLOCK_N: gl.constexpr,  # keys a ring slot
        HEAD_D: gl.constexpr,
        CAUSAL: gl.constexpr,
        STAGES: gl.constexpr,  # K / V ring slots (>= 2: block j + 1 loads while block j is read)
        num_warps: gl.constexpr,
    ):
        """One program: the query block of BLOCK_M rows of one head, the whole online softmax over its key blocks;
        O and LSE stored."""
        dtype: gl.constexpr = q_desc.dtype
        # Shared memory: Q (reused for O), a ring of STAGES K and V tiles, one mbarrier per buffer.
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
        fence_async_shared()
        if CAUSAL:
            pid_m = S // BLOCK_M - 1 - gl.program_id(0)  # heaviest first: the diagonal's far end starts first
        else:
            pid_m = gl.program_id(0)
        bh = gl.program_id(1)  # (batch, query head)
        row0, col0 = _head_origin(bh, H, RB, RH, CH)  # this (batch, head)'s first row and its column
        q_row = row0 + pid_m * BLOCK_M  # first row of this query block
        kv_row, kv_col = _kv_origin(bh, H, G, RBk, RHk, CHk)  # its key / value head's first row and column
        if CAUSAL:
            n_blocks = ((pid_m + 1) * BLOCK_M + BLOCK_N - 1) // BLOCK_N  # key blocks up to the diagonal
        else:
            n_blocks = S // BLOCK_N

        # Register layouts: the wgmma accumulators (warps stacked along M: each warpgroup owns 64 query rows), and P
        # as the register A operand of the P V wgmma.
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, HEAD_D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        # Step 1: Q, then the first STAGES key / value blocks (those that exist); block j goes to ring slot
        # j % STAGES, whose mbarrier completes its (j // STAGES)-th phase.
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row, col0], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            live = i < n_blocks
            mbarrier.expect(k_bars.index(i), k_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(k_desc, [kv_row + i * BLOCK_N, kv_col], k_bars.index(i), k_smem.index(i),
                                            pred=live)
            mbarrier.expect(v_bars.index(i), v_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(v_desc, [kv_row + i * BLOCK_N, kv_col], v_bars.index(i), v_smem.index(i),
                                            pred=live)

        # Step 2: block 0's scores and softmax (nothing to overlap with yet).
        mbarrier.wait(q_bar, phase=0)
        mbarrier.wait(k_bars.index(0), phase=0)
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        if CAUSAL:
            if n_blocks == 1:
                s = _scores_masked(s, pid_m * BLOCK_M, 0, BLOCK_M, BLOCK_N, s_layout)
        m_i, p, l_i = _softmax_first(s, qk_scale)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)

        # Step 3: iteration j overlaps the softmax of block j with the P V wgmma of block j - 1.
        for j in range(1, n_blocks):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_bars.index(slot), phase=(j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s, use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(prev), phase=((j - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # S_j done; P_{j-1} V_{j-1} may still run
            if CAUSAL:
                if j == n_blocks - 1:
                    s = _scores_masked(s, pid_m * BLOCK_M, j * BLOCK_N, BLOCK_M, BLOCK_N, s_layout)
            m_i, alpha, p, l_i = _softmax_next(s, m_i, l_i, qk_scale)
            acc, p_done = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))  # P_{j-1} kept live until here
            # block j - 1's K and V buffers are free: fetch block j - 1 + STAGES into them
            nxt = j - 1 + STAGES
            live = nxt < n_blocks
            mbarrier.expect(k_bars.index(prev), k_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(k_desc, [kv_row + nxt * BLOCK_N, kv_col], k_bars.index(prev),
                                            k_smem.index(prev), pred=live)
            mbarrier.expect(v_bars.index(prev), v_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(v_desc, [kv_row + nxt * BLOCK_N, kv_col], v_bars.index(prev),
                                            v_smem.index(prev), pred=live)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        # Step 4: the last block's P V, then O = acc / l and L = m + log2(l).
        last = n_blocks - 1
        mbarrier.wait(v_bars.index(last % STAGES), phase=(last // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
        acc, p_done = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        _store_out(acc, m_i, l_i, LSE, bh, S, pid_m * BLOCK_M, q_row, col0, q_smem, o_desc, BLOCK_M, row_s, row_o)
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))


    # ------------------------------------------------------------------------------------------------------------
    # The ping-pong, FlashAttention-3's warp specialization.  A CTA holds a query tile of 2 x 64 rows: two consumer
    # warpgroups (the default partition and a 4-warp worker), each owning 64 rows, and a 1-warp producer that keeps
    # the K / V ring full by TMA (ready barriers: the TMA's byte count; empty barriers: one arrival from each consumer
    # once its wgmmas that read the buffer have retired).  The consumers take turns at the tensor cores (turn
    # barriers): consumer c waits for its turn, issues its S_j = Q K_j^T and O += P_{j-1} V_{j-1}, hands the turn over
    # and runs its softmax while the other's matrix products run.
    # ------------------------------------------------------------------------------------------------------------

    @gluon.jit
    def _ws_producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, kv_col, n_blocks, c0,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """One query tile's n_blocks K / V blocks into the ring; ``c0``: blocks this program loaded before (block j
        goes to slot (c0 + j) % STAGES, the ring's (c0 + j) // STAGES-th use of it)."""
        for j in range(n_blocks):
            c = c0 + j
            slot = c % STAGES
            if c >= STAGES:  # wait until both consumers are done with the block that used this slot
                mbarrier.wait(k_empty.index(slot), phase=((c // STAGES) - 1) & 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, kv_col], k_ready.index(slot),
                                            k_smem.index(slot))
            if c >= STAGES:
                mbarrier.wait(v_empty.index(slot), phase=((c // STAGES) - 1) & 1)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, kv_col], v_ready.index(slot),
                                            v_smem.index(slot))

    @gluon.jit
    def _ws_consumer_tile(o_desc, LSE, qk_scale, S, bh, q_row, col0, q0, n_blocks, c0, T0, q_smem, o_smem, k_smem,
                          v_smem, k_ready, v_ready, k_empty, v_empty, my_turn, other_turn,
                          q_desc, q_bar, nq_row, nq_col, has_next,
                          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, CAUSAL: gl.constexpr,
                          STAGES: gl.constexpr, PERSISTENT: gl.constexpr):
        """64 query rows from q0 (in the sequence) of head bh, their Q landed in q_smem: the online softmax over the
        n_blocks key blocks, taking turns with the other consumer at the tensor cores.  ``c0``: key blocks this program
        consumed before (ring slot and phase as the producer's); ``T0``: turns this consumer took before.
        PERSISTENT: once the last wgmma reading Q retired, fetch the next tile's Q (rows nq_row.., column nq_col;
        ``has_next``) into q_smem, and store O through ``o_smem`` without waiting for it."""
        dtype: gl.constexpr = o_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        # block 0 (its turn: issue S_0, hand over, then its softmax)
        mbarrier.wait(my_turn, phase=T0 & 1)
        mbarrier.wait(k_ready.index(c0 % STAGES), phase=(c0 // STAGES) & 1)
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        s_tok = warpgroup_mma(q_smem, k_smem.index(c0 % STAGES).permute((1, 0)), s, use_acc=False, is_async=True)
        mbarrier.arrive(other_turn)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(c0 % STAGES))
        if CAUSAL:
            if BLOCK_N > q0 + 1:
                s = _scores_masked(s, q0, 0, BLOCK_M, BLOCK_N, s_layout)
        m_i, p, l_i = _softmax_first(s, qk_scale)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)
        for j in range(1, n_blocks):
            c = c0 + j
            slot = c % STAGES
            prev = (c - 1) % STAGES
            mbarrier.wait(my_turn, phase=(T0 + j) & 1)
            mbarrier.wait(k_ready.index(slot), phase=(c // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(prev), phase=((c - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            mbarrier.arrive(other_turn)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(slot))
            if CAUSAL:
                if (j + 1) * BLOCK_N > q0 + 1:  # a key block reaching past this consumer's first row
                    s = _scores_masked(s, q0, j * BLOCK_N, BLOCK_M, BLOCK_N, s_layout)
            m_i, alpha, p, l_i = _softmax_next(s, m_i, l_i, qk_scale)
            acc, p_done = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
            mbarrier.arrive(v_empty.index(prev))
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
        last = c0 + n_blocks - 1
        mbarrier.wait(my_turn, phase=(T0 + n_blocks) & 1)
        mbarrier.wait(v_ready.index(last % STAGES), phase=(last // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
        mbarrier.arrive(other_turn)
        acc, p_done = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        mbarrier.arrive(v_empty.index(last % STAGES))
        if PERSISTENT:
            # Q's buffer is free: the next tile's Q lands under this epilogue; O leaves through a buffer of its own,
            # once the previous tile's O has left it
            mbarrier.expect(q_bar, q_desc.block_type.nbytes, pred=has_next)
            tma.async_copy_global_to_shared(q_desc, [nq_row, nq_col], q_bar, q_smem, pred=has_next)
            tma.store_wait(pendings=0)
        _store_out(acc, m_i, l_i, LSE, bh, S, q0, q_row, col0, o_smem, o_desc, BLOCK_M, row_s, row_o, not PERSISTENT)

    @gluon.jit
    def _ws_consumer(q_desc, o_desc, LSE, qk_scale, S, bh, row0, col0, q0, n_blocks, q_smem, q_bar, k_smem, v_smem,
                     k_ready, v_ready, k_empty, v_empty, my_turn, other_turn,
                     FIRST: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                     CAUSAL: gl.constexpr, STAGES: gl.constexpr):
        """One program's one query tile (FIRST: this consumer starts); O leaves through Q's buffer."""
        q_row = row0 + q0
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row, col0], q_bar, q_smem)
        if not FIRST:
            mbarrier.arrive(other_turn)  # the first consumer goes first
        mbarrier.wait(q_bar, phase=0)
        _ws_consumer_tile(o_desc, LSE, qk_scale, S, bh, q_row, col0, q0, n_blocks, 0, 0, q_smem, q_smem, k_smem, v_smem,
                          k_ready, v_ready, k_empty, v_empty, my_turn, other_turn, q_desc, q_bar, 0, 0, False,
                          BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES, False)

    @gluon.jit
    def _ws_tile_of(t, n_tiles, BH, S, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
        """Persistent tile t -> (query tile of 128 rows, head, key blocks).  Causal: the query tiles heaviest first
        across all heads (t // BH from the diagonal's far end), so the round-robin hands every program one tile of each
        weight class in turn (balanced within a tile); else head-major (a head's tiles run together: K / V from L2)."""
        if CAUSAL:
            tile = n_tiles - 1 - t // BH
            bh = t % BH
            n_blocks = ((tile + 1) * 128 + BLOCK_N - 1) // BLOCK_N
        else:
            tile = t % n_tiles
            bh = t // n_tiles
            n_blocks = S // BLOCK_N
        return tile, bh, n_blocks

    @gluon.jit
    def _ws_producer_persistent(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, S, BH, H, G,
                                RBk, RHk, CHk, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """The producer of a persistent program: every tile's key blocks through one ring, running ahead across
        tiles."""
        n_tiles = S // 128
        c = 0
        for t in range(gl.program_id(0), n_tiles * BH, gl.num_programs(0)):
            tile, bh, n_blocks = _ws_tile_of(t, n_tiles, BH, S, CAUSAL, BLOCK_N)
            kv_row, kv_col = _kv_origin(bh, H, G, RBk, RHk, CHk)
            _ws_producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, kv_col, n_blocks,
                         c, BLOCK_N, STAGES)
            c += n_blocks

    @gluon.jit
    def _ws_consumer_persistent(q_desc, o_desc, LSE, qk_scale, S, BH, H, RB, RH, CH, q_smem, o_smem, q_bar, k_smem,
                                v_smem, k_ready, v_ready, k_empty, v_empty, my_turn, other_turn,
                                FIRST: gl.constexpr, HALF: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                HEAD_D: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
        """A consumer of a persistent program: rows HALF.. HALF + 63 of each of its tiles; ring position, turns and Q's
        phase carried across tiles, each tile's Q fetched under the previous tile's epilogue."""
        n_tiles = S // 128
        total = n_tiles * BH
        step = gl.num_programs(0)
        tile, bh, n_blocks = _ws_tile_of(gl.program_id(0), n_tiles, BH, S, CAUSAL, BLOCK_N)
        row0, col0 = _head_origin(bh, H, RB, RH, CH)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row0 + tile * 128 + HALF, col0], q_bar, q_smem)
        if not FIRST:
            mbarrier.arrive(other_turn)  # the first consumer goes first
        c = 0
        turns = 0
        q_phase = 0
        for t in range(gl.program_id(0), total, step):
            tile, bh, n_blocks = _ws_tile_of(t, n_tiles, BH, S, CAUSAL, BLOCK_N)
            row0, col0 = _head_origin(bh, H, RB, RH, CH)
            q0 = tile * 128 + HALF
            ntile, nbh, nblocks_unused = _ws_tile_of(t + step, n_tiles, BH, S, CAUSAL, BLOCK_N)
            nrow0, ncol0 = _head_origin(nbh, H, RB, RH, CH)
            mbarrier.wait(q_bar, phase=q_phase)
            _ws_consumer_tile(o_desc, LSE, qk_scale, S, bh, row0 + q0, col0, q0, n_blocks, c, turns, q_smem, o_smem,
                              k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, my_turn, other_turn,
                              q_desc, q_bar, nrow0 + ntile * 128 + HALF, ncol0, t + step < total,
                              BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES, True)
            c += n_blocks
            turns += n_blocks + 1
            q_phase ^= 1
        tma.store_wait(pendings=0)

    @gluon.jit
    def _attn_fwd_gluon_ws_kernel(
        LSE,  # fp32 (B*H, S) base-2 log-sum-exp, contiguous
        q_desc,  # TMA descriptor of Q in its 2-D view (_head_origin), block (64, D)
        k_desc,  # TMA descriptor of K in its 2-D view (_head_origin), block (BLOCK_N, D)
        v_desc,  # TMA descriptor of V in its 2-D view (_head_origin), block (BLOCK_N, D)
        o_desc,  # TMA descriptor of O in its 2-D view (_head_origin), block (64, D)
        qk_scale,  # scale * log2(e)
        S,  # sequence length (queries = keys), a multiple of 128 and BLOCK_N
        BH,  # batch x heads
        H,  # heads
        RB, RH, CH,  # head origins in the descriptors' 2-D views (_head_origin)
        G,  # query heads a key / value head (grouped-query attention; 1 otherwise)
        RBk, RHk, CHk,  # the key / value heads' origins in K's and V's views
        BLOCK_N: gl.constexpr,
        HEAD_D: gl.constexpr,
        CAUSAL: gl.constexpr,
        STAGES: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr,
        PERSISTENT: gl.constexpr,  # a grid of one program an SM walking the tiles (_ws_tile_of); else one a tile
        num_warps: gl.constexpr,  # 4: the first consumer (the default partition)
    ):
        dtype: gl.constexpr = q_desc.dtype
        BLOCK_M: gl.constexpr = 64  # rows a consumer
        q_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
        q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(q_bars.index(i), count=1)
            mbarrier.init(turn.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # one arrival from each consumer
            mbarrier.init(v_empty.index(i), count=2)
        fence_async_shared()
        if PERSISTENT:
            o_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_D], o_desc.layout)
            gl.warp_specialize([
                (_ws_consumer_persistent, (q_desc, o_desc, LSE, qk_scale, S, BH, H, RB, RH, CH, q_smem.index(0),
                                           o_smem.index(0), q_bars.index(0), k_smem, v_smem, k_ready, v_ready, k_empty,
                                           v_empty, turn.index(0), turn.index(1),
                                           True, 0, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES)),
                (_ws_consumer_persistent, (q_desc, o_desc, LSE, qk_scale, S, BH, H, RB, RH, CH, q_smem.index(1),
                                           o_smem.index(1), q_bars.index(1), k_smem, v_smem, k_ready, v_ready, k_empty,
                                           v_empty, turn.index(1), turn.index(0),
                                           False, BLOCK_M, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES)),
                (_ws_producer_persistent, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, S, BH, H,
                                           G, RBk, RHk, CHk, BLOCK_N, STAGES, CAUSAL)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
        else:
            n_tiles = S // (2 * BLOCK_M)
            if CAUSAL:
                tile = n_tiles - 1 - gl.program_id(0)  # heaviest first
                n_blocks = ((tile + 1) * 2 * BLOCK_M + BLOCK_N - 1) // BLOCK_N
            else:
                tile = gl.program_id(0)
                n_blocks = S // BLOCK_N
            bh = gl.program_id(1)
            row0, col0 = _head_origin(bh, H, RB, RH, CH)
            kv_row, kv_col = _kv_origin(bh, H, G, RBk, RHk, CHk)
            q0 = tile * 2 * BLOCK_M
            gl.warp_specialize([
                (_ws_consumer, (q_desc, o_desc, LSE, qk_scale, S, bh, row0, col0, q0, n_blocks, q_smem.index(0),
                                q_bars.index(0), k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn.index(0),
                                turn.index(1), True, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES)),
                (_ws_consumer, (q_desc, o_desc, LSE, qk_scale, S, bh, row0, col0, q0 + BLOCK_M, n_blocks,
                                q_smem.index(1), q_bars.index(1), k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                                turn.index(1), turn.index(0), False, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES)),
                (_ws_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, kv_col,
                                n_blocks, 0, BLOCK_N, STAGES)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])

    # ------------------------------------------------------------------------------------------------------------
    # Backward: the dK / dV kernel, the forward's recipe (one warpgroup a CTA, several CTAs an SM, a TMA ring,
    # asynchronous wgmma groups overlapping the elementwise work); dQ comes from the Triton dQ kernel.  Per CTA: BLOCK_N
    # keys of one head, K and V loaded once; per query block i (BLOCK_M rows): S^T = K Q_i^T and dP^T = V dO_i^T issued
    # together, P^T = exp2(S^T c - L_i) while dP^T runs, dV += P^T dO_i issued, dS^T = P^T (dP^T - delta_i) while dV
    # runs, dK += dS^T Q_i; dK scaled once at the end.
    # ------------------------------------------------------------------------------------------------------------

    @gluon.jit
    def _dkdv_step(t, n_iter, i_start, bhq0, row0, col0, H, RB, RH, CH, BLOCK_M: gl.constexpr, GQA: gl.constexpr):
        """Step t of a dK / dV program: query head bhq0 + t // n_iter (GQA; else bhq0, whose origin is row0, col0),
        its query block i_start + t % n_iter.  Returns (row, column) of that block in Q's / dO's views, the query
        head and the block's first query.  (Without GQA no per-step head arithmetic: D128 causal spills with it.)"""
        if GQA:
            g = t // n_iter
            bhq = bhq0 + g
            row0, col0 = _head_origin(bhq, H, RB, RH, CH)
            q0 = (i_start + t - g * n_iter) * BLOCK_M
        else:
            bhq = bhq0
            q0 = (i_start + t) * BLOCK_M
        return row0 + q0, col0, bhq, q0

    @gluon.jit
    def _attn_bwd_dkdv_gluon_kernel(
        LSE,  # fp32 (B*H, S) base-2 log-sum-exp of the forward
        DELTA,  # fp32 (B*H, S) rowsum(dO * O)
        q_desc,  # TMA descriptor of Q in its 2-D view (_head_origin), block (BLOCK_M, D)
        do_desc,  # TMA descriptor of dO in its 2-D view (_head_origin), block (BLOCK_M, D)
        k_desc,  # TMA descriptor of K in its 2-D view (_head_origin), block (BLOCK_N, D)
        v_desc,  # TMA descriptor of V in its 2-D view (_head_origin), block (BLOCK_N, D)
        dk_desc,  # TMA descriptor of dK in its 2-D view (_head_origin), block (BLOCK_N, D) (K's layout)
        dv_desc,  # TMA descriptor of dV in its 2-D view (_head_origin), block (BLOCK_N, D)
        qk_scale,  # scale * log2(e)
        sm_scale,  # scale (dK = scale dS^T Q)
        S,  # sequence length (queries = keys), a multiple of BLOCK_M and BLOCK_N
        H,  # heads
        RB, RH, CH,  # the query heads' origins in Q's and dO's 2-D views (_head_origin)
        G,  # query heads a key / value head (grouped-query attention; 1 otherwise)
        RBk, RHk, CHk,  # the key / value heads' origins in K's, V's, dK's and dV's views
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        HEAD_D: gl.constexpr,
        CAUSAL: gl.constexpr,
        STAGES: gl.constexpr,
        GQA: gl.constexpr,  # G > 1
        num_warps: gl.constexpr,
    ):
        """One program: BLOCK_N keys of one key / value head, dK and dV summed over the query blocks of its G query
        heads."""
        dtype: gl.constexpr = q_desc.dtype
        n0 = gl.program_id(0) * BLOCK_N  # first key of this block (causal: block 0, the heaviest, starts first)
        bhk = gl.program_id(1)  # key / value head: b * (H / G) + its index
        kv_row, kv_col = _head_origin(bhk, H // G, RBk, RHk, CHk)  # its first row and column in K's view
        bhq0 = (bhk // (H // G)) * H + (bhk % (H // G)) * G  # the first of the G query heads that read it
        row0, col0 = _head_origin(bhq0, H, RB, RH, CH)  # its origin in Q's / dO's views
        if CAUSAL:
            i_start = n0 // BLOCK_M  # query blocks before it see none of these keys
        else:
            i_start = 0
        n_iter = S // BLOCK_M - i_start  # query blocks a query head
        n_total = G * n_iter  # ... over the G query heads, one after the other

        # S^T and dP^T: [BLOCK_N, BLOCK_M]
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, HEAD_D, 16])  # dK, dV: [BLOCK_N, D]
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
        col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)  # a value per query (column of S^T)

        k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_D], k_desc.layout)  # (dK at the end)
        v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_D], v_desc.layout)  # (dV at the end)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_D], do_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())  # Q and dO of a slot
        mbarrier.init(kv_bar, count=1)
        for t in gl.static_range(STAGES):
            mbarrier.init(bars.index(t), count=1)
        fence_async_shared()

        # K and V once; the first STAGES query blocks' Q and dO
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + n0, kv_col], kv_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [kv_row + n0, kv_col], kv_bar, v_smem)
        for t in gl.static_range(STAGES):
            live = t < n_total
            q_row, q_col, _, _ = _dkdv_step(t, n_iter, i_start, bhq0, row0, col0, H, RB, RH, CH, BLOCK_M, GQA)
            mbarrier.expect(bars.index(t), q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(q_desc, [q_row, q_col], bars.index(t), q_smem.index(t), pred=live)
            tma.async_copy_global_to_shared(do_desc, [q_row, q_col], bars.index(t), do_smem.index(t), pred=live)

        dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, layout=kv_layout)
        st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
        dpt = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
        keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
        mbarrier.wait(kv_bar, phase=0)
        for t in range(n_total):
            slot = t % STAGES
            _, _, bhq, q0 = _dkdv_step(t, n_iter, i_start, bhq0, row0, col0, H, RB, RH, CH, BLOCK_M, GQA)
            cols = q0 + gl.arange(0, BLOCK_M, layout=col_layout)
            lse = gl.load(LSE + bhq.to(gl.int64) * S + cols)  # (issued before the waits: latency hidden)
            delta = gl.load(DELTA + bhq.to(gl.int64) * S + cols)
            mbarrier.wait(bars.index(slot), phase=(t // STAGES) & 1)
            q_t = q_smem.index(slot)
            do_t = do_smem.index(slot)
            st_tok = warpgroup_mma(k_smem, q_t.permute((1, 0)), st, use_acc=False, is_async=True)
            dpt_tok = warpgroup_mma(v_smem, do_t.permute((1, 0)), dpt, use_acc=False, is_async=True)
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok,))  # S^T done; dP^T may still run
            pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
            if CAUSAL:
                if q0 < n0 + BLOCK_N - 1:  # a block on the diagonal: keys after the query get nothing
                    pt = gl.where(gl.expand_dims(keys, 1) <= gl.expand_dims(cols, 0), pt, 0.0)
            pt_op = gl.convert_layout(pt.to(dtype), op_layout)
            dv_tok = warpgroup_mma(pt_op, do_t, dv, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt_tok,))  # dP^T done; dV may still run
            dst = pt * (dpt - gl.expand_dims(delta, 0))
            dst_op = gl.convert_layout(dst.to(dtype), op_layout)
            dk_tok = warpgroup_mma(dst_op, q_t, dk, is_async=True)
            dv, dk, pt_done, dst_done = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok, pt_op, dst_op))
            # the slot's Q and dO are free: fetch query block t + STAGES into it
            nxt = t + STAGES
            live = nxt < n_total
            q_row, q_col, _, _ = _dkdv_step(nxt, n_iter, i_start, bhq0, row0, col0, H, RB, RH, CH, BLOCK_M, GQA)
            mbarrier.expect(bars.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(q_desc, [q_row, q_col], bars.index(slot), q_smem.index(slot), pred=live)
            tma.async_copy_global_to_shared(do_desc, [q_row, q_col], bars.index(slot), do_smem.index(slot), pred=live)

        mbarrier.invalidate(kv_bar)
        for t in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(t))
        k_smem.store((dk * sm_scale).to(dtype))  # K's and V's buffers: every wgmma reading them has retired
        v_smem.store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, [kv_row + n0, kv_col], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [kv_row + n0, kv_col], v_smem)
        tma.store_wait(pendings=0)


def _layout(t: torch.Tensor, B: int, H: int, S: int, D: int):
    """The 2-D view the TMA descriptors read ``t`` (B, H, S, D) through, or None: (kind, rows, width, row stride).
    Kind 0, head-major: contiguous (B, H, S, D), rows B*H*S of D.  Kind 1, sequence-major: (B, S, H, D) memory
    (the transpose of a (B, S, H*D) projection), also q / k / v sliced from one packed (B, S, 3*H*D) projection;
    rows B*S of the heads side by side, any row stride that is a multiple of 16 bytes.  (Strides of size-1 dims do
    not matter.)"""
    sb, sh, ss, sd = t.stride()
    if sd != 1:
        return None
    if ss == D and (H == 1 or sh == S * D) and (B == 1 or sb == H * S * D):
        return 0, B * H * S, D, D
    if (H == 1 or sh == D) and (B == 1 or sb == S * ss) and ss % 8 == 0 and ss >= H * D:
        return 1, B * S, H * D, ss
    return None


def _origin(kind: int, H: int, S: int, D: int) -> tuple:
    """(RB, RH, CH) of _head_origin for a layout kind."""
    return (H * S, S, 0) if kind == 0 else (S, 0, D)


def _origin(kind: int, H: int, S: int, D: int) -> tuple:
    """(RB, RH, CH) of _head_origin for a layout kind."""
    return (H * S, S, 0) if kind == 0 else (S, 0, D)


_SUPPORTED: dict = {}
_MAX_CACHED = 4096


def _remember(cache: dict, key, value):
    """cache[key] = value, the cache emptied first when it holds _MAX_CACHED entries (shapes seen in a run are few)."""
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[key] = value
    return value


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str | None:
    """None when the Gluon kernels take the call, else why not (the caller then runs the Triton kernels).  k and v
    may have fewer heads than q (a divisor of its heads) and a layout of their own.  Every rule but the data's
    alignment depends on shapes, strides, dtypes and device only: cached (a call's host cost)."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device)
    why = _SUPPORTED.get(key, 0)
    if why == 0:
        why = _remember(_SUPPORTED, key, _supported(q, k, v))
    if why is None and (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:
        return "data must be 16-byte aligned"
    return why


def _on_sm90(t: torch.Tensor) -> bool:
    """``t`` is on an sm_90 GPU (the tests patch it to check the routing on the CPU)."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] == 9


def _supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    if not HAS_GLUON:
        return "no Gluon in this Triton"
    if not _on_sm90(q):
        return "not an sm_90 GPU"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return "dtype must be bf16 or fp16 for q, k and v alike"
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        return "q, k, v must be (B, H, S, D), k and v of one shape"
    B, H, S, D = q.shape
    HKV = k.shape[1]
    if q.numel() == 0 or k.numel() == 0:
        return "empty inputs"
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, S, D):
        return "k, v must have q's batch, sequence length (Sq == Sk) and head dim"
    if H % HKV:
        return f"q's heads ({H}) must be a multiple of k's and v's ({HKV})"
    if D not in GLUON_FWD_TILES:
        return f"head dim {D} not in {sorted(GLUON_FWD_TILES)}"
    bm, bn = GLUON_FWD_TILES[D].block_m, GLUON_FWD_TILES[D].block_n
    if S % bm or S % bn:
        return f"sequence length {S} not a multiple of {bm} and {bn}"
    lays = [_layout(q, B, H, S, D), _layout(k, B, HKV, S, D), _layout(v, B, HKV, S, D)]
    if None in lays or lays[1][0] != lays[2][0]:
        return ("q, k, v must each be contiguous (B, H, S, D) or (B, S, H, D) in memory (heads side by side in a "
                "row of 16-byte aligned stride), k and v alike")
    return None


def auto_ok(kernel: str, q: torch.Tensor, causal: bool) -> bool:
    """The Gluon ``kernel`` ("fwd" or "dkdv") takes this (supported) call: from GLUON_MIN_WORK up, and the dK / dV
    kernel only to the lengths of GLUON_DKDV_MAX_S."""
    B, H, S, D = q.shape
    if B * H * S * S * D // (2 if causal else 1) < GLUON_MIN_WORK:
        return False
    if kernel == "fwd":
        return True
    top = GLUON_DKDV_MAX_S.get(D, 0)
    return top is None or S <= top


def fwd_kernel(D: int, S: int, causal: bool) -> str:
    """The forward kernel that takes a (supported) call: "ws_persistent" (the ping-pong on a persistent grid) up to
    GLUON_FWD_PERSISTENT_MAX_S, else the one GLUON_FWD_KERNEL names, "ws" (the ping-pong) or "plain" (one
    warpgroup); the ping-pong needs S a multiple of its 128-row tiles and of its key tile."""
    key = (D, bool(causal))
    if S % max(128, GLUON_PINGPONG_TILES[D].block_n):
        return "plain"
    if S <= GLUON_FWD_PERSISTENT_MAX_S.get(key, 0):
        return "ws_persistent"
    return GLUON_FWD_KERNEL[key]


class _Launch:
    """One call shape's launch: the kernel bound through ops/_library.Kernel (after the first call, Triton's launcher
    directly: no JIT dispatch), its TMA descriptors made once (each call sets their ``base`` to its tensors: the
    launcher encodes the tensor map from base.data_ptr()), and the layout of what it allocates."""

    __slots__ = ("kernel", "descs", "ints", "out_stride")


_LAUNCHES: dict = {}


def _descs(tensors, blocks) -> list:
    """TMA descriptors over the 2-D views of ``tensors`` ((B, H, S, D), each with its own heads; ``blocks`` rows a
    tile), NVMMA-swizzled as the kernels' shared buffers."""
    out = []
    for t, block in zip(tensors, blocks):
        B, H, S, D = t.shape
        _, rows, width, stride = _layout(t, B, H, S, D)
        dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
        layout = gl.NVMMASharedLayout.get_default_for([block, D], dtype)
        out.append(TensorDescriptor(t, [rows, width], [stride, 1], [block, D], layout))
    return out


def _fire(plan: _Launch, first, tensors, *scalars) -> None:
    """Launch ``plan`` on this call's tensors (``first``: the leading tensor arguments)."""
    for d, t in zip(plan.descs, tensors):
        d.base = t
    plan.kernel(*first, *plan.descs, *scalars, *plan.ints)
    for d in plan.descs:  # (the tensor map was encoded at launch: hold no reference to this call's tensors)
        d.base = None


def _seq_major_stride(B: int, H: int, S: int, D: int) -> tuple:
    """Strides of a dense (B, S, H, D) buffer seen as (B, H, S, D)."""
    return (S * H * D, D, H * D, 1)


_SMS: dict = {}


def _sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def _fwd_launch(q, k, v, causal: bool, kind: str) -> _Launch:
    key = ("fwd", q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, bool(causal), kind)
    plan = _LAUNCHES.get(key)
    if plan is not None:
        return plan
    B, H, S, D = q.shape
    HKV = k.shape[1]
    q_kind, kv_kind = _layout(q, B, H, S, D)[0], _layout(k, B, HKV, S, D)[0]
    heads = (H, *_origin(q_kind, H, S, D), H // HKV, *_origin(kv_kind, HKV, S, D))
    plan = _Launch()
    plan.out_stride = _seq_major_stride(B, H, S, D) if q_kind == 1 else (H * S * D, S * D, D, 1)
    out = torch.empty_strided(q.shape, plan.out_stride, dtype=q.dtype, device=q.device)
    if kind == "plain":
        t = GLUON_FWD_TILES[D]
        plan.descs = _descs((q, k, v, out), (t.block_m, t.block_n, t.block_n, t.block_m))
        plan.ints = (S, *heads)
        plan.kernel = Kernel(_attn_fwd_gluon_kernel, (S // t.block_m, B * H), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                             HEAD_D=D, CAUSAL=bool(causal), STAGES=t.stages, num_warps=t.num_warps)
    else:
        t = GLUON_PINGPONG_TILES[D]
        plan.descs = _descs((q, k, v, out), (64, t.block_n, t.block_n, 64))
        plan.ints = (S, B * H, *heads)
        tiles = (S // 128) * B * H
        # persistent: one program an SM (at most one a tile), each walking tiles; else one program a 128-row tile
        persistent = kind == "ws_persistent"
        grid = (min(_sm_count(q.device), tiles), 1) if persistent else (S // 128, B * H)
        plan.kernel = Kernel(_attn_fwd_gluon_ws_kernel, grid, BLOCK_N=t.block_n, HEAD_D=D, CAUSAL=bool(causal),
                             STAGES=t.stages, CONSUMER_REGS=t.consumer_regs, PRODUCER_REGS=t.producer_regs,
                             PERSISTENT=persistent, num_warps=4)
    return _remember(_LAUNCHES, key, plan)


def _forward(q, k, v, causal: bool, scale: float | None, kind: str):
    """(O, LSE) by the forward kernel ``kind`` ("plain", "ws", "ws_persistent") for a call ``supported`` took."""
    plan = _fwd_launch(q, k, v, causal, kind)
    B, H, S, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.empty_strided(q.shape, plan.out_stride, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, S), device=q.device, dtype=torch.float32)
    _fire(plan, (lse,), (q, k, v, out), scale * LOG2E)
    return out, lse


def forward(q, k, v, causal: bool, scale: float | None):
    """The Gluon forward for a call ``supported`` took (not checked again here): the kernel ``fwd_kernel`` names."""
    return _forward(q, k, v, causal, scale, fwd_kernel(q.shape[-1], q.shape[2], causal))


def attention_forward_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                            scale: float | None = None):
    """(O, LSE): O laid out like q (head-major or sequence-major), LSE fp32 (B, H, S) base-2.  Raises ValueError
    when ``supported`` says no."""
    why = supported(q, k, v, causal)
    if why is not None:
        raise ValueError(f"attention_forward_gluon: {why}")
    return forward(q, k, v, causal, scale)


def dkdv_grads_ok(q, k, do, dk, dv) -> str | None:
    """After ``supported`` said yes for q, k, v: None when the dK / dV kernel takes this backward (dO of q's shape,
    dtype and layout kind, dK and dV of k's; S a multiple of its tiles), else why not."""
    B, H, S, D = q.shape
    t = GLUON_DKDV_TILES[D]
    if S % t.block_m or S % t.block_n:
        return f"sequence length {S} not a multiple of {t.block_m} and {t.block_n}"
    q_kind, kv_kind = _layout(q, B, H, S, D)[0], _layout(k, B, k.shape[1], S, D)[0]
    for g, ref, ref_kind in ((do, q, q_kind), (dk, k, kv_kind), (dv, k, kv_kind)):
        lay = _layout(g, *ref.shape) if g.shape == ref.shape and g.dtype == q.dtype else None
        if lay is None or lay[0] != ref_kind or g.data_ptr() % 16:
            return "dO and the gradients must have q's (dO) or k's (dK, dV) shape, dtype and layout kind"
    return None


def _dkdv_launch(q, k, v, do, dk, dv, causal: bool) -> _Launch:
    """The dK / dV kernel's launch: descriptors q, dO, K, V, dK, dV; a program per key block of each key / value
    head."""
    key = ("dkdv", q.shape, q.stride(), k.shape, k.stride(), v.stride(), do.stride(), dk.stride(), dv.stride(),
           q.dtype, q.device, bool(causal))
    plan = _LAUNCHES.get(key)
    if plan is not None:
        return plan
    B, H, S, D = q.shape
    t = GLUON_DKDV_TILES[D]
    HKV = k.shape[1]
    q_kind, kv_kind = _layout(q, B, H, S, D)[0], _layout(k, B, HKV, S, D)[0]
    plan = _Launch()
    plan.out_stride = None
    bm, bn = t.block_m, t.block_n
    plan.descs = _descs((q, do, k, v, dk, dv), (bm, bm, bn, bn, bn, bn))
    plan.ints = (S, H, *_origin(q_kind, H, S, D), H // HKV, *_origin(kv_kind, HKV, S, D))
    plan.kernel = Kernel(_attn_bwd_dkdv_gluon_kernel, (S // bn, B * HKV), BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D,
                         CAUSAL=bool(causal), STAGES=t.stages, GQA=HKV != H, num_warps=t.num_warps)
    return _remember(_LAUNCHES, key, plan)


def dkdv(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float):
    """dK and dV into ``dk``, ``dv`` for a backward ``supported`` and ``dkdv_grads_ok`` took (not checked again)."""
    plan = _dkdv_launch(q, k, v, do, dk, dv, causal)
    _fire(plan, (lse, delta), (q, do, k, v, dk, dv), scale * LOG2E, scale)
    return dk, dv


def attention_dkdv_gluon(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float):
    """dK and dV into ``dk``, ``dv`` (Gluon); ``lse`` the forward's base-2 LSE, ``delta`` rowsum(dO O), both fp32
    (B, H, S) contiguous.  Raises ValueError when the kernel does not take the call."""
    why = supported(q, k, v, causal)
    if why is None:
        why = dkdv_grads_ok(q, k, do, dk, dv)
    if why is not None:
        raise ValueError(f"attention_dkdv_gluon: {why}")
    return dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale)
