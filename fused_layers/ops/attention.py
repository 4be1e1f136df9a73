r"""Streaming-softmax (FlashAttention-style) attention: Triton forward and backward.

Notation.  For one (batch, head): Q is Sq x D, K and V are Sk x D, ``scale`` defaults to 1/sqrt(D),

    S = scale * Q K^T + b,     P = softmax(S) (row-wise),     O = P V,

where ``b`` is an optional per-key additive bias (a key-padding mask: 0 keeps a key, -inf drops it) and
the causal mask (``is_causal``) keeps key j for query i iff j <= i: aligned to the *top-left* corner,
exactly like ``F.scaled_dot_product_attention(is_causal=True)`` (for Sq > Sk the last rows see every
key; for Sq < Sk row i sees only keys 0..i).

Forward (online softmax).  A program owns BLOCK_M query rows and streams K and V in tiles of BLOCK_N
keys, never materializing S.  It keeps, per row, the running max m, the running sum l and an fp32
accumulator A.  Working in base 2 (exp2 is the native instruction) with c = scale * log2(e) > 0 and the
raw scores x = Q K^T of a tile, for each tile

    m' = max(m, c * rowmax(x)),   P~ = exp2(c * x - m'),   a = exp2(m - m'),
    l' = a * l + rowsum(P~),      A' = a * A + P~ V,

and at the end O = A / l and the base-2 log-sum-exp L = m + log2(l) is saved (fp32, O(S) memory) for
the backward.  The scale sits inside exp2's argument (one FMA a score) and on the row max, since c > 0
gives max(c x) = c max(x); with a key bias the scores are scaled first, s2 = c x + b log2(e), and
m' = max(m, rowmax(s2)), P~ = exp2(s2 - m').  A row with no allowed key (all of its keys masked) keeps
m = -inf: the kernel subtracts 0 instead of -inf there (no -inf - -inf = NaN), so l = 0 and the row's
output is 0, which is what SDPA returns on this torch version; its saved L is +inf so that the backward
recomputes P = 0 for it (zero gradients, like SDPA).  Within a program the key range is split in two:
tiles that are fully visible to every row (no mask arithmetic at all) and the tiles on the causal diagonal
or the ragged end of Sk (masked).

Backward.  With dO the incoming gradient, recompute P = exp2(s2 - L) from the saved L, then

    dV = P^T dO,    dP = dO V^T,    dS = P * (dP - delta),    delta = rowsum(dO * O) = rowsum(P * dP),
    dQ = scale * dS K,     dK = scale * dS^T Q.

Three kernels: ``_attn_bwd_preprocess`` computes delta; ``_attn_bwd_dkdv_kernel`` owns BLOCK_N keys of
one K/V head and loops over the query blocks of *every query head of its group* (grouped-query
attention: the dK/dV of a shared K/V head sum over its Hq/Hkv query heads in registers, no atomics);
``_attn_bwd_dq_kernel`` owns BLOCK_M queries and loops over key blocks.  Query rows past the end of the
sequence load L = +inf, so they contribute P = 0 without any mask arithmetic.  Where it measured faster
(dense bf16, Sk >= 4096, ``attention_config.BWD_TMA_CASES``) the dK/dV kernel loads its Q and dO tiles
through TMA tensor descriptors (``USE_TMA``) instead of pointer loads.

Layouts.  Dense tensors are (B, H, S, D) with any strides (views of a fused qkv projection, transposes
of (B, S, H, D)); no copy is made.  Packed variable-length sequences (``fused_attention_varlen``, the
layout of flash_attn_varlen_func) are (total, H, D) with ``cu_seqlens`` (int32, B + 1 offsets): the
same kernels run with a batch stride of 0 and per-sequence start offsets read from ``cu_seqlens``, and
programs past a short sequence's end exit at once, so padding costs no work.  Head dims up to 256 are
padded to a power of two BLOCK_D with masked loads (other = 0, the identity of the dot products).

Dtypes.  float16 / bfloat16: tensor-core dots with fp32 accumulation, P cast to the input dtype for the
P V and dS K products (as FlashAttention).  float32: the dots run in tf32 when
``torch.backends.cuda.matmul.allow_tf32`` is True and in full fp32 ("ieee") otherwise (the default),
so float32 inputs get float32 accuracy unless the user opted in to tf32.  float64 runs the PyTorch
reference (SDPA).

Dropout (``dropout_p`` > 0).  With Z = M / (1 - p), M a Bernoulli(1 - p) keep mask, the output is
O = (P * Z) V: the forward drops elements of P~ before the P~ V product only (the normalizer l sums the
undropped P~, as softmax-then-dropout does) and multiplies O by 1 / (1 - p) in the epilogue; the saved L
is unchanged.  Backward: dV = (P * Z)^T dO, dP = (dO V^T) * Z, dS = P * (dP - delta) with the same
delta = rowsum(dO * O) (= rowsum(P * dP)).  M is never stored: every kernel regenerates it from
Philox-4x32-10 (``_dropout_keep``), with the counters (key j // 16, query i, b * H + h, 1) and
a 64-bit seed drawn from torch's RNG per call, so the backward sees the forward's mask and
``torch.manual_seed`` reproduces it.  One Philox call serves 16 keys of a row (8 bits each, so p acts in
steps of 1/256, as FlashAttention-2's dropout), and the kept values are scaled by 1 / (1 - p') with p'
the rounded p (``_dropout_scale``): E[O] is the undropped O.

Sliding window (``window`` = w > 0, transformers' ``sliding_window``).  Query i sees key j only if
j > i - w (and j <= i with ``is_causal``; without it every key right of i too), in the causal mask's top-left
coordinates.  A query block [m0, m0 + BLOCK_M) then needs keys from m0 - w + 1 on, and keys from
m0 + BLOCK_M - w on are in the window of all its rows, so its key range splits into a masked left edge, the
unmasked middle, and the masked diagonal / ragged end (``_window_range``); tiles left of m0 - w + 1 are never
read (a window saves their work).  The dK/dV kernel mirrors it: key block [n0, n0 + BLOCK_N) is seen by rows
i < n0 + BLOCK_N + w - 1, and by every row i < n0 + w without a mask.  A row whose window holds no key (Sq > Sk)
outputs 0, like a fully masked row.

Soft-capping (``softcap`` = c > 0, Gemma 2's ``attn_logit_softcapping``).  With x = q . k, t = tanh(scale x / c)
the score is s = c t, after the scale and before any bias or mask; the kernels form s2 = s log2(e) and
run the online softmax on it (tanh from exp2: tanh(y) = 1 - 2 / (exp2(2 y log2 e) + 1)).  Backward: the softmax
gives dS with respect to s as above, and ds / dx = scale (1 - t^2), so dS is multiplied by 1 - t^2 (t recomputed
from the same dot) before dQ = scale dS K and dK = scale dS^T Q.  Both are constexprs of the kernels
(``WINDOW``, ``SOFTCAP``): one compile per value, and the kernels without them compile to the same code as
before.  The Gluon kernels have neither: those calls run the Triton kernels.

Not implemented: masks that vary along the query dim (SDPA fallback), a value head dim different from
the query's.

Which kernels run.  ``fused_attention`` runs these Triton kernels, except on sm_90 for large eager dense
bf16 / fp16 calls at head dims 64 / 128 with Sq == Sk, no mask and no dropout, whose forward and dK/dV
kernel are the Gluon ones of ops/attention_gluon.py (``attention_config.GLUON_*``).  The swapped modules
(``FusedAttention``, ``FusedMultiheadAttention``) call SDPA instead where cuDNN's attention is the faster
kernel (``prefer_sdpa``).  Tile sizes, warps and pipeline stages come from ``attention_config.tiles``:
one config per (kernel, head-dim bucket, causal, dtype), never per sequence length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _cpp
from ._common import (
    INTERPRET,
    FusedShapeError,
    autocast_cast,
    autocast_dtype,
    check_float_dtype,
    check_same_device,
    check_tensor,
    concrete,
    config_override,  # noqa: F401  (the tests' tile hook: config_override("attention", block_m=16, ...))
    next_power_of_2,
    override_epoch,
    use_fallback,
    warn_once,
)
from ._library import FusedOp, Kernel, ensure_triton_allocator
from .attention_config import BWD_TMA_CASES, BWD_TMA_MIN_SEQLEN_K, PREPROCESS_BLOCK_M, tiles

_OP = "fused_attention"
LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)  # the same, inside the kernels
MAX_HEAD_DIM = 256
DROPOUT_STEPS = 256  # the keep mask's resolution: 8 random bits an element


# ==================================================================================================
# Dropout mask (shared by every kernel: the backward regenerates exactly the forward's mask)
# ==================================================================================================
@triton.jit
def _dropout_keep(
    seed,  # int64 scalar, drawn from torch's RNG per call (loaded from a 1-element tensor)
    bh,  # query (batch, head) index b * H + h
    rows,  # [BLOCK_M] query indices
    key_start,  # first key of the tile (a multiple of 16)
    dropout_p,  # probability of dropping an element
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # keys in the tile (a multiple of 16)
):
    """[BLOCK_M, BLOCK_N] True where P[b, h, row, key] is kept.

    One Philox-4x32-10 call per 16 keys of a row: the counters (key // 16, row, b * H + h, 1) give 4 x 32
    bits, cut into 16 8-bit uniforms, one per key (a fixed order of the 16); a key is kept when its byte is
    >= round(p * 256), so p acts in steps of 1/256 (as FlashAttention-2's dropout, which SDPA's flash
    backend runs).  Every kernel calls this with the same (row, key) -> bits map.
    """
    G: tl.constexpr = BLOCK_N // 16  # Philox calls a row of the tile
    grp = key_start // 16 + tl.arange(0, G)
    zero = rows[:, None] * 0 + grp[None, :] * 0  # int32 [BLOCK_M, G]: broadcasts the counters
    r0, r1, r2, r3 = tl.philox(seed, (grp[None, :] + zero).to(tl.uint32), (rows[:, None] + zero).to(tl.uint32),
                               (zero + bh).to(tl.uint32), (zero + 1).to(tl.uint32), n_rounds=10)
    # 4 words of 32 bits -> 16 bytes, one per key: [BLOCK_M, G, 4] -> [BLOCK_M, G, 4, 2, 2] -> [BLOCK_M, BLOCK_N]
    w = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), [BLOCK_M, G, 4])
    lo = tl.join(w & 0xFF, (w >> 8) & 0xFF)  # [BLOCK_M, G, 4, 2]
    hi = tl.join((w >> 16) & 0xFF, w >> 24)
    bytes_ = tl.reshape(tl.join(lo, hi), [BLOCK_M, BLOCK_N])
    thr8 = tl.cast(dropout_p * 256.0 + 0.5, tl.uint32)
    return bytes_ >= thr8


@triton.jit
def _dropout_mask_kernel(
    SEED,  # pointer to the int64 seed [1]
    OUT,  # int8 keep mask (B*H, SQ, SK), contiguous (written)
    SQ, SK,
    dropout_p,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Materialize the keep mask the attention kernels use (tests / debugging only)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    seed = tl.load(SEED)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    base = OUT + pid_bh.to(tl.int64) * SQ * SK
    for start_n in range(0, SK, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        keep = _dropout_keep(seed, pid_bh, rows, start_n, dropout_p, BLOCK_M, BLOCK_N)
        mask = (rows[:, None] < SQ) & (cols[None, :] < SK)
        tl.store(base + rows[:, None].to(tl.int64) * SK + cols[None, :], keep.to(tl.int8), mask=mask)


# ==================================================================================================
# Soft-capping and the sliding window (shared by the forward and the dQ kernel)
# ==================================================================================================
@triton.jit
def _tanh(x):
    """tanh(x) = 1 - 2 / (exp(2x) + 1) (2 log2(e) = 2.885...): exp2 saturates to +inf (tanh -> 1) or 0 (-> -1),
    never NaN."""
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def _window_range(
    start_m,  # first query row of the block
    n_full,  # without the window: keys [0, n_full) are visible to every row of the block, [n_full, n_end) masked
    WINDOW: tl.constexpr,  # w > 0: row i sees key j only if j > i - w
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """With a window, the key tiles a query block streams split into [n_lo, n_a) masked (the window's left edge),
    [n_a, n_b) visible to every row (no mask arithmetic) and [n_b, n_end) masked (the causal diagonal, the ragged
    end of Sk); tiles left of n_lo are skipped.  The block's first row needs keys from start_m - w + 1 on; keys
    from start_m + BLOCK_M - w on are in the window of every row of the block."""
    n_lo = (tl.maximum(start_m - WINDOW + 1, 0) // BLOCK_N) * BLOCK_N
    n_b = tl.maximum(n_full, n_lo)
    n_a = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(start_m + BLOCK_M - WINDOW, 0), BLOCK_N) * BLOCK_N, n_lo), n_b)
    return n_lo, n_a, n_b


@triton.jit
def _sequence(
    CU_Q, CU_K,  # int32 [B + 1] cumulative sequence offsets (only read when VARLEN)
    b,  # the program's sequence
    SQ, SK,  # sequence lengths of the dense layout
    VARLEN: tl.constexpr,
):
    """Where sequence b's query and key rows start, and how many there are: (q_start, seqlen_q, k_start,
    seqlen_k)."""
    if VARLEN:
        q_start = tl.load(CU_Q + b)
        seqlen_q = tl.load(CU_Q + b + 1) - q_start
        k_start = tl.load(CU_K + b)
        seqlen_k = tl.load(CU_K + b + 1) - k_start
    else:
        q_start = 0
        seqlen_q = SQ
        k_start = 0
        seqlen_k = SK
    return q_start, seqlen_q, k_start, seqlen_k


@triton.jit
def _key_tiles(
    start_m,  # first query row of the block
    seqlen_k,  # keys of the sequence
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,  # 0: none; w > 0: row i sees key j only if j > i - w
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The key tiles a query block streams, (n_lo, n_a, n_b, n_end): [n_a, n_b) is visible to every row of the block
    (no mask arithmetic); [n_b, n_end) holds the causal diagonal and / or the ragged last tile (masked); with a
    window, [n_lo, n_a) holds its left edge (masked) and tiles left of n_lo are never read (_window_range)."""
    if CAUSAL:
        n_end = tl.minimum(seqlen_k, start_m + BLOCK_M)
        n_full = (tl.minimum(start_m, seqlen_k) // BLOCK_N) * BLOCK_N
    else:
        n_end = seqlen_k
        n_full = (seqlen_k // BLOCK_N) * BLOCK_N
    n_lo = 0
    n_a = 0
    n_b = n_full
    if WINDOW > 0:
        n_lo, n_a, n_b = _window_range(start_m, n_full, WINDOW, BLOCK_M, BLOCK_N)
    return n_lo, n_a, n_b, n_end


@triton.jit
def _load_keys(
    ptrs,  # pointers to the first tile [BLOCK_N, BLOCK_D] of the sequence's keys (or values)
    start_n, stride,  # the tile's first key, and the stride along keys
    cols, seqlen_k, d_mask,  # the tile's key indices [BLOCK_N], keys of the sequence, head-dim mask [BLOCK_D]
    MASKED: tl.constexpr,  # a tile that may reach past seqlen_k
    EVEN_D: tl.constexpr,  # D == BLOCK_D: no head-dim mask
):
    """One K or V tile; keys past the end and padded head dims load 0 (the identity of the dot products)."""
    if MASKED:
        kv_mask = cols[:, None] < seqlen_k
        if not EVEN_D:
            kv_mask = kv_mask & d_mask[None, :]
        tile = tl.load(ptrs + start_n * stride, mask=kv_mask, other=0.0)
    elif EVEN_D:
        tile = tl.load(ptrs + start_n * stride)
    else:
        tile = tl.load(ptrs + start_n * stride, mask=d_mask[None, :], other=0.0)
    return tile


@triton.jit
def _visible(
    rows, cols,  # query rows [BLOCK_M] and keys [BLOCK_N] of a masked tile
    seqlen_k,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """Which scores of a masked tile exist [BLOCK_M, BLOCK_N]: the key is in the sequence, not after the row
    (causal), and within the row's window."""
    keep = cols[None, :] < seqlen_k
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None])
    if WINDOW > 0:
        keep = keep & (cols[None, :] > rows[:, None] - WINDOW)
    return keep


# ==================================================================================================
# Forward kernel
# ==================================================================================================
@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i,  # running fp32 accumulator [BLOCK_M, BLOCK_D], sum [BLOCK_M], max [BLOCK_M] (base 2)
    q,  # the program's query tile [BLOCK_M, BLOCK_D] (input dtype)
    k_ptrs, v_ptrs,  # pointers to the first K / V tile [BLOCK_N, BLOCK_D] of this key range
    kb_ptrs,  # pointers to the per-key bias of the first key of the range (only read when HAS_KB)
    sks, svs, skbn,  # strides of K, V and the key bias along the key dim
    offs_m, offs_n, d_mask,  # query row indices [BLOCK_M], key offsets in a tile [BLOCK_N], head-dim mask
    seqlen_k, lo, hi,  # keys of this sequence, and the key range [lo, hi) of this call
    qk_scale,  # scale * log2(e)
    seed, bh, dropout_p,  # dropout: seed, query (batch, head) index, drop probability (HAS_DROPOUT only)
    MASKED: tl.constexpr,  # apply the ragged-end (and causal) mask: tiles on the diagonal / at the end
    CAUSAL: tl.constexpr,
    HAS_KB: tl.constexpr,
    EVEN_D: tl.constexpr,  # D == BLOCK_D: no head-dim mask
    BLOCK_N: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    WINDOW: tl.constexpr = 0,  # 0: no window; w > 0: the masked tiles also drop keys j <= i - w
    SOFTCAP: tl.constexpr = 0.0,  # 0: none; c > 0: scores c * tanh(scale * q . k / c)
):
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_keys(k_ptrs, start_n, sks, cols, seqlen_k, d_mask, MASKED, EVEN_D)
        # Scores.  Without a key bias the raw q . k stays in qk and c = scale * log2(e) is applied to its
        # row max and inside exp2's argument, one FMA a score (c > 0: max(qk) * c = max(qk * c)).  With a
        # bias, the base-2 scores s2 = (q . k) * c + bias * log2(e) are formed first.
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if SOFTCAP > 0:  # s2 = c * tanh(scale * qk / c) * log2(e), before any bias or mask (as Gemma 2)
            qk = _tanh(qk * (qk_scale / (SOFTCAP * _LOG2E))) * (SOFTCAP * _LOG2E)
        elif HAS_KB:
            qk = qk * qk_scale
        if HAS_KB:
            # -inf (a dropped key, or a key past the end) is the identity of the max that follows.
            kb = tl.load(kb_ptrs + cols * skbn, mask=cols < seqlen_k, other=-float("inf")).to(tl.float32)
            qk = qk + kb[None, :] * _LOG2E
        if MASKED:
            qk = tl.where(_visible(offs_m, cols, seqlen_k, CAUSAL, WINDOW), qk, -float("inf"))
        # Online softmax update: the new row max, the old terms rescaled by alpha = exp2(m_old - m_new).
        if HAS_KB or SOFTCAP > 0:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row that has seen no key yet
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha
        acc = acc * alpha[:, None]
        m_i = m_new
        if HAS_KB or SOFTCAP > 0:
            p = tl.math.exp2(qk - m_ref[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - m_ref[:, None])
        l_i = l_i + tl.sum(p, 1)  # the softmax normalizer sums the probabilities before dropout
        if HAS_DROPOUT:  # dropped probabilities add nothing to P V (the 1 / (1 - p) is in the epilogue)
            p = tl.where(_dropout_keep(seed, bh, offs_m, start_n, dropout_p, BLOCK_M, BLOCK_N), p, 0.0)
        v = _load_keys(v_ptrs, start_n, svs, cols, seqlen_k, d_mask, MASKED, EVEN_D)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q,  # queries: element (b, h, i, d) at Q + b*sqb + h*sqh + (q_start + i)*sqs + d*sqd
    K,  # keys, head hk = h // GROUP: K + b*skb + hk*skh + (k_start + j)*sks + d*skd
    V,  # values, same indexing as K with the sv* strides
    O,  # noqa: E741  (output, same indexing as Q with the so* strides)
    LSE,  # fp32 base-2 log-sum-exp per query row: LSE + b*slb + h*slh + q_start + i
    KB,  # fp32 per-key additive bias (b, h, j) at KB + b*skbb + h*skbh + j*skbn (only when HAS_KB)
    CU_Q, CU_K,  # int32 [B + 1] cumulative sequence offsets (only when VARLEN)
    SEED,  # int64 [1] dropout seed (only when HAS_DROPOUT)
    qk_scale,  # scale * log2(e)
    dropout_p, dropout_scale,  # drop probability and 1 / (1 - p) (only when HAS_DROPOUT)
    sqb, sqh, sqs, sqd,
    skb, skh, sks, skd,
    svb, svh, svs, svd,
    sob, soh, sos, sod,
    slb, slh,
    skbb, skbh, skbn,
    H,  # query heads
    GROUP,  # query heads per K/V head (1: MHA, H: MQA)
    SQ, SK,  # sequence lengths (dense layout; VARLEN reads them from CU_Q / CU_K)
    HEAD_DIM,  # D (<= BLOCK_D)
    VARLEN: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KB: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next power of two >= D (>= 16)
    EVEN_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per program
    BLOCK_N: tl.constexpr,  # keys per streamed tile
    HAS_DROPOUT: tl.constexpr = False,
    WINDOW: tl.constexpr = 0,  # sliding window: 0 none, w > 0: row i sees key j only if j > i - w
    SOFTCAP: tl.constexpr = 0.0,  # logit soft-capping: 0 none, c > 0: scores c * tanh(scale * q . k / c)
):
    """One program: BLOCK_M query rows of one query head; streams the key tiles they see."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # a float argument may arrive as fp64 (Inductor's launch)
    # Heaviest blocks first: with a causal mask, later query blocks see more keys.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    q_start, seqlen_q, k_start, seqlen_k = _sequence(CU_Q, CU_K, b, SQ, SK, VARLEN)
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:  # a short sequence of a packed batch
        return
    b64 = b.to(tl.int64)
    q_base = Q + b64 * sqb + h.to(tl.int64) * sqh + q_start.to(tl.int64) * sqs
    k_base = K + b64 * skb + hk.to(tl.int64) * skh + k_start.to(tl.int64) * sks
    v_base = V + b64 * svb + hk.to(tl.int64) * svh + k_start.to(tl.int64) * svs
    o_base = O + b64 * sob + h.to(tl.int64) * soh + q_start.to(tl.int64) * sos
    kb_ptrs = KB + b64 * skbb + h.to(tl.int64) * skbh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_mask = offs_m[:, None] < seqlen_q
    if not EVEN_D:
        q_mask = q_mask & d_mask[None, :]
    q = tl.load(q_base + offs_m[:, None] * sqs + offs_d[None, :] * sqd, mask=q_mask, other=0.0)
    k_ptrs = k_base + offs_n[:, None] * sks + offs_d[None, :] * skd
    v_ptrs = v_base + offs_n[:, None] * svs + offs_d[None, :] * svd

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    # Key tiles (_key_tiles): [n_lo, n_a) masked (a window's left edge), [n_a, n_b) unmasked, [n_b, n_end) masked.
    n_lo, n_a, n_b, n_end = _key_tiles(start_m, seqlen_k, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
    if WINDOW > 0:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, kb_ptrs, sks, svs, skbn, offs_m, offs_n, d_mask,
            seqlen_k, n_lo, n_a, qk_scale, seed, pid_bh, dropout_p,
            MASKED=True, CAUSAL=CAUSAL, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_N=BLOCK_N,
            INPUT_PRECISION=INPUT_PRECISION, HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
        )
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, kb_ptrs, sks, svs, skbn, offs_m, offs_n, d_mask,
        seqlen_k, n_a, n_b, qk_scale, seed, pid_bh, dropout_p,
        MASKED=False, CAUSAL=CAUSAL, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_N=BLOCK_N, INPUT_PRECISION=INPUT_PRECISION,
        HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
    )
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, kb_ptrs, sks, svs, skbn, offs_m, offs_n, d_mask,
        seqlen_k, n_b, n_end, qk_scale, seed, pid_bh, dropout_p,
        MASKED=True, CAUSAL=CAUSAL, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_N=BLOCK_N, INPUT_PRECISION=INPUT_PRECISION,
        HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
    )
    # Epilogue: normalize; a row with no allowed key (l = 0) outputs 0 and saves L = +inf.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    if HAS_DROPOUT:
        out = acc * (dropout_scale / l_safe)[:, None]  # out = acc / l * 1 / (1 - p); L below stays undropped
    else:
        out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    row_ok = offs_m < seqlen_q
    tl.store(LSE + b64 * slb + h.to(tl.int64) * slh + q_start + offs_m, lse, mask=row_ok)
    o_mask = row_ok[:, None]
    if not EVEN_D:
        o_mask = o_mask & d_mask[None, :]
    tl.store(o_base + offs_m[:, None] * sos + offs_d[None, :] * sod, out.to(O.dtype.element_ty), mask=o_mask)


# ==================================================================================================
# Backward kernels
# ==================================================================================================
@triton.jit
def _attn_bwd_preprocess(
    O, DO,  # noqa: E741  (output and its gradient, indexed like Q: strides so*, sdo*)
    DELTA,  # fp32 rowsum(dO * O), laid out like LSE (strides slb, slh)
    CU_Q,  # int32 [B + 1] cumulative sequence offsets (only when VARLEN)
    sob, soh, sos, sod,
    sdob, sdoh, sdos, sdod,
    slb, slh,
    H, SQ, HEAD_DIM,
    VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per program
    BLOCK_D: tl.constexpr,
):
    """One program: delta = rowsum(dO * O) of BLOCK_M query rows of one head (the backward's dS term)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    if VARLEN:
        q_start = tl.load(CU_Q + b)
        seqlen_q = tl.load(CU_Q + b + 1) - q_start
    else:
        q_start = 0
        seqlen_q = SQ
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    rows = (q_start + offs_m).to(tl.int64)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    o = tl.load(O + b64 * sob + h64 * soh + rows[:, None] * sos + offs_d[None, :] * sod, mask=mask, other=0.0)
    do = tl.load(DO + b64 * sdob + h64 * sdoh + rows[:, None] * sdos + offs_d[None, :] * sdod, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + b64 * slb + h64 * slh + rows, delta, mask=offs_m < seqlen_q)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv,  # fp32 accumulators [BLOCK_N, BLOCK_D]
    k, v,  # this program's key / value tiles [BLOCK_N, BLOCK_D]
    kb,  # per-key bias (base 2) [BLOCK_N] (only when HAS_KB)
    q_src, do_src,  # pointers to the first query / dO tile [BLOCK_M, BLOCK_D] of the sequence, or
                    # (USE_TMA) tensor descriptors of the sequence's rows of this query head
    lse_ptr, delta_ptr,  # pointers to row 0 of the sequence's L and delta
    sqs, sdos,
    offs_m, cols, d_mask,  # row offsets in a tile [BLOCK_M], this program's keys [BLOCK_N], head-dim mask
    seqlen_q, lo, hi, qk_scale,
    seed, bh, dropout_p, dropout_scale,  # dropout (HAS_DROPOUT only): the forward's mask is regenerated
    key_start,  # first key of this program's block (dropout only)
    MASKED: tl.constexpr,  # causal mask on the diagonal tiles (and the window's mask, with WINDOW)
    HAS_KB: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_TMA: tl.constexpr,
    CAUSAL: tl.constexpr = True,
    WINDOW: tl.constexpr = 0,
    SOFTCAP: tl.constexpr = 0.0,
):
    for start_m in tl.range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < seqlen_q
        if USE_TMA:
            q = q_src.load([start_m, 0])  # rows >= seqlen_q and dims >= D read 0
            do = do_src.load([start_m, 0])
        else:
            qd_mask = row_ok[:, None]
            if not EVEN_D:
                qd_mask = qd_mask & d_mask[None, :]
            q = tl.load(q_src + start_m * sqs, mask=qd_mask, other=0.0)
            do = tl.load(do_src + start_m * sdos, mask=qd_mask, other=0.0)
        # Rows past the end load L = +inf: P^T = exp2(s2 - inf) = 0, no further mask needed.
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + rows, mask=row_ok, other=0.0)
        # Transposed scores s2^T [BLOCK_N, BLOCK_M] and probabilities P^T recomputed from L.
        qkT = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)
        if SOFTCAP > 0:  # t = tanh(scale * qk / c), s2 = c * t * log2(e); ds / d(qk) = scale * (1 - t^2)
            tT = _tanh(qkT * (qk_scale / (SOFTCAP * _LOG2E)))
            qkT = tT * (SOFTCAP * _LOG2E)
        else:
            qkT = qkT * qk_scale
        if HAS_KB:
            qkT = qkT + kb[:, None]
        pT = tl.math.exp2(qkT - lse[None, :])
        if MASKED:
            if CAUSAL:
                pT = tl.where(rows[None, :] >= cols[:, None], pT, 0.0)
            if WINDOW > 0:
                pT = tl.where(rows[None, :] < cols[:, None] + WINDOW, pT, 0.0)
        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # dP^T = V dO^T
        if HAS_DROPOUT:  # with Z = keep / (1 - p): dV += (P Z)^T dO, dP = (dO V^T) Z
            keepT = tl.trans(_dropout_keep(seed, bh, rows, key_start, dropout_p, BLOCK_M, BLOCK_N))
            dv = tl.dot(tl.where(keepT, pT * dropout_scale, 0.0).to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
            dpT = tl.where(keepT, dpT * dropout_scale, 0.0)
        else:
            dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)  # dV += P^T dO
        dsT = pT * (dpT - delta[None, :])  # dS^T (scale applied at the end)
        if SOFTCAP > 0:
            dsT = dsT * (1.0 - tT * tT)
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=INPUT_PRECISION)  # dK += dS^T Q
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO,  # inputs and the output gradient (strides below; DO indexed like Q)
    DK, DV,  # gradients of K and V (written), indexed like K / V with the sdk*, sdv* strides
    LSE, DELTA,  # fp32 per query row (strides slb, slh)
    KB, CU_Q, CU_K, SEED,  # as in _attn_fwd_kernel
    qk_scale, sm_scale,
    dropout_p, dropout_scale,  # as in _attn_fwd_kernel
    sqb, sqh, sqs, sqd,
    skb, skh, sks, skd,
    svb, svh, svs, svd,
    sdob, sdoh, sdos, sdod,
    sdkb, sdkh, sdks, sdkd,
    sdvb, sdvh, sdvs, sdvd,
    slb, slh,
    skbb, skbh, skbn,
    HKV,  # K/V heads
    GROUP,  # query heads per K/V head
    SQ, SK, HEAD_DIM,
    VARLEN: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KB: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per inner step
    BLOCK_N: tl.constexpr,  # keys per program
    HAS_DROPOUT: tl.constexpr = False,
    USE_TMA: tl.constexpr = False,  # Q / dO tiles through TMA tensor descriptors (sqd == sdod == 1)
    WINDOW: tl.constexpr = 0,  # as in _attn_fwd_kernel
    SOFTCAP: tl.constexpr = 0.0,
):
    """One program: BLOCK_N keys of one K/V head; dK, dV summed over every query head of the group.

    USE_TMA: the Q and dO tiles come through device-side tensor descriptors (TMA on sm_90), one 2-D descriptor per
    (sequence, query head) based at that head's first row, so any batch / head / sequence strides, GQA and varlen
    work unchanged; the copy engine zero-fills rows past the sequence and head dims past D, so those loads need no
    mask."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # float arguments may arrive as fp64 (Inductor's launch)
    sm_scale = tl.cast(sm_scale, tl.float32)
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    q_start, seqlen_q, k_start, seqlen_k = _sequence(CU_Q, CU_K, b, SQ, SK, VARLEN)
    start_n = pid_n * BLOCK_N
    if start_n >= seqlen_k:
        return
    b64 = b.to(tl.int64)
    hk64 = hk.to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    kv_mask = (cols[:, None] < seqlen_k) & d_mask[None, :]
    k_off = b64 * skb + hk64 * skh + k_start.to(tl.int64) * sks
    v_off = b64 * svb + hk64 * svh + k_start.to(tl.int64) * svs
    k = tl.load(K + k_off + cols[:, None] * sks + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
    v = tl.load(V + v_off + cols[:, None] * svs + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # Query rows that see this key block: causal -> rows >= start_n. Tiles [lo, hi_mask) straddle the
    # diagonal (masked), tiles from hi_mask on see every key of the block.
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        hi_mask = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M)
        lo_full = tl.maximum(lo, hi_mask)
    else:
        lo = 0
        hi_mask = 0
        lo_full = 0
    # With a window, row i sees key j only if i < j + w: rows [lo_full, hi_full) see every key of the block,
    # rows [hi_full, hi_end) some (masked), rows from hi_end on none (never read).
    hi_full = seqlen_q
    hi_end = seqlen_q
    if WINDOW > 0:
        hi_end = tl.minimum(tl.cdiv(start_n + BLOCK_N + WINDOW - 1, BLOCK_M) * BLOCK_M,
                            tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M)
        hi_full = tl.maximum(lo_full, tl.minimum(((start_n + WINDOW) // BLOCK_M) * BLOCK_M, hi_end))
    kb = tl.zeros([BLOCK_N], tl.float32)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    for g in range(GROUP):
        h64 = (hk * GROUP + g).to(tl.int64)
        bh = b * (HKV * GROUP) + hk * GROUP + g  # the query head's (batch, head) index, as in the forward
        if HAS_KB:
            kb = tl.load(KB + b64 * skbb + h64 * skbh + cols * skbn, mask=cols < seqlen_k, other=-float("inf"))
            kb = kb.to(tl.float32) * _LOG2E
        q_base = Q + b64 * sqb + h64 * sqh + q_start.to(tl.int64) * sqs
        do_base = DO + b64 * sdob + h64 * sdoh + q_start.to(tl.int64) * sdos
        if USE_TMA:
            q_src = tl.make_tensor_descriptor(q_base, shape=[seqlen_q, HEAD_DIM], strides=[sqs, 1],
                                              block_shape=[BLOCK_M, BLOCK_D])
            do_src = tl.make_tensor_descriptor(do_base, shape=[seqlen_q, HEAD_DIM], strides=[sdos, 1],
                                               block_shape=[BLOCK_M, BLOCK_D])
        else:
            q_src = q_base + offs_m[:, None] * sqs + offs_d[None, :] * sqd
            do_src = do_base + offs_m[:, None] * sdos + offs_d[None, :] * sdod
        lse_ptr = LSE + b64 * slb + h64 * slh + q_start
        delta_ptr = DELTA + b64 * slb + h64 * slh + q_start
        if CAUSAL:
            dk, dv = _attn_bwd_dkdv_inner(
                dk, dv, k, v, kb, q_src, do_src, lse_ptr, delta_ptr, sqs, sdos, offs_m, cols, d_mask,
                seqlen_q, lo, hi_mask, qk_scale, seed, bh, dropout_p, dropout_scale, start_n,
                MASKED=True, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_M=BLOCK_M, INPUT_PRECISION=INPUT_PRECISION,
                HAS_DROPOUT=HAS_DROPOUT, BLOCK_N=BLOCK_N, USE_TMA=USE_TMA, CAUSAL=CAUSAL, WINDOW=WINDOW,
                SOFTCAP=SOFTCAP,
            )
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, kb, q_src, do_src, lse_ptr, delta_ptr, sqs, sdos, offs_m, cols, d_mask,
            seqlen_q, lo_full, hi_full, qk_scale, seed, bh, dropout_p, dropout_scale, start_n,
            MASKED=False, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_M=BLOCK_M, INPUT_PRECISION=INPUT_PRECISION,
            HAS_DROPOUT=HAS_DROPOUT, BLOCK_N=BLOCK_N, USE_TMA=USE_TMA, CAUSAL=CAUSAL, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
        )
        if WINDOW > 0:
            dk, dv = _attn_bwd_dkdv_inner(
                dk, dv, k, v, kb, q_src, do_src, lse_ptr, delta_ptr, sqs, sdos, offs_m, cols, d_mask,
                seqlen_q, hi_full, hi_end, qk_scale, seed, bh, dropout_p, dropout_scale, start_n,
                MASKED=True, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_M=BLOCK_M, INPUT_PRECISION=INPUT_PRECISION,
                HAS_DROPOUT=HAS_DROPOUT, BLOCK_N=BLOCK_N, USE_TMA=USE_TMA, CAUSAL=CAUSAL, WINDOW=WINDOW,
                SOFTCAP=SOFTCAP,
            )
    dk = dk * sm_scale
    dk_off = b64 * sdkb + hk64 * sdkh + k_start.to(tl.int64) * sdks
    dv_off = b64 * sdvb + hk64 * sdvh + k_start.to(tl.int64) * sdvs
    tl.store(DK + dk_off + cols[:, None] * sdks + offs_d[None, :] * sdkd, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + dv_off + cols[:, None] * sdvs + offs_d[None, :] * sdvd, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attn_bwd_dq_inner(
    dq,  # fp32 accumulator [BLOCK_M, BLOCK_D]
    q, do, lse, delta,  # this program's tiles / rows
    k_ptrs, v_ptrs, kb_ptrs,  # pointers to the first K / V tile and the key bias of the sequence
    sks, svs, skbn,
    rows, offs_n, d_mask,
    seqlen_k, lo, hi, qk_scale,
    seed, bh, dropout_p, dropout_scale,  # dropout (HAS_DROPOUT only)
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KB: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    WINDOW: tl.constexpr = 0,
    SOFTCAP: tl.constexpr = 0.0,
):
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_keys(k_ptrs, start_n, sks, cols, seqlen_k, d_mask, MASKED, EVEN_D)
        v = _load_keys(v_ptrs, start_n, svs, cols, seqlen_k, d_mask, MASKED, EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if SOFTCAP > 0:  # as in _attn_bwd_dkdv_inner
            t = _tanh(qk * (qk_scale / (SOFTCAP * _LOG2E)))
            qk = t * (SOFTCAP * _LOG2E)
        else:
            qk = qk * qk_scale
        if HAS_KB:
            kb = tl.load(kb_ptrs + cols * skbn, mask=cols < seqlen_k, other=-float("inf")).to(tl.float32)
            qk = qk + kb[None, :] * _LOG2E
        p = tl.math.exp2(qk - lse[:, None])
        if MASKED:
            p = tl.where(_visible(rows, cols, seqlen_k, CAUSAL, WINDOW), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)  # dP = dO V^T
        if HAS_DROPOUT:  # dP = (dO V^T) Z, Z = keep / (1 - p)
            keep_d = _dropout_keep(seed, bh, rows, start_n, dropout_p, BLOCK_M, BLOCK_N)
            dp = tl.where(keep_d, dp * dropout_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP > 0:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)  # dQ += dS K
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO,
    DQ,  # gradient of Q (written), indexed like Q with the sdq* strides
    LSE, DELTA, KB, CU_Q, CU_K, SEED,
    qk_scale, sm_scale,
    dropout_p, dropout_scale,
    sqb, sqh, sqs, sqd,
    skb, skh, sks, skd,
    svb, svh, svs, svd,
    sdob, sdoh, sdos, sdod,
    sdqb, sdqh, sdqs, sdqd,
    slb, slh,
    skbb, skbh, skbn,
    H, GROUP, SQ, SK, HEAD_DIM,
    VARLEN: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KB: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per program
    BLOCK_N: tl.constexpr,  # keys per inner step
    HAS_DROPOUT: tl.constexpr = False,
    WINDOW: tl.constexpr = 0,  # as in _attn_fwd_kernel
    SOFTCAP: tl.constexpr = 0.0,
):
    """One program: BLOCK_M query rows of one query head; loops over the key blocks they see."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # float arguments may arrive as fp64 (Inductor's launch)
    sm_scale = tl.cast(sm_scale, tl.float32)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    q_start, seqlen_q, k_start, seqlen_k = _sequence(CU_Q, CU_K, b, SQ, SK, VARLEN)
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    hk64 = hk.to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    row_ok = rows < seqlen_q
    qd_mask = row_ok[:, None] & d_mask[None, :]
    q_row = q_start.to(tl.int64) + rows
    q = tl.load(Q + b64 * sqb + h64 * sqh + q_row[:, None] * sqs + offs_d[None, :] * sqd, mask=qd_mask, other=0.0)
    do = tl.load(DO + b64 * sdob + h64 * sdoh + q_row[:, None] * sdos + offs_d[None, :] * sdod, mask=qd_mask, other=0.0)
    lse = tl.load(LSE + b64 * slb + h64 * slh + q_row, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + b64 * slb + h64 * slh + q_row, mask=row_ok, other=0.0)
    k_ptrs = K + b64 * skb + hk64 * skh + k_start.to(tl.int64) * sks + offs_n[:, None] * sks + offs_d[None, :] * skd
    v_ptrs = V + b64 * svb + hk64 * svh + k_start.to(tl.int64) * svs + offs_n[:, None] * svs + offs_d[None, :] * svd
    kb_ptrs = KB + b64 * skbb + h64 * skbh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    n_lo, n_a, n_b, n_end = _key_tiles(start_m, seqlen_k, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)  # as in the forward
    if WINDOW > 0:
        dq = _attn_bwd_dq_inner(
            dq, q, do, lse, delta, k_ptrs, v_ptrs, kb_ptrs, sks, svs, skbn, rows, offs_n, d_mask,
            seqlen_k, n_lo, n_a, qk_scale, seed, pid_bh, dropout_p, dropout_scale,
            MASKED=True, CAUSAL=CAUSAL, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_N=BLOCK_N,
            INPUT_PRECISION=INPUT_PRECISION, HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
        )
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse, delta, k_ptrs, v_ptrs, kb_ptrs, sks, svs, skbn, rows, offs_n, d_mask,
        seqlen_k, n_a, n_b, qk_scale, seed, pid_bh, dropout_p, dropout_scale,
        MASKED=False, CAUSAL=CAUSAL, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_N=BLOCK_N, INPUT_PRECISION=INPUT_PRECISION,
        HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
    )
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse, delta, k_ptrs, v_ptrs, kb_ptrs, sks, svs, skbn, rows, offs_n, d_mask,
        seqlen_k, n_b, n_end, qk_scale, seed, pid_bh, dropout_p, dropout_scale,
        MASKED=True, CAUSAL=CAUSAL, HAS_KB=HAS_KB, EVEN_D=EVEN_D, BLOCK_N=BLOCK_N, INPUT_PRECISION=INPUT_PRECISION,
        HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
    )
    dq = dq * sm_scale
    tl.store(DQ + b64 * sdqb + h64 * sdqh + q_row[:, None] * sdqs + offs_d[None, :] * sdqd,
             dq.to(DQ.dtype.element_ty), mask=qd_mask)


