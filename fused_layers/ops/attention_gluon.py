"""Hopper attention kernels written in Gluon (Triton's explicit layout / shared-memory / barrier language): issue 13.
GPU only (Gluon has no interpreter), sm_90.  ops/attention.py runs them by default on large eager calls they take
(attention_config variants ``fwd_gluon``, ``bwd_gluon_dkdv``, ``bwd_gluon_dq``; ``auto_ok`` and the tables at the end
of this file); ``benchmarks/bench_attention_gluon.py`` times them beside the Triton kernels and cuDNN:

  * ``attention_forward_gluon_ws``: FlashAttention-3's warp-specialized ping-pong (two consumer warpgroups, a TMA
    producer warp), the default forward at D128 and D64 causal: 1.00-1.13x cuDNN at D128 S >= 4K (session 14); on a
    persistent grid (one program an SM, session 17) the default for short rows (``FWD_PERSIST_MAX_S``);
  * ``attention_forward_gluon``: one warpgroup a CTA (below), the default at D64 non-causal;
  * ``attention_dkdv_gluon``: the backward's dK / dV kernel (the Triton dQ kernel runs after it);
  * ``attention_dq_gluon``: a dQ kernel (opt-in: it did not beat the Triton one, session 14).

q, k, v are read in place in two layouts (``_layout``): contiguous (B, H, S, D), and sequence-major ((B, S, H, D)
memory, also slices of one packed (B, S, 3, H, D) projection); ``_head_origin`` maps a (batch, head) to its first row
and column in the 2-D view a TMA descriptor sees.  Launches go through ops/_library.Kernel (bound once per call shape,
then Triton's launcher directly), the descriptors made once per shape with their ``base`` set per call.

Why Gluon.  The Triton forward (ops/attention.py) reaches 0.67-0.93 of cuDNN's forward.  ncu (issue13/ncu/): cuDNN runs
3 warpgroups at 73% SM busy, ours 2 warpgroups at 48%; Triton 3.6's pipeliner loads K / V with cp.async and waits for
each Q K^T before its softmax, so a warpgroup's tensor cores idle while it exponentiates.  Triton's automatic warp
specialization (``tl.range(warp_specialize=True)``) and TMA variants were measured slower (issue13/run6_variants/).
Gluon states the schedule directly:

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
backward's LSE, so the two forwards are interchangeable).

Scope: (B, H, S, D) inputs in one of the two layouts above, Sq == Sk, S a multiple of BLOCK_M and BLOCK_N, D in
{64, 128}, bf16 / fp16, no mask, no dropout, no GQA.  ``supported`` says whether a call qualifies; the caller falls
back to the Triton kernels otherwise.
"""

from __future__ import annotations

import math

import torch

from ._library import Kernel

try:  # Gluon: Triton >= 3.5 with the NVIDIA Hopper dialect
    import triton
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

