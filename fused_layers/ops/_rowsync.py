r"""Wide rows held on chip by several co-resident programs: the machinery the wide softmax, the cross-entropy
and the wide norm backward share.

Why.  A row-wise softmax needs a statistic of the whole row (its max and sum of exponentials, or the
dot sum(y * dy) of the backward) before it can write any element.  One program streaming a row that does
not fit its registers must read it twice (statistics, then output): two reads and a write, at most 2/3 of
the copy bandwidth when the second read misses L2.  Here a row of C columns is cut into SPLITS pieces of
at most BLOCK_N columns and every piece is held, in registers, by a program of its own:

1. each program loads its piece (once), reduces it to a pair of float32 partials (a, b), and *publishes*
   the pair into the row's slot array;
2. it waits until every piece of the row has published, combines the SPLITS pairs (every program of the
   row computes the same combination from the same values), and writes its piece of the output from the
   registers: one read and one write at any width.

Persistent, co-resident programs.  A program waiting for its row's other pieces must never keep them
from running, so the grid is at most what the GPU holds at once (``persistent_groups``: the occupancy of
the compiled kernel from the driver, times the SMs) and the launch is *cooperative*
(``launch_cooperative_grid``): the driver then guarantees co-residency, or fails the launch with an
error instead of hanging.  Program g works on piece ``g % SPLITS`` of the rows ``g // SPLITS``,
``g // SPLITS + GROUPS``, ...: the SPLITS programs of a group meet once per row.  A load is always in
flight while a program waits (below).

Slots.  A pair is published as one 64-bit word, ``(bits(a) << 32) | bits(b)``, written by one atomic
exchange: the value is its own flag, so no fence orders it against anything else (relaxed atomics and
volatile polling).  Slots are zeroed before the launch, and a published word is never 0: callers
guarantee it (the softmax pair (max, sum exp) has sum >= 1 whenever max is finite, and max = -inf has
nonzero bits; single values use ``pack_flagged``).

Register form.  Iteration k of a program publishes row k's word, issues the load of row k + 1's piece,
then waits for row k - 1 -- which every sibling published an iteration ago, so the wait rarely spins --
and writes row k - 1's output from the registers: three pieces in registers (rows k - 1, k, k + 1), in the
input's dtype.  The first row is peeled off the loop, and the loop runs one iteration past the last row
(for its output); the loops carry no data-dependent branch.

SMEM-pipelined form (``STAGES`` > 1 in the kernels): one row in registers; the wait is a function call
(``wait_row_max_sum_call`` / ``wait_row_sum_call``, not inlined), so the row loop has no nested loop and
Triton's pipeliner issues the next rows' piece loads by cp.async into shared memory while the program
waits.  The called waits poll 32 words at a time (``WAIT_CHUNK``) and use no shared memory: with a 64-word
poll their block reduction did, and the pipelined loops computed wrong rows on the H200.

The Triton interpreter runs programs one after another, so no program may wait there: kernels take a
``PHASE`` constexpr, 2 on the GPU (publish, wait, write in one launch) and 0 then 1 under the
interpreter (two launches: every piece publishes; then every piece finds its row complete and writes).
"""

from __future__ import annotations

import ctypes
import functools
import inspect

import torch
import triton
import triton.language as tl

from ._common import INTERPRET


@triton.jit
def pack_pair(a, b):
    """Two float32 scalars as one int64 word: bits(a) high, bits(b) low."""
    ua = a.to(tl.uint32, bitcast=True).to(tl.uint64)
    ub = b.to(tl.uint32, bitcast=True).to(tl.uint64)
    return ((ua << 32) | ub).to(tl.int64, bitcast=True)


@triton.jit
def pack_flagged(a):
    """One float32 scalar as a never-zero int64 word (bit 32 set)."""
    ua = a.to(tl.uint32, bitcast=True).to(tl.uint64)
    return ((1 << 32) | ua).to(tl.int64, bitcast=True)


@triton.jit
def pack_sums(a, b):
    """Two float32 partial sums as one never-zero int64 word: bits(a) high, bits(b) low, a zero b published as
    -0.0 (bit 31 set: it sums as +0.0 does), so the word is its own flag (the wide norm backward: one publish and
    one polled word a piece instead of two ``pack_flagged`` words)."""
    ua = a.to(tl.uint32, bitcast=True).to(tl.uint64)
    ub = b.to(tl.uint32, bitcast=True).to(tl.uint64) | ((b == 0.0).to(tl.uint64) << 31)
    return ((ua << 32) | ub).to(tl.int64, bitcast=True)


