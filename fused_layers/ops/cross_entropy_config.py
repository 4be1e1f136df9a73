"""Launch configurations of the cross-entropy kernels (data, not code paths).

Not yet tuned on a GPU: first-principles values (register counts from ptxas for sm_90), to be replaced
by the winners of ``benchmarks/bench_cross_entropy.py --sweep`` on the H200.

* Rows whose padded width (next power of two of C) is at most ``MAX_SINGLE`` are held in registers by
  one program: one read of the logits, one write of the gradient.  ``_SINGLE[width]`` gives (BLOCK_M
  rows per program, num_warps); narrower rows pack several rows per program (about 4K elements per
  program).  (A 32K-wide tile takes the whole register file of an SM: one program per SM.)
* Wider rows with a gradient (``WIDE_MODE``):
  0 = coop (default): balanced pieces of at most ``COOP_BLOCK`` columns, one program each, held in
  registers while the pieces of the row publish their statistics (``_ce_fwd_coop_kernel``: one read,
  one write, at any width);
  2 = split: pieces of ``PIECE`` columns streamed in chunks of ``SPLIT_BLOCK``, the second read of a
  piece from L2 (``_ce_fwd_split_kernel``);
  3 = coop, but each program reads its piece again after the wait (from L2) instead of holding it in
  registers across the wait (fewer registers, more programs resident);
  1 = stream: one program per row, chunks of ``STREAM_BLOCK``, two passes (second read from L2 while
  the rows in flight fit there).  Without a gradient wide rows always stream (one pass).
* ``LINEAR_CHUNK_BYTES``: the fused linear cross-entropy computes the logits of this many bytes at a
  time (rows = bytes / (V * element size), a multiple of 128 rows, at least 128).
"""

# padded width -> (BLOCK_M, num_warps); widths below 256 keep about 4096 elements per program
_SINGLE = {256: (16, 4), 512: (8, 4), 1024: (4, 4), 2048: (2, 8), 4096: (1, 8), 8192: (1, 8), 16384: (1, 16), 32768: (1, 16)}
MAX_SINGLE = 16384
WIDE_MODE = 0
COOP_BLOCK = {2: 8192, 4: 8192}  # element size -> widest piece per program (a power of two)
COOP_WARPS = 8
STREAM_BLOCK = {2: 8192, 4: 4096}  # element size -> chunk columns
STREAM_WARPS = 16
PIECE = {2: 16384, 4: 8192}  # element size -> columns per piece
SPLIT_BLOCK = {2: 8192, 4: 4096}  # element size -> chunk columns inside a piece
SPLIT_WARPS = 8
LINEAR_CHUNK_BYTES = 256 * 2**20