# ==================================================================================================
# PyTorch reference (float64 inputs, devices Triton cannot run on, masks the kernels cannot fuse)
# ==================================================================================================
def attention_reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, dropout_p=0.0,
                        window=None, softcap=None):
    """SDPA, with ``is_causal`` and ``attn_mask`` allowed together (folded into one boolean/float mask).
    With ``dropout_p`` SDPA draws its own mask (not the kernels').  With a ``window`` or ``softcap``, the
    same in explicit PyTorch (``_math_reference``)."""
    if window is not None or softcap is not None:
        return _math_reference(q, k, v, attn_mask, is_causal, scale, dropout_p, window, softcap)
    if is_causal and attn_mask is not None:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        if attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & keep
        else:
            attn_mask = attn_mask.masked_fill(~keep, float("-inf"))
        is_causal = False
    if attn_mask is not None and attn_mask.dtype != torch.bool and attn_mask.dtype != q.dtype:
        attn_mask = attn_mask.to(q.dtype)
    kw = {"enable_gqa": True} if enable_gqa else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                          dropout_p=dropout_p, **kw)


def _math_reference(q, k, v, attn_mask, is_causal, scale, dropout_p, window, softcap):
    """Attention written out: s = scale * q k^T, then s = softcap * tanh(s / softcap) (Gemma 2's order: after
    the scale, before any mask), then the masks (``attn_mask`` as SDPA reads it, the top-left causal mask, the
    window: key j for query i only if j > i - window), softmax in float32 or wider, dropout, P v.  A row with
    no key left gives 0, as SDPA.  (..., Hq, S, D) with K/V heads dividing Hq."""
    sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:  # grouped-query: K/V head h serves query heads h*g..h*g+g-1
        rep_ = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep_, -3), v.repeat_interleave(rep_, -3)
    wdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q.to(wdt) @ k.to(wdt).transpose(-1, -2)) * (1.0 / math.sqrt(d) if scale is None else scale)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if is_causal:
        keep &= j <= i
    if window is not None:
        keep &= j > i - window
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = keep & attn_mask
        else:
            s = s + attn_mask.to(wdt)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a row with no key: 0
    if dropout_p > 0.0:
        p = F.dropout(p, dropout_p)
    return (p @ v.to(wdt)).to(q.dtype)


