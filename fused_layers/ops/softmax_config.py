"""Tuning table of the softmax kernels (fused_layers/ops/softmax.py): data, not code paths.

Measured on an H200 (benchmarks/bench_softmax.py --sweep; results in benchmarks/results/softmax_h200.json).
``config_override("softmax", ...)`` (tests, sweeps) takes precedence over every entry.
"""

from __future__ import annotations

import triton

from ._common import get_override

# One table: configs per width bucket (next power of two of N) and element size, tuned on an H200
# (benchmarks/results/softmax_h200.json, "sweep"). A bucket never re-tunes for a new row count, so the
# first call on a new bucket costs one Triton compile of that kernel (cached on disk by Triton for later
# processes) and nothing after that; the number of compiles is bounded by the buckets (width bucket x
# dtype size x direction), never by the shapes a run produces.
#
# Single block, (BLOCK_M rows per program, num_warps) by (element size, width bucket):
_SINGLE_BLOCK = {
    2: {256: (8, 4), 512: (4, 4), 1024: (2, 4), 2048: (2, 4), 4096: (2, 4), 8192: (1, 8), 16384: (1, 16), 32768: (1, 16)},
    4: {256: (8, 8), 512: (4, 8), 1024: (2, 8), 2048: (1, 8), 4096: (1, 16), 8192: (1, 16), 16384: (1, 16), 32768: (1, 16)},
}
# The backward holds y and dy: at fp32 32K, 8 warps beat 16 (0.95 vs 0.92 of copy in the first sweep,
# where 16 warps gave 0.87 in the table).
_SINGLE_BLOCK_BWD_WARPS = {(4, 32768): 8}
MAX_SINGLE_BLOCK = 32768  # wider rows take the wide (piece-wise, one launch) kernels
# (direction, element size) -> a lower single-block limit for eager calls, whose wide rows take the persistent
# kernels (WIDE_MODE 2): H200, 2026-12-02 session 10, bf16 forward at 32,768 columns: single block 0.72 of copy
# (issue10/run14_defaults/sm.log), the SMEM-pipelined persistent form 0.80 (issue10/run14_sweep/sm.log).  The bf16
# backward at 32K: single block 0.78-0.92, persistent 0.91 (two runs): kept.
PERSIST_MAX_SINGLE_BLOCK = {("fwd", 2): 16384}
# Wide rows: (BLOCK_N chunk, PIECE columns per piece, num_warps) by direction and element size; the
# winners of the H200 sweep (benchmarks/results/softmax_h200.json, "sweep"; fraction of copy at 65,536 /
# 262,144: fwd bf16 0.73 / 0.70, fp32 0.78 / 0.76; bwd bf16 0.75 / 0.73, fp32 0.75 / 0.77).
_WIDE = {("fwd", 2): (8192, 16384, 8), ("fwd", 4): (8192, 8192, 8), ("bwd", 2): (4096, 8192, 16), ("bwd", 4): (4096, 4096, 16)}
# Software pipelining of the wide kernels' chunk loops (tl.range num_stages; 1 = off, the measured
# default).  With STAGES > 1 Triton loads the next chunks of a piece by cp.async into shared memory while
# one is reduced (the change that won for the cross-entropy, cross_entropy_config.STREAM).  Pieces are 1-2
# chunks at the defaults, so it pairs with smaller chunks: config_override("softmax", stages=3, ...).
# H200 sweep, 2026-12-01 (benchmarks/results/issue10/run6_stages/softmax_sweep.log): the 3-4 stage
# candidates (2K-4K chunks) did not beat the unpipelined defaults at 65,536 or 262,144.
WIDE_STAGES = 1
# L2 hints of the piece-wise kernels (bits; their phase 2 re-reads a piece read moments ago): 1 = phase-1 loads
# evict_last, 2 = phase-2 loads evict_first, 4 = streaming (.cs) stores of the output.  0 = none.  H200, 2026-12-02
# (issue10/run13_l2_hints/sm.log): within 0.02 of none in the forward, the backward noisy either way; off.  (ncu: the
# piece-wise kernel already reads 1.10x the minimum from DRAM: its re-read hits L2.)
WIDE_EVICT = 0
# Wide rows, by (direction, element size): 0 = piece-wise, one launch (the _WIDE kernels: each piece read
# twice, the second time from L2); 2 = persistent (pieces held in registers by co-resident programs that
# exchange their statistics, one read: ops/_rowsync.py), eager calls only (traced calls take mode 0).
# (Mode 1, non-persistent "coop" kernels relying on dispatch order for co-residency, measured 0.57-0.64 bf16 /
# 0.79-0.87 fp32 forward in the same sweeps: removed.)  H200, 2^26 elements, fraction of copy at 65,536 / 131,072 / 262,144
# (benchmarks/results/issue10/run10_persist_lag/sm.log, bench_cross_entropy.py --softmax-only):
#   fp32 fwd  piece-wise 0.75 / 0.74 / 0.73   persistent 2K w4 **0.89 / 0.78 / 0.84**, 4K w4 0.84 / 0.86 / 0.80
#   fp32 bwd  piece-wise 0.72 / 0.73 / 0.74   persistent 4K w4 **0.97 / 0.98 / 0.95**
#   bf16 fwd  piece-wise 0.68 / 0.67 / 0.66   persistent best 0.71 / 0.69 / 0.67 (2K / 4K / 8K): within noise
#   bf16 bwd  piece-wise 0.72 / 0.71 / 0.70   persistent best 0.80 / 0.73 / 0.68: not consistent
# so fp32 wide rows are persistent; 16-bit ones were piece-wise until the SMEM-pipelined persistent form below won
# (session 10).  (The first, unpipelined persistent kernels, issue10/run10_persist/: bf16 fwd 0.74 / 0.77 / 0.62 at
# 4K w4, fp32 fwd 0.88 / 0.86 / 0.78.)
# Mode 3 (opt-in, config_override("softmax", wide_mode=3)): ops/softmax_gluon.py's TMA kernels for eager softmaxes
# over the last dim on an sm_90 GPU, else mode 2.  Session 15 (issue10/run22_b/): correct, and slower everywhere (bf16
# forward 0.19-0.37 of copy against 0.78-0.81, backward 0.21-0.39 against 0.90-0.93).
WIDE_MODE = {("fwd", 2): 2, ("bwd", 2): 2, ("fwd", 4): 2, ("bwd", 4): 2}
# 16-bit forward rows whose width or row stride is not a multiple of 16 elements (softmax.rows_misaligned: no 16-byte
# vectors, so the plain persistent form's loads are 2 bytes wide) and that cannot take VEC8 (below) take the piece-wise
# kernels (mode 0).  H200,
# session 23 (issue10/run30_m/sm_odd.txt), bf16 forward, 2^26 elements, do_bench / graph: 50,257 piece-wise 0.443 /
# 0.459 against the persistent form's 0.366 / 0.383 (its register form 0.364 / 0.374); 32,001 0.507 / 0.521 against
# 0.398 / 0.412; 100,277 0.470 / 0.487 against 0.356 / 0.371.  (Aligned rows: 0.78-0.81 persistent.)
MISALIGNED_PIECEWISE = True
# Such rows (forward and backward) whose inputs' row offsets are congruent to the contiguous output's modulo the window
# (below) take the persistent kernels' VEC8 form instead (session 24): pieces on the row's window, its whole 16-byte
# vectors read and written as vectors, the at most 7 + 7 unaligned head and tail columns a separate 16-lane tensor
# (ops/_rowsync.py).  H200, bf16, 2^26 elements, do_bench / graph, against session 23's routes (issue10/run31_f/):
# forward 0.711 / 0.740 against piece-wise 0.439 / 0.455 at 50,257; 0.745 / 0.780 against 0.503 / 0.517 at 32,001;
# 0.702 / 0.729 against 0.466 / 0.485 at 100,277; 0.557 / 0.580 against 0.495 / 0.513 at 262,143; backward (against
# the plain persistent form) 0.867 / 0.912 against 0.440 / 0.454 at 50,257, 0.841 / 0.880 against 0.450 / 0.463 at
# 100,277, 0.678 / 0.698 against 0.430 / 0.446 at 262,143.
MISALIGNED_VEC8 = True
# The VEC8 window's alignment in elements, the first of these that every row shares (64: 128-byte lines, 8: 16-byte
# vectors).  H200, session 24 (issue10/run31_b/), bf16, do_bench / graph, 64 against 8: CE fwd + bwd (8,192 rows) 0.622 /
# 0.639 against 0.615 / 0.630 at 50,257, 0.668 against 0.657 at 100,277; softmax forward (2^26 elements) 0.716 / 0.749
# against 0.686 / 0.712 at 50,257, 0.708 against 0.658 at 100,277; backward 0.871 / 0.914 against 0.819 / 0.853 at
# 50,257, 0.847 against 0.790 at 100,277.  (A warp's 512 bytes span 4 cache lines on a 128-byte window, else 5.)
MISALIGNED_WINDOW = (64, 8)
# Rows take VEC8 when their width or row stride is not a multiple of this many elements: 16 (no 16-byte vectors
# otherwise); 64 takes rows off 128-byte lines too, and lost there (issue10/run31_g, OPT's 50,272, bf16, graph replay:
# CE 0.638 against the plain persistent kernel's 0.708, softmax forward 0.739 against 0.805, backward 0.913 / 0.901).
MISALIGNED_GRAIN = 16
# Persistent kernels: (direction, element size) -> (BLOCK_N columns per piece, num_warps, most programs per SM).
# (16-bit: at most 16 per SM, as swept: the compiled binary's occupancy binds first.)
_PERSIST = {("fwd", 2): (4096, 4, 16), ("fwd", 4): (2048, 4, 16), ("bwd", 2): (4096, 4, 16), ("bwd", 4): (4096, 4, 8)}
# Persistent kernels' form, by (direction, element size): 1 = pieces held ahead in registers (three rows a program);
# > 1 = the SMEM-pipelined form, one row in registers and the loads of the next STAGES - 1 rows in flight by cp.async
# (the wait is a function call, so Triton pipelines the row loop).  Session 9's counters (issue10/run13_ncu): the
# register form keeps ~32 KB in flight per SM at bf16 (118 registers, 4 programs per SM: 55% of the DRAM peak).
# H200, 2026-12-02, 4K x 4 warps, 3 stages (issue10/run13_smem_first/sm.log), bf16 fwd / bwd: 0.79 / 0.90 at 32K,
# 0.78 / 0.90 at 64K, 0.79 / 0.83 at 128K (piece-wise 0.68-0.72 / 0.70-0.71).  That first form gave wrong rows at
# 64+ pieces a row (the called wait's shared memory; fixed: _rowsync.WAIT_CHUNK, right in every case of call 8,
# issue10/run13_wait_chunk/, whose timings were noisy).  Clean sweep, H200, 2026-12-02 session 10
# (issue10/run14_sweep/sm.log, gpu_session14_a.sh), fraction of copy at 32K / 64K / 128K / 256K columns:
#   bf16 fwd  piece-wise 0.72 / 0.67 / 0.67 / 0.66   SMEM 4K x 4 warps x 3 stages **0.80 / 0.80 / 0.79 / 0.69**
#   bf16 bwd  piece-wise 0.78 / 0.71 / 0.65 / 0.71   SMEM 4K x 4 warps x 3 stages **0.91 / 0.72 / 0.76 / 0.75**
#   (4 stages 0.77-0.80 fwd / 0.55-0.85 bwd; 2K x 4, 4K x 8, 8K x 8 warps lower)
#   fp32 fwd  register form 0.92 / 0.89 / 0.78 / 0.84   SMEM 4K x 4 x 3 0.87 / 0.88 / 0.84 / 0.80: kept
#   fp32 bwd  register form 0.96 / 0.97 / 0.98 / 0.95   SMEM 0.87-0.95: kept
_PERSIST_STAGES = {("fwd", 2): 3, ("bwd", 2): 3}
# By width bucket, (direction, element size, next power of two of N) -> (BLOCK_N, num_warps, most programs per SM,
# STAGES), in place of _PERSIST / _PERSIST_STAGES there.  Session 22 (issue10/run29_j/sweep_fp32.txt, H200, 2^26
# elements, do_bench / graph replay, two runs of the default), float32 forward, the SMEM form 4K x 4 warps x 3 stages
# against the register form (2K x 4):
#   64K   0.889 / 0.911 against 0.858-0.897 / 0.905-0.907 (a tie: kept)
#   128K  **0.867 / 0.903** against 0.794-0.795 / 0.808-0.810 (taken; 4 stages 0.850 / 0.861, 2K x 4 x 3 0.781 / 0.764,
#         8K x 8 x 3 0.832 / 0.856)
#   256K  0.817 / 0.841 against 0.846-0.848 / 0.861-0.863 (kept)
#   bf16 forward, CTA shape (session 25, issue10/run32_d, run32_e; 2^26 elements, do_bench / graph replay, the default
#   4K x 4 warps x 3 stages measured twice in each run):
#     32K   2K x 2 warps, up to 32 an SM **0.819 / 0.871 and 0.818 / 0.864** against 0.807-0.811 / 0.835-0.841 and
#           0.797-0.802 / 0.835-0.836 (taken); 1K x 1 warp 0.807 / 0.862; 8K x 8 0.797 / 0.839; 16K x 16 0.579 / 0.598
#     64K   2K x 2 0.809 / 0.857 and 0.804 / 0.849 against 0.810-0.811 / 0.855-0.856 and 0.802-0.804 / 0.846-0.848 (a tie)
#     128K / 256K  2K x 2 0.763 / 0.815 and 0.642 / 0.674 against 0.793-0.800 / 0.846-0.848 and 0.708 / 0.739-0.744
_PERSIST_BY_WIDTH = {("fwd", 4, 131072): (4096, 4, 16, 3), ("fwd", 2, 32768): (2048, 2, 32, 3)}
# Measured, not kept: fewer instructions in the bf16 forward's row loop (session 25, issue10/run32_a, run32_c, do_bench /
# graph replay at 32K / 64K / 128K / 256K, the default in the same run 0.80-0.81 / 0.84-0.85 ... 0.71 / 0.69-0.75):
#   the exponents as one FFMA with a uniform branch to the exact form past |m log2 e| = 2^7 (persist_fma; row loop 571 ->
#   508 on the fast path, 62 registers): 0.787 / 0.832, 0.791 / 0.831, 0.763 / 0.799, 0.677 / 0.704;
#   the same without the branch, the pieces publishing K = fl(m log2 e) (persist_kfma; 510, 56 registers): 0.812 / 0.828,
#   0.816 / 0.862, 0.801 / 0.856, 0.719 / 0.754 -- at most +1%, and an FFMA's exact product leaves 2^(m log2 e - K), up to
#   2^(ulp(K) / 2), in every term: NaN for logits near 1e30 on the GPU;
#   no masks where every piece is a whole tile (persist_even; 498, 64 registers): 0.802 / 0.847, 0.799 / 0.849, 0.775 /
#   0.820, 0.700 / 0.725; both (460, 55 registers): 0.811 / 0.823 ... 0.721 / 0.751.
# So the loop is not issue-bound (ncu, run32_b: 0.65 warps issued a cycle a scheduler, 0.66 warp instructions an element
# against the 16K single block's 0.63 and 0.60 at copy speed).
# HOLD (LAG's schedule, row k - 1's piece from registers: see _softmax_bwd_persist_kernel) in the SMEM form, by
# (direction, element size): the narrowest row it takes by default.  Session 13 sweep, H200, bf16, 4K x 4 warps x 3
# stages, fraction of copy, do_bench (graph replay), HOLD against the default in the same run
# (benchmarks/results/issue10/run19_c/softmax_hold.log):
#   bwd  32K 0.889 (0.887) against 0.905 (0.956)    64K 0.892 (0.912) against 0.905 (0.956)
#       128K **0.893 (0.930)** against 0.845 (0.881)  256K **0.867 (0.908)** against 0.744 (0.748)
#   fwd  lost at every width (0.57-0.68 against 0.69-0.80): not taken.
# config_override("softmax", persist_hold=0 / 1) turns it off / on at any width.
PERSIST_HOLD_MIN_N = {("bwd", 2): 65537}
# (Candidate, not a default: config_override("softmax", persist_lag=True) writes row k - 1 after publishing row k,
# from a second load of its piece (L2), so the wait leaves the critical path.  Timed in session 11: it lost, bf16
# forward 0.52-0.70 against 0.69-0.80, the backward op 0.82 against 0.91 at 64K: issue10/run15_a, run16_b.)


