"""Launch configurations and routing thresholds of the attention kernels: data, read by ops/attention.py (Triton
kernels) and ops/attention_gluon.py (Gluon kernels).

A configuration depends on the kernel, the head-dim bucket, the causal flag and the dtype, never on the sequence
length, so a first call compiles one configuration per kernel.  The numbers were measured on an H200 in bf16 with
16 heads: the Triton tiles per kernel alone at B 4, S 4,096 (milliseconds, the winner against the runner-up), the
Gluon tiles and the routing thresholds on the whole forward or backward at S 1K / 4K / 16K with B * S = 16K tokens
(TFLOP/s).

``config_override("attention", block_m=.., block_n=.., num_warps=.., num_stages=..)`` (or per kernel:
``fwd_block_m``, ``dkdv_num_warps``, ``dq_block_n``, ...) is the tests' hook: it replaces the Triton kernels' tiles so
that the interpreter runs the default kernels on small shapes spanning several tiles (the interpreter's own tiles
are 16 x 16).  It is not a tuning interface.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._common import INTERPRET, get_override


@dataclass(frozen=True)
class Tiles:
    """One Triton launch: BLOCK_M query rows and BLOCK_N keys a tile, warps, software-pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# bf16 / fp16, (kernel, head-dim bucket, causal): "fwd" the forward, "dkdv" the backward's dK / dV kernel, "dq" its
# dQ kernel.  Buckets: BLOCK_D (the head dim padded to a power of two) <= 64, <= 128, <= 256.
TILES: dict[tuple[str, int, bool], Tiles] = {
    ("fwd", 64, False): Tiles(128, 64, 8, 4),  # 0.652 ms; (128, 64, 8, 3) 0.654
    ("fwd", 64, True): Tiles(128, 64, 8, 3),  # 0.390 ms; (128, 64, 8, 4) 0.391
    ("fwd", 128, False): Tiles(128, 64, 8, 3),  # 1.215 ms; (128, 128, 8, 3) 1.219
    ("fwd", 128, True): Tiles(128, 64, 8, 3),  # 0.662 ms; (128, 128, 8, 3) 0.671
    ("dkdv", 64, False): Tiles(32, 128, 4, 3),  # 1.965 ms; (32, 64, 4, 4) 2.012
    ("dkdv", 64, True): Tiles(64, 64, 4, 3),  # 1.200 ms; (32, 64, 4, 4) 1.305
    ("dkdv", 128, False): Tiles(64, 128, 8, 3),  # 3.611 ms; (32, 64, 4, 4) 3.711
    ("dkdv", 128, True): Tiles(64, 128, 8, 3),  # 1.987 ms; (64, 128, 8, 2) 2.056
    ("dq", 64, False): Tiles(128, 64, 8, 3),  # 2.092 ms; (64, 64, 4, 3) 2.139
    ("dq", 64, True): Tiles(64, 64, 4, 3),  # 1.246 ms; (64, 32, 4, 3) 1.270
    ("dq", 128, False): Tiles(128, 64, 8, 3),  # 4.228 ms; (128, 128, 8, 2) 4.316
    ("dq", 128, True): Tiles(128, 64, 8, 3),  # 2.295 ms; (128, 128, 8, 2) 2.352
    # Head dim 256, not timed: tiles that fit sm_90's 227 KB of shared memory at 2 stages (160 / 128 / 128 KB).
    **{("fwd", 256, c): Tiles(64, 64, 4, 2) for c in (False, True)},
    **{("dkdv", 256, c): Tiles(32, 64, 4, 2) for c in (False, True)},
    **{("dq", 256, c): Tiles(64, 32, 4, 2) for c in (False, True)},
}

# float32, (kernel, head-dim bucket), not timed: float32 operands take twice the shared memory of 16-bit ones, so
# half the bf16 tile area, and half again (BLOCK_M * BLOCK_N <= 2048) at head dim 256.
TILES_FP32: dict[tuple[str, int], Tiles] = {
    ("fwd", 128): Tiles(64, 64, 4, 2),
    ("fwd", 256): Tiles(64, 32, 4, 2),
    ("dkdv", 128): Tiles(32, 64, 4, 2),
    ("dkdv", 256): Tiles(32, 64, 4, 2),
    ("dq", 128): Tiles(64, 32, 4, 2),
    ("dq", 256): Tiles(64, 32, 4, 2),
}

# Under the interpreter: 16 x 16 tiles, so that the tests' small shapes span several of them.
TILES_INTERPRETER = Tiles(16, 16, 4, 2)

# The backward's delta = rowsum(dO * O) kernel: query rows a program (not timed: a memory-bound pass of 2 reads).
PREPROCESS_BLOCK_M = 64