def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal=False, scale=None, window=None,
                               softcap=None):
    """Each packed sequence through SDPA (or ``_math_reference``), one by one."""
    outs = []
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    gqa = q.shape[1] != k.shape[1]
    for i in range(len(cq) - 1):
        qi = q[cq[i] : cq[i + 1]].transpose(0, 1)
        ki = k[ck[i] : ck[i + 1]].transpose(0, 1)
        vi = v[ck[i] : ck[i + 1]].transpose(0, 1)
        outs.append(attention_reference(qi, ki, vi, is_causal=is_causal, scale=scale, enable_gqa=gqa, window=window,
                                        softcap=softcap).transpose(0, 1))
    return torch.cat(outs, 0) if outs else q.new_empty(q.shape)


# ==================================================================================================
# Launchers
# ==================================================================================================
def _input_precision(dtype: torch.dtype) -> str:
    """Dot precision: full fp32 for float32 inputs unless the user enabled tf32 (Triton's default,
    "tf32", is what 16-bit operands always use: it only affects float32 operands)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _memory_order(stride) -> tuple[int, ...]:
    """Dims ordered outermost first by stride (ties: lower dim outer): how to lay out a look-alike."""
    return tuple(sorted(range(len(stride)), key=lambda i: (-stride[i], i)))


def _alloc_ordered(shape, order, dtype, device) -> torch.Tensor:
    phys = torch.empty([shape[i] for i in order], dtype=dtype, device=device)
    if order == tuple(range(len(order))):
        return phys
    return phys.permute([order.index(i) for i in range(len(order))])


def _strides4(stride, varlen):
    """(batch, head, seq, dim) strides; packed (total, H, D) tensors get batch stride 0."""
    if varlen:
        return 0, stride[1], stride[0], stride[2]
    return tuple(stride)


def _contiguous_stride(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _permuted_stride(shape, order) -> tuple[int, ...]:
    """Strides of ``_alloc_ordered(shape, order)``."""
    phys = _contiguous_stride([shape[i] for i in order])
    st = [0] * len(shape)
    for pos, dim in enumerate(order):
        st[dim] = phys[pos]
    return tuple(st)


# --------------------------------------------------------------------------------------------------
# Launch plans: everything but the tensors and the scale, from (shapes, strides, dtype, mask layout,
# varlen bounds, causal, tf32 setting, override epoch), computed once with the bound kernels.
# --------------------------------------------------------------------------------------------------
class _FwdPlan:
    __slots__ = ("empty", "order", "lse_shape", "kernel", "ints", "cpp")


class _BwdPlan:
    __slots__ = ("empty", "zero", "orders", "pre", "pre_ints", "dkdv", "dkdv_ints", "dq", "dq_ints", "dkdv_tma",
                 "dkdv_tma_ok")


# --------------------------------------------------------------------------------------------------
# The dK/dV kernel's TMA loads (USE_TMA): device-side tensor descriptors (``tl.make_tensor_descriptor``)
# need a Triton that has them, unit head-dim strides and 16-byte aligned bases and other strides, and
# ``triton.set_allocator`` (set to a torch allocator when none is).  A call they cannot serve runs the
# pointer-load kernel.
# --------------------------------------------------------------------------------------------------
HAS_TMA_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")


def _tma_strides_ok(stride, elem_size: int) -> bool:
    """A device-side descriptor over rows of this tensor: unit last-dim stride, 16-byte other strides."""
    return stride[-1] == 1 and all((s * elem_size) % 16 == 0 for s in stride[:-1])


def _use_bwd_tma(dtype: torch.dtype, max_seqlen_k: int, causal: bool, block_d: int, varlen: bool) -> bool:
    """Whether a backward plan takes the dK/dV kernel's TMA loads: where they measured faster on the H200
    (``attention_config.BWD_TMA_CASES``: dense bf16, seqlen_k >= 4096, BLOCK_D 64, or 128 when not causal), on
    a Triton with device-side descriptors, never under the interpreter (the plan also checks the strides)."""
    return (HAS_TMA_DESCRIPTORS and not INTERPRET and not varlen and dtype == torch.bfloat16
            and max_seqlen_k >= BWD_TMA_MIN_SEQLEN_K and (block_d, bool(causal)) in BWD_TMA_CASES)


def _tma_call_ok(q, do) -> bool:
    """Per call: plain tensors (not traced) with 16-byte aligned data (the plan checked the strides)."""
    if type(q) not in (torch.Tensor, torch.nn.Parameter) or ((q.data_ptr() | do.data_ptr()) & 15):
        return False
    if not INTERPRET:
        ensure_triton_allocator()
    return True


def _launch_tma(plan: _BwdPlan, args: tuple) -> bool:
    """Launch the plan's TMA dK/dV kernel.  On its first launch a failure (a compile error of an installed
    Triton whose device-side descriptors do not work) drops it from the plan with a warning and returns
    False: the caller runs the pointer-load kernel.  Once it has launched, errors propagate; under the
    interpreter nothing is caught (tests must see failures)."""
    kernel = plan.dkdv_tma
    if INTERPRET or plan.dkdv_tma_ok:
        kernel(*args)
        return True
    try:
        kernel(*args)
    except Exception as e:  # noqa: BLE001
        plan.dkdv_tma = None
        msg = f"{type(e).__name__}: {str(e)[:300]}"
        warn_once(f"{_OP}:tma:{msg[:200]}", f"{_OP}: the dK/dV kernel with TMA loads failed to launch, using "
                  f"pointer loads: {msg}")
        return False
    plan.dkdv_tma_ok = True
    return True


def _gluon_takes(q, k, v, causal: bool, kernel: str) -> bool:
    """The Gluon ``kernel`` ("fwd" or "dkdv", ops/attention_gluon.py) takes this dense call: plain tensors (not
    traced) that ``attention_gluon.supported`` accepts (never under the interpreter: Gluon has none), large enough
    and where it measured faster (``attention_gluon.auto_ok``)."""
    if INTERPRET or not all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in (q, k, v)):
        return False
    from . import attention_gluon  # (imported on first use: Gluon's import is not free)

    return attention_gluon.supported(q, k, v, causal) is None and attention_gluon.auto_ok(kernel, q, causal)


_FWD_PLANS: dict[tuple, _FwdPlan] = {}
_BWD_PLANS: dict[tuple, _BwdPlan] = {}
_MAX_PLANS = 4096


def _geometry(qs, ks, varlen: bool, nb: int, max_q: int, max_k: int):
    """(B, Hq, Hkv, Sq, Sk, D, LSE shape) of the dense (B, H, S, D) or packed (total, H, D) layout."""
    if varlen:
        return nb - 1, qs[1], ks[1], max_q, max_k, qs[2], (qs[1], qs[0])
    B, H, SQ, D = qs
    return B, H, ks[1], SQ, ks[2], D, (qs[0], qs[1], qs[2])


def _fwd_plan(key) -> _FwdPlan:
    (qs, qst, ks, kst, vst, dtype, kbst, varlen, nb, max_q, max_k, causal, prec, dropout, window, softcap,
     _epoch) = key
    plan = _FwdPlan()
    plan.cpp = {}  # (device, with backward) -> C++ fast-path plan id, or False (ops/_cpp.py)
    B, H, HKV, SQ, SK, D, lse_shape = _geometry(qs, ks, varlen, nb, max_q, max_k)
    plan.order = _memory_order(qst)
    plan.lse_shape = lse_shape
    plan.empty = math.prod(qs) == 0 or SQ == 0
    ost = _permuted_stride(qs, plan.order)
    lst = _contiguous_stride(lse_shape)
    lse_st = (0, lst[0]) if varlen else (lst[0], lst[1])
    bd = max(16, next_power_of_2(D))
    plan.ints = (
        *_strides4(qst, varlen), *_strides4(kst, varlen), *_strides4(vst, varlen), *_strides4(ost, varlen),
        *lse_st, *(kbst or (0, 0, 0)), H, H // HKV, SQ, SK, D,
    )
    plan.kernel = None
    if not plan.empty:
        cfg = tiles("fwd", bd, causal, dtype)
        plan.kernel = Kernel(_attn_fwd_kernel, (triton.cdiv(SQ, cfg["BLOCK_M"]), B * H), check=(0, 1, 2, 5, 6, 7),
                             VARLEN=varlen, CAUSAL=causal, HAS_KB=kbst is not None, BLOCK_D=bd, EVEN_D=D == bd,
                             INPUT_PRECISION=prec, HAS_DROPOUT=dropout, WINDOW=window, SOFTCAP=softcap, **cfg)
    return plan


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kb: torch.Tensor | None,
                      cu_q: torch.Tensor | None, cu_k: torch.Tensor | None, max_q: int, max_k: int, causal: bool,
                      scale: float, dropout_p: float = 0.0, seed: torch.Tensor | None = None, window: int = 0,
                      softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward. Returns (out laid out like q, fp32 base-2 LSE [B, H, Sq] or [H, total_q]).

    ``dropout_p`` > 0 drops attention probabilities (Philox, keyed by ``seed``, an int64 [1] tensor).
    ``window`` > 0: query i sees key j only if j > i - window; ``softcap`` > 0: scores softcap * tanh(s / softcap)
    (both constexprs of the kernels: one compile per value, and the plain kernels are unchanged)."""
    varlen = cu_q is not None
    dropout = dropout_p > 0.0
    # The Gluon kernels have no window or soft-capping: those calls run the Triton kernels.
    if (not varlen and kb is None and not dropout and not window and not softcap
            and _gluon_takes(q, k, v, causal, "fwd")):
        from . import attention_gluon

        return attention_gluon.forward(q, k, v, causal, scale)
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, None if kb is None else kb.stride(),
           varlen, cu_q.shape[0] if varlen else 0, max_q, max_k, causal,
           _input_precision(q.dtype), dropout, int(window), float(softcap), override_epoch())
    try:
        plan = _FWD_PLANS.get(key)
    except TypeError:  # symbolic sizes (tracing with dynamic shapes): plan for their values
        key = tuple(concrete(e) if isinstance(e, (tuple, torch.Size)) else e for e in key)
        plan = None
    if plan is None:
        plan = _fwd_plan(key)
        if len(_FWD_PLANS) >= _MAX_PLANS:
            _FWD_PLANS.clear()
        _FWD_PLANS[key] = plan
    out = _alloc_ordered(q.shape, plan.order, q.dtype, q.device)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device)
    if plan.empty:
        return out, lse
    plan.kernel(q, k, v, out, lse, q if kb is None else kb, cu_q if varlen else q, cu_k if varlen else q,
                seed if dropout else q, scale * LOG2E, dropout_p, _dropout_scale(dropout_p) if dropout else 1.0,
                *plan.ints)
    return out, lse