@triton.jit
def unpack_pair(v):
    """The float32 pair of words v (any shape): (high, low)."""
    u = v.to(tl.uint64, bitcast=True)
    a = (u >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    b = (u & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    return a, b


@triton.jit
def publish(SLOT, word, live):
    """Publish this piece's word at SLOT (a scalar int64 pointer) when ``live``: one relaxed atomic exchange
    (the word is its own flag, so nothing else needs ordering)."""
    tl.atomic_xchg(SLOT, word, mask=live, sem="relaxed")


@triton.jit
def publish_max_sum(x, SLOT, live):
    """Publish the (max, sum of exp(x - max)) of a piece x (float32, -inf where masked) at SLOT when live."""
    m_p = tl.max(x, axis=0)
    m_ps = tl.where(m_p == -float("inf"), 0.0, m_p)  # an all -inf piece: sum 0, not NaN
    s_p = tl.sum(tl.exp2((x - m_ps) * 1.4426950408889634), axis=0)
    publish(SLOT, pack_pair(m_p, s_p), live)


@triton.jit
def exp_scaled(x, ref, scale):
    """The output step over a piece: exp(x - ref) * scale, from the raw piece x (any float dtype)."""
    return tl.exp2((x.to(tl.float32) - ref) * 1.4426950408889634) * scale


@triton.jit
def wait_row(ROW_SLOTS, SPLITS, SPLITS_P2: tl.constexpr):
    """Wait until the SPLITS slots at ROW_SLOTS are all published; returns (words [SPLITS_P2], valid lanes).

    Volatile loads (not cached in L1: each poll sees the L2's current words).  Lanes past SPLITS read as 1
    (published) and must be masked by the caller with the identity of its combination.
    """
    p = tl.arange(0, SPLITS_P2)
    pm = p < SPLITS
    v = tl.load(ROW_SLOTS + p, mask=pm, other=1, volatile=True)
    while tl.min(tl.where(v != 0, 1, 0), axis=0) == 0:
        v = tl.load(ROW_SLOTS + p, mask=pm, other=1, volatile=True)
    return v, pm


@triton.jit
def program_piece(SPLITS, PIECE, N, BLOCK_N: tl.constexpr):
    """This program's piece of its rows: (piece index, row group, first column, column mask [BLOCK_N],
    columns [BLOCK_N] as int64).  Program g holds piece g % SPLITS of rows g // SPLITS, + GROUPS, ..."""
    g = tl.program_id(0)
    piece = g % SPLITS
    start = piece * PIECE
    c = start + tl.arange(0, BLOCK_N)
    return piece, g // SPLITS, start, c < tl.minimum(start + PIECE, N), c.to(tl.int64)


@triton.jit
def piece_ptrs(BASE, r, INNER, so, si, sc, c64):
    """Pointers to the columns ``c64`` (int64) of row ``r``, a row being an (outer, inner) pair
    (r // INNER, r % INNER) with strides (so, si) and column stride sc."""
    return BASE + (r // INNER) * so + (r % INNER) * si + c64 * sc


@triton.jit
def load_piece(BASE, r, M, INNER, so, si, sc, c64, cm, other):
    """The piece (columns ``c64`` where ``cm``) of row ``r``; ``other`` where masked and for rows past M (the
    identity of the reduction that follows)."""
    return tl.load(piece_ptrs(BASE, r, INNER, so, si, sc, c64), mask=cm & (c64 * 0 + r < M), other=other)


# --------------------------------------------------------------------------------------------------
# VEC8 pieces: 16-bit rows at any alignment, read and written as whole 16-byte vectors
# --------------------------------------------------------------------------------------------------
# Triton vectorizes a load (and the pipeliner's cp.async) only where it can prove 16-byte alignment: a row whose
# first element sits at an offset that is not a multiple of 8 elements (a width or row stride not a multiple of 8:
# 50,257, 30,522, 32,001) gets 2-byte accesses (LDG.E.U16 / STG.E.U16 in the SASS), at half the rate of
# aligned rows or less.  A VEC8 piece is laid out on the row's *window*: window position w is element woff + w of the
# buffer, woff = off - d the row's offset rounded down to a multiple of WIN elements (d = off % WIN; WIN = 64, a
# 128-byte line, or 8, a 16-byte vector; ``tl.multiple_of`` lets Triton see it), so every 8 positions are one 16-byte
# vector and column c of the row is position c + d.  A piece covers the positions [start, start + PIECE) and keeps
# the whole vectors that lie inside the row, [ceil8(d), floor8(d + N)) (``vec_row``: the mask is constant over each
# vector, so the access stays 16 bytes wide: LDGSTS.E.BYPASS.128 / STG.E.128 as at aligned widths); the at most 7
# columns before the first whole vector (the head) and 7 after the last (the tail) are a separate 16-lane tensor
# (``edge_cols``) which the row's first piece reads (a row ahead: 2-byte loads cannot be cp.async) and writes.  The
# pieces of a row cover its N + WIN - 1 positions.  Other tensors read or written through the same window positions
# need the same d: their row offsets congruent to the first's modulo WIN (the host checks; ``vec_woff``).
@triton.jit
def vec_row(off, N, start, in_piece, BLOCK_N: tl.constexpr, WIN: tl.constexpr = 8):
    """A VEC8 piece of the row whose first element is at element offset ``off`` (int64, unit column stride) of its
    buffer, on a window aligned to WIN elements (8: 16 bytes; 64: 128 bytes, whole cache lines): (d, woff, body):
    d = off % WIN (column c is window position c + d); woff = off - d, the window's offset, which Triton knows to be
    a multiple of WIN (its pointers, ``BASE + woff + w`` with w the piece's positions, are aligned vectors); body the
    mask of the whole 16-byte vectors of the row among the piece's positions, compared in 32 bits against the
    piece's own columns j (``in_piece``: j < PIECE, computed once)."""
    d = off & (WIN - 1)
    woff = tl.multiple_of(off - d, WIN)
    j = tl.arange(0, BLOCK_N)
    lo = (((d + 7) >> 3 << 3) - start).to(tl.int32)  # the first whole vector (a multiple of 8, as start is: the mask
    hi = (((d + N) >> 3 << 3) - start).to(tl.int32)  # is constant over each vector); past the last one
    return d, woff, (j >= lo) & (j < hi) & in_piece


@triton.jit
def vec_woff(off, d, WIN: tl.constexpr = 8):
    """The window offset, a multiple of WIN that Triton sees, of a row at element offset ``off`` that shares the
    window phase d of ``vec_row``'s row (an output, or a second input, whose row offsets are congruent to the first's
    modulo WIN: the host checks)."""
    return tl.multiple_of(off - d, WIN)


@triton.jit
def edge_cols(d, N, piece):
    """The columns of a VEC8 row outside its whole vectors, as 16 lanes: lanes 0-7 the head (columns below
    ceil8(d) - d), lanes 8-15 the tail (columns from floor8(d + N) - d up to N - 1); (columns int32 [16], mask),
    masked off unless ``piece`` is 0 (the row's first piece reads and writes them)."""
    j = tl.arange(0, 16)
    head = ((d + 7) >> 3 << 3) - d
    tail = tl.maximum(((d + N) >> 3 << 3) - d, head)  # (a row inside one vector: its columns are all head)
    c = tl.where(j < 8, j, (tail - 8).to(tl.int32) + j)
    m = ((j >= 8) | (j < head)) & (c < N)
    return c, m & (j * 0 + piece == 0)  # (a vector mask: the interpreter takes no vector & scalar)


@triton.jit
def vec_load(BASE, r, INNER, so, si, N, start, in_piece, c64, other, BLOCK_N: tl.constexpr, WIN: tl.constexpr):
    """Row r's VEC8 piece (``vec_row``) of BASE (strides so, si; unit column stride) at the window positions c64:
    (row offset, d, body mask, the piece with ``other`` where masked)."""
    off = (r // INNER) * so + (r % INNER) * si  # the row's first element
    d, woff, body = vec_row(off, N, start, in_piece, BLOCK_N, WIN)
    return off, d, body, tl.load(BASE + woff + c64, mask=body, other=other)  # whole 16-byte vectors


@triton.jit
def edge_load(BASE, r, M, INNER, so, si, N, piece, other, WIN: tl.constexpr):
    """Row r's edge lanes (``edge_cols``) of BASE, ``other`` where masked and for r >= M: (columns, mask, values in
    BASE's dtype).  The kernels load them a row ahead (2-byte loads cannot be cp.async)."""
    off = (r // INNER) * so + (r % INNER) * si
    ec, em = edge_cols(off & (WIN - 1), N, piece)
    em = em & (ec * 0 + r < M)  # (a vector mask: the interpreter takes no vector & scalar)
    return ec, em, tl.load(BASE + off + ec, mask=em, other=other)


@triton.jit
def vec_step(X, r, GROUPS, M, INNER, so, si, N, start, piece, in_piece, c64, ec_n, em_n, xe_n, other,
             BLOCK_N: tl.constexpr, WIN: tl.constexpr):
    """One row of a VEC8 forward loop over X: row r's piece (``vec_load``), its edge lanes (ec_n, em_n, xe_n, loaded
    an iteration ago) and the next row's (r + GROUPS), loaded now: (off, d, body, x, ec, em, xe float32, the next
    row's ec, em, xe)."""
    off, d, body, x = vec_load(X, r, INNER, so, si, N, start, in_piece, c64, other, BLOCK_N, WIN)
    ec_next, em_next, xe_next = edge_load(X, r + GROUPS, M, INNER, so, si, N, piece, other, WIN)
    return off, d, body, x, ec_n, em_n, xe_n.to(tl.float32), ec_next, em_next, xe_next


@triton.jit
def max_sum2(x, xe):
    """(max, sum of exp(v - max)) over a piece x and its edge lanes xe (float32, -inf where masked)."""
    m_p = tl.maximum(tl.max(x, axis=0), tl.max(xe, axis=0))
    m_ps = tl.where(m_p == -float("inf"), 0.0, m_p)  # an all -inf piece: sum 0, not NaN
    s_p = tl.sum(tl.exp2((x - m_ps) * 1.4426950408889634), axis=0) + \
        tl.sum(tl.exp2((xe - m_ps) * 1.4426950408889634), axis=0)
    return m_p, s_p


@triton.jit
def wait_row_max_sum(ROW_SLOTS, SPLITS, SPLITS_P2: tl.constexpr):
    """Wait for a row's (max, sum of exp(x - max)) words (``pack_pair``) and combine them: the row's
    m = max_p m_p and s = sum_p s_p exp(m_p - m) (an all -inf row: m = -inf, s = 0)."""
    words, pm = wait_row(ROW_SLOTS, SPLITS, SPLITS_P2)
    m_all, s_all = unpack_pair(words)
    m_all = tl.where(pm, m_all, -float("inf"))  # the identity of max
    s_all = tl.where(pm, s_all, 0.0)  # the identity of the sum
    m = tl.max(m_all, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)  # while only -inf was seen, subtract 0 (never -inf - -inf)
    s = tl.sum(s_all * tl.exp2((m_all - m_safe) * 1.4426950408889634), axis=0)
    return m, s


# The called waits poll 32 words at a time (WAIT_CHUNK): a tensor of 32 lanes is reduced within a warp, so the
# called function uses no shared memory.  With 64+ lanes its block reduction does, and the SMEM-pipelined row loops
# computed wrong rows on the H200 (3+ stages, 64+ lanes).
WAIT_CHUNK = tl.constexpr(32)


@triton.jit(noinline=True)
def wait_row_max_sum_call(ROW_SLOTS, SPLITS):
    """``wait_row_max_sum`` as a function call (not inlined): a row loop holding it has no nested loop, so
    Triton's software pipeliner takes it and issues the next rows' piece loads ahead by cp.async into shared
    memory while the program waits (with the wait inlined the pipeliner leaves the loop alone; sm_90 SASS:
    LDGSTS only with the call).  The words are waited for and combined WAIT_CHUNK at a time (see above):
    m' = max(m, m_c), s' = s exp(m - m') + s_c exp(m_c - m') (m' = -inf: subtract 0, never -inf - -inf)."""
    m = -float("inf")
    s = 0.0
    for c0 in range(0, SPLITS, WAIT_CHUNK):
        m_c, s_c = wait_row_max_sum(ROW_SLOTS + c0, tl.minimum(SPLITS - c0, WAIT_CHUNK), WAIT_CHUNK)
        m_new = tl.maximum(m, m_c)
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp2((m - m_safe) * 1.4426950408889634) + s_c * tl.exp2((m_c - m_safe) * 1.4426950408889634)
        m = m_new
    return m, s


@triton.jit(noinline=True)
def wait_row_sum_call(ROW_SLOTS, SPLITS):
    """The sum of a row's ``pack_flagged`` words once all are published (a function call, as
    ``wait_row_max_sum_call``; WAIT_CHUNK words at a time)."""
    total = 0.0
    for c0 in range(0, SPLITS, WAIT_CHUNK):
        words, pm = wait_row(ROW_SLOTS + c0, tl.minimum(SPLITS - c0, WAIT_CHUNK), WAIT_CHUNK)
        _flag, vals = unpack_pair(words)
        total += tl.sum(tl.where(pm, vals, 0.0), axis=0)
    return total


@triton.jit(noinline=True)
def wait_row_two_sums_call(ROW_SLOTS, SPLITS):
    """Two sums of a row once all its pieces have published two ``pack_flagged`` words each (piece p at
    ROW_SLOTS + 2p, the first sum's partial, and + 2p + 1, the second's): a function call, as
    ``wait_row_max_sum_call``, WAIT_CHUNK words (an even number: whole pieces) at a time.  The wide-row
    norm backward's (sum g * xhat, sum g)."""
    s1 = 0.0
    s2 = 0.0
    words_total = 2 * SPLITS
    odd = (tl.arange(0, WAIT_CHUNK) % 2) == 1
    for c0 in range(0, words_total, WAIT_CHUNK):
        words, pm = wait_row(ROW_SLOTS + c0, tl.minimum(words_total - c0, WAIT_CHUNK), WAIT_CHUNK)
        _flag, vals = unpack_pair(words)
        s1 += tl.sum(tl.where(pm & ~odd, vals, 0.0), axis=0)
        s2 += tl.sum(tl.where(pm & odd, vals, 0.0), axis=0)
    return s1, s2


@triton.jit(noinline=True)
def wait_row_pair_sums_call(ROW_SLOTS, SPLITS):
    """Two sums of a row once all its pieces have published one ``pack_sums`` word each (piece p at ROW_SLOTS + p):
    a function call, as ``wait_row_max_sum_call``, WAIT_CHUNK words at a time, in a fixed order."""
    s1 = 0.0
    s2 = 0.0
    for c0 in range(0, SPLITS, WAIT_CHUNK):
        words, pm = wait_row(ROW_SLOTS + c0, tl.minimum(SPLITS - c0, WAIT_CHUNK), WAIT_CHUNK)
        a, b = unpack_pair(words)
        s1 += tl.sum(tl.where(pm, a, 0.0), axis=0)
        s2 += tl.sum(tl.where(pm, b, 0.0), axis=0)
    return s1, s2


# --------------------------------------------------------------------------------------------------
# Host side: how many programs the GPU holds at once
# --------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:  # pragma: no cover - no driver
        return None


def _driver_occupancy(function: int, threads: int, shared: int) -> int | None:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor for a loaded CUfunction, or None."""
    lib = _libcuda()
    if lib is None or not function:
        return None
    n = ctypes.c_int(0)
    try:
        err = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(function),
                                                              ctypes.c_int(threads), ctypes.c_size_t(shared))
    except Exception:  # pragma: no cover
        return None
    return int(n.value) if err == 0 else None


def _estimated_occupancy(n_regs: int, warps: int, shared: int, device: torch.device) -> int:
    """Programs per SM from registers, threads and shared memory (the driver's rule, for when it cannot be
    asked): registers are allocated per warp in units of 256."""
    props = torch.cuda.get_device_properties(device)
    regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
    by_regs = (getattr(props, "regs_per_multiprocessor", 65536) // regs_per_warp) // warps
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (warps * 32)
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    by_smem = smem // (shared + 1024) if shared else 32
    return max(0, min(by_regs, by_threads, by_smem, 32))


def programs_per_sm(compiled, device: torch.device) -> int:
    """How many programs of Triton's ``compiled`` kernel one SM holds at once."""
    md = compiled.metadata
    warps, shared = md.num_warps, md.shared
    try:
        compiled._init_handles()  # loads the binary: ``function`` is its CUfunction
    except Exception:  # pragma: no cover
        pass
    n = _driver_occupancy(getattr(compiled, "function", 0) or 0, warps * 32, shared)
    if n is None:
        n = _estimated_occupancy(getattr(compiled, "n_regs", 255), warps, shared, device)
    return n


def persistent_groups(compiled, device: torch.device, splits: int, rows: int, per_sm_cap: int) -> int:
    """GROUPS for a persistent launch of ``compiled`` with SPLITS programs per row: as many row groups as
    the GPU holds at once (at most ``per_sm_cap`` programs per SM, at most one group per row); 0 when not
    even one group fits (the caller then takes another kernel)."""
    per_sm = min(programs_per_sm(compiled, device), per_sm_cap)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return min((sms * per_sm) // splits, rows)


def interpreter_groups(rows: int) -> int:
    """GROUPS under the interpreter (no co-residency there): a few, so the row loop runs more than once."""
    return max(1, min(rows, 3))


def bind_persistent(fn, args: tuple, splits: int, rows: int, per_sm: int, **meta):
    """The launches of a persistent row kernel ``fn`` (runtime arguments ``args``, then GROUPS; constexprs
    ``meta``; a ``PHASE`` constexpr), as ``(kernels, groups)``: call each kernel with ``(*args, groups)``.

    On the GPU: one cooperative launch of GROUPS x SPLITS programs, GROUPS from the occupancy of the
    binary compiled for these very arguments (``fn.warmup``: compiled, not launched; GROUPS must be in
    ``do_not_specialize``), at most ``per_sm`` programs per SM.  None when not even one group of SPLITS
    programs fits: the caller then takes another kernel.  Under the interpreter: two launches (PHASE 0
    publishes every piece, PHASE 1 combines and writes).
    """
    from ._library import Kernel  # (import cycle: _library imports nothing from here)

    meta = with_constexpr_defaults(fn, meta)
    if INTERPRET:
        groups = interpreter_groups(rows)
        return tuple(Kernel(fn, (groups * splits,), check=None, **meta, PHASE=ph) for ph in (0, 1)), groups
    meta = dict(meta, launch_cooperative_grid=True)
    compiled = fn.warmup(*args, 1, grid=(1,), **meta, PHASE=2)
    groups = persistent_groups(compiled, args[0].device, splits, rows, per_sm)
    if groups <= 0:
        return None
    return (Kernel(fn, (groups * splits,), check=None, **meta, PHASE=2),), groups


def with_constexpr_defaults(fn, meta: dict) -> dict:
    """``meta`` with every defaulted constexpr of ``fn`` that it leaves out named at its default, except PHASE (set
    per launch): a launch through ``Kernel`` binds its direct fast path only when every argument after the runtime
    ones is named (``Kernel._bind``; else each call pays Triton's own dispatch), and Inductor's ``wrap_triton``
    rejects a launch that leaves one to its default."""
    out = dict(meta)
    for name, prm in inspect.signature(getattr(fn, "fn", fn)).parameters.items():
        if (name not in out and name != "PHASE" and "constexpr" in str(prm.annotation)
                and prm.default is not inspect.Parameter.empty):
            out[name] = prm.default
    return out


def balanced_pieces(n: int, block: int) -> tuple[int, int]:
    """(SPLITS, PIECE): the fewest pieces of at most ``block`` columns covering ``n``, balanced, each
    starting on a multiple of 64 columns (aligned vector loads)."""
    splits = -(-n // block)
    align = min(64, block)
    piece = -(-(-(-n // splits)) // align) * align
    return splits, piece


__all__ = [
    "pack_pair", "pack_flagged", "pack_sums", "unpack_pair", "publish", "publish_max_sum", "exp_scaled", "wait_row",
    "wait_row_max_sum", "wait_row_max_sum_call", "wait_row_sum_call", "wait_row_two_sums_call",
    "wait_row_pair_sums_call", "program_piece", "piece_ptrs", "load_piece", "vec_row", "vec_woff", "vec_load",
    "vec_step", "edge_cols", "edge_load", "max_sum2", "persistent_groups", "interpreter_groups", "programs_per_sm",
    "bind_persistent", "with_constexpr_defaults", "balanced_pieces",
]