# PACKED single-block forward (_softmax_fwd_kernel PACKED: the row held in its 16-bit dtype, converted at each pass)
# with ptxas's register cap (Triton's maxnreg), by width bucket: (num_warps, maxnreg).  sm_90 with Triton 3.6: bf16
# 16K x 16 warps 63 registers (two programs an SM) -> packed and capped at 40, no spill: three.  Session 21 (H200,
# bf16, 2^26 elements, issue10/run28_d/sweep_softmax_packed.txt, fraction of copy, do_bench / graph replay):
#   16K  packed 16 warps cap 40 **0.911 / 0.953** against the default 0.866-0.874 / 0.923-0.926 (taken); cap 48 0.832 /
#        0.880, no cap 0.827 / 0.867, 8 warps cap 64 0.747 / 0.779
#   32K  packed 16 warps cap 64 (two programs an SM, 16 bytes of spill) 0.689 / 0.713, cap 72 / none 0.47-0.50, 32 warps
#        0.635-0.685 / 0.66-0.71, the plain single block 0.725 / 0.754, against the persistent default's 0.80 / 0.85
#   64K  packed 32 warps 0.531 / 0.544 against 0.807 / 0.854
#   fp16 16K (call 6, issue10/run28_f/sweep_fp16.txt): packed 0.798-0.803 / 0.836-0.838 against 0.870 / 0.914: bf16 only
#   (bf16 in the same run 0.903-0.904 / 0.952-0.954 against 0.873 / 0.916)
#   32K-128K, the persistent form with bigger pieces (run28_f/sweep_persist.txt): 16K x 16 warps 0.39-0.58, 8K x 8 warps
#   x 3 stages 0.78-0.80 / 0.82-0.84, 8K x 16 0.61-0.68, against the default's 0.79-0.81 / 0.84-0.85
# Eager forwards only (traced plans keep the plain kernel: Inductor emits its own launch); config_override("softmax",
# packed=0 / 1) turns it off / on (any 16-bit dtype) where the table has the width, packed_warps / packed_maxnreg its
# shape.
PACKED_SINGLE_BLOCK = {16384: (16, 40)}
PACKED_DTYPES = ("bfloat16",)


