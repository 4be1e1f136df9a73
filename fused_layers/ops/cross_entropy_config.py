"""Launch configurations of the cross-entropy kernels (data, not code paths).

Not yet tuned on a GPU: first-principles values, to be replaced by the winners of
``benchmarks/bench_cross_entropy.py --sweep`` on the H200.

* Rows whose padded width (next power of two of C) is at most ``MAX_SINGLE`` are held in registers:
  one read of the logits, one write of the gradient, nothing re-read.  ``_SINGLE[width]`` gives
  (BLOCK_M rows per program, num_warps); narrower rows pack several rows per program (about 4K
  elements per program).
* Wider rows stream over chunks of ``STREAM_BLOCK`` columns twice (statistics, then the gradient),
  one program per row; the second read of a row comes from L2 while the rows in flight fit there.
* Rows of at least ``SPLIT_MIN`` columns, when the gradient is written, are cut into pieces of
  ``PIECE`` columns, one program each (``_ce_fwd_split_kernel``), so that the second read of each
  piece comes from L2 at any width (a few hundred pieces in flight).
* ``LINEAR_CHUNK_BYTES``: the fused linear cross-entropy computes the logits of this many bytes at a
  time (rows = bytes / (V * element size), a multiple of 128 rows, at least 128).
"""

# padded width -> (BLOCK_M, num_warps); widths below 256 keep about 4096 elements per program
_SINGLE = {256: (16, 4), 512: (8, 4), 1024: (4, 4), 2048: (2, 8), 4096: (1, 8), 8192: (1, 8), 16384: (1, 16), 32768: (1, 16)}
MAX_SINGLE = 32768
STREAM_BLOCK = {2: 8192, 4: 4096}  # element size -> chunk columns
STREAM_WARPS = 16
SPLIT_MIN = 65536
PIECE = {2: 16384, 4: 8192}  # element size -> columns per piece
SPLIT_BLOCK = {2: 8192, 4: 4096}  # element size -> chunk columns inside a piece
SPLIT_WARPS = 8
LINEAR_CHUNK_BYTES = 256 * 2**20
