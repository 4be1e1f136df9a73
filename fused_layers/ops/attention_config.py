"""Tuning table of the attention kernels (fused_layers/ops/attention.py): data, not code paths.

``config_override("attention", ...)`` (tests, sweeps) takes precedence over every entry;
FUSED_LAYERS_ATTENTION_TABLE=<json> replaces entries, FUSED_LAYERS_ATTENTION_AUTOTUNE=1 autotunes.
"""

from __future__ import annotations

import json
import os

import torch

from ._common import INTERPRET, get_override

# Candidate configs, (BLOCK_M, BLOCK_N, num_warps, num_stages) per head-dim bucket (BLOCK_D <= 64, 128,
# 256); the first of each is the default (see _TABLE). Chosen without GPU timings (none could be taken
# for this change): every one compiles for sm_90 with Triton (wgmma "HGMMA" + cp.async "LDGSTS" in the
# SASS), and the defaults are the register-spill-free ones of a wider static scan (cuobjdump resource
# usage of AOT-compiled sm_90 cubins; e.g. dK/dV at D=128 with (64, 128, 8, 2) spills 400 bytes a
# thread, (32, 128, 8, 2) none non-causal). ``bench_attention.py --sweep`` times them on a GPU.
_TUNE = {
    "fwd": {
        64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 4)],
        128: [(128, 128, 8, 3), (128, 64, 8, 4), (128, 64, 8, 3), (64, 64, 4, 3)],
        256: [(64, 64, 4, 2), (64, 32, 4, 2), (128, 32, 8, 2)],
    },
    "dkdv": {
        64: [(64, 128, 8, 3), (32, 128, 8, 3), (32, 64, 4, 4), (64, 64, 4, 3)],
        128: [(32, 128, 8, 2), (32, 64, 8, 3), (16, 128, 8, 3), (64, 64, 8, 2)],
        256: [(32, 64, 4, 2), (16, 64, 4, 2), (32, 32, 4, 2)],
    },
    "dq": {
        64: [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 4)],
        128: [(128, 64, 8, 3), (128, 32, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3)],
        256: [(64, 32, 4, 2), (64, 16, 4, 2), (32, 32, 4, 2)],
    },
}
# float32 operands take twice the shared memory: small tiles only.
_TUNE_FP32 = {"fwd": [(64, 64, 4, 2), (64, 32, 4, 2)], "dkdv": [(32, 64, 4, 2), (16, 64, 4, 2)], "dq": [(64, 32, 4, 2), (32, 32, 4, 2)]}


def _bucket_configs(kind: str, block_d: int, dtype: torch.dtype) -> list[tuple[int, int, int, int]]:
    if dtype == torch.float32:
        return _TUNE_FP32[kind] if block_d <= 128 else [c for c in _TUNE_FP32[kind] if c[0] * c[1] <= 2048] or [(16, 32, 4, 1)]
    return _TUNE[kind][64 if block_d <= 64 else 128 if block_d <= 128 else 256]


# The configs used by default per (kernel, head-dim bucket, causal) for 2-byte dtypes: offline tuning,
# no first-call tuning, nothing keyed on the sequence length; buckets missing here (D=256) use the
# first entry of _TUNE. FUSED_LAYERS_ATTENTION_AUTOTUNE=1 autotunes over _TUNE's bucket instead;
# FUSED_LAYERS_ATTENTION_TABLE=<json> replaces entries (written by the sweep: {"fwd,128,1": [m, n, w, s]}).
# Measured on the H200 (benchmarks/bench_attention.py --sweep, 2026-11-30; benchmarks/results/attn_sweep_h200.json):
# the fastest (BLOCK_M, BLOCK_N, num_warps, num_stages) per (kernel, head-dim bucket, causal), bf16.
_TABLE: dict[tuple[str, int, bool], tuple[int, int, int, int]] = {
    ("dkdv", 128, False): (64, 128, 8, 3),
    ("dkdv", 128, True): (64, 128, 8, 3),
    ("dkdv", 64, False): (32, 128, 4, 3),
    ("dkdv", 64, True): (64, 64, 4, 3),
    ("dq", 128, False): (128, 64, 8, 3),
    ("dq", 128, True): (128, 64, 8, 3),
    ("dq", 64, False): (128, 64, 8, 3),
    ("dq", 64, True): (64, 64, 4, 3),
    ("fwd", 128, False): (128, 64, 8, 3),
    ("fwd", 128, True): (128, 64, 8, 3),
    ("fwd", 64, False): (128, 64, 8, 4),
    ("fwd", 64, True): (128, 64, 8, 3),
}
_AUTOTUNE = os.environ.get("FUSED_LAYERS_ATTENTION_AUTOTUNE", "0") == "1"
if os.environ.get("FUSED_LAYERS_ATTENTION_TABLE"):
    with open(os.environ["FUSED_LAYERS_ATTENTION_TABLE"]) as _f:
        for _k, _v in json.load(_f).items():
            _kind, _bd, _c = _k.split(",")
            _TABLE[(_kind, int(_bd), _c == "1")] = tuple(_v)