def _packed_config(n_pow2: int, dtype_name: str) -> tuple[int, int] | None:
    """(num_warps, maxnreg) of the PACKED single-block forward for rows of width bucket n_pow2 in dtype ``dtype_name``
    (torch's name: "bfloat16", "float16"), or None."""
    entry = PACKED_SINGLE_BLOCK.get(n_pow2)
    if dtype_name not in ("bfloat16", "float16") or entry is None or not get_override(
            "softmax", "packed", dtype_name in PACKED_DTYPES):
        return None
    return get_override("softmax", "packed_warps", entry[0]), get_override("softmax", "packed_maxnreg", entry[1])


def _single_block_config(n_pow2: int, elem: int, direction: str) -> tuple[int, int]:
    """(BLOCK_M rows per program, num_warps) for a single-block tile of width n_pow2."""
    block_m, warps = _SINGLE_BLOCK[elem].get(max(n_pow2, 256), (1, 32))  # wider: only via overrides
    warps = _SINGLE_BLOCK_BWD_WARPS.get((elem, n_pow2), warps) if direction == "bwd" else warps
    if n_pow2 < 256:  # narrow rows: keep about 2048 elements per program
        block_m = 2048 // n_pow2
    return get_override("softmax", "block_m", block_m), get_override("softmax", "num_warps", warps)


