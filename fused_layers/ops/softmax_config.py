"""Launch configurations of the softmax kernels (fused_layers/ops/softmax.py): data, not code paths.

Tables are keyed by direction ("fwd" / "bwd"), element size in bytes (2: bf16 / fp16, 4: fp32) and width bucket
(the next power of two of the row width N), so the number of compiled kernels is bounded by the buckets, never by
the shapes a run produces.  Numbers are fractions of the copy bandwidth (one read + one write) on an H200, 2^26
elements (`python -m benchmarks ops`, and sweeps of these entries); each default names the number that decided it.

``config_override("softmax", ...)`` is the tests' hook to shrink thresholds and tiles so that the interpreter runs
the default kernels at small sizes: ``max_single_block``, ``eager_max_single_block``, ``wide_block``,
``wide_piece``, ``persist_block`` and ``hold_min_n``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SingleBlock:
    """The whole row in registers: BLOCK_M rows a program."""

    block_m: int
    num_warps: int


@dataclass(frozen=True)
class Packed:
    """The single-block forward holding the row in its 16-bit dtype, under ptxas's register cap."""

    num_warps: int
    maxnreg: int


@dataclass(frozen=True)
class PieceWise:
    """One launch, rows cut into pieces of ``piece`` columns streamed in chunks of ``block_n``, each piece read
    twice (the second time from L2)."""

    block_n: int
    piece: int
    num_warps: int


@dataclass(frozen=True)
class Persistent:
    """Co-resident programs each holding one piece of ``block_n`` columns of a row (one read).  ``stages`` 1: the
    register form (rows k - 1, k, k + 1 in registers); > 1: the SMEM-pipelined form (one row in registers, the next
    rows' loads in flight by cp.async)."""

    block_n: int
    num_warps: int
    per_sm: int  # most programs an SM (the compiled binary's occupancy may bind first)
    stages: int


# ---- single block ----------------------------------------------------------------------------------------------------
# Winners of the width sweep, by element size and width bucket; narrower rows than 256 keep 2048 elements a program
# (BLOCK_M = 2048 // N) with the 256 entry's warps.
SINGLE_BLOCK = {
    2: {256: SingleBlock(8, 4), 512: SingleBlock(4, 4), 1024: SingleBlock(2, 4), 2048: SingleBlock(2, 4),
        4096: SingleBlock(2, 4), 8192: SingleBlock(1, 8), 16384: SingleBlock(1, 16), 32768: SingleBlock(1, 16)},
    4: {256: SingleBlock(8, 8), 512: SingleBlock(4, 8), 1024: SingleBlock(2, 8), 2048: SingleBlock(1, 8),
        4096: SingleBlock(1, 16), 8192: SingleBlock(1, 16), 16384: SingleBlock(1, 16), 32768: SingleBlock(1, 16)},
}
# The backward, in place of SINGLE_BLOCK's entry: fp32 32K with 8 warps, 0.95 against 0.92 with 16 (y and dy held).
SINGLE_BLOCK_BWD = {(4, 32768): SingleBlock(1, 8)}
# The widest row a single block takes; wider rows go persistent (eager) or piece-wise (traced).
MAX_SINGLE_BLOCK = 32768
# Eager calls, whose wide rows go persistent, by (direction, element size): a lower limit where that wins.  bf16
# forward at 32K: the persistent SMEM form 0.80 against the single block's 0.72 (backward: 0.91 against 0.78-0.92,
# kept).
EAGER_MAX_SINGLE_BLOCK = {("fwd", 2): 16384}
# Eager bf16 forwards of the 16K bucket: the row packed in bf16, 16 warps capped at 40 registers (three programs an
# SM): 0.911 against the plain single block's 0.866-0.874.  fp16 measured 0.80 against 0.87: bf16 only.
PACKED = {16384: Packed(16, 40)}