def _config(kind: str, block_d: int, causal: bool, dtype: torch.dtype) -> dict | None:
    """Launch config of kernel ``kind`` ("fwd", "dkdv", "dq"); None means: use the autotuner.

    ``config_override("attention", block_m=.., block_n=.., num_warps=.., num_stages=..)`` (or the
    per-kernel ``fwd_block_m``, ``dq_num_warps``, ...) forces values (tests, the sweep); the interpreter
    uses 16 x 16 tiles so that small tests span several of them.
    """

    def ov(name, default):
        return get_override("attention", f"{kind}_{name}", get_override("attention", name, default))

    if INTERPRET:
        base = (16, 16, 4, 2)
    elif _AUTOTUNE and not any(ov(n, 0) for n in ("block_m", "block_n")):
        return None
    else:
        bucket = 64 if block_d <= 64 else 128 if block_d <= 128 else 256
        if dtype == torch.float32:
            base = _bucket_configs(kind, block_d, dtype)[0]
        else:
            base = _TABLE.get((kind, bucket, bool(causal)), _TUNE[kind][bucket][0])
    return {
        "BLOCK_M": ov("block_m", base[0]),
        "BLOCK_N": ov("block_n", base[1]),
        "num_warps": ov("num_warps", base[2]),
        "num_stages": ov("num_stages", base[3]),
    }