# (head dim) -> (BLOCK_M, BLOCK_N, num_warps, STAGES); shared memory: Q BLOCK_M x D + 2 x STAGES x BLOCK_N x D.
# One warpgroup of 64 query rows a CTA, so that several CTAs share an SM and one's softmax overlaps another's wgmma
# (the scheduler's ping-pong): H200, session 13 (benchmarks/results/issue13/run19_g/), TFLOP/s of the forward at
# S 1K / 4K / 16K, non-causal and causal, against the first form (128 rows, 8 warps, one CTA an SM):
#   D128  64 x 64, 3 stages (112 KB: 2 CTAs an SM)   458 / 376 / 502 / 458 / 513 / 504   (first form 389-480 / 295-420)
#         64 x 64 x 2 stages 387-452 / 320-422; 64 x 128 x 2 stages (144 KB: one CTA) 311-390 / 239-325
#   D64   64 x 128, 3 stages (104 KB: 2 CTAs)        377-386 / 190-282 / 425-427 / 377-381 / 437-445 / 428-432
#         64 x 64 x 4 stages 385 / 194-308 / 407 / 369-375 / 410-414 / 395; 64 x 128 x 2 stages 388-409 / 193-209 /
#         440 / 327 / 423-427 / 344-347; 128 x 128 x 8 warps 316-318 / 196-229 / 366-369 / 314 / 384 / 369
# (D64 S1024 causal spreads 190-308 run to run for every config: 4,096 short CTAs.)
CONFIGS = {64: (64, 128, 4, 3), 128: (64, 64, 4, 3)}
# Persistent grid (programs an SM; 0 = one program a query block, what the table above measured).  Measured in
# session 14 (issue13/run20_a/): 1 or 2 programs an SM ran at 0.5-0.9x of one program a block in every case.
PERSISTENT_PER_SM = 0


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
    def _attn_fwd_tile(q_desc, k_desc, v_desc, o_desc, LSE, qk_scale, S, H, RB, RH, CH, G, RBk, RHk, CHk, pid_m, bh,
                       base, tile_phase,
                       q_smem, k_smem, v_smem, q_bar, k_bars, v_bars,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, CAUSAL: gl.constexpr,
                       STAGES: gl.constexpr, num_warps: gl.constexpr):
        """One query block (pid_m, bh): the whole online softmax over its key blocks, O and LSE stored.  ``base``:
        K / V blocks this program consumed before (ring slot of block j: (base + j) % STAGES, its mbarrier phase
        ((base + j) // STAGES) & 1); ``tile_phase``: Q's mbarrier phase.  Returns the blocks consumed."""
        dtype: gl.constexpr = q_desc.dtype
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

        # Step 1: Q, then the first STAGES key / value blocks (those that exist).  Every slot is free: the previous
        # tile (persistent programs) waited for all its loads and wgmmas.
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row, col0], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            live = i < n_blocks
            sl = (base + i) % STAGES
            mbarrier.expect(k_bars.index(sl), k_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(k_desc, [kv_row + i * BLOCK_N, kv_col], k_bars.index(sl), k_smem.index(sl), pred=live)
            mbarrier.expect(v_bars.index(sl), v_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(v_desc, [kv_row + i * BLOCK_N, kv_col], v_bars.index(sl), v_smem.index(sl), pred=live)

        # Step 2: block 0's scores and softmax (nothing to overlap with yet).
        mbarrier.wait(q_bar, phase=tile_phase)
        mbarrier.wait(k_bars.index(base % STAGES), phase=(base // STAGES) & 1)
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        s_tok = warpgroup_mma(q_smem, k_smem.index(base % STAGES).permute((1, 0)), s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        if CAUSAL:
            if n_blocks == 1:
                s = _scores_masked(s, pid_m * BLOCK_M, 0, BLOCK_M, BLOCK_N, s_layout)
        m_i, p, l_i = _softmax_first(s, qk_scale)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)

        # Step 3: iteration j overlaps the softmax of block j with the P V wgmma of block j - 1.
        for j in range(1, n_blocks):
            slot = (base + j) % STAGES
            prev = (base + j - 1) % STAGES
            mbarrier.wait(k_bars.index(slot), phase=((base + j) // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s, use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(prev), phase=((base + j - 1) // STAGES) & 1)
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
            tma.async_copy_global_to_shared(k_desc, [kv_row + nxt * BLOCK_N, kv_col], k_bars.index(prev), k_smem.index(prev), pred=live)
            mbarrier.expect(v_bars.index(prev), v_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(v_desc, [kv_row + nxt * BLOCK_N, kv_col], v_bars.index(prev), v_smem.index(prev), pred=live)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        # Step 4: the last block's P V, then O = acc / l and L = m + log2(l).
        last = base + n_blocks - 1
        mbarrier.wait(v_bars.index(last % STAGES), phase=(last // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
        acc, p_done = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        _store_out(acc, m_i, l_i, LSE, bh, S, pid_m * BLOCK_M, q_row, col0, q_smem, o_desc, BLOCK_M, row_s, row_o)
        return n_blocks

    @gluon.jit
    def _attn_fwd_gluon_kernel(
        LSE,  # fp32 (B*H, S) base-2 log-sum-exp, contiguous
        q_desc,  # TMA descriptor of Q in its 2-D view (_head_origin), block (BLOCK_M, D)
        k_desc,  # TMA descriptor of K in its 2-D view (_head_origin), block (BLOCK_N, D)
        v_desc,  # TMA descriptor of V in its 2-D view (_head_origin), block (BLOCK_N, D)
        o_desc,  # TMA descriptor of O in its 2-D view (_head_origin), block (BLOCK_M, D) (Q's layout)
        qk_scale,  # scale * log2(e)
        S,  # sequence length (queries = keys), a multiple of BLOCK_M and BLOCK_N
        BH,  # batch x heads
        H,  # heads
        RB, RH, CH,  # head origins in the descriptors' 2-D views (_head_origin)
        G,  # query heads a key / value head (grouped-query attention; 1 otherwise)
        RBk, RHk, CHk,  # the key / value heads' origins in K's and V's views
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        HEAD_D: gl.constexpr,
        CAUSAL: gl.constexpr,
        STAGES: gl.constexpr,
        PERSISTENT: gl.constexpr,  # a grid of a few programs an SM walking the query blocks heaviest first
        num_warps: gl.constexpr,
    ):
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
        n_qblocks = S // BLOCK_M
        if PERSISTENT:
            # Tile t: query block t // BH from the far end of the diagonal (causal: heaviest first), head t % BH;
            # round-robin over the programs, so every program starts on a heavy block and ends on light ones.
            base = 0
            tile_phase = 0
            for t in range(gl.program_id(0), n_qblocks * BH, gl.num_programs(0)):
                if CAUSAL:
                    pid_m = n_qblocks - 1 - t // BH
                else:
                    pid_m = t // BH
                used = _attn_fwd_tile(q_desc, k_desc, v_desc, o_desc, LSE, qk_scale, S, H, RB, RH, CH, G, RBk, RHk, CHk, pid_m,
                                      t % BH, base, tile_phase,
                                      q_smem, k_smem, v_smem, q_bar, k_bars, v_bars,
                                      BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES, num_warps)
                base += used
                tile_phase ^= 1
        else:
            if CAUSAL:
                pid_m = n_qblocks - 1 - gl.program_id(0)  # heaviest first: the diagonal's far end starts first
            else:
                pid_m = gl.program_id(0)
            _attn_fwd_tile(q_desc, k_desc, v_desc, o_desc, LSE, qk_scale, S, H, RB, RH, CH, G, RBk, RHk, CHk, pid_m,
                           gl.program_id(1), 0, 0,
                           q_smem, k_smem, v_smem, q_bar, k_bars, v_bars,
                           BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES, num_warps)
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))


    # ------------------------------------------------------------------------------------------------------------
    # The ping-pong (session 13; a default forward since session 14), FlashAttention-3's warp specialization.  A CTA
    # holds a query tile of 2 x 64 rows: two consumer warpgroups (the default partition and a 4-warp worker), each owning 64
    # rows, and a 1-warp producer that keeps the K / V ring full by TMA (ready barriers: the TMA's byte count; empty
    # barriers: one arrival from each consumer once its wgmmas that read the buffer have retired).  The consumers take
    # turns at the tensor cores (turn barriers): consumer c waits for its turn, issues its S_j = Q K_j^T and
    # O += P_{j-1} V_{j-1}, hands the turn over and runs its softmax while the other's matrix products run.
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
            tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, kv_col], k_ready.index(slot), k_smem.index(slot))
            if c >= STAGES:
                mbarrier.wait(v_empty.index(slot), phase=((c // STAGES) - 1) & 1)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, kv_col], v_ready.index(slot), v_smem.index(slot))

    @gluon.jit
    def _ws_consumer_tile(o_desc, LSE, qk_scale, S, bh, q_row, col0, q0, n_blocks, c0, T0, q_smem, o_smem, k_smem, v_smem,
                          k_ready, v_ready, k_empty, v_empty, my_turn, other_turn,
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
        """The producer of a persistent program: every tile's key blocks through one ring, running ahead across tiles."""
        n_tiles = S // 128
        c = 0
        for t in range(gl.program_id(0), n_tiles * BH, gl.num_programs(0)):
            tile, bh, n_blocks = _ws_tile_of(t, n_tiles, BH, S, CAUSAL, BLOCK_N)
            kv_row, kv_col = _kv_origin(bh, H, G, RBk, RHk, CHk)
            _ws_producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, kv_col, n_blocks, c,
                         BLOCK_N, STAGES)
            c += n_blocks

    @gluon.jit
    def _ws_consumer_persistent(q_desc, o_desc, LSE, qk_scale, S, BH, H, RB, RH, CH, q_smem, o_smem, q_bar, k_smem, v_smem,
                                k_ready, v_ready, k_empty, v_empty, my_turn, other_turn,
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
            _ws_consumer_tile(o_desc, LSE, qk_scale, S, bh, row0 + q0, col0, q0, n_blocks, c, turns, q_smem, o_smem, k_smem,
                              v_smem, k_ready, v_ready, k_empty, v_empty, my_turn, other_turn,
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
                (_ws_producer_persistent, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, S, BH, H, G,
                                           RBk, RHk, CHk, BLOCK_N, STAGES, CAUSAL)),
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
                (_ws_consumer, (q_desc, o_desc, LSE, qk_scale, S, bh, row0, col0, q0, n_blocks, q_smem.index(0), q_bars.index(0),
                                k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn.index(0), turn.index(1),
                                True, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES)),
                (_ws_consumer, (q_desc, o_desc, LSE, qk_scale, S, bh, row0, col0, q0 + BLOCK_M, n_blocks, q_smem.index(1), q_bars.index(1),
                                k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn.index(1), turn.index(0),
                                False, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES)),
                (_ws_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, kv_col, n_blocks,
                                0, BLOCK_N, STAGES)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


    # ------------------------------------------------------------------------------------------------------------
    # Backward (session 13; default since session 14): the dK / dV kernel in Gluon, the forward's recipe (one
    # warpgroup a CTA, several CTAs an SM, a TMA ring, asynchronous wgmma groups overlapping the elementwise work);
    # dQ stays with the Triton dQ kernel.  Per CTA: BLOCK_N keys of one head, K and V loaded once; per query block
    # i (BLOCK_M rows): S^T = K Q_i^T and dP^T = V dO_i^T issued together, P^T = exp2(S^T c - L_i) while dP^T runs,
    # dV += P^T dO_i issued, dS^T = P^T (dP^T - delta_i) while dV runs, dK += dS^T Q_i; dK scaled once at the end.
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
        DQ,  # (FUSED_DQ) fp32 (B*H, S, D) contiguous, zeroed: scale * dQ accumulated by atomics; else unused
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
        FUSED_DQ: gl.constexpr,  # also dQ_i += scale dS_i K (dS^T through shared memory), added into DQ by atomics
        num_warps: gl.constexpr,
    ):
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

        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, BLOCK_M, 16])  # S^T, dP^T: [BLOCK_N, BLOCK_M]
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

        if FUSED_DQ:
            ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M],
                                                gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
            dq_t = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=kv_layout)
            dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, kv_layout))
            dq_cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, kv_layout))
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
            if FUSED_DQ:
                # dQ_i = dS_i K: dS^T to shared memory, read back transposed as the A operand (K is B as it lies)
                ds_smem.store(dst.to(dtype))
                fence_async_shared()
                gl.thread_barrier()
                dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_t, use_acc=False, is_async=True)
                dv, dk, dq_t, pt_done, dst_done = warpgroup_mma_wait(num_outstanding=0,
                                                                     deps=(dv_tok, dk_tok, dq_tok, pt_op, dst_op))
                dq_ptr = DQ + gl.expand_dims((bhq.to(gl.int64) * S + q0 + dq_rows) * HEAD_D, 1) + gl.expand_dims(dq_cols, 0)
                gl.atomic_add(dq_ptr, dq_t * sm_scale, sem="relaxed")
            else:
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

    # ------------------------------------------------------------------------------------------------------------
    # Backward, dQ (session 14): the Triton dQ kernel's work in Gluon, the dK / dV kernel's recipe turned around.  Per
    # CTA: BLOCK_M queries of one head, Q and dO loaded once, a TMA ring of K / V blocks; per key block j:
    # S_j = Q K_j^T and dP_j = dO V_j^T are issued, then dQ += dS_{j-1} K_{j-1} (the previous block's), so that the
    # tensor cores run dP_j and dQ_{j-1} while P_j = exp2(S_j c - L) and dS_j = P_j (dP_j - delta) are computed.
    # dQ is scaled once at the end and stored by TMA through Q's buffer.
    # ------------------------------------------------------------------------------------------------------------

    @gluon.jit
    def _dq_probs(s, lse, qk_scale, q0, k0, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  layout: gl.constexpr):
        """P = exp2(S c - L) of one key block from k0 (0 where a key comes after its query, causal)."""
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
        if CAUSAL:
            if k0 + BLOCK_N > q0 + 1:  # a key block reaching past this block's first query
                rows = q0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
                cols = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
                p = gl.where(gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0), p, 0.0)
        return p

    @gluon.jit
    def _attn_bwd_dq_gluon_kernel(
        LSE,  # fp32 (B*H, S) base-2 log-sum-exp of the forward
        DELTA,  # fp32 (B*H, S) rowsum(dO * O)
        q_desc,  # TMA descriptor of Q in its 2-D view (_head_origin), block (BLOCK_M, D)
        do_desc,  # TMA descriptor of dO in its 2-D view (_head_origin), block (BLOCK_M, D)
        k_desc,  # TMA descriptor of K in its 2-D view (_head_origin), block (BLOCK_N, D)
        v_desc,  # TMA descriptor of V in its 2-D view (_head_origin), block (BLOCK_N, D)
        dq_desc,  # TMA descriptor of dQ in its 2-D view (_head_origin), block (BLOCK_M, D) (Q's layout)
        qk_scale,  # scale * log2(e)
        sm_scale,  # scale (dQ = scale dS K)
        S,  # sequence length (queries = keys), a multiple of BLOCK_M and BLOCK_N
        H,  # heads
        RB, RH, CH,  # head origins in the descriptors' 2-D views (_head_origin)
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        HEAD_D: gl.constexpr,
        CAUSAL: gl.constexpr,
        STAGES: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        dtype: gl.constexpr = q_desc.dtype
        n_qblocks = S // BLOCK_M
        if CAUSAL:
            pid_m = n_qblocks - 1 - gl.program_id(0)  # heaviest first
            n_blocks = ((pid_m + 1) * BLOCK_M + BLOCK_N - 1) // BLOCK_N  # key blocks up to the diagonal
        else:
            pid_m = gl.program_id(0)
            n_blocks = S // BLOCK_N
        bh = gl.program_id(1)
        row0, col0 = _head_origin(bh, H, RB, RH, CH)  # this head's first row and column in the 2-D views
        q0 = pid_m * BLOCK_M

        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])  # S, dP: [BLOCK_M, BLOCK_N]
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, HEAD_D, 16])  # dQ: [BLOCK_M, D]
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)  # (dQ at the end)
        do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
        qdo_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(qdo_bar, count=1)
        for t in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(t), count=1)
            mbarrier.init(v_bars.index(t), count=1)
        fence_async_shared()

        # Step 1: Q and dO once; the first STAGES key / value blocks (those that exist).
        mbarrier.expect(qdo_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row0 + q0, col0], qdo_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [row0 + q0, col0], qdo_bar, do_smem)
        for t in gl.static_range(STAGES):
            live = t < n_blocks
            mbarrier.expect(k_bars.index(t), k_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(k_desc, [row0 + t * BLOCK_N, col0], k_bars.index(t), k_smem.index(t), pred=live)
            mbarrier.expect(v_bars.index(t), v_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(v_desc, [row0 + t * BLOCK_N, col0], v_bars.index(t), v_smem.index(t), pred=live)
        rows = q0 + gl.arange(0, BLOCK_M, layout=row_s)
        lse = gl.load(LSE + bh.to(gl.int64) * S + rows)
        delta = gl.load(DELTA + bh.to(gl.int64) * S + rows)

        # Step 2: block 0's S, dP and dS (nothing to overlap with yet but dP with P).
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        dp = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        mbarrier.wait(qdo_bar, phase=0)
        mbarrier.wait(k_bars.index(0), phase=0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(0), phase=0)
        dp_tok = warpgroup_mma(do_smem, v_smem.index(0).permute((1, 0)), dp, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        p = _dq_probs(s, lse, qk_scale, q0, 0, CAUSAL, BLOCK_M, BLOCK_N, s_layout)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
        ds_op = gl.convert_layout((p * (dp - gl.expand_dims(delta, 1))).to(dtype), op_layout)
        dq = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=dq_layout)

        # Step 3: iteration j issues S_j, dP_j, then dQ += dS_{j-1} K_{j-1}; P_j and dS_j run beside the last two.
        for j in range(1, n_blocks):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_bars.index(slot), phase=(j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s, use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(slot), phase=(j // STAGES) & 1)
            dp_tok = warpgroup_mma(do_smem, v_smem.index(slot).permute((1, 0)), dp, use_acc=False, is_async=True)
            dq_tok = warpgroup_mma(ds_op, k_smem.index(prev), dq, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=2, deps=(s_tok,))  # S_j done; dP_j and dQ_{j-1} may run
            p = _dq_probs(s, lse, qk_scale, q0, j * BLOCK_N, CAUSAL, BLOCK_M, BLOCK_N, s_layout)
            dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp_tok,))  # dP_j done; dQ_{j-1} may run
            ds = p * (dp - gl.expand_dims(delta, 1))
            dq, ds_done = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ds_op))
            # block j - 1's K and V buffers are free (dP_{j-1} and dQ_{j-1} retired): fetch block j - 1 + STAGES
            nxt = j - 1 + STAGES
            live = nxt < n_blocks
            mbarrier.expect(k_bars.index(prev), k_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(k_desc, [row0 + nxt * BLOCK_N, col0], k_bars.index(prev), k_smem.index(prev), pred=live)
            mbarrier.expect(v_bars.index(prev), v_desc.block_type.nbytes, pred=live)
            tma.async_copy_global_to_shared(v_desc, [row0 + nxt * BLOCK_N, col0], v_bars.index(prev), v_smem.index(prev), pred=live)
            ds_op = gl.convert_layout(ds.to(dtype), op_layout)

        # Step 4: the last block's dQ, then dQ * scale by TMA through Q's buffer (every wgmma reading it has retired).
        last = (n_blocks - 1) % STAGES
        dq_tok = warpgroup_mma(ds_op, k_smem.index(last), dq, is_async=True)
        dq, ds_done = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ds_op))
        mbarrier.invalidate(qdo_bar)
        for t in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(t))
            mbarrier.invalidate(v_bars.index(t))
        q_smem.store((dq * sm_scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [row0 + q0, col0], q_smem)
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


_SUPPORTED: dict = {}
_MAX_CACHED = 4096


def _remember(cache: dict, key, value):
    """cache[key] = value, the cache emptied first when it holds _MAX_CACHED entries (shapes seen in a run are few)."""
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[key] = value
    return value


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, gqa: bool = False) -> str | None:
    """None when the Gluon kernels take the call, else why not (the caller then runs the Triton kernels).  ``gqa``
    (the forwards): k and v may have fewer heads than q (a divisor of its heads) and a layout of their own; the
    backward kernels take neither.  Every rule but the data's alignment depends on shapes, strides, dtypes and
    device only: cached (a call's host cost)."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device, gqa)
    why = _SUPPORTED.get(key, 0)
    if why == 0:
        why = _remember(_SUPPORTED, key, _supported(q, k, v, gqa))
    if why is None and (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:
        return "data must be 16-byte aligned"
    return why


def _supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> str | None:
    if not HAS_GLUON:
        return "no Gluon in this Triton"
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
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
    if HKV != H and not (gqa and H % HKV == 0):
        return ("k, v must have q's heads" if not gqa else f"q's heads ({H}) must be a multiple of k's and v's ({HKV})")
    if D not in CONFIGS:
        return f"head dim {D} not in {sorted(CONFIGS)}"
    bm, bn, _, _ = CONFIGS[D]
    if S % bm or S % bn:
        return f"sequence length {S} not a multiple of {bm} and {bn}"
    lays = [_layout(q, B, H, S, D), _layout(k, B, HKV, S, D), _layout(v, B, HKV, S, D)]
    if None in lays or lays[1][0] != lays[2][0] or (not gqa and lays[0][0] != lays[1][0]):
        return ("q, k, v must all be contiguous (B, H, S, D), or all (B, S, H, D) in memory (heads side by side in a "
                "row of 16-byte aligned stride)" + (": k and v alike" if gqa else ""))
    return None


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
        layout = gl.NVMMASharedLayout.get_default_for([block, D], gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16)
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


def _fwd_launch(q, k, v, causal: bool, ws: bool, config, per_sm: int) -> _Launch:
    key = ("fwd", q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, bool(causal), ws, config,
           per_sm)
    plan = _LAUNCHES.get(key)
    if plan is not None:
        return plan
    B, H, S, D = q.shape
    HKV = k.shape[1]
    kind, kind_kv = _layout(q, B, H, S, D)[0], _layout(k, B, HKV, S, D)[0]
    heads = (H, *_origin(kind, H, S, D), H // HKV, *_origin(kind_kv, HKV, S, D))
    plan = _Launch()
    plan.out_stride = _seq_major_stride(B, H, S, D) if kind == 1 else (H * S * D, S * D, D, 1)
    out = torch.empty_strided(q.shape, plan.out_stride, dtype=q.dtype, device=q.device)
    if ws:
        bn, stages, cregs, pregs = config[:4]
        persist = config[4] if len(config) > 4 else 0
        plan.descs = _descs((q, k, v, out), (64, bn, bn, 64))
        plan.ints = (S, B * H, *heads)
        tiles = (S // 128) * B * H
        # persistent: `persist` programs an SM (a negative value: that many programs in all, a test's way to give each
        # program many tiles), at most one a tile; else one program a 128-row query tile
        grid = ((min(persist * _sm_count(q.device) if persist > 0 else -persist, tiles), 1) if persist
                else (S // 128, B * H))
        plan.kernel = Kernel(_attn_fwd_gluon_ws_kernel, grid, BLOCK_N=bn, HEAD_D=D, CAUSAL=bool(causal),
                             STAGES=stages, CONSUMER_REGS=cregs, PRODUCER_REGS=pregs, PERSISTENT=bool(persist),
                             num_warps=4)
    else:
        bm, bn, warps, stages = config
        plan.descs = _descs((q, k, v, out), (bm, bn, bn, bm))
        plan.ints = (S, B * H, *heads)
        # persistent: per_sm programs an SM (at most one a query block); else one program a query block
        grid = (min(per_sm * _sm_count(q.device), (S // bm) * B * H), 1) if per_sm else (S // bm, B * H)
        plan.kernel = Kernel(_attn_fwd_gluon_kernel, grid, BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, CAUSAL=bool(causal),
                             STAGES=stages, PERSISTENT=bool(per_sm), num_warps=warps)
    return _remember(_LAUNCHES, key, plan)


def _forward(q, k, v, causal, scale, ws: bool, config, per_sm: int = 0):
    plan = _fwd_launch(q, k, v, causal, ws, config, per_sm)
    B, H, S, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.empty_strided(q.shape, plan.out_stride, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, S), device=q.device, dtype=torch.float32)
    _fire(plan, (lse,), (q, k, v, out), scale * LOG2E)
    return out, lse


def attention_forward_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                            scale: float | None = None, config: tuple | None = None, per_sm: int | None = None):
    """(O, LSE): O laid out like q (head-major or sequence-major), LSE fp32 (B, H, S) base-2.  Raises ValueError
    when ``supported`` says no.  ``per_sm``: a persistent grid of that many programs an SM walking the query blocks
    heaviest first (measured slower, session 14; default PERSISTENT_PER_SM = 0, one program a query block)."""
    why = supported(q, k, v, causal, gqa=True)
    if why is not None:
        raise ValueError(f"attention_forward_gluon: {why}")
    D = q.shape[-1]
    bm, bn, warps, stages = config = tuple(config or CONFIGS[D])
    if stages < 2 or bm > bn or bm != 64 * (warps // 4) or warps % 4:
        # (one stage deadlocks: block j + 1 is loaded into the only buffer after block j's P V; BLOCK_M > BLOCK_N
        # would leave two masked key blocks on the causal diagonal, which the kernel does not mask)
        raise ValueError(f"attention_forward_gluon: config {(bm, bn, warps, stages)} needs STAGES >= 2, BLOCK_M <= "
                         "BLOCK_N and 16 query rows a warp (BLOCK_M = 16 x num_warps)")
    per_sm = PERSISTENT_PER_SM if per_sm is None else int(per_sm)
    return _forward(q, k, v, causal, scale, False, config, per_sm)


_SMS: dict = {}


def _sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


# The ping-pong's shapes (head dim -> (BLOCK_N, STAGES, consumer registers, producer registers)); 128-row query tiles.
# Session 14 (issue13/run21_a/, TFLOP/s at S 1K / 4K / 16K, non-causal / causal): D64 128 x 2 stages 366 / 253 / 448 /
# 389 / 435 / 459 against 128 x 3 345 / 248 / 414 / 386 / 431 / 453 and 64 x 4 322 / 231 / 382 / 331 / 400 / 392;
# D128 128 x 2 519 / 385 / 612 / 532 / 636 / 619 against 64 x 3 467 / 354 / 533 / 465 / 491 / 527 and 64 x 4
# 473 / 355 / 540 / 465 / 557 / 483.
WS_CONFIGS = {64: (128, 2, 232, 40), 128: (128, 2, 232, 40)}


def attention_forward_gluon_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                               scale: float | None = None, config: tuple | None = None):
    """The warp-specialized ping-pong (see the kernel): (O, LSE) as attention_forward_gluon."""
    why = supported(q, k, v, causal, gqa=True)
    S = q.shape[2]
    if why is None and S % 128:
        why = f"sequence length {S} not a multiple of 128"
    if why is not None:
        raise ValueError(f"attention_forward_gluon_ws: {why}")
    config = tuple(config or WS_CONFIGS[q.shape[-1]])
    bn, stages = config[:2]
    if stages < 2 or S % bn or len(config) not in (4, 5):
        raise ValueError(f"attention_forward_gluon_ws: config {config} needs (BLOCK_N, STAGES >= 2, consumer registers, "
                         f"producer registers[, persistent programs an SM]) with S a multiple of BLOCK_N ({bn})")
    return _forward(q, k, v, causal, scale, True, config)


# The dK / dV kernel's shapes: head dim -> (BLOCK_M queries a step, BLOCK_N keys a CTA, num_warps, STAGES).  Session
# 14 (issue13/run20_a/, TFLOP/s of the whole backward at S 1K / 4K / 16K, non-causal / causal): D128 64 x 64 x 2
# stages 375 / 291 / 438 / 383 / 454 / 437 against 32 x 64 x 3 stages 346 / 274 / 398 / 363 / 414 / 408 and
# 32 x 128 x 8 warps 301-387 (Triton's backward 335 / 248 / 398 / 343 / 417 / 395).
DKDV_CONFIGS = {64: (64, 64, 4, 2), 128: (64, 64, 4, 2)}


def _bwd_supported(q, k, v, do, grads, causal: bool, tiles: tuple) -> str | None:
    """After ``supported`` said yes for q, k, v: None when a Gluon backward kernel with (BLOCK_M, BLOCK_N) ``tiles``
    takes the call: S a multiple of both tiles; dO of q's shape, dtype and layout kind; ``grads`` (dK, dV) of k's, or
    (dQ,) of q's.  The dQ kernel reads K / V at q's heads and layout kind (no GQA); the dK / dV kernel has origins of
    its own for the key / value heads."""
    B, H, S, D = q.shape
    bm, bn = tiles
    if S % bm or S % bn:
        return f"sequence length {S} not a multiple of {bm} and {bn}"
    kind, kind_kv = _layout(q, B, H, S, D)[0], _layout(k, B, k.shape[1], S, D)[0]
    like = (k, kind_kv) if len(grads) == 2 else (q, kind)
    if len(grads) == 1 and (k.shape != q.shape or kind_kv != kind):
        return "the dQ kernel needs k, v of q's heads and layout (no GQA)"
    for t, (ref, ref_kind) in zip((do, *grads), ((q, kind),) + (like,) * len(grads)):
        lay = _layout(t, *ref.shape) if t.shape == ref.shape and t.dtype == q.dtype else None
        if lay is None or lay[0] != ref_kind or t.data_ptr() % 16:
            return "dO and the gradients must have q's (dO, dQ) or k's (dK, dV) shape, dtype and layout kind"
    return None


def dkdv_supported(q, k, v, do, dk, dv, causal: bool) -> str | None:
    """None when the Gluon dK / dV kernel takes this backward, else why not."""
    why = supported(q, k, v, causal)
    return why if why is not None else _bwd_supported(q, k, v, do, (dk, dv), causal, DKDV_CONFIGS[q.shape[-1]][:2])


def _check_bwd_config(name: str, config: tuple, S: int) -> None:
    bm, bn, warps, stages = config
    if stages < 2 or bm > bn or S % bm or S % bn:
        raise ValueError(f"{name}: config {config} needs STAGES >= 2, BLOCK_M <= BLOCK_N and S a multiple of both")


def _bwd_launch(which: str, fn, q, k, v, do, grads, causal: bool, config: tuple, fused_dq: bool = False) -> _Launch:
    """The launch of a backward kernel: ``which`` "dkdv" (descriptors q, dO, K, V, dK, dV; a program per key block;
    ``fused_dq``: also dQ by atomics) or "dq" (q, dO, K, V, dQ; a program per query block)."""
    key = (which, q.shape, q.stride(), k.shape, k.stride(), v.stride(), do.stride(), *(g.stride() for g in grads),
           q.dtype, q.device, bool(causal), config, fused_dq)
    plan = _LAUNCHES.get(key)
    if plan is not None:
        return plan
    B, H, S, D = q.shape
    bm, bn, warps, stages = config
    HKV = k.shape[1]
    kind, kind_kv = _layout(q, B, H, S, D)[0], _layout(k, B, HKV, S, D)[0]
    plan = _Launch()
    plan.out_stride = None
    blocks = (bm, bm, bn, bn, bn, bn) if which == "dkdv" else (bm, bm, bn, bn, bm)
    plan.descs = _descs((q, do, k, v, *grads), blocks)
    plan.ints = (S, H, *_origin(kind, H, S, D))
    if which == "dkdv":  # a program per key block of each key / value head, with their origins
        plan.ints += (H // HKV, *_origin(kind_kv, HKV, S, D))
    grid = (S // bn, B * HKV) if which == "dkdv" else (S // bm, B * H)
    gqa = dict(GQA=HKV != H, FUSED_DQ=bool(fused_dq)) if which == "dkdv" else {}
    plan.kernel = Kernel(fn, grid, BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, CAUSAL=bool(causal), STAGES=stages, **gqa,
                         num_warps=warps)
    return _remember(_LAUNCHES, key, plan)


def attention_dkdv_gluon(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, config: tuple | None = None,
                         dq_acc: torch.Tensor | None = None):
    """dK and dV into ``dk``, ``dv`` (Gluon); ``lse`` the forward's base-2 LSE, ``delta`` rowsum(dO O), both fp32
    (B, H, S) contiguous.  ``dq_acc``: a zeroed fp32 (B, H, S, D) contiguous buffer that also receives dQ (added by
    atomics from every key block's program: the backward in one kernel, no dQ kernel)."""
    why = dkdv_supported(q, k, v, do, dk, dv, causal)
    if why is None and dq_acc is not None and (dq_acc.dtype != torch.float32 or dq_acc.shape != q.shape
                                               or not dq_acc.is_contiguous() or dq_acc.device != q.device):
        why = "dq_acc must be a contiguous float32 tensor of q's shape on q's device"
    if why is not None:
        raise ValueError(f"attention_dkdv_gluon: {why}")
    config = tuple(config or DKDV_CONFIGS[q.shape[-1]])
    _check_bwd_config("attention_dkdv_gluon", config, q.shape[2])
    return _dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, config, dq_acc)


