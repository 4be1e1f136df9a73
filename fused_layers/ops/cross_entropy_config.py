"""Launch configurations of the cross-entropy kernels (fused_layers/ops/cross_entropy.py): data, not code paths.

Tables are keyed by element size in bytes (2: bf16 / fp16, 4: fp32) and width bucket (the next power of two of
the class count C).  Numbers are fractions of the copy bandwidth (one read of the logits + one write of the
gradient) on an H200, 8,192 rows, forward + backward (`python -m benchmarks ops`, and sweeps of these entries);
each default names the number that decided it.  Columns "32K / 50K / 128K / 262K" are C = 32,000 / 50,304 /
128,256 / 262,144.

``config_override("cross_entropy", ...)`` is the tests' hook to shrink thresholds and tiles so that the interpreter
runs the default kernels at small sizes: ``max_single``, ``block_n`` and ``persist_block``
(``config_override("linear_cross_entropy", chunk_bytes=..., min_rows=...)`` for the fused linear cross-entropy's
chunks, with a trained weight or a frozen one).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SingleBlock:
    """The whole row in registers: BLOCK_M rows a program."""

    block_m: int
    num_warps: int


@dataclass(frozen=True)
class Stream:
    """One program a row, chunks of ``block_n`` columns, two passes (the second from L2, last chunk first).
    ``stages`` > 1 pipelines the chunk loops through shared memory (cp.async); 1 prefetches one chunk in
    registers."""

    block_n: int
    num_warps: int
    stages: int


@dataclass(frozen=True)
class Persistent:
    """Co-resident programs each holding one piece of ``block_n`` columns of a row (one read), the SMEM-pipelined
    form with ``stages`` row loads in flight."""

    block_n: int
    num_warps: int
    per_sm: int  # most programs an SM (the compiled binary's occupancy may bind first)
    stages: int


@dataclass(frozen=True)
class TmaHold:
    """The Gluon TMA kernel (ops/cross_entropy_gluon.py) holding the row in a shared-memory ring of ``nbuf`` chunks
    of ``sub`` boxes of ``box`` columns: rows of at most ``widest`` classes, a multiple of ``box``."""

    widest: int
    sub: int
    box: int
    nbuf: int
    nout: int  # gradient chunks in flight (TMA stores)
    num_warps: int
    per_sm: int  # CTAs an SM


# ---- rows up to MAX_SINGLE (padded): single block --------------------------------------------------------------------
# By width bucket; narrower rows than 256 keep 4096 elements a program (BLOCK_M = 4096 // C) with the 256 entry's warps.
SINGLE = {256: SingleBlock(16, 4), 512: SingleBlock(8, 4), 1024: SingleBlock(4, 4), 2048: SingleBlock(2, 8),
          4096: SingleBlock(1, 8), 8192: SingleBlock(1, 8), 16384: SingleBlock(1, 16)}
# A 32K tile takes an SM's whole register file: at 32,000 the single block ran 0.52 against the stream's 0.62.
MAX_SINGLE = 16384

# ---- wider rows: the stream (fp32; no gradient, label smoothing, probabilities, traced calls) ----------------------
# By element size.  bf16 4K x 8 warps x 4 stages: 0.63 / 0.65 / 0.65 / 0.65 against 8K x 16 with one chunk prefetched
# in registers, 0.58 / 0.61 / 0.65 / 0.66 (4K x 8 x 3 0.46 at 32K, 8K x 16 x 3 0.57 / 0.55).  fp32 keeps the register
# prefetch (4K x 16 warps: 8K x 16's bytes a chunk).
STREAM = {2: Stream(4096, 8, 4), 4: Stream(4096, 16, 1)}

# ---- wider 16-bit rows with a gradient, eager: persistent -----------------------------------------------------------
# 4K x 4 warps x 4 stages: 0.68 / 0.69 / 0.73 / 0.68 against the stream's 0.63 / 0.65 / 0.65 / 0.65 (3 stages
# 0.65 / 0.65 / 0.68 / 0.63; 2K x 4, 4K x 8, 8K x 8 0.44-0.60).  Misaligned rows sharing a window (ops/_rows.py) take
# its VEC8 form: 0.626 against the stream's 0.502 at 50,257, where the plain form's 2-byte loads ran 0.280.
PERSIST = {2: Persistent(4096, 4, 16, 4)}
# In place of PERSIST's entry for one width bucket: up to 64K, 2K x 2 warps, up to 32 an SM: 0.719 against 0.702 at
# 50,304 (0.705 against 0.730 at 128K: not above).
PERSIST_BY_WIDTH = {(2, 65536): Persistent(2048, 2, 32, 4)}

# ---- 16-bit rows of at most 32,768 classes on an sm_90 GPU: the TMA kernel, the row held ---------------------------
# 64 KB ring, 4 warps, 3 CTAs an SM: 0.767 against the persistent kernel's 0.69 at 32,000 (two 4-warp CTAs 0.75, three
# 8-warp 0.74-0.76; wider rows do not fit three CTAs: two with a 13- or 25-chunk ring read 0.21-0.40 at 50,304).
TMA_HOLD = {2: TmaHold(widest=32768, sub=16, box=256, nbuf=8, nout=1, num_warps=4, per_sm=3)}

# ---- the fused linear cross-entropy --------------------------------------------------------------------------------
# Logits computed at most this many bytes at a time (a multiple of 128 rows): one chunk's logits, not (N, V).
LINEAR_CHUNK_BYTES = 256 * 2**20
# ... but at least this many rows: with several chunks the (V, H) weight gradient is read and written once a chunk,
# which at n rows costs about 125 / n of the chunk's matmul time (bf16 sum, whatever V and H).  Only a vocabulary
# above 262K rows reaches the floor; the cap decides Gemma's 256K (512 rows) and Qwen2's 152K (768).  Whole eager
# steps (bf16, H100, arms interleaved with Liger, commit 9053212) at 1,024 / 768 / 512 rows: Gemma 24.12 / 25.16 /
# 25.74 ms for 2,094 / 1,969 / 1,844 MiB of extra peak (Liger 2,041 MiB, 141.3 ms), Qwen2 41.71 / 42.47 / 43.45 ms for
# 3,487 / 3,414 / 3,339 MiB (Liger 4,159): the cap is what puts Gemma under Liger.
LINEAR_MIN_ROWS = 512
# Where the sum weighs more, the floor stays at 1,024 rows: a float32 sum (a float32 weight under autocast) moves twice
# the bytes a chunk, and under torch.compile the step is compared with compiled unfused, not Liger: its peak is
# already 67 % below it at Gemma, whose whole compiled step is 24 ms, of which the four more sums of 512-row chunks
# would take 1.5 ms (its 1.10x over compiled unfused).
LINEAR_SUM_MIN_ROWS = 1024
# A weight that does not train (LoRA, a frozen tied embedding) has no gradient to sum, so its chunks are bound by
# their logits alone, and each chunk reads the weight again: 32 MiB but at least 256 rows.  LoRA steps (as above) at
# 512 / 256 / 128 rows: Gemma 21.47 / 22.63 / 26.75 ms for 1,630 / 1,505 / 1,443 MiB (Liger 1,443, 79.8 ms); Llama 3
# 28.60 / 29.51 / 35.49 ms for 2,487 / 2,422 / 2,402 (Liger 2,403); Llama 32K at 1,024 / 512 rows 26.39 / 26.49 ms
# for 2,420 / 2,405 (Liger 2,407).  128 rows would cost 20 % of a LoRA Gemma step.
LINEAR_FROZEN_CHUNK_BYTES = 32 * 2**20
LINEAR_FROZEN_MIN_ROWS = 256
# Where V elements are not a 16-byte multiple, the head's weight gets zero classes up to a multiple of this, so that
# every matmul has aligned sizes: bf16 8,192 x 1,024 x 32,001 forward + backward then takes 3.60 ms on an H100 (32,000:
# 2.83; Inductor's compiled head at 32,001: 14.39); padding only the logits' rows left GPT-2's head at 14.7 ms.
LOGITS_ROW_ALIGN = 64


def single_block(c_pow2: int) -> SingleBlock:
    """The single-block config of rows of width bucket ``c_pow2`` (narrow rows: 4096 elements a program)."""
    cfg = SINGLE[max(c_pow2, 256)]
    if c_pow2 < 256:
        cfg = SingleBlock(4096 // c_pow2, cfg.num_warps)
    return cfg


def persistent(elem: int, c_pow2: int) -> Persistent:
    """The persistent config of 16-bit rows of width bucket ``c_pow2``."""
    return PERSIST_BY_WIDTH.get((elem, c_pow2), PERSIST[elem])


def tma_hold(c: int, elem: int) -> TmaHold | None:
    """The TMA_HOLD config for C classes of ``elem``-byte logits, or None where the kernel's ring does not fit."""
    t = TMA_HOLD.get(elem)
    return t if t is not None and c <= t.widest and c % t.box == 0 else None