def _dropout_scale(dropout_p: float) -> float:
    """The kept values' scale, 1 / (1 - p'), with p' = p rounded to the mask's steps of 1/256 exactly as the
    kernels round it (their threshold), so E[output] equals the undropped output for any p; 0 where p'
    rounds to 1 (everything dropped: the output is 0, as F.dropout with p = 1)."""
    p_eff = math.floor(dropout_p * DROPOUT_STEPS + 0.5) / DROPOUT_STEPS
    return 1.0 / (1.0 - p_eff) if p_eff < 1.0 else 0.0


def _bwd_plan(key) -> _BwdPlan:
    (qs, qst, ks, kst, vst, dost, dtype, kbst, varlen, nb, max_q, max_k, causal, prec, dropout, window, softcap,
     _epoch) = key
    plan = _BwdPlan()
    B, H, HKV, SQ, SK, D, lse_shape = _geometry(qs, ks, varlen, nb, max_q, max_k)
    plan.orders = (_memory_order(qst), _memory_order(kst), _memory_order(vst))
    plan.empty = math.prod(qs) == 0 and math.prod(ks) == 0
    plan.zero = SQ == 0 or SK == 0
    dqst = _permuted_stride(qs, plan.orders[0])
    dkst = _permuted_stride(ks, plan.orders[1])
    dvst = _permuted_stride(ks[:-1] + (D,), plan.orders[2])
    ost = dqst  # the forward's output is laid out like q
    lst = _contiguous_stride(lse_shape)
    lse_st = (0, lst[0]) if varlen else (lst[0], lst[1])
    kb3 = kbst or (0, 0, 0)
    bd = max(16, next_power_of_2(D))
    pre_bm = 16 if INTERPRET else PREPROCESS_BLOCK_M
    plan.pre = Kernel(_attn_bwd_preprocess, (triton.cdiv(SQ, pre_bm), B * H), check=(0, 1, 3), VARLEN=varlen,
                      BLOCK_M=pre_bm, BLOCK_D=bd)
    plan.pre_ints = (*_strides4(ost, varlen), *_strides4(dost, varlen), *lse_st, H, SQ, D)
    common = (*_strides4(qst, varlen), *_strides4(kst, varlen), *_strides4(vst, varlen), *_strides4(dost, varlen))
    plan.dkdv_ints = (*common, *_strides4(dkst, varlen), *_strides4(dvst, varlen), *lse_st, *kb3,
                      HKV, H // HKV, SQ, SK, D)
    plan.dq_ints = (*common, *_strides4(dqst, varlen), *lse_st, *kb3, H, H // HKV, SQ, SK, D)
    meta = dict(VARLEN=varlen, CAUSAL=causal, HAS_KB=kbst is not None, BLOCK_D=bd, EVEN_D=D == bd,
                INPUT_PRECISION=prec, HAS_DROPOUT=dropout, WINDOW=window, SOFTCAP=softcap)
    f_dkdv, f_dq = tiles("dkdv", bd, causal, dtype), tiles("dq", bd, causal, dtype)
    # USE_TMA is passed even where off: torch.compile's wrap_triton wants every constexpr named
    grid_dkdv = (triton.cdiv(SK, f_dkdv["BLOCK_N"]), B * HKV)
    plan.dkdv = Kernel(_attn_bwd_dkdv_kernel, grid_dkdv, check=(0, 1, 2, 3, 6, 8, 9, 10), **meta, **f_dkdv,
                       USE_TMA=False)
    plan.dq = Kernel(_attn_bwd_dq_kernel, (triton.cdiv(SQ, f_dq["BLOCK_M"]), B * H), check=(0, 1, 2, 3, 5, 7, 8, 9),
                     **meta, **f_dq)
    # The same dK/dV kernel with its Q / dO tiles through TMA descriptors, where it measured faster and
    # descriptors can serve q and dO (same arguments).
    plan.dkdv_tma = None
    plan.dkdv_tma_ok = False
    if (_use_bwd_tma(dtype, SK, causal, bd, varlen)
            and all(_tma_strides_ok(_strides4(st, varlen), dtype.itemsize) for st in (qst, dost))):
        plan.dkdv_tma = Kernel(_attn_bwd_dkdv_kernel, grid_dkdv, check=(0, 1, 2, 3, 6, 8, 9, 10), **meta, **f_dkdv,
                               USE_TMA=True)
    return plan


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, kb: torch.Tensor | None, cu_q: torch.Tensor | None,
                       cu_k: torch.Tensor | None, max_q: int, max_k: int, causal: bool,
                       scale: float, dropout_p: float = 0.0, seed: torch.Tensor | None = None, window: int = 0,
                       softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward. Returns (dq, dk, dv), each laid out like its input.  With ``dropout_p`` > 0
    the forward's keep mask is regenerated from ``seed`` (nothing of it was stored); ``window`` and
    ``softcap`` as in ``attention_forward``."""
    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    varlen = cu_q is not None
    dropout = dropout_p > 0.0
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), do.stride(), q.dtype,
           None if kb is None else kb.stride(), varlen, cu_q.shape[0] if varlen else 0, max_q, max_k, causal,
           _input_precision(q.dtype), dropout, int(window), float(softcap), override_epoch())
    try:
        plan = _BWD_PLANS.get(key)
    except TypeError:  # symbolic sizes: plan for their values
        key = tuple(concrete(e) if isinstance(e, (tuple, torch.Size)) else e for e in key)
        plan = None
    if plan is None:
        plan = _bwd_plan(key)
        if len(_BWD_PLANS) >= _MAX_PLANS:
            _BWD_PLANS.clear()
        _BWD_PLANS[key] = plan
    oq, ok, ov = plan.orders
    dq = _alloc_ordered(q.shape, oq, q.dtype, q.device)
    dk = _alloc_ordered(k.shape, ok, k.dtype, k.device)
    dv = _alloc_ordered(v.shape, ov, v.dtype, v.device)
    if plan.empty:
        return dq, dk, dv
    if plan.zero:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    kb_ = q if kb is None else kb
    cq = cu_q if varlen else q
    ck = cu_k if varlen else q
    plan.pre(out, do, delta, cq, *plan.pre_ints)
    qk_scale = scale * LOG2E
    sd = seed if dropout else q
    dscale = _dropout_scale(dropout_p) if dropout else 1.0
    dkdv_args = (q, k, v, do, dk, dv, lse, delta, kb_, cq, ck, sd, qk_scale, scale, dropout_p, dscale, *plan.dkdv_ints)
    dq_args = (q, k, v, do, dq, lse, delta, kb_, cq, ck, sd, qk_scale, scale, dropout_p, dscale, *plan.dq_ints)
    if not varlen and kb is None and not dropout and not window and not softcap and _gluon_takes(q, k, v, causal,
                                                                                                   "dkdv"):
        from . import attention_gluon as ag

        if ag.dkdv_grads_ok(q, k, do, dk, dv) is None:  # (q, k, v: checked)
            ag.dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale)  # Gluon dK / dV, then the Triton dQ kernel
            plan.dq(*dq_args)
            return dq, dk, dv
    if plan.dkdv_tma is not None and _tma_call_ok(q, do) and _launch_tma(plan, dkdv_args):
        plan.dq(*dq_args)
    else:
        plan.dkdv(*dkdv_args)
        plan.dq(*dq_args)
    return dq, dk, dv


# ==================================================================================================
# Registration (ops/_library.py): custom ops for torch.compile, autograd, the eager direct path
# ==================================================================================================
def _setup_context(ctx, inputs, outputs):
    q, k, v, kb, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p, seed, window, softcap = inputs
    ctx.save_for_backward(q, k, v, outputs[0], outputs[1], kb, cu_q, cu_k, seed)
    ctx.args = (max_q, max_k, causal, scale, dropout_p)
    ctx.window_softcap = (window, softcap)


def _grads(ctx, backward, dout):
    q, k, v, out, lse, kb, cu_q, cu_k, seed = ctx.saved_tensors
    dq, dk, dv = backward(dout, q, k, v, out, lse, kb, cu_q, cu_k, *ctx.args, seed, *ctx.window_softcap)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None


attention_op = FusedOp("attention", attention_forward, attention_backward, _setup_context, _grads)


def _run(q, k, v, kb, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p=0.0, seed=None, window=0, softcap=0.0):
    if INTERPRET and q.dtype in (torch.float16, torch.bfloat16) and q.device.type == "cpu":
        # The interpreter (numpy) has no bf16 matmul: run the same kernels on float32 copies.
        out = _run(q.float(), k.float(), v.float(), kb, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p, seed,
                   window, softcap)
        return out.to(q.dtype)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if _cpp.ENABLED and kb is None and cu_q is None and not window and not softcap and _cpp.eager_ok():
        out = _cpp_attention(q, k, v, max_q, max_k, causal, scale, needs_grad, dropout_p, seed)
        if out is not None:
            return out
    return attention_op(q, k, v, kb, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p, seed, int(window),
                        float(softcap), needs_grad=needs_grad)


def _fwd_key(q, k, v, max_q, max_k, causal, dropout=False):
    """attention_forward's plan key of a dense call (no key bias, fixed lengths)."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, None, False, 0, max_q, max_k, causal,
            _input_precision(q.dtype), dropout, 0, 0.0, override_epoch())


def _cpp_attention_register(plan, q, k, v, max_q, max_k, causal, scale, grad, dropout_p=0.0, seed=None):
    """Register a dense plan's kernels with the C++ fast path (the forward; with ``grad`` the backward's
    preprocess, dK/dV and dQ kernels for a dO laid out like the output): the plan id, None while the forward
    is not compiled for these dtypes yet, False if unsupported (also where the Gluon kernels take the call)."""
    # The C++ plan launches the Triton kernels, so a layout the Python path sends to a Gluon kernel stays on the
    # Python path, even where a Triton plan exists for it (an earlier call of it that Gluon did not take).
    if dropout_p == 0.0 and (_gluon_takes(q, k, v, causal, "fwd") or (grad and _gluon_takes(q, k, v, causal, "dkdv"))):
        return False
    dev, qd, f32 = q.get_device(), q.dtype, torch.float32
    fwd = _cpp.register_all(dev, (plan.kernel, (qd,) * 4 + (f32,) + (qd,) * 4, plan.ints,
                                  _cpp.roles(9, len(plan.ints), 3, floats_first=True)))
    if not fwd:
        return fwd
    fwd = fwd[0]
    ost = _permuted_stride(q.shape, plan.order)
    if not grad:
        return _cpp.register_plan("register_attention", fwd, -1, -1, -1, list(ost), list(plan.lse_shape), [], [], [])
    bkey = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), tuple(ost), qd, None, False, 0, max_q, max_k, causal,
            _input_precision(qd), dropout_p > 0.0, 0, 0.0, override_epoch())
    bplan = _BWD_PLANS.get(bkey)
    if bplan is None or bplan.dq.compiled(bplan.dq.aligned_key(dev, (qd,) * 5 + (f32, f32) + (qd,) * 4)) is None:
        # Compile the backward for a dO laid out like the output (the layout the C++ node gives it): one
        # launch on zeros, results discarded.
        zo = torch.empty_strided(q.shape, ost, dtype=qd, device=q.device).zero_()
        lse0 = torch.zeros(plan.lse_shape, dtype=f32, device=q.device)
        attention_backward(zo, q.detach(), k.detach(), v.detach(), zo, lse0, None, None, None, max_q, max_k, causal,
                           scale, dropout_p, seed)
        bplan = _BWD_PLANS.get(bkey)
    if bplan is None or bplan.empty or bplan.zero:
        return False
    # The dK/dV kernel the Python path runs for this plan: the TMA one where it is on (and launched), else the
    # plain one; same parameters (the TMA one also takes Triton's global scratch, allocated per launch).
    dkdv = bplan.dkdv_tma if bplan.dkdv_tma is not None else bplan.dkdv
    handles = _cpp.register_all(
        dev,
        (bplan.pre, (qd, qd, f32, qd), bplan.pre_ints, _cpp.roles(4, len(bplan.pre_ints))),
        (dkdv, (qd,) * 6 + (f32, f32) + (qd,) * 4, bplan.dkdv_ints,
         _cpp.roles(12, len(bplan.dkdv_ints), 4, floats_first=True)),
        (bplan.dq, (qd,) * 5 + (f32, f32) + (qd,) * 4, bplan.dq_ints,
         _cpp.roles(11, len(bplan.dq_ints), 4, floats_first=True)),
    )
    if not handles:  # (compiled by the warm-up above: None would be a kernel it did not launch)
        return False
    oq, ok_, ov = bplan.orders
    return _cpp.register_plan("register_attention", fwd, *handles, list(ost), list(plan.lse_shape),
                              list(_permuted_stride(q.shape, oq)), list(_permuted_stride(k.shape, ok_)),
                              list(_permuted_stride(v.shape, ov)))


