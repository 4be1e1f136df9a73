"""Tuning table of the LayerNorm / RMSNorm kernels (fused_layers/ops/layer_norm.py): data, not code paths.

``config_override("layer_norm", ...)`` (tests, sweeps) takes precedence over every entry.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import get_override

_CFG = "layer_norm"  # config_override key shared by both norms

# One table, by width bucket (next power of two of N) and element size; never re-tuned for a new row
# count.  Rules set from a first sweep on an H200 (event timing, host-bound: benchmarks/results/sweep_norm.json),
# then per-width winners of a second, CUDA-graph-timed sweep (_TUNED below).
#
# Forward: single block up to FWD_MAX_SINGLE, tiles of FWD_TILE elements for narrow rows; beyond it the
# wide-row kernels with chunks of FWD_CHUNK (8192 / 16 warps edged out 4096 / 8 at 32K-64K).
FWD_MAX_SINGLE = {2: 32768, 4: 16384}  # by element size (bytes): fp16/bf16, fp32
FWD_TILE = {2: 4096, 4: 4096}
FWD_CHUNK = 8192
FWD_CHUNK_WARPS = 16
# LayerNorm single-block forward: the mean's correction and the variance in one two-value reduction
# (FUSED_STATS) instead of two dependent ones.  Off until timed on a GPU: LayerNorm's forward at 768 ran
# 0.80 of copy where RMSNorm (one reduction) ran 0.98 (benchmarks/results/issue9/run6_norm_stages/defaults/).
FWD_FUSED_STATS = 0
# Backward: single block up to BWD_MAX_SINGLE (the row, dy and two float32 accumulators in registers;
# at 16K that spills and ran 4-8x slower); BWD_PROGS_PER_SM programs per SM, each over a contiguous
# group of rows (4 for rows <= 1024 wide: fp32 0.85 of copy against 0.57 with 2); 16 warps from 4096
# wide (fp32 4096: 0.88 against 0.67 with 8).  Wide rows: chunks of 4096, 16 warps, 1 program per SM.
BWD_MAX_SINGLE = {2: 8192, 4: 8192}
BWD_TILE = {2: 4096, 4: 4096}
BWD_PROGS_PER_SM = 2
BWD_NARROW_PROGS_PER_SM = 4  # n_pow2 <= 1024
BWD_CHUNK = 4096
BWD_CHUNK_WARPS = 16
BWD_CHUNK_PROGS_PER_SM = 1
# Wide rows, eager calls: the one-read persistent backward (_norm_bwd_persist_kernel: a row's pieces held by
# co-resident programs that exchange their partial row sums, ops/_rowsync.py), by (element size, width bucket):
# (BLOCK_N columns per piece, num_warps, most programs per SM, STAGES).  Written in session 10 (2026-12-02) for the
# 16K backward (two-pass kernels: 0.46-0.48 of copy, issue 9's target 0.85).  H200 sweeps of session 11, bf16,
# CUDA-graph replay (issue10/run16_b/norm_graph_*.txt, issue9/run16_c/norm_*.txt; do_bench in issue10/run15_a agrees
# on the order), LN / RMS fraction of copy, the entry against the two-pass kernels (bwd_persist=0) in the same run:
#   16K  2048 x 4 warps x 3 stages   0.65 / 0.72   (two-pass 0.47 / 0.47)
#   32K  2048 x 4 x 3                0.64 / 0.74   (0.44 / 0.45)
#   64K  4096 x 8 x 3                0.54 / 0.63   (0.39 / 0.42)
#   128K 8192 x 16 x 3               0.47 / 0.59   (0.33 / 0.37)
# Still short of 0.85; 4 stages tied (within 0.01), 1 stage lost at every width.  float32: no entry (not swept).  Opt-in
# elsewhere: config_override("layer_norm", bwd_persist=1, bwd_persist_block=.., bwd_persist_warps=..,
# bwd_persist_per_sm=.., bwd_persist_stages=..); bwd_persist=0 turns an entry off.
BWD_PERSIST: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (2, 16384): (2048, 4, 8, 3),
    (2, 32768): (2048, 4, 8, 3),
    (2, 65536): (4096, 8, 8, 3),
    (2, 131072): (8192, 16, 8, 3),
}
BWD_PERSIST_DEFAULT = (4096, 8, 4, 3)  # what bwd_persist=1 takes where the table has no entry
# HOLD (see _norm_bwd_persist_kernel: publish row k, then wait for row k - 1 and write it from its pieces held in
# registers, so the wait leaves the critical path), by (element size, width bucket, is_rms), with its own piece shape
# (these entries replace BWD_PERSIST's there).  Session 13 sweep, bf16, CUDA-graph replay, fraction of copy, the same
# run (benchmarks/results/issue9/run19_a/hold_sweep_{ln,rms}.txt):
#   RMSNorm  16K  1024 x 2 warps  0.777 against the default's 0.732 (no-exchange diagnostic 0.877)
#            32K  1024 x 2        0.769 against 0.730 (0.868)
#            64K  2048 x 4        0.737 against 0.624 (0.868)
#   LayerNorm 64K 2048 x 4        0.609 against 0.574 (0.889); at 16K / 32K HOLD lost (0.632 / 0.627 against 0.646 / 0.639)
#   RMSNorm 128K  4096 x 8        0.708 against 0.578 (session 13), 0.711 against 0.578 again in session 14 with its
#                 GPU test passing (issue9/run20_b/); LayerNorm 128K a tie (0.526 against 0.522): not taken
# config_override bwd_persist_hold=0 / 1 turns it off / on anywhere (with BWD_PERSIST's piece shape where this table
# has no entry).
BWD_PERSIST_HOLD: dict[tuple[int, int, bool], tuple[int, int, int, int]] = {
    (2, 16384, True): (1024, 2, 8, 3),
    (2, 32768, True): (1024, 2, 8, 3),
    (2, 65536, True): (2048, 4, 8, 3),
    (2, 65536, False): (2048, 4, 8, 3),
    (2, 131072, True): (4096, 8, 8, 3),
}
# The Gluon row backward (ops/layer_norm_gluon.py: one 16-warp CTA an SM, a whole row in shared memory by TMA, read
# twice from there, no exchange between programs), by (element size, width bucket, is_rms): True where it is the
# default for eager calls it takes.  Written in session 17 for the 16K backward (LayerNorm 0.65 / RMSNorm 0.78 of copy
# with the persistent kernels, target 0.85); sm_90 scan (benchmarks/results/issue9/norm_gluon_static_scan_sm90_triton36.txt):
# bf16 16K LayerNorm 128 registers with 9 spill stores, RMSNorm 103, none.  Each entry: (rows in the shared-memory
# ring, dB accumulated in shared memory instead of registers).  Session 18 sweep, bf16, graph replay
# (issue9/run25_a/gluon_sweep_*.txt; fraction of copy, Gluon against the default): RMSNorm 16K 0.862 against the
# persistent kernel's 0.786 (taken); 8K 0.871 / 0.887, 4K 0.709 / 0.898; LayerNorm 16K 0.670 / 0.651, 8K 0.773 / 0.860,
# 4K 0.539 / 0.872 (per-row synchronisation dominates short rows).  Call 3 (issue9/run25_c), after rstd moved onto
# the row sums and dx into two FMAs (LayerNorm SASS 1192 -> 1136 a row loop): LayerNorm 16K 0.769 against 0.650
# (taken), RMSNorm 16K 0.859-0.881.  ncu there: LayerNorm 53.6 M instructions against RMSNorm's 41.9 M at the same
# ~0.45 issued a cycle per scheduler (4 warps each): instruction-bound.
# config_override("layer_norm", bwd_gluon=1 / 0) turns it on / off wherever it applies; bwd_gluon_<field> sets a
# field of its form (GluonVariant).  Session 19 (issue9/run26_a, run26_b; bf16 16K, graph replay, two runs each):
# - smem_sums (the row sums' cross-warp step through one buffer, one barrier a row; sm_90 LayerNorm row loop 11 -> 7
#   barriers, no spills): LayerNorm 0.795-0.796 against 0.769-0.770 (taken); RMSNorm 0.815-0.820 against 0.873 (not).
# - device_desc (descriptors made on the device: a pointers-and-ints launch): LayerNorm 0.750-0.755, RMSNorm 0.810-0.813;
#   with smem_sums 0.792-0.793 / 0.793 (not profiled; device-made descriptors carry no L2 promotion, the host ones
#   128 B, and are read from global memory).  Not taken: the C++ fast path now launches the host-descriptor form itself (it encodes
#   the descriptors at each call, ops/_cpp.py register, kind 'T'), which is what took 16K out of the Python path:
#   do_bench fwd+bwd minus fwd 0.19 -> 0.73 (LayerNorm), 0.28 -> 0.84 (RMSNorm) with device_desc (run26_b), and
#   0.48 -> 0.78 / 0.45 -> 0.87 with the default host-descriptor form through C++ (run26_c; run26_f: 0.79 / 0.86).
# - fold_mean (LayerNorm: s1 sums g x and c1 takes - mean c2r, as aten's CUDA LayerNorm backward; xhat = x rstd - mean
#   rstd, one FMA; sm_90 row loop 1176 -> 1112): on top of smem_sums 0.814 against 0.800 in the same run (taken; 6 GPU
#   tests against float64 and the C++ / graph tests at the new default passed), without smem_sums 0.776 (run26_h).
class GluonVariant(NamedTuple):
    """A form of the Gluon row backward (ops/layer_norm_gluon.py); each field has a config_override key
    ``bwd_gluon_<field>``."""

    stages: int = 2  # rows in the shared-memory ring
    db_smem: bool = False  # dB accumulated in shared memory (LayerNorm's two row sums then in one reduction)
    warps: int = 16  # warps a CTA
    w_f32: bool = False  # the weight held in shared memory as float32
    device_desc: bool = False  # TMA descriptors made on the device: the C++ fast path can launch it
    smem_sums: bool = False  # the row sums' cross-warp step through one buffer and one barrier a row
    fold_mean: bool = False  # LayerNorm: the mean folded into the row sums and xhat (one op a value fewer a pass)
    pdl: int = 0  # programmatic dependent launch as BWD_PDL (1: its reduce a dependent; 2: the kernel too)
    parts_evict: bool = False  # the dW / dB partial rows stored with L2 policy evict_last (session 21, a diagnostic)


BWD_GLUON: dict[tuple[int, int, bool], GluonVariant] = {
    (2, 16384, True): GluonVariant(pdl=2),
    (2, 16384, False): GluonVariant(smem_sums=True, fold_mean=True, pdl=2),
}
# pdl=2 since session 21 (issue9/run28_a/sweep_pdl16k.txt, bf16 16K, default / pdl 1 / pdl 2 / default, do_bench
# fwd+bwd minus fwd and graph replay of the backward): LayerNorm 0.792 / 0.802 / 0.819 / 0.793 and 0.810 / 0.814 /
# 0.816 / 0.807; RMSNorm 0.857 / 0.867 / 0.878 / 0.865 and 0.871 / 0.887 / 0.883 / 0.887.  101 GPU tests (the Gluon
# variants pdl 1 / 2 against float64, CUDA graph + side stream) passed in the same call.
# LayerNorm's persistent backward publishes its two partial row sums packed in one word (PACK: one atomic and one
# polled word a piece instead of two).  Session 12 sweep, bf16, CUDA-graph replay (issue10/run18_b/pack_sweep.txt):
# 16K 0.653 against 0.638, 32K 0.655 against 0.632, 64K (4096 x 8) 0.587 against 0.563.  config_override
# bwd_persist_pack=0 restores the two-word form.
BWD_PERSIST_PACK = True

# dW / dB: the G partial rows (one per backward program: a few hundred) of N float32 summed column-wise in a fixed
# order by _norm_reduce_partials_kernel.  The partials were just written (L2-resident): the kernel is latency-bound
# and wants many programs.  Strips of 256 columns gave the 768-wide rows of GPT-2 3 programs and 8 us a call (0.20 ms
# of a 40 ms step, issue10/run14_e2e_cpp).  Session 12 sweep of the reduce's shape, the LayerNorm backward of 2^26
# elements (issue9/run18_e/reduce_sweep_*.txt; fraction of copy, old shape -> this one): bf16 graph replay 768 0.842 ->
# 0.879, 1024 0.847 -> 0.865, 2048 0.838 -> 0.873, 4096 0.852 -> 0.871, 8192 0.838 -> 0.847, 16K (persistent) tie;
# fp32 1024 / 4096 0.890 / 0.894 -> 0.911 / 0.915; do_bench 768 / 4096 / 8192 0.802 / 0.810 / 0.800 -> 0.834 / 0.826 /
# 0.808; RMSNorm 768 / 4096 0.863 / 0.867 -> 0.892 / 0.898.  16-column strips (64-byte row segments) of REDUCE_TILE
# floats, the loop over G pipelined (REDUCE_STAGES) won or tied at every width; 8-64 columns and 8 warps within 0.01.
# config_override keys reduce_block_n, reduce_block_g, reduce_warps, reduce_stages (the old shape: 256, 32, 4, 1).
REDUCE_BLOCK_N = 16
REDUCE_TILE = 2048
REDUCE_WARPS = 4
REDUCE_STAGES = 3

_SM_COUNT: dict[int, int] = {}


def _sm_count(index: int) -> int:
    """SMs of CUDA device ``index`` (programs per wave), cached per device; 2 for the interpreter (-1)."""
    if index < 0:
        return 2
    count = _SM_COUNT.get(index)
    if count is None:
        count = _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return count


def _warps_for(n_pow2: int, block_m: int) -> int:
    elems = n_pow2 * block_m
    if elems <= 1024:
        return 2
    if elems <= 4096:
        return 4
    if elems <= 8192:
        return 8
    return 16 if elems <= 16384 else 32


# Per-width winners of the final H200 sweep (CUDA-graph timing, benchmarks/results/norm_sweep_h200.json),
# for the swept buckets (keys: element size, width bucket or an exact width such as 768, part); an exact
# width's entry comes before its bucket's; both take precedence over the rules below, and config_override
# over all.
_TUNED: dict[tuple[int, int, str], dict[str, int]] = {
    # bwd_stages: the row loop software-pipelined (tl.range num_stages, cp.async); session 4 sweep,
    # benchmarks/results/issue9/run6_norm_stages/ (0.68 -> 0.84 at 1024, 0.68 -> 0.75 at 4096)
    # session 20 (issue9/run27_a/sweep_rms1k.txt: RMSNorm 0.921 against 0.826; run27_b/sweep_fused_reduce.txt, both norms,
    # do_bench fwd+bwd minus fwd / graph replay: LayerNorm 0.845 / 0.906 against 0.826 / 0.869, RMSNorm 0.864 / 0.922
    # against 0.846 / 0.828); was 8 rows x 8 warps x 1 program an SM x 4 stages
    (2, 1024, "bwd"): {'bwd_block_m': 4, 'bwd_warps': 4, 'bwd_progs_per_sm': 4, 'bwd_stages': 3, 'bwd_max_single': 65536},
    # RMSNorm 768 keeps the old 1K tile (issue9/run27_c/sweep_norm_tiles.txt, graph replay 0.892 against the new 1K
    # tile's 0.876; LayerNorm 768 has its own entry below)
    (2, 768, "bwd"): {'bwd_block_m': 8, 'bwd_warps': 8, 'bwd_progs_per_sm': 1, 'bwd_stages': 4, 'bwd_max_single': 65536},
    (2, 1024, "fwd"): {'fwd_block_m': 4, 'fwd_warps': 4},  # 0.95 of copy
    (2, 16384, "bwd"): {'bwd_max_single': 1024, 'bwd_chunk': 4096, 'bwd_warps': 8, 'bwd_progs_per_sm': 2},  # 0.46 of copy
    (2, 32768, "bwd"): {'bwd_max_single': 1024, 'bwd_chunk': 4096, 'bwd_warps': 16, 'bwd_progs_per_sm': 1},  # 0.43 of copy
    (2, 2048, "bwd"): {'bwd_block_m': 1, 'bwd_warps': 8, 'bwd_progs_per_sm': 2, 'bwd_stages': 4, 'bwd_max_single': 65536},  # 0.79 of copy (0.58 before)
    (2, 8192, "bwd"): {'bwd_block_m': 1, 'bwd_warps': 16, 'bwd_progs_per_sm': 1, 'bwd_stages': 3, 'bwd_max_single': 65536},  # 0.83 of copy (0.62 before)
    # LayerNorm at 8192: the bucket's entry with the two row sums in one reduction, 0.861 against 0.849 (session 13,
    # graph replay, issue9/run19_a/sweep_8k.log; every candidate at 8K within 0.84-0.86)
    (2, 8192, "bwd_ln"): {'bwd_block_m': 1, 'bwd_warps': 16, 'bwd_progs_per_sm': 1, 'bwd_stages': 3, 'bwd_max_single': 65536,
                          'bwd_pair_sum': 1},
    (4, 1024, "bwd"): {'bwd_block_m': 4, 'bwd_warps': 4, 'bwd_progs_per_sm': 2, 'bwd_stages': 2, 'bwd_max_single': 65536},  # 0.89 of copy (0.86 before)
    # 4096, both norms: 2 rows x 16 warps with one-row accumulators (and LayerNorm's pair sum): LayerNorm 0.75 -> 0.85,
    # RMSNorm 0.75 -> 0.87 (session 7, issue9/run9_norm_variants/, run9_rms_variants/)
    (2, 4096, "bwd"): {'bwd_block_m': 2, 'bwd_warps': 16, 'bwd_progs_per_sm': 1, 'bwd_stages': 3, 'bwd_max_single': 65536,
                       'bwd_acc_rows': 1, 'bwd_pair_sum': 1},
    (2, 4096, "fwd"): {'fwd_block_m': 1, 'fwd_warps': 4, 'fwd_max_single': 65536},  # 0.93 of copy
    (2, 65536, "bwd"): {'bwd_max_single': 1024, 'bwd_chunk': 4096, 'bwd_warps': 16, 'bwd_progs_per_sm': 1},  # 0.39 of copy
    (2, 65536, "fwd"): {'fwd_max_single': 1024, 'fwd_chunk': 4096, 'fwd_warps': 8, 'fwd_stages': 3},  # 0.59 of copy (0.53 before; session 5, issue9/run7_norm768/norm_wide.log)
    # 768 (GPT-2, ViT), LayerNorm only (RMSNorm at 768 ran 0.98 / 0.90 with the bucket's entries and lost
    # backward with these): session 5 sweep, benchmarks/results/issue9/run7_norm768/
    (2, 768, "fwd_ln"): {'fwd_block_m': 2, 'fwd_warps': 2},  # 0.87 of copy (0.80 before)
    (2, 768, "bwd_ln"): {'bwd_block_m': 4, 'bwd_warps': 4, 'bwd_progs_per_sm': 2, 'bwd_stages': 4, 'bwd_max_single': 65536,
                         'bwd_acc_rows': 1},  # 0.84 (0.77 without bwd_acc_rows; session 7, issue9/run9_norm_variants/)
    # LayerNorm-only backward: one-row dW/dB accumulators and the two row sums in one reduction (session 7 sweep,
    # benchmarks/results/issue9/run9_norm_variants/; RMSNorm keeps the bucket's entries, not swept with these)
    (2, 2048, "bwd_ln"): {'bwd_block_m': 2, 'bwd_warps': 8, 'bwd_progs_per_sm': 2, 'bwd_stages': 3, 'bwd_max_single': 65536,
                          'bwd_acc_rows': 1, 'bwd_pair_sum': 1},  # 0.84 of copy (0.79 before)
    (4, 1024, "fwd"): {'fwd_block_m': 4, 'fwd_warps': 8},  # 0.96 of copy
    (4, 16384, "fwd"): {'fwd_block_m': 2, 'fwd_warps': 16, 'fwd_max_single': 65536},  # 0.88 of copy
    (4, 4096, "bwd"): {'bwd_block_m': 1, 'bwd_warps': 16, 'bwd_progs_per_sm': 2, 'bwd_max_single': 65536},  # 0.90 of copy
    (4, 4096, "fwd"): {'fwd_block_m': 1, 'fwd_warps': 16, 'fwd_max_single': 65536},  # 0.97 of copy
    (4, 65536, "bwd"): {'bwd_max_single': 1024, 'bwd_chunk': 4096, 'bwd_warps': 16, 'bwd_progs_per_sm': 1},  # 0.53 of copy
    (4, 65536, "fwd"): {'fwd_max_single': 1024, 'fwd_chunk': 4096, 'fwd_warps': 8},  # 0.61 of copy
}


def _tuned(n_pow2: int, elem: int, part: str, n: int | None = None, is_rms: bool | None = None):
    """Lookup in _TUNED: an entry for the exact width n (e.g. 768) first, then its bucket n_pow2; at each, a
    LayerNorm-only entry (part "fwd_ln" / "bwd_ln") before the shared one when ``is_rms`` is False."""
    parts = (part + "_ln", part) if is_rms is False else (part,)
    for width in ((n, n_pow2) if n is not None else (n_pow2,)):
        for p in parts:
            t = _TUNED.get((elem, width, p))
            if t is not None:
                return lambda name, default: get_override(_CFG, name, t.get(name, default))
    return lambda name, default: get_override(_CFG, name, default)


def _fwd_config(n_pow2: int, elem: int, n: int | None = None, is_rms: bool | None = None) -> tuple[bool, int, int]:
    """(single_block, BLOCK_M or chunk, num_warps) for the forward of rows n wide (bucket n_pow2)."""
    ov = _tuned(n_pow2, elem, "fwd", n, is_rms)
    if n_pow2 <= ov("fwd_max_single", FWD_MAX_SINGLE[elem]):
        block_m = ov("fwd_block_m", max(1, FWD_TILE[elem] // n_pow2))
        warps = ov("fwd_warps", _warps_for(n_pow2, block_m))
        return True, block_m, warps
    return False, ov("fwd_chunk", FWD_CHUNK), ov("fwd_warps", FWD_CHUNK_WARPS)


def _fwd_stages(n_pow2: int, elem: int, n: int | None = None, is_rms: bool | None = None) -> int:
    """Software-pipelining depth of the wide-row forward's chunk loops (tl.range num_stages): 0/1 = none."""
    return _tuned(n_pow2, elem, "fwd", n, is_rms)("fwd_stages", 0)