def _wide_config(n: int, elem: int, direction: str) -> tuple[int, int, int, int]:
    """(BLOCK_N chunk, SPLITS pieces per row, PIECE columns per piece, num_warps) for wide rows."""
    block, piece, warps = _WIDE[(direction, elem)]
    block = get_override("softmax", "wide_block", block)
    piece = triton.cdiv(get_override("softmax", "wide_piece", piece), block) * block
    piece = min(piece, triton.cdiv(n, block) * block)
    return block, triton.cdiv(n, piece), piece, get_override("softmax", "wide_warps", warps)


def _persist_config(elem: int, direction: str, n_pow2: int = 0) -> tuple[int, int, int, int]:
    """(BLOCK_N columns per piece, num_warps, most programs per SM, STAGES) of the persistent wide kernels for rows of
    ``n_pow2`` (the next power of two of their width): _PERSIST_BY_WIDTH's entry, else _PERSIST and _PERSIST_STAGES;
    config_override persist_block / persist_warps / persist_per_sm / persist_stages over either."""
    entry = _PERSIST_BY_WIDTH.get((direction, elem, n_pow2))
    if entry is None:
        entry = (*_PERSIST[(direction, elem)], _PERSIST_STAGES.get((direction, elem), 1))
    block, warps, per_sm, stages = entry
    return (get_override("softmax", "persist_block", block), get_override("softmax", "persist_warps", warps),
            get_override("softmax", "persist_per_sm", per_sm), int(get_override("softmax", "persist_stages", stages)))