# Hopper variants (issue 13), measured on the H200 (benchmarks/results/issue13/attention_variants.md, clean
# timing, bf16, H=16, B*S=16384).  One is kept:
#   bwd_tma   backward: the Q and dO tiles of the dK/dV kernel through TMA tensor descriptors (the dQ
#             kernel runs after as usual).  -1 = auto (the default: _bwd_tma_auto below), 1 = on, 0 = off.
# Removed after the measurements: fwd_tma / fwd_ws / fwd_persistent (a forward through TMA descriptors,
# warp-specialized, persistent: slower than the default forward in every case, e.g. D64 S4096 408 TFLOP/s
# default, 382 TMA, 312 persistent; the warp-specialized 4-warp forms gave wrong output at D64 S1024) and
# bwd_dq_atomic (dQ by fp32 atomics in the dK/dV kernel: slower everywhere, e.g. D64 S4096 272 vs 365).
# ``config_override("attention", bwd_tma=1)`` or FUSED_LAYERS_ATTENTION_VARIANTS="bwd_tma=0" set it.
# dropout_bits: random bits per attention element for dropout, 8 (the default: one Philox call per 16 keys,
# p in steps of 1/256 as FlashAttention-2's dropout, which SDPA's flash backend runs) or 16 (p in steps of
# 2^-16, twice the Philox work).  p is rounded to the nearest step and the kept values are scaled by
# 1 / (1 - rounded p) (attention._dropout_scale), so the output's expectation is exact; p < 1/512 drops
# nothing at 8 bits.  Measured on the H200 (benchmarks/results/issue11/run3/dropout_h200.md), fwd+bwd at
# p = 0.1, 16 bits -> 8 bits: GPT-2 shape 0.416 -> 0.393 ms, Llama shape 1.018 -> 0.977, ViT shape 0.619
# -> 0.437, S4096 D128 causal 4.677 -> 4.510.  The no-spill dK/dV configs of the static scan were slower.
# fwd_fold_scale: the forward applies the softmax scale inside exp2's argument (one FMA per score) and to
# the row max, instead of multiplying every score first (no key bias only).  On by default: faster in all
# 12 cases of the H200 sweep, +1% to +10% (D128 S16384 443 -> 489 TFLOP/s; D64 S4096 405 -> 419)
# (benchmarks/results/issue13/run4_fold/attention_variants.md); BLOCK_N 128 with it gained <= 1% at
# S16384 only and lost at S1024, so the table keeps 64.
# Tried and removed: conditional rescaling in the forward (FlashAttention-4's: rescale acc and l only
# when a row max grew by > 2^8, a block-wide max per tile instead): slower in all 12 cases of the H200
# sweep, 0.63-0.94 of the default (D64 S4096 causal 367 -> 232 TFLOP/s; likely the block-wide branch and
# the max compare cost more than the multiplies they skip in a 2-warpgroup kernel)
# (benchmarks/results/issue13/run6_variants/).
# bwd_dq_reduce (off: measured slower): the dK/dV kernel also accumulates dQ = scale * dS K in an fp32
# buffer by TMA reduce-add (FlashAttention-3's dQ accumulation) and the dQ kernel does not run: 10 matmul
# units (B*H*S^2*D) of backward work instead of 14 (ncu, issue 13).  Dense layouts with D a multiple of
# 16; costs a zeroed fp32 [B, H, S, D] buffer and a cast.  H200 sweep (run6_variants): 0.76-1.05 of the
# default backward: ahead only at causal S16384 (D64 358 -> 375, D128 410 -> 411 TFLOP/s) and S4096 D128
# causal (346 -> 347); likely the reduce-adds of every key-block program to the same dQ rows serialize where
# the dQ kernel's recompute runs at full matmul rate.  Kept as an opt-in for long causal sequences.
# dropout_rounds: Philox-4x32 rounds per call of the dropout mask, 10 (the default, as curand's
# Philox4_32_10 and FlashAttention's) or down to 7, which Random123's authors report still passes
# TestU01's BigCrush ("crush-resistant"; they keep 10 for a safety margin).  The mask is most of dropout's
# cost (issue 11: +46-92% on attention's time at p = 0.1); 7 rounds do 30% less of its integer work.
# Not yet timed: a candidate of benchmarks/bench_attention_dropout.py.
# fwd_gluon: the forward of eager dense calls that ops/attention_gluon.py takes (bf16 / fp16 (B, H, S, D) contiguous,
# D 64 / 128, Sq == Sk, S a multiple of its tiles, no mask, no dropout, no GQA) runs a Gluon kernel (TMA ring, FA3's
# intra-warpgroup overlap; the ping-pong of two consumer warpgroups); everything else, and every traced call, stays on
# the Triton kernels.  -1 (default) = the kernel attention_gluon.fwd_kernel picks per (D, causal, S) (FWD_KERNEL,
# FWD_PERSIST_MAX_S); 1 = the one-warpgroup kernel; 2 = the ping-pong where S is a multiple of 128; 3 = the ping-pong on
# a persistent grid (one program an SM), same condition; 0 = off.  Session 14 (issue13/run20_a/): the
# ping-pong 1.00-1.13x cuDNN at D128 S >= 4K (0.91-0.92 at S1K), 1.29-1.35x the Triton forward.
# bwd_gluon_dkdv: the backward's dK / dV kernel in Gluon (one warpgroup a CTA, a TMA ring of Q / dO, asynchronous
# wgmma groups overlapping the elementwise work) for the calls the Gluon forward takes (and dO contiguous).  -1
# (default) = where attention_gluon.DKDV_MAX_S says it won (session 14: D128 1.08-1.17x the Triton backward; D64 only
# to S 4K); 1 = always; 0 = off.
# bwd_gluon_dq: the dQ kernel in Gluon after the Gluon dK / dV kernel (else the Triton dQ kernel).  Same values.
# bwd_gluon_gqa: the Gluon dK / dV kernel also takes grouped-query attention (each program sums the G query heads of
# its key / value head) and k / v in a layout of their own, wherever bwd_gluon_dkdv takes the call.  -1 (default) /
# 1 = on, 0 = off.  Session 15 (issue13/run22_d/): the table's GQA case (Hq32 Hkv8 B4 S4096 D128 causal) backward 382
# TFLOP/s against 340 on the Triton kernels (Flex 340, cuDNN 455).
# bwd_gluon_fused_dq: wherever the Gluon dK / dV kernel runs, it also computes dQ (dS through shared memory, dQ_i = dS_i
# K by wgmma, added into a zeroed fp32 buffer by atomics), so no dQ kernel runs (5 matmul passes instead of 7, as
# cuDNN's backward), then dQ is cast into q's layout.  -1 = where attention_gluon.FUSED_DQ_MAX_S says it won, 1 = always,
# 0 = off (default: session 17 measured it at 0.68-0.88x of the split backward, the atomics' own cost; see there).
_VARIANTS: dict[str, int] = {"bwd_tma": -1, "dropout_bits": 8, "dropout_rounds": 10, "fwd_fold_scale": 1,
                             "bwd_dq_reduce": 0, "fwd_gluon": -1, "bwd_gluon_dkdv": -1, "bwd_gluon_dq": 0,
                             "bwd_gluon_gqa": -1, "bwd_gluon_fused_dq": 0}