def _dkdv(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, config: tuple, dq_acc=None):
    """attention_dkdv_gluon after its checks (ops/attention.py calls it once dkdv_supported said yes)."""
    plan = _bwd_launch("dkdv", _attn_bwd_dkdv_gluon_kernel, q, k, v, do, (dk, dv), causal, config, dq_acc is not None)
    _fire(plan, (lse, delta, lse if dq_acc is None else dq_acc), (q, do, k, v, dk, dv), scale * LOG2E, scale)
    return dk, dv


# The dQ kernel's shapes: head dim -> (BLOCK_M queries a CTA, BLOCK_N keys a step, num_warps, STAGES).  Shared memory
# Q + dO + 2 x STAGES x BLOCK_N x D: D128 64 x 64 x 2 stages is 96 KB (two CTAs an SM).
DQ_CONFIGS = {64: (64, 64, 4, 2), 128: (64, 64, 4, 2)}


def dq_supported(q, k, v, do, dq, causal: bool) -> str | None:
    """None when the Gluon dQ kernel takes this backward, else why not."""
    why = supported(q, k, v, causal)
    return why if why is not None else _bwd_supported(q, k, v, do, (dq,), causal, DQ_CONFIGS[q.shape[-1]][:2])


def attention_dq_gluon(q, k, v, do, lse, delta, dq, causal: bool, scale: float, config: tuple | None = None):
    """dQ into ``dq`` (Gluon); ``lse`` the forward's base-2 LSE, ``delta`` rowsum(dO O), both fp32 (B, H, S)."""
    why = dq_supported(q, k, v, do, dq, causal)
    if why is not None:
        raise ValueError(f"attention_dq_gluon: {why}")
    config = tuple(config or DQ_CONFIGS[q.shape[-1]])
    _check_bwd_config("attention_dq_gluon", config, q.shape[2])
    bm, _, warps, _ = config
    if bm != 64 * (warps // 4) or warps % 4:
        raise ValueError(f"attention_dq_gluon: config {config} needs 64 query rows a warpgroup")
    return _dq(q, k, v, do, lse, delta, dq, causal, scale, config)


def _dq(q, k, v, do, lse, delta, dq, causal: bool, scale: float, config: tuple):
    """attention_dq_gluon after its checks (ops/attention.py calls it once dq_supported said yes)."""
    plan = _bwd_launch("dq", _attn_bwd_dq_gluon_kernel, q, k, v, do, (dq,), causal, config)
    _fire(plan, (lse, delta), (q, do, k, v, dq), scale * LOG2E, scale)
    return dq


# ----------------------------------------------------------------------------------------------------------------
# Which kernel takes a call by default (attention_config variants at -1, "auto"), from the H200 tables of session 14
# (benchmarks/results/issue13/run20_a/, TFLOP/s at S 1K / 4K / 16K):
#   forward, (head dim, causal) -> "ws" (the ping-pong; S a multiple of 128) or "plain" (one warpgroup a CTA):
#     D128: ws 521 / 389 / 608 / 537 / 643 / 626 against plain 460 / 380 / 507 / 459 / 519 / 506;
#     D64 non-causal: plain 386 / 433 / 445 against ws 344 / 411 / 432; D64 causal: ws 252 / 382 / 457 against
#     plain 172-279 / 382-384 / 434.
FWD_KERNEL = {(64, False): "plain", (64, True): "ws", (128, False): "ws", (128, True): "ws"}
#   the ping-pong on a persistent grid (one program an SM, WS_CONFIGS + (1,)) instead, for S up to (head dim, causal)
#   -> S here (session 17, issue13/run24_b/ws/attention_gluon.md, TFLOP/s at S 1K / 4K / 16K, persistent against the
#   kernel FWD_KERNEL names): D64 404 / 448 / 450 against plain 382 / 433 / 449; D64 causal 285 / 399 / 428 against
#   ws 250 / 385 / 457; D128 588 / 593 / 595 against ws 531 / 603 / 636; D128 causal 367 / 501 / 552 against ws 391 /
#   533 / 622 (not taken).  Short rows win: a tile's prologue and epilogue overlap the next tile's loads.  Two more runs
#   at S 1K / 4K (run24_c/ws, run24_d/ws): D64 408 / 449 and 405 / 442 against plain 384 / 433 and 382 / 431; D128 S1K
#   613 and 585 against ws 531 and 525; D64 causal S1K 285 and 285 against ws 254 and 253, but S4K 381 and 377 against
#   ws 383 and 390 (a tie over three runs: D64 causal stops at 2K).  Deeper rings (D64 128-key x 3 stages, 64 x 4;
#   D128 64 x 4) tied or lost (run24_d).
FWD_PERSIST_MAX_S = {(64, False): 4096, (64, True): 2048, (128, False): 1024}
#   backward dK / dV: head dim -> the longest S it takes (None: all).  D128 the Gluon dK / dV + Triton dQ backward is
#   1.08-1.17x the Triton backward at every S; D64 1.02-1.09x to S 4K (causal), a tie or 1-2 % behind at S 16K.
DKDV_MAX_S = {64: 4096, 128: None}
#   dQ: head dim -> the longest S it takes (None: all; absent: off).  Off: the Gluon dQ kernel after the Gluon dK / dV
#   one (issue13/run21_a/) gained 2-4 % at D128 S 1K-4K non-causal, tied at 16K, and lost at D128 S1K causal (220
#   against 289 TFLOP/s) and at D64 S1K (217 / 158 against 322 / 248).
DQ_MAX_S: dict = {}
#   dQ inside the dK / dV kernel (bwd_gluon_fused_dq): (head dim, causal) -> the longest S auto mode takes it for
#   (absent: not in auto mode).  Empty: session 17 (issue13/run24_e/bwd/attention_gluon.md) measured it at 0.68-0.88x
#   of the split backward in every case (D64 S1K causal 214 against 244 TFLOP/s, D128 S16K causal 283 against 442);
#   the atomics alone, with the dK / dV kernel's grid and nothing else to do, take 0.42-0.86 of cuDNN's whole backward
#   (diag_dq_atomics.py, run24_e/atomics/).  Correct (GPU tests); D128 also spills (21-30 stores).
FUSED_DQ_MAX_S: dict = {}


def fused_dq_ok(q: torch.Tensor, causal: bool, mode: int) -> bool:
    """The dK / dV kernel also computes dQ (variant bwd_gluon_fused_dq = ``mode``) for this call, which the Gluon dK /
    dV kernel takes."""
    if mode <= 0:
        return mode < 0 and q.shape[2] <= FUSED_DQ_MAX_S.get((q.shape[-1], bool(causal)), 0)
    return True


# The smallest call auto mode takes: B * H * Sq * Sk * D (halved when causal).  The Gluon kernels launch from Python
# (TensorDescriptor objects and Gluon's JIT launch, no C++ fast path), so a small call, where the host's cost per
# launch is larger than the kernel, stays on the Triton kernels and the C++ fast path (issue 9's host-bound steps).
# 2^32 is about 40 us of forward and 100 us of backward on the H200.
GLUON_MIN_WORK = 2**32


def auto_ok(variant: str, q: torch.Tensor, causal: bool) -> bool:
    """Auto mode of ``variant`` (fwd_gluon, bwd_gluon_dkdv, bwd_gluon_dq) takes this (supported) call."""
    B, H, S, D = q.shape
    if B * H * S * S * D // (2 if causal else 1) < GLUON_MIN_WORK:
        return False
    if variant == "fwd_gluon":
        return True
    table = DKDV_MAX_S if variant == "bwd_gluon_dkdv" else DQ_MAX_S
    if D not in table:
        return False
    return table[D] is None or S <= table[D]


def fwd_kernel(D: int, S: int, causal: bool, mode: int = -1) -> str:
    """The forward kernel ``mode`` (fwd_gluon's value: -1 auto, 1 one warpgroup, 2 the ping-pong, 3 the ping-pong on a
    persistent grid) takes for a (supported) call: "plain", "ws" or "ws_persistent".  The ping-pong needs S a multiple
    of 128 and of its key tile; elsewhere the one-warpgroup kernel runs."""
    key = (D, bool(causal))
    if mode < 0:
        mode = 3 if S <= FWD_PERSIST_MAX_S.get(key, 0) else (2 if FWD_KERNEL.get(key) == "ws" else 1)
    if mode >= 2 and S % max(128, WS_CONFIGS[D][0]) == 0:
        return "ws_persistent" if mode == 3 else "ws"
    return "plain"


def attention_forward_auto(q, k, v, causal: bool, scale: float | None, mode: int = -1):
    """The Gluon forward for a call ``supported`` took (not checked again here), the kernel ``fwd_kernel`` names."""
    D, S = q.shape[-1], q.shape[2]
    kind = fwd_kernel(D, S, causal, mode)
    if kind == "ws_persistent":
        return _forward(q, k, v, causal, scale, True, WS_CONFIGS[D] + (1,))
    if kind == "ws":
        return _forward(q, k, v, causal, scale, True, WS_CONFIGS[D])
    return _forward(q, k, v, causal, scale, False, CONFIGS[D], PERSISTENT_PER_SM)
