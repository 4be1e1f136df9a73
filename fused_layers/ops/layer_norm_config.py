"""Launch configuration of the LayerNorm / RMSNorm kernels (ops/layer_norm.py): which kernel, in what shape, for a
row width, an element size (2: bf16 / fp16, 4: fp32) and a norm.

A width looks up its exact value first (768: GPT-2, ViT), then its bucket (the next power of two), each time an
entry of its norm before one both norms share; widths without an entry take the rules (``_fwd_rule``,
``_bwd_rule``).  The row count never enters.  Each default's comment is the measurement that decided it: an H200,
2^26 elements, fraction of the copy bandwidth by CUDA-graph replay (do_bench where said), bf16 unless said, the
default against the runner-up in the same run.

``config_override("layer_norm", fwd=..., bwd=..., persist=..., gluon=False, programs=...)`` is the tests' hook:
it forces one configuration at every width (``programs``: the backward's program count), so that the Triton
interpreter reaches the chunked, persistent and multi-program kernels on tensors of a few dozen columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from ._common import get_override

_CFG = "layer_norm"  # config_override key shared by both norms
LN, RMS = "ln", "rms"


@dataclass(frozen=True)
class FwdTile:
    """Forward, single block: a program normalizes ``block_m`` whole rows held in registers."""

    block_m: int
    warps: int


@dataclass(frozen=True)
class FwdChunks:
    """Forward, wide rows: a program a row streams it in chunks of ``chunk`` columns twice (statistics, then output),
    both loops software-pipelined ``stages`` deep (1: not)."""

    chunk: int
    warps: int
    stages: int = 1


@dataclass(frozen=True)
class BwdTile:
    """Backward, single block: ``progs_per_sm`` programs an SM, each over a contiguous group of rows in tiles of
    ``block_m``, its row loop software-pipelined ``stages`` deep (1: not); ``acc_rows``: dW / dB accumulators of one
    row, each tile summed over its rows first; ``pair_sum``: LayerNorm's two row sums in one reduction."""

    block_m: int
    warps: int
    progs_per_sm: int
    stages: int = 1
    acc_rows: bool = False
    pair_sum: bool = False


@dataclass(frozen=True)
class BwdChunks:
    """Backward, wide rows in two passes: a kernel for the row sums, then ``progs_per_sm`` programs an SM walking
    column chunks of ``chunk`` over their rows."""

    chunk: int
    warps: int
    progs_per_sm: int


@dataclass(frozen=True)
class BwdPersist:
    """Backward, wide rows in one read (eager calls): a row's pieces of at most ``block`` columns held by co-resident
    programs of ``warps`` warps that exchange their partial row sums; ``hold``: publish row k, then wait for row
    k - 1 and write it from registers, so that the wait leaves the critical path."""

    block: int
    warps: int
    hold: bool = False


Fwd = Union[FwdTile, FwdChunks]
Bwd = Union[BwdTile, BwdChunks]

# --------------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------------
FWD: dict[tuple[int, int, Optional[str]], Fwd] = {
    (2, 768, LN): FwdTile(2, 2),  # 0.87 of copy, 0.80 before this entry
    (4, 1024, None): FwdTile(4, 8),  # 0.96 of copy
    (4, 4096, None): FwdTile(1, 16),  # 0.97 of copy
    (4, 16384, None): FwdTile(2, 16),  # 0.88 of copy
    (2, 65536, None): FwdChunks(4096, 8, stages=3),  # 0.59 of copy, 0.53 before this entry
    (4, 65536, None): FwdChunks(4096, 8),  # 0.61 of copy
}
FWD_MAX_SINGLE = {2: 32768, 4: 16384}  # widest bucket whose row stays in registers, by element size
FWD_TILE = 4096  # elements a single-block program holds: rows of 4,096 and narrower share programs
FWD_CHUNK = FwdChunks(8192, 16)  # wider rows: 8K chunks x 16 warps edged out 4K x 8 at 32K-64K


def _warps_for(n_pow2: int, block_m: int) -> int:
    """Warps of a single-block program over ``block_m`` rows of ``n_pow2`` columns: 2 up to 1K elements, then one
    more power of two per doubling, 32 past 16K."""
    elems = n_pow2 * block_m
    if elems <= 1024:
        return 2
    if elems <= 4096:
        return 4
    if elems <= 8192:
        return 8
    return 16 if elems <= 16384 else 32