if os.environ.get("FUSED_LAYERS_ATTENTION_VARIANTS"):
    for _kv in os.environ["FUSED_LAYERS_ATTENTION_VARIANTS"].split(","):
        _n, _, _val = _kv.partition("=")
        if _n.strip() not in _VARIANTS:
            raise ValueError(f"FUSED_LAYERS_ATTENTION_VARIANTS: unknown variant {_n!r}; known: {sorted(_VARIANTS)}")
        _VARIANTS[_n.strip()] = int(_val or 1)


def _variant(name: str) -> int:
    """The value of variant ``name`` (0 = off, 1 = on, -1 = auto): config_override first, then _VARIANTS."""
    return int(get_override("attention", name, _VARIANTS[name]))


def _dropout_bits() -> int:
    """Random bits per element of the attention dropout mask: 16 or 8 (``dropout_bits``)."""
    bits = _variant("dropout_bits")
    if bits not in (8, 16):
        raise ValueError(f"fused_attention: config 'dropout_bits' must be 8 or 16, got {bits}")
    return bits


def _dropout_code() -> int:
    """The kernels' HAS_DROPOUT constexpr: bits per element | Philox rounds << 8 (``dropout_rounds``, 7-10)."""
    rounds = _variant("dropout_rounds")
    if not 7 <= rounds <= 10:
        raise ValueError(f"fused_attention: config 'dropout_rounds' must be 7 to 10, got {rounds}")
    return _dropout_bits() | (rounds << 8)


# Where bwd_tma beat the default backward on the H200 (TFLOP/s of the backward, bwd_tma vs default):
#   D64  S4096  non-causal 372 vs 365, causal 321 vs 309;  D64  S16384 non-causal 380 vs 373, causal 355 vs 342;
#   D128 S4096  non-causal 401 vs 384;                      D128 S16384 non-causal 420 vs 404
# (an earlier, contended sweep agreed).  It lost at S1024 (D64 non-causal 319 vs 326) and at D128 causal
# (S4096 309 vs 351, S16384 354 vs 402).  Only dense bf16 at D 64 / 128 was timed, so auto stays inside what
# was measured: fp16, float32, varlen and the other head-dim buckets run the default kernels (force with 1).
BWD_TMA_MIN_SEQLEN_K = 4096


def _bwd_tma_auto(dtype: torch.dtype, max_seqlen_k: int, causal: bool, block_d: int, has_tma: bool,
                  interpret: bool | None = None, varlen: bool = False) -> bool:
    """bwd_tma's auto rule: on iff the installed Triton has device-side descriptors, not under the
    interpreter, dense (not varlen) bf16, seqlen_k >= 4096, and head-dim bucket 64, or 128 when not causal."""
    if interpret is None:
        interpret = INTERPRET
    return (has_tma and not interpret and not varlen and dtype == torch.bfloat16
            and max_seqlen_k >= BWD_TMA_MIN_SEQLEN_K and (block_d == 64 or (block_d == 128 and not causal)))


def _use_bwd_tma(dtype: torch.dtype, max_seqlen_k: int, causal: bool, block_d: int, has_tma: bool,
                 varlen: bool = False) -> bool:
    """Whether a backward plan asks for the bwd_tma dK/dV kernel: the knob (1 on, 0 off), else the auto
    rule.  Forced on it still needs descriptors (``has_tma``); the plan also checks the strides."""
    v = _variant("bwd_tma")
    if v >= 0:
        return bool(v) and has_tma
    return _bwd_tma_auto(dtype, max_seqlen_k, causal, block_d, has_tma, varlen=varlen)
