"""Launch configurations of the cross-entropy kernels (data, not code paths).

Measured on the H200 (``benchmarks/bench_cross_entropy.py --sweep``, 8,192 bf16 rows, forward +
backward, fraction of the copy bandwidth for one read + one write; notes/ce_run4):

=========  ==============  ============  ===============  ==============  =============================
vocab      single 32K w16  coop (best)   stream 8K w16    stream 16K w32  split p16K b8K w8
=========  ==============  ============  ===============  ==============  =============================
32,000     0.52            0.58          **0.62**         0.33            0.44
50,304     -               0.55          **0.58**         0.55            0.56
128,256    -               0.54          0.62             0.64            **0.65**
262,144    -               0.53          0.64             **0.65**        0.58
=========  ==============  ============  ===============  ==============  =============================

So wide rows stream by default (the coop kernel, pieces of a row in registers waiting on each other,
was slower everywhere and needed its programs co-resident: removed).  Second sweep (benchmarks/results/
cross_entropy_h200.md, 2026-12-01), stream 8K w16 variants, fraction of copy at 32,000 / 50,304 / 128,256 /
262,144: the old form 0.59 / 0.56 / 0.56 / 0.58; + prefetch + reversed gradient pass ("rowmax")
**0.63 / 0.61 / 0.65 / 0.66**; + per-lane running max 0.46 / 0.49 / 0.55 / 0.54 (the per-lane max holds
more registers per thread and lost); two chunks ahead 0.44-0.54; 4K w8 0.60-0.62; 16K w32 0.47-0.59.
So the default is prefetch + reverse with a per-row max (``STREAM_LANE_MAX = 0``).  Peers at the same
sizes: Liger 0.27 / 0.26 / 0.44 / 0.49, torch.compile of ``F.cross_entropy(x.float())`` 0.35-0.40.

* Rows whose padded width (next power of two of C) is at most ``MAX_SINGLE`` are held in registers by
  one program: one read of the logits, one write of the gradient.  ``_SINGLE[width]`` gives (BLOCK_M
  rows per program, num_warps); narrower rows pack several rows per program (about 4K elements per
  program).  (A 32K-wide tile takes the whole register file of an SM: one program per SM.)
* Wider rows (``WIDE_MODE``): 1 = stream: one program per row, chunks of BLOCK_N columns from
  ``STREAM[elem]`` (first entry whose widest C is not exceeded), two passes, the second read from L2;
  2 = split: pieces of ``PIECE`` columns streamed in chunks of ``SPLIT_BLOCK``, several programs per
  row, the second read of a piece from L2 (``_ce_fwd_split_kernel``); 3 = persistent (opt-in): the pieces of
  a row held in registers by co-resident programs that exchange their statistics (one read, one write;
  ``PERSIST``; the default of 16-bit logits, eager calls: ``PERSIST_STAGES``); 4 = TMA (the default of 16-bit rows in
  ``TMA_HOLD``, since session 23; otherwise opt-in, measured slower,
  session 15: ops/softmax_gluon.py's cross-entropy on 2-D logits on an sm_90 GPU, else 3).  Without a gradient,
  wide rows always stream (one pass).
* ``LINEAR_CHUNK_BYTES``: the fused linear cross-entropy computes the logits of this many bytes at a
  time (rows = bytes / (V * element size), a multiple of 128 rows, at least 128).
"""

# padded width -> (BLOCK_M, num_warps); widths below 256 keep about 4096 elements per program
_SINGLE = {256: (16, 4), 512: (8, 4), 1024: (4, 4), 2048: (2, 8), 4096: (1, 8), 8192: (1, 8), 16384: (1, 16),
           32768: (1, 16), 65536: (1, 32)}