def _cpp_attention_register_and_bind(plan, q, k, v, max_q, max_k, causal, scale, grad, dropout_p=0.0, seed=None):
    """``_cpp_attention_register``, then (16-bit q: float32's plan depends on the global TF32 flag) the layout
    is bound for ``attention_fast``, F.scaled_dot_product_attention's call in one C++ call."""
    nid = _cpp_attention_register(plan, q, k, v, max_q, max_k, causal, scale, grad, dropout_p, seed)
    ext = _cpp.extension()
    if type(nid) is int and ext is not None and q.dtype != torch.float32:
        ext.bind_attention(q, k, v, causal, dropout_p, grad, nid, _dropout_scale(dropout_p) if dropout_p > 0.0 else 1.0)
    return nid


def _cpp_attention(q, k, v, max_q, max_k, causal, scale, grad, dropout_p=0.0, seed=None):
    """A dense eager call through the C++ fast path (ops/_cpp.py): with ``grad`` a C++ autograd node, else a
    forward; None: the Python path runs (first call of a plan, unaligned or non-CUDA inputs)."""
    if not q.is_cuda or q.dtype != k.dtype or q.dtype != v.dtype or any(t.data_ptr() & 15 for t in (q, k, v)):
        return None
    dropout = dropout_p > 0.0
    plan = _FWD_PLANS.get(_fwd_key(q, k, v, max_q, max_k, causal, dropout))
    if plan is None or plan.kernel is None or plan.empty:
        return None
    nid = _cpp.plan_id(plan.cpp, (q.get_device(), grad), _cpp_attention_register_and_bind, plan, q, k, v, max_q, max_k,
                       causal, scale, grad, dropout_p, seed)
    if nid is None:
        return None
    ext = _cpp.extension()
    qk_scale = scale * LOG2E
    dscale = _dropout_scale(dropout_p) if dropout else 1.0
    if grad:
        return ext.attention_apply(q, k, v, qk_scale, scale, seed if dropout else None, dropout_p, dscale, nid)
    return ext.attention_infer(q, k, v, qk_scale, seed if dropout else None, dropout_p, dscale, nid)