def _fwd_rule(n_pow2: int, elem: int) -> Fwd:
    if n_pow2 > FWD_MAX_SINGLE[elem]:
        return FWD_CHUNK
    block_m = max(1, FWD_TILE // n_pow2)
    return FwdTile(block_m, _warps_for(n_pow2, block_m))


# --------------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------------
BWD: dict[tuple[int, int, Optional[str]], Bwd] = {
    (2, 768, LN): BwdTile(4, 4, 2, stages=4, acc_rows=True),  # 0.84 of copy against 0.77 without acc_rows
    (2, 768, RMS): BwdTile(8, 8, 1, stages=4),  # 0.892 of copy against 0.876 with the 1K bucket's tile
    (2, 1024, None): BwdTile(4, 4, 4, stages=3),  # LN 0.906 / RMS 0.921 of copy, 0.869 / 0.826 before this entry
    (2, 2048, LN): BwdTile(2, 8, 2, stages=3, acc_rows=True, pair_sum=True),  # 0.84 of copy, 0.79 before this entry
    (2, 2048, RMS): BwdTile(1, 8, 2, stages=4),  # 0.79 of copy, 0.58 before this entry
    (2, 4096, LN): BwdTile(2, 16, 1, stages=3, acc_rows=True, pair_sum=True),  # 0.85 of copy, 0.75 before this entry
    (2, 4096, RMS): BwdTile(2, 16, 1, stages=3, acc_rows=True),  # 0.87 of copy, 0.75 before this entry
    (2, 8192, LN): BwdTile(1, 16, 1, stages=3, pair_sum=True),  # 0.861 of copy against 0.849 without pair_sum
    (2, 8192, RMS): BwdTile(1, 16, 1, stages=3),  # 0.83 of copy, 0.62 before this entry
    (4, 1024, None): BwdTile(4, 4, 2, stages=2),  # 0.89 of copy, 0.86 before this entry
    (2, 16384, None): BwdChunks(4096, 8, 2),  # 0.46 of copy (traced calls; eager ones take BWD_PERSIST / Gluon)
}
BWD_MAX_SINGLE = 8192  # widest bucket held in registers with its dW / dB accumulators: 16K spilled, 4-8x slower
BWD_TILE = 4096  # elements a single-block program's tile holds
BWD_NARROW_PROGS_PER_SM = 4  # up to 1,024 wide: fp32 0.85 of copy against 0.57 with 2
BWD_PROGS_PER_SM = 2
BWD_WIDE_WARPS = 16  # from 4,096 wide: fp32 0.88 of copy against 0.67 with 8 warps
BWD_CHUNK = BwdChunks(4096, 16, 1)  # two-pass kernels past BWD_MAX_SINGLE


def _bwd_rule(n_pow2: int, elem: int) -> Bwd:
    if n_pow2 > BWD_MAX_SINGLE:
        return BWD_CHUNK
    block_m = max(1, BWD_TILE // n_pow2)
    warps = BWD_WIDE_WARPS if n_pow2 >= 4096 else _warps_for(n_pow2, block_m)
    return BwdTile(block_m, warps, BWD_NARROW_PROGS_PER_SM if n_pow2 <= 1024 else BWD_PROGS_PER_SM)


# Wide rows, eager calls: the one-read persistent backward (3 N elements a row against the two-pass kernels' 5 N),
# 16-bit rows (swept in bf16).  LayerNorm publishes its two partial sums in one word (16K: 0.653 of copy against
# 0.638 with two).
BWD_PERSIST: dict[tuple[int, int, Optional[str]], BwdPersist] = {
    (2, 16384, LN): BwdPersist(2048, 4),  # 0.65 of copy against the two-pass 0.47; hold lost, 0.632 against 0.646
    (2, 16384, RMS): BwdPersist(1024, 2, hold=True),  # 0.777 of copy against 0.732 without hold (two-pass 0.47)
    (2, 32768, LN): BwdPersist(2048, 4),  # 0.64 of copy against the two-pass 0.44; hold lost, 0.627 against 0.639
    (2, 32768, RMS): BwdPersist(1024, 2, hold=True),  # 0.769 of copy against 0.730 without hold (two-pass 0.45)
    (2, 65536, LN): BwdPersist(2048, 4, hold=True),  # 0.609 of copy against 0.574 without hold (two-pass 0.39)
    (2, 65536, RMS): BwdPersist(2048, 4, hold=True),  # 0.737 of copy against 0.624 without hold (two-pass 0.42)
    (2, 131072, LN): BwdPersist(8192, 16),  # 0.47 of copy against the two-pass 0.33; hold tied, 0.526 / 0.522
    (2, 131072, RMS): BwdPersist(4096, 8, hold=True),  # 0.708 of copy against 0.578 without hold (two-pass 0.37)
}
PERSIST_STAGES = 3  # the row loop pipelined 3 deep: 4 tied (within 0.01), 1 lost at every width
PERSIST_MAX_PER_SM = 8  # programs an SM at most (the binary's occupancy decides below that)

# 16-bit rows of 16K in the Gluon row backward (ops/layer_norm_gluon.py: a row in shared memory, one CTA an SM),
# eager calls on sm_90: LayerNorm 0.81 of copy against the persistent kernel's 0.65, RMSNorm 0.862 against 0.786.  At 8K
# it lost to the single-block kernels (LayerNorm 0.773 against 0.860, RMSNorm 0.871 against 0.887).  Exact widths:
# the kernel takes 12K rows too (three TMA boxes a row), a layout not yet run on a GPU, so they stay on the
# persistent kernel unless forced (config_override gluon=True).
BWD_GLUON: frozenset[tuple[int, int]] = frozenset({(2, 16384)})

# dW / dB: the G partial rows (one a backward program) summed column-wise in a fixed order.  Latency-bound (the
# partials are L2-resident): strips of 16 columns, tiles of REDUCE_TILE floats, the loop over G pipelined 3 deep.
# LayerNorm 768 0.879 of copy against 0.842 with 256-column strips of 32 rows unpipelined; 8-64 columns within 0.01.
REDUCE_BLOCK_N = 16
REDUCE_TILE = 2048
REDUCE_WARPS = 4
REDUCE_STAGES = 3


# --------------------------------------------------------------------------------------------------
# Lookups (the launch plans of ops/layer_norm.py call these once per shape)
# --------------------------------------------------------------------------------------------------
_UNSET = object()


def _lookup(table: dict, elem: int, n: int, n_pow2: int, is_rms: bool):
    norm = RMS if is_rms else LN
    for width in (n, n_pow2):
        for key in ((elem, width, norm), (elem, width, None)):
            entry = table.get(key)
            if entry is not None:
                return entry
    return None


def fwd_config(n: int, n_pow2: int, elem: int, is_rms: bool) -> Fwd:
    """The forward of rows ``n`` wide (bucket ``n_pow2``) of ``elem``-byte elements."""
    forced = get_override(_CFG, "fwd", None)
    if forced is not None:
        return forced
    return _lookup(FWD, elem, n, n_pow2, is_rms) or _fwd_rule(n_pow2, elem)


def bwd_config(n: int, n_pow2: int, elem: int, is_rms: bool) -> Bwd:
    """The single-block or two-pass backward of rows ``n`` wide (bucket ``n_pow2``)."""
    forced = get_override(_CFG, "bwd", None)
    if forced is not None:
        return forced
    return _lookup(BWD, elem, n, n_pow2, is_rms) or _bwd_rule(n_pow2, elem)


def bwd_programs(default: int) -> int:
    """The backward's program count: ``default`` unless a test forces it."""
    return get_override(_CFG, "programs", default)


def persist_config(n: int, n_pow2: int, elem: int, is_rms: bool) -> Optional[BwdPersist]:
    """The persistent one-read backward of eager calls at this width, or None (the two-pass kernels)."""
    forced = get_override(_CFG, "persist", _UNSET)
    if forced is not _UNSET:
        return forced
    return _lookup(BWD_PERSIST, elem, n, n_pow2, is_rms)


def gluon_config(n: int, elem: int) -> bool:
    """True where the Gluon row backward is the eager default for rows ``n`` wide (it still checks what it takes:
    ``supported``)."""
    return bool(get_override(_CFG, "gluon", (elem, n) in BWD_GLUON))


def reduce_config(n: int, g: int) -> tuple[int, int]:
    """(BLOCK_N columns a program, BLOCK_G partial rows an iteration) of the dW / dB reduce over ``g`` rows of ``n``."""
    block_n = min(REDUCE_BLOCK_N, 1 << max(0, n - 1).bit_length())
    return block_n, min(REDUCE_TILE // block_n, 1 << max(0, g - 1).bit_length())


_SM_COUNT: dict[int, int] = {}


def sm_count(index: int) -> int:
    """SMs of CUDA device ``index`` (programs a wave), cached per device; 2 for the interpreter (-1)."""
    if index < 0:
        return 2
    count = _SM_COUNT.get(index)
    if count is None:
        count = _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return count