MAX_SINGLE = 16384
# element size -> wide-row form (rows with a gradient, class-index targets, no smoothing; anything else streams):
# 16-bit logits take the SMEM-pipelined persistent form (PERSIST / PERSIST_STAGES below), fp32 the stream.
WIDE_MODE = {2: 3, 4: 1}
# element size -> ((widest C, ops/softmax_gluon.py launch tuple), ...): rows with a gradient, class-index targets, no
# smoothing, whose C is at most widest C and a multiple of the tuple's BOX (FLAT boxes) take WIDE_MODE 4, the TMA
# cross-entropy, with the row held in its ring (HOLD): (SUB 16, BOX 256, NBUF 8 = a 32,768-column ring, NOUT 1,
# 4 warps, 3 CTAs an SM, HOLD, K 1, FLAT).  The kernel takes the call only on an sm_90 GPU with 2-D logits, unit
# class stride, 16-byte aligned rows, reduction mean / sum and no upstream gradient given (else the persistent
# kernel runs).  H200, 8,192 rows, bf16, fraction of copy do_bench / graph replay (issue10/run30_e, run30_f):
#   32,000: 0.767 / 0.799-0.808 against the persistent default's 0.69 / 0.72;  32,768: 0.766 / 0.803 against - / 0.736;
#   two 4-warp CTAs 0.75 / 0.79; three 8-warp 0.74-0.76 / 0.78-0.79; 4 KB chunks 0.75 / 0.79; plain stores a tie.
#   Wider rows do not fit three CTAs: at 50,304 two CTAs an SM with a 13- or 25-chunk ring read 0.21-0.40.
TMA_HOLD = {2: ((32768, (16, 256, 8, 1, 4, 3, 1, 1, 1)),)}
# 16-bit rows whose class count or row stride is not a multiple of 16 elements and that cannot take VEC8 (below)
# stream (WIDE_MODE 1): no 16-byte vectors there, so the plain persistent kernel's loads are 2 bytes wide (LDG.E.U16,
# benchmarks/scan_vec8.py).  H200, session 23, 8,192 bf16 rows, fwd + bwd, do_bench /
# graph (issue10/run30_l/ce_odd.txt): 50,257 stream 0.504 / 0.515 against the persistent default's 0.280 / 0.284
# (split 0.32, persistent in registers 0.32, stream 8K x 16 0.44); 30,522 0.506 / 0.527 against 0.288 / 0.294;
# 100,277 0.497 / 0.502 against 0.276 / 0.277; 32,001 0.518 / 0.537 against 0.289 / 0.294 (run30_k: 32,008 0.29 too;
# aligned widths 0.66-0.80).
MISALIGNED_STREAM = True
# Such rows whose gradient can share their window (row stride - C a multiple of the window, below: contiguous logits
# always) take the persistent kernel's VEC8 form instead (session 24): pieces laid on the row's window, its whole
# 16-byte vectors read and written as vectors, its at most 7 + 7 unaligned head and tail columns a separate 16-lane
# tensor (ops/_rowsync.py).  H200, bf16, do_bench / graph, against the stream (issue10/run31_f/ce_odd.txt): 50,257
# 0.626 / 0.640 against 0.502 / 0.513; 30,522 0.556 / 0.631 against 0.505 / 0.523; 32,001 0.629 / 0.659 against 0.516 /
# 0.534; 100,277 0.668 / 0.677 against 0.494 / 0.497 (aligned 50,304 / 128,256: 0.698 / 0.727 in the same run).
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