def draw_dropout_seed(device: torch.device | str) -> torch.Tensor:
    """The int64 [1] Philox seed of one dropout call, drawn from torch's generator of ``device`` (so
    ``torch.manual_seed`` reproduces the mask; on CUDA no host sync, and torch.compile traces it)."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def attention_dropout_mask(seed: torch.Tensor, B: int, H: int, Sq: int, Sk: int, dropout_p: float) -> torch.Tensor:
    """The boolean keep mask (B, H, Sq, Sk) the kernels apply for ``seed`` (tests and debugging only:
    the kernels themselves never store it).  True = kept (and scaled by 1 / (1 - p))."""
    if not isinstance(seed, torch.Tensor) or seed.dtype != torch.int64 or seed.numel() != 1:
        raise TypeError("attention_dropout_mask: argument 'seed' must be an int64 tensor with one element")
    out = torch.empty((B, H, Sq, Sk), dtype=torch.int8, device=seed.device)
    if out.numel():
        bm, bn = (16, 16) if INTERPRET else (64, 64)
        _dropout_mask_kernel[(triton.cdiv(Sq, bm), B * H)](seed, out, Sq, Sk, float(dropout_p), BLOCK_M=bm, BLOCK_N=bn)
    return out.bool()


# ==================================================================================================
# Public API
# ==================================================================================================
def _check_qkv(q, k, v, names=("query", "key", "value")):
    for t, n in zip((q, k, v), names):
        check_tensor(_OP, n, t)
        check_float_dtype(_OP, n, t, allow_float64=True)
    check_same_device(_OP, names[0], q, **{names[1]: k, names[2]: v})
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            f"{_OP}: arguments 'query', 'key' and 'value' must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )


def _check_window_softcap(op: str, window, softcap) -> tuple[int, float]:
    """(window, softcap) as the kernels take them (0: off), or a TypeError / ValueError naming the argument."""
    w, c = 0, 0.0
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int):
            raise TypeError(f"{op}: argument 'window' must be a positive int or None, got {type(window).__name__}")
        if window < 1:
            raise ValueError(f"{op}: argument 'window' must be >= 1 (query i sees keys i - window < j), got {window}")
        w = int(window)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise TypeError(f"{op}: argument 'softcap' must be a positive float or None, got {type(softcap).__name__}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"{op}: argument 'softcap' must be a finite float > 0, got {softcap}")
        c = float(softcap)
    return w, c


def _broadcast_shapes(op: str, what: str, *shapes) -> tuple[int, ...]:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        raise FusedShapeError(f"{op}: the {what} of 'query' {tuple(shapes[0])}, 'key' {tuple(shapes[1])} and 'value' "
                              f"{tuple(shapes[2])} do not broadcast") from None


def _sdpa_layout(q, k, v, attn_mask, enable_gqa):
    """SDPA's batch broadcasting on inputs the kernels' own layout does not cover: q (*N, L, E), k (*N, S, E),
    v (*N, S, Ev) with the batch dims *N broadcast together (with ``enable_gqa``, the head dim -3 of q and of k / v
    stay apart, so that K/V heads can divide the query's).  Returns (q, k, v, mask) as 4-D (B, H, *, *) tensors --
    broadcast dims expanded with stride 0, more than two batch dims flattened into B -- and the output's shape."""
    for n, t in (("query", q), ("key", k), ("value", v)):
        if t.dim() < 2:
            raise FusedShapeError(f"{_OP}: argument '{n}' must have at least 2 dims (..., S, E), got {t.dim()}-D")
    if enable_gqa and max(q.dim(), k.dim(), v.dim()) >= 3:
        def head(t):
            return t.shape[-3] if t.dim() >= 3 else 1

        def lead(t):
            return t.shape[:-3] if t.dim() >= 3 else ()

        batch = _broadcast_shapes(_OP, "batch dims", lead(q), lead(k), lead(v))
        if head(k) != head(v):
            raise FusedShapeError(f"{_OP}: 'key' and 'value' must have the same number of heads, got {head(k)} and "
                                  f"{head(v)}")
        hq, hkv = head(q), head(k)
        qb, kb_ = batch + (hq,), batch + (hkv,)
    else:
        batch = _broadcast_shapes(_OP, "batch dims", q.shape[:-2], k.shape[:-2], v.shape[:-2])
        qb = kb_ = batch
    out_shape = qb + (q.shape[-2], v.shape[-1])

    def to4(t, b):
        t = t.expand(b + t.shape[-2:])
        if len(b) > 2:
            return t.reshape((-1, b[-1]) + t.shape[-2:])
        return t.reshape((1,) * (2 - len(b)) + tuple(t.shape))

    mask = attn_mask
    if mask is not None:
        lm = mask.shape[-2] if mask.dim() >= 2 else 1  # 1: a key mask, kept as one (the fusable form)
        try:
            mask = to4(mask.expand(qb + (lm, k.shape[-2])), qb)
        except RuntimeError:
            raise FusedShapeError(f"{_OP}: argument 'attn_mask' of shape {tuple(attn_mask.shape)} does not broadcast "
                                  f"to {qb + (q.shape[-2], k.shape[-2])}") from None
    return to4(q, qb), to4(k, kb_), to4(v, kb_), mask, out_shape


def key_bias_from_mask(attn_mask: torch.Tensor, B: int, H: int, Sq: int, Sk: int) -> torch.Tensor | None:
    """The fp32 per-key bias (B, H, Sk) (broadcast strides) equivalent to ``attn_mask``, or None.

    ``attn_mask`` (SDPA semantics: bool True keeps, float is added) is fusable when it does not vary
    along the query dim, i.e. broadcasts from (B or 1, H or 1, 1, Sk): a key-padding mask.
    """
    m = attn_mask
    if m.requires_grad or m.dim() > 4 or m.dim() == 0:
        return None
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if m.shape[-2] != 1 and Sq != 1:
        return None
    try:
        m = m[..., :1, :].expand(B, H, 1, Sk)
    except RuntimeError:
        raise ValueError(
            f"{_OP}: argument 'attn_mask' of shape {tuple(attn_mask.shape)} does not broadcast to "
            f"(B, H, Sq, Sk) = {(B, H, Sq, Sk)}"
        ) from None
    # Build the bias on the un-broadcast tensor, then broadcast with stride-0 dims (no B*H copy).
    base = attn_mask
    while base.dim() < 4:
        base = base.unsqueeze(0)
    base = base[..., :1, :]
    if base.dtype == torch.bool:
        bias = torch.zeros(base.shape, dtype=torch.float32, device=base.device).masked_fill_(~base, float("-inf"))
    else:
        bias = base.to(torch.float32)
    return bias.expand(B, H, 1, Sk)[:, :, 0, :]


# --------------------------------------------------------------------------------------------------
# Which attention a swapped module runs.  On Hopper, torch's SDPA picks cuDNN's attention for dense
# bf16 / fp16 inputs, and cuDNN is the faster kernel there (H200: these kernels' forward 0.67-0.90x and
# backward 0.49-0.91x of cuDNN's), including GQA / MQA through SDPA's ``enable_gqa`` (Llama-shape GQA 16/4 x 64,
# S 2,048, causal, forward + backward: SDPA 0.411 ms against 0.512) and dropout (0.639 against 1.019 ms at
# p = 0.1).  A swapped module must never make the step slower, so for those cases (no mask, head dim 64 or
# 128, compute capability 9.x, cuDNN SDPA enabled) ``fused_attention`` calls SDPA (``backend="auto"``, its default,
# which the modules and integrations use); key-padding masks (fused as a bias), other head dims, float32 and varlen
# run the Triton kernels, which beat SDPA's other backends there.  ``backend="triton"`` runs these kernels whatever
# the shape (the tests, the ops suite's ``fused`` rows).
# --------------------------------------------------------------------------------------------------
_CUDNN_FASTER: dict[int, bool] = {}
#: The device type whose tensors ``prefer_sdpa`` may hand to cuDNN (a module global, read while Dynamo traces:
#: the CPU tests set it to "cpu" to trace the GPU route under the interpreter).
ROUTE_DEVICE_TYPE = "cuda"
#: ``fused_attention``'s backend when its caller names none: "auto" (the tests' conftest sets "triton", so that
#: every test of the kernels runs them; the routing tests pass "auto").
DEFAULT_BACKEND = "auto"
_BACKENDS = ("auto", "triton")


@torch.compiler.assume_constant_result
def _cudnn_sdpa_available(device_index: int) -> bool:
    """Compute capability 9.x with cuDNN's SDPA enabled, cached per device.  A constant to torch.compile
    (``assume_constant_result``: Dynamo runs it once while tracing and bakes the answer in): traced as code,
    ``torch.backends.cuda.cudnn_sdp_enabled()`` is a torch function returning a bool, a graph break in every
    attention call whenever the cache was still empty when tracing began (a model compiled before any eager
    call): GPT-2 small fused + compile ran 45-51 ms a step on 34 ms of GPU, 0.67-0.74x compiled SDPA."""
    hit = _CUDNN_FASTER.get(device_index)
    if hit is None:
        major, _ = torch.cuda.get_device_capability(device_index)
        enabled = getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: False)
        hit = _CUDNN_FASTER[device_index] = major == 9 and enabled()
    return hit