# ---- wide rows, traced calls: piece-wise, one launch ------------------------------------------------------------
# By (direction, element size), the sweep's winners; at 65,536 / 262,144 columns fwd bf16 0.73 / 0.70, fp32
# 0.78 / 0.76, bwd bf16 0.75 / 0.73, fp32 0.75 / 0.77 (chunk loops unpipelined: 3-4 stages with 2K-4K chunks did not
# beat them).  Eager 16-bit forward rows that are misaligned with no shared VEC8 window (ops/_rows.py) take them too:
# 0.443 against the plain persistent form's 0.366 at 50,257 (its loads are 2 bytes wide there).
PIECEWISE = {
    ("fwd", 2): PieceWise(8192, 16384, 8),
    ("fwd", 4): PieceWise(8192, 8192, 8),
    ("bwd", 2): PieceWise(4096, 8192, 16),
    ("bwd", 4): PieceWise(4096, 4096, 16),
}

# ---- wide rows, eager calls: persistent ------------------------------------------------------------------------------
# By (direction, element size), fraction of copy at 32K / 64K / 128K / 256K columns:
#   bf16 fwd  SMEM 4K x 4 warps x 3 stages 0.80 / 0.80 / 0.79 / 0.69 against piece-wise 0.72 / 0.67 / 0.67 / 0.66
#   bf16 bwd  SMEM 4K x 4 x 3              0.91 / 0.72 / 0.76 / 0.75 against piece-wise 0.78 / 0.71 / 0.65 / 0.71
#   fp32 fwd  register 2K x 4              0.92 / 0.89 / 0.78 / 0.84 against SMEM 4K x 4 x 3's 0.87 / 0.88 / 0.84 / 0.80
#   fp32 bwd  register 4K x 4, 8 an SM     0.96 / 0.97 / 0.98 / 0.95 against SMEM's 0.87-0.95
# Misaligned 16-bit rows sharing a window take the VEC8 form of the same entry: fwd 0.711 against piece-wise 0.439,
# bwd 0.867 against the plain persistent form's 0.440 (bf16, 50,257 columns).
PERSIST = {
    ("fwd", 2): Persistent(4096, 4, 16, 3),
    ("fwd", 4): Persistent(2048, 4, 16, 1),
    ("bwd", 2): Persistent(4096, 4, 16, 3),
    ("bwd", 4): Persistent(4096, 4, 8, 1),
}
# In place of PERSIST's entry for one width bucket, (direction, element size, bucket):
#   fp32 fwd 128K: SMEM 4K x 4 x 3, 0.867 against the register form's 0.794 (a tie at 64K, a loss at 256K);
#   bf16 fwd 32K: 2K x 2 warps, up to 32 an SM, 0.819 against 4K x 4's 0.807-0.811 (a tie at 64K, a loss above).
PERSIST_BY_WIDTH = {
    ("fwd", 4, 131072): Persistent(4096, 4, 16, 3),
    ("fwd", 2, 32768): Persistent(2048, 2, 32, 3),
}
# HOLD (the SMEM form writing row k - 1 after publishing row k, from registers) from this width on, by (direction,
# element size): bf16 bwd 0.893 against 0.845 at 128K, 0.867 against 0.744 at 256K (0.889 against 0.905 at 32K).
# The forward lost at every width (0.57-0.68 against 0.69-0.80).
HOLD_MIN_N = {("bwd", 2): 65537}


def single_block(direction: str, elem: int, n_pow2: int) -> SingleBlock:
    """The single-block config of rows of width bucket ``n_pow2`` (narrow rows: 2048 elements a program)."""
    cfg = SINGLE_BLOCK[elem][max(n_pow2, 256)]
    if direction == "bwd":
        cfg = SINGLE_BLOCK_BWD.get((elem, n_pow2), cfg)
    if n_pow2 < 256:
        cfg = SingleBlock(2048 // n_pow2, cfg.num_warps)
    return cfg


def persistent(direction: str, elem: int, n_pow2: int) -> Persistent:
    """The persistent config of rows of width bucket ``n_pow2``."""
    return PERSIST_BY_WIDTH.get((direction, elem, n_pow2), PERSIST[(direction, elem)])