# element size -> ((widest C, BLOCK_N, num_warps, STAGES), ...): the first entry with C <= widest C (None: any).
# STAGES > 1 software-pipelines the chunk loops (tl.range num_stages: cp.async into shared memory; the
# register prefetch is then off); a plain range loop (STAGES = 1) keeps at most STREAM_PREFETCH chunks in
# flight, in registers (sm_90 SASS: LDGSTS appears only with num_stages >= 2, benchmarks/scan_stream_stages.py).
# Third sweep (H200, 2026-12-01 session 4, benchmarks/results/issue10/run6_stages/), fraction of copy at
# 32,000 / 50,304 / 128,256 / 262,144:
#   8K/w16 prefetch 1 (the previous default)   0.58 / 0.61 / 0.65 / 0.66
#   4K/w8, 4 stages (the bf16 default now)     **0.63 / 0.65 / 0.65 / 0.65**
#   4K/w8, 3 stages                            0.46 / 0.64 / 0.65 / 0.65
#   8K/w16, 3 stages                           0.57 / 0.55 / 0.64 / 0.66
#   2K/w4, 4 stages                            0.61 / 0.63 / 0.64 / 0.65
# Pass 1 at 32K-50K was short of bytes in flight; the pipelined loop fixes that.  fp32 rows keep the
# register prefetch (not yet swept with stages).
STREAM = {
    2: ((None, 4096, 8, 4),),  # bf16/fp16
    4: ((None, 4096, 16, 1),),  # fp32: 8K/w16 prefetch 1's bytes per chunk
}
STREAM_PREFETCH = 1  # chunks loaded ahead in registers when STAGES == 1
STREAM_REVERSE = 1
STREAM_LANE_MAX = 0  # measured: the per-row max won (see above)
# L2 hints of the streaming kernel (bits): 1 = pass-1 loads evict_last (keep the row for its re-read), 2 = pass-2
# loads evict_first (its last use), 4 = the gradient stored as streaming (.cs) so it does not push out rows still
# to be re-read.  H200, 2026-12-02 (issue10/run13_l2_hints/), fraction of copy at 32,000 / 50,304 / 128,256 /
# 262,144: hints 7 0.63 / 0.65 / 0.64 / 0.64, none 0.63 / 0.64 / 0.64 / 0.64: off.  (ncu: pass 2 re-reads 77-88%
# from DRAM either way.  A capped grid of 1-3 programs per SM looping over the rows, to keep the rows in flight
# within L2, measured 0.39-0.61 and was removed.)
STREAM_EVICT = 0
# Persistent (WIDE_MODE 3, opt-in, ``_ce_fwd_persist_kernel``): element size -> (BLOCK_N columns per piece,
# num_warps, most programs per SM).  Each program holds one piece of a row in registers (and the next row's
# piece in flight); the SPLITS = ceil(C / BLOCK_N) programs of a row exchange their statistics
# (ops/_rowsync.py).  H200 sweeps, fraction of copy at 32,000 / 50,304 / 128,256 / 262,144:
#   targets read after the exchange, x_t by a block reduction (issue10/run10_persist_lag/ce.log): best of 2K-16K
#   pieces x 2-16 warps 0.41 / 0.42 / 0.41 / 0.39 (190-222 registers a thread, 2 programs per SM);
#   targets loaded a row ahead, everything else the row needs loaded before the wait, x_t read by its owner
#   (issue10/run10_depth/ce.log): 4K x 4 warps 0.52 / 0.51 / 0.54 / 0.51 (128 registers on sm_90);
#   the stream in the same runs: 0.63 / 0.65 / 0.65 / 0.65.  So the default stays streaming.
PERSIST = {2: (4096, 4, 16), 4: (4096, 8, 4)}  # (16-bit: at most 16 per SM, as swept; occupancy binds first)
# element size -> the persistent kernel's form: 1 = pieces held ahead in registers; > 1 = SMEM-pipelined (one row in
# registers, the next STAGES - 1 rows' piece loads in flight by cp.async; softmax_config._PERSIST_STAGES).  H200,
# 2026-12-02 (issue10/run13_smem_first/), 4K x 4 warps, 3 stages: 0.69 / 0.68 / 0.74 at 32K / 50K / 128K (the stream
# 0.63 / 0.64 / 0.64), wrong rows at 262K before the wait fix (softmax_config._PERSIST_STAGES); after it (call 8, a
# noisy run, issue10/run13_wait_chunk/) 0.65 / 0.65 / 0.68 / 0.64 against 0.63 / 0.65 / 0.65 / 0.65.
# Clean sweep, H200, 2026-12-02 session 10 (issue10/run14_sweep/ce.log, gpu_session14_a.sh), bf16, 32K / 50K / 128K / 262K:
#   stream 4K w8 4 stages (the previous default)   0.63 / 0.65 / 0.65 / 0.65
#   SMEM 4K x 4 warps, 3 stages                   0.65 / 0.65 / 0.68 / 0.63
#   SMEM 4K x 4 warps, 4 stages (the default)     **0.68 / 0.69 / 0.73 / 0.68**
#   SMEM 2K x 4 / 4K x 8 / 8K x 8 warps, 3 stages  0.44-0.58 / 0.50-0.56 / 0.54-0.60
# (fp32 logits: not swept in this form; they stream.)
PERSIST_STAGES = {2: 4}
# By width bucket, (element size, next power of two of C) -> (BLOCK_N, num_warps, most programs per SM), in place of
# PERSIST there.  Session 25 (issue10/run32_d, run32_e; H200, 8,192 bf16 rows, fwd + bwd, do_bench / graph replay, the
# default 4K x 4 warps in the same runs):
#   50,304   2K x 2 warps, up to 32 an SM **0.719 / 0.741 and 0.716 / 0.741** against 0.702 / 0.723 and 0.697-0.698 /
#            0.722 (taken); 1K x 1 warp 0.681 / 0.703
#   128,256  2K x 2 0.705 / 0.712 and 0.702 / 0.710 against 0.728-0.732 / 0.736-0.738;  262,144  0.613 / 0.600 against
#            0.674-0.675 / 0.658-0.659
PERSIST_BY_WIDTH = {(2, 65536): (2048, 2, 32)}
# Measured, not kept (session 25, issue10/run32_a, run32_e): the exponents as one FFMA, x log2 e - fl(m log2 e), with a
# uniform branch to the exact form past |m log2 e| = 2^7 (persist_fma): 0.622 / 0.654 / 0.622 against 0.699 / 0.732 /
# 0.681 at 50,304 / 128,256 / 262,144 (64 registers' occupancy for one fewer instruction an element); the gradient stored
# as coef p and the target's element rewritten a row later, after the next row's block-reduction barriers (no
# per-element compare with t; persist_fixup, row loop 783 -> 731): 0.618 / 0.639 / 0.600 against 0.698 / 0.729 / 0.675.
# (Candidate: config_override("cross_entropy", persist_lag=True), row k - 1's loss and gradient after row k is
# published, its piece re-read from L2.  Timed in session 11: it lost, 0.37-0.59 of copy against 0.67-0.73:
# issue10/run16_b/ce.log.)
PIECE = {2: 16384, 4: 8192}  # element size -> columns per piece
SPLIT_BLOCK = {2: 8192, 4: 4096}  # element size -> chunk columns inside a piece
SPLIT_WARPS = 8
LINEAR_CHUNK_BYTES = 256 * 2**20


def stream_config(C: int, elem: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, STAGES) of the streaming kernel for rows of C classes of ``elem`` bytes."""
    for widest, block_n, warps, stages in STREAM[elem]:
        if widest is None or C <= widest:
            return block_n, warps, stages
    raise AssertionError("the last STREAM entry takes any width")


def tma_hold_config(C: int, elem: int):
    """The TMA_HOLD launch tuple for C classes of ``elem``-byte logits, or None."""
    for widest, config in TMA_HOLD.get(elem, ()):
        if C <= widest and C % config[1] == 0:
            return config
    return None