_SDPA_HAS_GQA = "enable_gqa" in (torch.nn.functional.scaled_dot_product_attention.__doc__ or "")


def _sdpa_faster(dtype: torch.dtype, shape: tuple, hkv: int, has_mask: bool) -> bool:
    """The measured rule of ``prefer_sdpa`` on shapes alone (device checks apart): dense 4-D bf16/fp16 with
    head dim 64 / 128 and as many K/V heads as query heads, or a divisor of them (GQA / MQA) where SDPA
    takes ``enable_gqa``."""
    if has_mask or dtype not in (torch.bfloat16, torch.float16) or len(shape) != 4 or shape[-1] not in (64, 128):
        return False
    hq = shape[-3]
    return hkv == hq or (_SDPA_HAS_GQA and hkv > 0 and hq % hkv == 0)


def prefer_sdpa(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """True when a swapped attention module should call SDPA (cuDNN) rather than the Triton kernels.
    Callers pass ``enable_gqa=True`` to SDPA when K/V have fewer heads."""
    hkv = k.shape[-3] if k.dim() == 4 else -1
    return (q.device.type == ROUTE_DEVICE_TYPE and _sdpa_faster(q.dtype, tuple(q.shape), hkv, attn_mask is not None)
            and _cudnn_sdpa_available(q.get_device()))


def fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with FlashAttention-style Triton forward and backward kernels.

    Takes ``F.scaled_dot_product_attention``'s full signature, in its order: ``(query, key, value,
    attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False)``, plus three keywords SDPA
    does not have:

    - ``window`` (int >= 1): a sliding window on the left: query i sees key j only if ``j > i - window``
      (``window`` keys up to and including its own position with ``is_causal``; without it every key to the
      right too), in the same top-left coordinates as ``is_causal``.  transformers' ``sliding_window``
      (``sliding_window_overlay``).  Key tiles left of every row's window are never read, so a window also
      saves their work; a window of Sq or more cuts nothing and runs the windowless kernels (Gluon on Hopper).
    - ``softcap`` (float > 0): logit soft-capping, scores ``softcap * tanh(scale * q . k / softcap)`` after
      the scale and before any mask, as Gemma 2's ``attn_logit_softcapping``.
    - ``backend``: ``"auto"`` (the default) calls SDPA where its cuDNN kernel is measured faster than these
      (``prefer_sdpa``: compute capability 9.x, dense bf16 / fp16 4-D inputs, head dim 64 / 128, no mask, window
      or soft-cap; H200, fwd+bwd at B16 H16 S 1,024, not causal: cuDNN 0.64 / 1.04 ms against these kernels'
      0.69 / 1.10 at D64 / D128), these kernels everywhere else; ``"triton"``: these kernels whatever the shape.

    Same layout and semantics as ``F.scaled_dot_product_attention``: q (B, Hq, Sq, D), k and v
    (B, Hkv, Sk, D) (3-D inputs (B, S, D) are one head), any strides; ``is_causal`` aligned to the
    top-left; ``scale`` defaults to 1/sqrt(D); ``enable_gqa`` lets Hkv divide Hq. Returns (B, Hq, Sq, D)
    in q's dtype, laid out in memory like q.  SDPA's batch broadcasting holds too (q (*N, Sq, D) against
    k / v (*N', Sk, D) with *N and *N' broadcast: a 3-D query with 4-D keys, a batch or K/V head of 1, more
    than two batch dims, 2-D inputs): those run the same kernels on 4-D views, broadcast dims expanded with
    stride 0 (their gradients summed by autograd).

    ``attn_mask`` that does not vary along the query dim (a key-padding mask, bool or additive, shaped
    (B or 1, H or 1, 1, Sk) or broadcastable) runs fused, also together with ``is_causal``; any other mask
    falls back to SDPA with a one-time warning. A query row whose keys are all masked gives 0 (and zero
    gradients), as SDPA does. float64 inputs and devices Triton cannot run on use SDPA.

    ``dropout_p`` (applied whenever > 0, like SDPA; pass 0 in eval): each probability is kept with
    probability 1 - p and scaled by 1 / (1 - p).  The mask comes from Philox inside the kernels, keyed by a
    seed drawn from torch's RNG on q's device (``torch.manual_seed`` reproduces it); the backward
    regenerates it, nothing is stored.  ``attention_dropout_mask`` materializes it for tests.
    """
    win, cap = _check_window_softcap(_OP, window, softcap)
    backend = DEFAULT_BACKEND if backend is None else backend
    if backend not in _BACKENDS:
        raise ValueError(f"{_OP}: argument 'backend' must be one of {_BACKENDS}, got {backend!r}")
    if isinstance(query, torch.Tensor) and (adt := autocast_dtype(query)) is not None:
        # SDPA is one of autocast's lower-precision ops: under autocast its inputs run in the autocast dtype (a
        # float32 query from HF's RoPE with a bfloat16 value included), so here too
        query, key, value, attn_mask = autocast_cast(adt, query, key, value, attn_mask)
    # SDPA (cuDNN) where it is measured faster, first thing (a module's every call takes this path on Hopper): SDPA
    # checks the rest of its inputs itself, with PyTorch's errors; K/V heads that need enable_gqa and lack it get
    # this function's error below instead
    if (backend == "auto" and attn_mask is None and not win and not cap and isinstance(query, torch.Tensor)
            and isinstance(key, torch.Tensor) and (enable_gqa or key.dim() != 4 or key.shape[-3] == query.shape[-3])
            and prefer_sdpa(query, key, None)):
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, None, dropout_p, is_causal, scale=scale, **({"enable_gqa": True} if enable_gqa else {}))
    if _cpp.ENABLED and attn_mask is None and not win and not cap:  # a registered dense layout: one C++ call
        out = _cpp.fast_call("attention_fast", query, key, value, dropout_p, is_causal, scale, enable_gqa)
        if out is not None:
            return out
    _check_qkv(query, key, value)
    q, k, v = query, key, value
    own_layout = q.dim() == k.dim() == v.dim() and q.dim() in (3, 4) and q.shape[0] == k.shape[0] == v.shape[0]
    if own_layout and not enable_gqa and q.dim() == 4:
        own_layout = q.shape[1] == k.shape[1] == v.shape[1] or 1 not in (k.shape[1], v.shape[1])  # else: broadcast
    if not own_layout:
        # SDPA's batch broadcasting (a 3-D query with 4-D keys, a batch or K/V head of 1, more than two batch
        # dims, 2-D inputs): the same call on 4-D (B, H, *, *) inputs, broadcast dims expanded with stride 0
        if attn_mask is not None:
            check_tensor(_OP, "attn_mask", attn_mask)
        q4, k4, v4, m4, out_shape = _sdpa_layout(q, k, v, attn_mask, enable_gqa)
        out = fused_attention(q4, k4, v4, m4, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa,
                              window=window, softcap=softcap, backend=backend)
        return out.reshape(out_shape)
    if attn_mask is not None:
        check_tensor(_OP, "attn_mask", attn_mask)
        check_same_device(_OP, "query", q, attn_mask=attn_mask)
        if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
            raise TypeError(f"{_OP}: argument 'attn_mask' must be bool or floating point, got {attn_mask.dtype}")
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"{_OP}: argument 'scale' must be a float or None, got {type(scale).__name__}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"{_OP}: argument 'dropout_p' must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{_OP}: argument 'dropout_p' must be in [0, 1], got {dropout_p}")
    squeeze = q.dim() == 3
    if squeeze:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    B, Hq, Sq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"{_OP}: batch sizes differ: query {B}, key {k.shape[0]}, value {v.shape[0]}")
    if k.shape[-1] != D:
        raise ValueError(f"{_OP}: 'key' head dim {k.shape[-1]} != 'query' head dim {D}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"{_OP}: 'key' {tuple(key.shape)} and 'value' {tuple(value.shape)} must have the same heads "
                         "and length")
    Hkv, Sk = k.shape[1], k.shape[2]
    if Hkv != Hq:
        if not enable_gqa:
            raise ValueError(f"{_OP}: 'query' has {Hq} heads but 'key'/'value' {Hkv}; pass enable_gqa=True for "
                             "grouped-query attention")
        if Hkv == 0 or Hq % Hkv:
            raise ValueError(f"{_OP}: 'key'/'value' heads ({Hkv}) must divide 'query' heads ({Hq}) for grouped-query "
                             "attention")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"{_OP}: head dim {D} of 'query' is not supported (at most {MAX_HEAD_DIM})")
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)

    def fallback():
        out = attention_reference(q, k, v, attn_mask, is_causal, scale, enable_gqa, dropout_p, window, softcap)
        return out.squeeze(1) if squeeze else out

    if q.dtype == torch.float64 or use_fallback(_OP, q, k, v) or dropout_p == 1.0:  # p = 1: SDPA gives zeros
        return fallback()
    if v.shape[-1] != D:
        warn_once(f"{_OP}:dv", f"{_OP}: value head dim {v.shape[-1]} != query head dim {D} is not fused; using SDPA.")
        return fallback()
    kb = None
    if attn_mask is not None:
        kb = key_bias_from_mask(attn_mask, B, Hq, Sq, Sk)
        if kb is None:
            warn_once(
                f"{_OP}:mask",
                f"{_OP}: an attn_mask that varies along the query dim (shape {tuple(attn_mask.shape)}) cannot be "
                "fused (only key-padding masks shaped (B|1, H|1, 1, Sk) are); using SDPA.",
            )
            return fallback()
    if win >= Sq:  # every row's window reaches key 0: no key is cut, and the windowless kernels (Gluon) take it
        win = 0
    dp = float(dropout_p)
    seed = draw_dropout_seed(q.device) if dp > 0.0 else None
    out = _run(q, k, v, kb, None, None, Sq, Sk, bool(is_causal), sc, dp, seed, win, cap)
    return out.squeeze(1) if squeeze else out


def fused_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    window: int | None = None,
    softcap: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention over packed variable-length sequences (the layout of ``flash_attn_varlen_func``).

    q (total_q, Hq, D), k and v (total_k, Hkv, D) with Hkv dividing Hq (grouped-query when smaller);
    sequence b is rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q against rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of k and v (int32 or int64, B + 1 non-decreasing offsets
    starting at 0); ``max_seqlen_q`` / ``max_seqlen_k`` bound the lengths (they size the launch grid).
    Causal alignment is top-left per sequence; ``window``, ``softcap`` and ``dropout_p`` as in
    ``fused_attention``, per sequence (sequence b's dropout mask is the one a dense batch draws for its batch
    row b). Returns (total_q, Hq, D). Under ``torch.autocast`` q, k and v run in the autocast dtype, as in
    ``fused_attention``.
    """
    op = "fused_attention_varlen"
    if isinstance(q, torch.Tensor) and (adt := autocast_dtype(q)) is not None:  # as fused_attention (SDPA)
        q, k, v = autocast_cast(adt, q, k, v)
    _check_qkv(q, k, v, ("q", "k", "v"))
    win, cap = _check_window_softcap(op, window, softcap)
    for n, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(op, n, t)
        check_same_device(op, "q", q, **{n: t})
        if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64) or t.numel() < 1:
            raise ValueError(f"{op}: argument '{n}' must be a 1-D int32/int64 tensor of B + 1 offsets, got {t.dtype} "
                             f"{tuple(t.shape)}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"{op}: 'cu_seqlens_q' and 'cu_seqlens_k' must have the same length (B + 1)")
    if not (q.dim() == k.dim() == v.dim() == 3):
        raise ValueError(f"{op}: 'q', 'k', 'v' must be 3-D (total, H, D), got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D")
    Hq, D = q.shape[1], q.shape[2]
    Hkv = k.shape[1]
    if k.shape[2] != D or v.shape[2] != D:
        raise ValueError(f"{op}: 'k' / 'v' head dims ({k.shape[2]}, {v.shape[2]}) must equal 'q''s ({D})")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"{op}: 'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} must have the same (total, H)")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"{op}: 'k'/'v' heads ({Hkv}) must divide 'q' heads ({Hq})")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"{op}: head dim {D} is not supported (at most {MAX_HEAD_DIM})")
    for n, val in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 0:
            if not isinstance(val, torch.SymInt):
                raise TypeError(f"{op}: argument '{n}' must be a non-negative int, got {val!r}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"{op}: argument 'dropout_p' must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: argument 'dropout_p' must be in [0, 1), got {dropout_p}")
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if q.dtype == torch.float64 or use_fallback(op, q, k, v):
        if dropout_p > 0.0:
            raise NotImplementedError(f"{op}: dropout_p > 0 needs the Triton kernels (float16 / bfloat16 / float32 "
                                      "on a device Triton runs on)")
        return attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, sc, window, softcap)
    cu_q = cu_seqlens_q.to(torch.int32)
    cu_k = cu_seqlens_k.to(torch.int32)
    if isinstance(max_seqlen_q, int) and win >= max_seqlen_q:  # no sequence is longer than its window
        win = 0
    dp = float(dropout_p)
    seed = draw_dropout_seed(q.device) if dp > 0.0 else None
    return _run(q, k, v, None, cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k), bool(is_causal), sc, dp, seed,
                win, cap)