def _bwd_stages(n_pow2: int, elem: int, n: int | None = None, is_rms: bool | None = None) -> int:
    """Software-pipelining depth (Triton's num_stages) of the backward's row loop: 0 = Triton's default."""
    return _tuned(n_pow2, elem, "bwd", n, is_rms)("bwd_stages", 0)


def _bwd_variants(n_pow2: int, elem: int, n: int | None = None, is_rms: bool | None = None) -> tuple[bool, bool]:
    """(ACC_ROWS, PAIR_SUM) of the single-block backward (see _norm_bwd_kernel): both off unless tuned."""
    ov = _tuned(n_pow2, elem, "bwd", n, is_rms)
    return bool(ov("bwd_acc_rows", 0)), bool(ov("bwd_pair_sum", 0))


def _bwd_config(n_pow2: int, elem: int, n: int | None = None, is_rms: bool | None = None) -> tuple[bool, int, int, int]:
    """(single_block, BLOCK_M or chunk, num_warps, programs per SM) for the backward."""
    ov = _tuned(n_pow2, elem, "bwd", n, is_rms)
    if n_pow2 <= ov("bwd_max_single", BWD_MAX_SINGLE[elem]):
        block_m = ov("bwd_block_m", max(1, BWD_TILE[elem] // n_pow2))
        warps = ov("bwd_warps", 16 if n_pow2 >= 4096 else _warps_for(n_pow2, block_m))
        per_sm = BWD_NARROW_PROGS_PER_SM if n_pow2 <= 1024 else BWD_PROGS_PER_SM
        return True, block_m, warps, ov("bwd_progs_per_sm", per_sm)
    return False, ov("bwd_chunk", BWD_CHUNK), ov("bwd_warps", BWD_CHUNK_WARPS), ov("bwd_progs_per_sm", BWD_CHUNK_PROGS_PER_SM)


def _reduce_config(n: int, g: int) -> tuple[int, int, int, int, bool]:
    """(BLOCK_N columns per program, BLOCK_G rows per iteration, num_warps, STAGES, EVICT_FIRST) of the dW / dB
    reduce over ``g`` partial rows of ``n`` columns (EVICT_FIRST: its loads with L2 policy evict_first; config_override
    key reduce_evict_first, a session-21 diagnostic)."""
    block_n = min(get_override(_CFG, "reduce_block_n", REDUCE_BLOCK_N), 1 << max(0, n - 1).bit_length())
    block_g = min(get_override(_CFG, "reduce_block_g", max(1, REDUCE_TILE // block_n)), 1 << max(0, g - 1).bit_length())
    return (block_n, block_g, get_override(_CFG, "reduce_warps", REDUCE_WARPS),
            get_override(_CFG, "reduce_stages", REDUCE_STAGES), bool(get_override(_CFG, "reduce_evict_first", False)))


def _bwd_persist_pack() -> bool:
    """LayerNorm's persistent backward: both partial row sums in one published word (see BWD_PERSIST_PACK)."""
    return bool(get_override(_CFG, "bwd_persist_pack", BWD_PERSIST_PACK))


def _bwd_persist_config(n_pow2: int, elem: int, is_rms: bool = False) -> tuple[int, int, int, int, bool] | None:
    """(BLOCK_N piece, num_warps, programs per SM, STAGES, HOLD) of the persistent wide-row backward, or None (off)."""
    entry = BWD_PERSIST.get((elem, n_pow2))
    if not get_override(_CFG, "bwd_persist", entry is not None):
        return None
    held = BWD_PERSIST_HOLD.get((elem, n_pow2, bool(is_rms)))
    hold = bool(get_override(_CFG, "bwd_persist_hold", held is not None))
    block, warps, per_sm, stages = (held if hold and held is not None else entry) or BWD_PERSIST_DEFAULT
    return (get_override(_CFG, "bwd_persist_block", block), get_override(_CFG, "bwd_persist_warps", warps),
            get_override(_CFG, "bwd_persist_per_sm", per_sm), get_override(_CFG, "bwd_persist_stages", stages), hold)


def _bwd_gluon(elem: int, n_pow2: int, is_rms: bool) -> GluonVariant | None:
    """The form of the Gluon row backward (ops/layer_norm_gluon.py) that takes an eager call it supports, else None:
    BWD_GLUON, then config_override bwd_gluon and bwd_gluon_<field> (GluonVariant's fields)."""
    entry = BWD_GLUON.get((elem, n_pow2, is_rms))
    if not get_override(_CFG, "bwd_gluon", entry is not None):
        return None
    entry = entry or GluonVariant()
    return GluonVariant(*(type(v)(get_override(_CFG, f"bwd_gluon_{k}", v)) for k, v in entry._asdict().items()))


# Programmatic dependent launch of the single-block backward's kernels (eager and traced launches alike; Triton's
# launch_pdl): 1 = the dW / dB reduce launches as a dependent of the row kernel (which triggers it after its rows) and
# waits for it on the device (griddepcontrol.wait), so its launch overlaps the row kernel's tail instead of following
# it (session 20's timeline: 1.1-1.5 us between the two, issue9/run27_a/diag_norm_timeline.txt); 2 = the row kernel
# too, after whatever precedes it (it waits for it first).  sm_90 and newer; the C++ fast path launches these with
# cuLaunchKernelEx; traced launches (torch.compile) are plain.  Session 20, bf16 2^26 elements, default / 1 / 2, same
# run (issue9/run27_g/sweep_pdl.txt; do_bench fwd+bwd minus fwd, the clean samples): LayerNorm 768 0.841 / 0.856 /
# 0.870, 1K 0.854-0.866 / 0.867 / 0.880, 2K 0.839-0.841 / 0.846 / 0.860, 4K 0.839-0.856 / - / 0.870; RMSNorm 2K 0.878-0.880
# / 0.884 / 0.892, 4K 0.865 / 0.887 / 0.892, 8K 0.859-0.874 / 0.876 / 0.883; graph replay +0.5-1 % with 2 (run27_f,
# run27_g).  config_override key bwd_pdl.
BWD_PDL = 2


def _bwd_pdl() -> int:
    return int(get_override(_CFG, "bwd_pdl", BWD_PDL))