def tiles(kind: str, block_d: int, causal: bool, dtype: torch.dtype) -> dict:
    """Launch configuration of Triton kernel ``kind`` ("fwd", "dkdv", "dq") as launch keywords: BLOCK_M, BLOCK_N,
    num_warps, num_stages; ``config_override`` values (tests) replace the table's."""
    if INTERPRET:
        t = TILES_INTERPRETER
    else:
        bucket = 64 if block_d <= 64 else 128 if block_d <= 128 else 256
        t = TILES_FP32[(kind, max(bucket, 128))] if dtype == torch.float32 else TILES[(kind, bucket, bool(causal))]

    def ov(name: str, default: int) -> int:
        return get_override("attention", f"{kind}_{name}", get_override("attention", name, default))

    return {"BLOCK_M": ov("block_m", t.block_m), "BLOCK_N": ov("block_n", t.block_n),
            "num_warps": ov("num_warps", t.num_warps), "num_stages": ov("num_stages", t.num_stages)}


# ------------------------------------------------------------------------------------------------------------------
# The dK / dV kernel's Q and dO tiles through TMA descriptors: dense bf16 with Sk >= 4096 at these (BLOCK_D, causal);
# backward TFLOP/s against the pointer loads: D64 S4096 372 vs 365 (causal 321 vs 309), D128 S4096 non-causal 401 vs
# 384; it lost at S1024 (D64 319 vs 326) and at D128 causal (S4096 309 vs 351).
# ------------------------------------------------------------------------------------------------------------------
BWD_TMA_MIN_SEQLEN_K = 4096
BWD_TMA_CASES = frozenset({(64, False), (64, True), (128, False)})


# ------------------------------------------------------------------------------------------------------------------
# Gluon kernels (sm_90, bf16 / fp16, head dims 64 and 128)
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GluonTiles:
    """A one-warpgroup Gluon kernel: BLOCK_M rows, BLOCK_N columns, warps, stages of its TMA ring."""

    block_m: int
    block_n: int
    num_warps: int
    stages: int


@dataclass(frozen=True)
class PingPongTiles:
    """The ping-pong forward (128-row query tiles, two consumer warpgroups of 64 rows, a producer warp): keys a tile,
    stages of the K / V ring, registers a consumer thread and a producer thread (setmaxnreg)."""

    block_n: int
    stages: int
    consumer_regs: int
    producer_regs: int


# The one-warpgroup forward, by head dim (64 rows a CTA: two CTAs an SM, one's softmax under the other's wgmma).
GLUON_FWD_TILES: dict[int, GluonTiles] = {
    64: GluonTiles(64, 128, 4, 3),  # 425-427 TFLOP/s at S4K non-causal; 64 keys x 4 stages 407
    128: GluonTiles(64, 64, 4, 3),  # 502 TFLOP/s at S4K non-causal; 128 rows x 8 warps (one CTA an SM) 389-480
}
# The ping-pong, by head dim.  232 / 40 registers: FlashAttention-3's split for two consumers and one producer warp.
GLUON_PINGPONG_TILES: dict[int, PingPongTiles] = {
    64: PingPongTiles(128, 2, 232, 40),  # 448 TFLOP/s at S4K non-causal; 128 keys x 3 stages 414, 64 x 4 382
    128: PingPongTiles(128, 2, 232, 40),  # 612 TFLOP/s at S4K non-causal; 64 keys x 3 stages 533, 64 x 4 540
}
# The dK / dV kernel, by head dim (BLOCK_M queries a step, BLOCK_N keys a CTA).
GLUON_DKDV_TILES: dict[int, GluonTiles] = {
    64: GluonTiles(64, 64, 4, 2),  # D128's tiles (not swept at D64)
    128: GluonTiles(64, 64, 4, 2),  # backward 438 TFLOP/s at S4K non-causal; 32 x 64 x 3 stages 398
}

# Which forward takes a call: (head dim, causal) -> "ws" (the ping-pong) or "plain" (one warpgroup).  D128 ping-pong
# 608 against 507 TFLOP/s at S4K non-causal; D64 non-causal one warpgroup 433 against 411; D64 causal ping-pong 382
# against 382-384 at S4K and 457 against 434 at S16K.
GLUON_FWD_KERNEL: dict[tuple[int, bool], str] = {(64, False): "plain", (64, True): "ws", (128, False): "ws",
                                                 (128, True): "ws"}
# The ping-pong on a persistent grid (one program an SM) for S up to this, where a tile's prologue and epilogue
# overlap the next tile's loads: D64 S4K 448 against 433 (one warpgroup), D64 causal S1K 285 against 250, D128 S1K
# 588 against 531; D64 causal at S4K tied (381 against 383) and D128 causal lost (552 against 622 at S16K).
GLUON_FWD_PERSISTENT_MAX_S: dict[tuple[int, bool], int] = {(64, False): 4096, (64, True): 2048, (128, False): 1024}
# The dK / dV kernel for S up to this (None: any): D128 1.08-1.17x the Triton backward at every S; D64 1.02-1.09x to
# S 4K, a tie or 1-2 % behind at S 16K.  The Triton dQ kernel runs after it.
GLUON_DKDV_MAX_S: dict[int, int | None] = {64: 4096, 128: None}
# The smallest call the Gluon kernels take, B * H * Sq * Sk * D (halved when causal): they launch from Python
# (descriptors, Gluon's launcher), so below about 40 us of forward and 100 us of backward on the H200 the Triton
# kernels' C++ launch path is faster.
GLUON_MIN_WORK = 2**32
