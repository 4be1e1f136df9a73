"""The default kernel configurations that ``python -m benchmarks sass`` compiles, one list per op.

Each case is what a default launch on an H200 compiles: the kernel, its constexprs as the launcher's plan sets them
from the op's config table, the argument types, and the specialization Triton's launcher derives from realistic
runtime integers (a value of 1 becomes the constant 1, a multiple of 16 gets 16-divisibility, ``None``: an argument
that is not specialized).  The configurations are written out here rather than read from the config tables, so the
list pins the compiled code: a change of a default is a change here too, and shows as a changed case.

Names say what selects the case (direction, kernel form, dtype, width or head dim, and the condition that routes a
launch there).  Gluon cases (``sass.Case.gluon``) compile with the Triton the Gluon kernels are written for (3.6).
"""

from __future__ import annotations

from typing import Iterator

from fused_layers.ops import attention as attn
from fused_layers.ops import attention_gluon as attn_gluon
from fused_layers.ops import cross_entropy as ce
from fused_layers.ops import cross_entropy_gluon as ce_gluon
from fused_layers.ops import gated_activation as gated
from fused_layers.ops import layer_norm as ln
from fused_layers.ops import layer_norm_gluon as ln_gluon
from fused_layers.ops import residual_norm as resn
from fused_layers.ops import rope
from fused_layers.ops import softmax as sm

from .sass import Case

PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


def p2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def launch(op: str, name: str, fn, constexprs: dict, ptrs: dict, ints: dict, floats=(), types=None, **options) -> Case:
    """A case from a launch's runtime values: ``ptrs`` {arg: "*bf16"}, ``ints`` {arg: value, or None where the
    kernel does not specialize it}; ``floats`` are fp32 scalars."""
    ty = dict(ptrs)
    ty.update({f: "fp32" for f in floats})
    ty.update(types or {})
    ones, div = [], []
    for k, v in ints.items():
        if v is None:
            continue
        if v == 1:
            ones.append(k)
        elif v % 16 == 0:
            div.append(k)
        if abs(v) >= 2**31:
            ty[k] = "i64"
    return Case(op, name, fn, constexprs, ty, tuple(ones), tuple(div), **options)


def balanced(n: int, block: int) -> tuple[int, int]:
    """(pieces, piece width) of a persistent launch: a row cut into equal pieces of whole 64-column steps."""
    splits = cdiv(n, block)
    align = min(64, block)
    return splits, cdiv(cdiv(n, splits), align) * align


def _gluon_layout(bits: int, rank: int) -> str:
    from triton.experimental.gluon import language as gl

    return repr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=rank))


# --------------------------------------------------------------------------------------------------
# Softmax (ops/softmax.py, softmax_config.py): 2^26 elements, rows contiguous
# --------------------------------------------------------------------------------------------------
def _rows(n: int, prefix: str, so: int | None = None) -> dict:
    """Strides of a (M, n) view over its last dim: outer ``so`` (default n), inner 0, column 1."""
    return {f"s{prefix}o": n if so is None else so, f"s{prefix}i": 0, f"s{prefix}n": 1}


def _sm_single_fwd(name, dt, n, block_m, warps, packed=False, maxnreg=None):
    ints = dict(M=(1 << 26) // p2(n) if n >= 256 else 8192, N=n, INNER=1, **_rows(n, "x"), **_rows(n, "y"))
    return launch("softmax", f"fwd single {dt} {n} {name}".strip(), sm._softmax_fwd_kernel,
                  dict(BLOCK_M=block_m, BLOCK_N=p2(n), PACKED=packed), {"X": PTR[dt], "Y": PTR[dt]}, ints,
                  num_warps=warps, maxnreg=maxnreg)


def _sm_single_bwd(name, dt, n, block_m, warps):
    ints = dict(M=(1 << 26) // p2(n), N=n, INNER=1, **_rows(n, "y"), **_rows(n, "d"), **_rows(n, "g"))
    return launch("softmax", f"bwd single {dt} {n} {name}".strip(), sm._softmax_bwd_kernel,
                  dict(BLOCK_M=block_m, BLOCK_N=p2(n)), {"Y": PTR[dt], "DY": PTR[dt], "DX": PTR[dt]}, ints,
                  num_warps=warps)


def _sm_piecewise(name, direction, dt, n, block, piece, warps, so=None):
    piece = min(cdiv(piece, block) * block, cdiv(n, block) * block)
    splits = cdiv(n, piece)
    m = (1 << 26) // p2(n)
    cx = dict(SPLITS_P2=p2(splits), BLOCK_N=block)
    label = f"{direction} piecewise {dt} {n} {name}".strip()
    if direction == "fwd":
        ints = dict(M=m, N=n, INNER=1, **_rows(n, "x", so), **_rows(n, "y"), SPLITS=splits, PIECE=piece)
        return launch("softmax", label, sm._softmax_fwd_wide_kernel, cx,
                      {"X": PTR[dt], "Y": PTR[dt], "STATS": "*fp32", "COUNT": "*i32"}, ints, num_warps=warps)
    ints = dict(M=m, N=n, INNER=1, **_rows(n, "y"), **_rows(n, "d"), **_rows(n, "g"), SPLITS=splits, PIECE=piece)
    return launch("softmax", label, sm._softmax_bwd_wide_kernel, cx,
                  {"Y": PTR[dt], "DY": PTR[dt], "DX": PTR[dt], "DOT": "*fp32", "COUNT": "*i32"}, ints,
                  num_warps=warps)


def _sm_persist(name, direction, dt, n, block, warps, stages, hold=False, vec_win=0, so=None, dso=None):
    """The persistent kernels of eager wide rows, PHASE 2 (one cooperative launch on the GPU)."""
    splits, piece = balanced(n + vec_win - 1 if vec_win else n, block)
    m = (1 << 26) // p2(n)
    cx = dict(SPLITS_P2=p2(splits), BLOCK_N=block, PHASE=2, STAGES=stages, VEC_WIN=vec_win)
    label = f"{direction} persistent {dt} {n} {name}".strip()
    if direction == "fwd":
        ints = dict(M=m, N=n, INNER=1, **_rows(n, "x", so), **_rows(n, "y"), SPLITS=splits, PIECE=piece,
                    GROUPS=None)
        return launch("softmax", label, sm._softmax_fwd_persist_kernel, cx,
                      {"X": PTR[dt], "Y": PTR[dt], "SLOTS": "*i64"}, ints, num_warps=warps)
    cx["HOLD"] = hold
    ints = dict(M=m, N=n, INNER=1, **_rows(n, "y"), **_rows(n, "d", dso), **_rows(n, "g"), SPLITS=splits,
                PIECE=piece, GROUPS=None)
    return launch("softmax", label, sm._softmax_bwd_persist_kernel, cx,
                  {"Y": PTR[dt], "DY": PTR[dt], "DX": PTR[dt], "SLOTS": "*i64"}, ints, num_warps=warps)


def softmax_cases() -> Iterator[Case]:
    # forward, single block: SINGLE_BLOCK by element size and width bucket (below 256 columns, 2048 // N rows)
    yield _sm_single_fwd("", "bf16", 64, 32, 4)
    yield _sm_single_fwd("", "bf16", 256, 8, 4)
    yield _sm_single_fwd("", "bf16", 1000, 2, 4)
    yield _sm_single_fwd("", "bf16", 4096, 2, 4)
    yield _sm_single_fwd("", "bf16", 8192, 1, 8)
    yield _sm_single_fwd("traced", "bf16", 16384, 1, 16)
    yield _sm_single_fwd("eager packed", "bf16", 16384, 1, 16, packed=True, maxnreg=40)
    yield _sm_single_fwd("traced", "bf16", 32768, 1, 16)
    yield _sm_single_fwd("", "fp16", 4096, 2, 4)
    yield _sm_single_fwd("", "fp32", 256, 8, 8)
    yield _sm_single_fwd("", "fp32", 2048, 1, 8)
    yield _sm_single_fwd("", "fp32", 32768, 1, 16)
    # backward, single block: SINGLE_BLOCK, SINGLE_BLOCK_BWD for fp32 32K (8 warps)
    yield _sm_single_bwd("", "bf16", 1024, 2, 4)
    yield _sm_single_bwd("", "bf16", 32768, 1, 16)
    yield _sm_single_bwd("", "fp32", 4096, 1, 16)
    yield _sm_single_bwd("", "fp32", 32768, 1, 8)
    # piece-wise, one launch: PIECEWISE for traced calls' wide rows and eager misaligned rows with no shared window
    yield _sm_piecewise("traced", "fwd", "bf16", 65536, 8192, 16384, 8)
    yield _sm_piecewise("traced", "fwd", "fp32", 65536, 8192, 8192, 8)
    yield _sm_piecewise("traced", "bwd", "bf16", 65536, 4096, 8192, 16)
    yield _sm_piecewise("traced", "bwd", "fp32", 65536, 4096, 4096, 16)
    yield _sm_piecewise("eager misaligned stride 50264", "fwd", "bf16", 50257, 8192, 16384, 8, so=50264)
    # forward, persistent (eager wide rows): PERSIST, PERSIST_BY_WIDTH, and the VEC8 window of misaligned rows
    yield _sm_persist("eager 2K x 2 warps", "fwd", "bf16", 32768, 2048, 2, 3)
    yield _sm_persist("eager", "fwd", "bf16", 65536, 4096, 4, 3)
    yield _sm_persist("eager", "fwd", "fp16", 262144, 4096, 4, 3)
    yield _sm_persist("eager register form", "fwd", "fp32", 65536, 2048, 4, 1)
    yield _sm_persist("eager smem form", "fwd", "fp32", 131072, 4096, 4, 3)
    yield _sm_persist("eager misaligned vec8 window 64", "fwd", "bf16", 50257, 4096, 4, 3, vec_win=64)
    yield _sm_persist("eager misaligned vec8 window 64", "fwd", "bf16", 32001, 2048, 2, 3, vec_win=64)
    yield _sm_persist("eager stride 50265 vec8 window 8", "fwd", "bf16", 50257, 4096, 4, 3, vec_win=8, so=50265)
    # backward, persistent (eager wide rows): PERSIST, HOLD_MIN_N, the VEC8 window
    yield _sm_persist("eager", "bwd", "bf16", 65536, 4096, 4, 3)
    yield _sm_persist("eager hold", "bwd", "bf16", 131072, 4096, 4, 3, hold=True)
    yield _sm_persist("eager hold", "bwd", "fp16", 100277, 4096, 4, 3, hold=True)
    yield _sm_persist("eager register form", "bwd", "fp32", 65536, 4096, 4, 1)
    yield _sm_persist("eager misaligned vec8 window 64", "bwd", "bf16", 50257, 4096, 4, 3, vec_win=64)
    yield _sm_persist("eager dy stride 50260 no window", "bwd", "bf16", 50257, 4096, 4, 3, dso=50260)


# --------------------------------------------------------------------------------------------------
# Cross-entropy and linear cross-entropy (ops/cross_entropy.py, cross_entropy_config.py): 8,192 rows
# --------------------------------------------------------------------------------------------------
def _ce_fwd(name, dt, c, block_m, block_n, warps, single, stages=1, grad=True, mean=True, weight=False,
            smooth=False, soft=False, row_scale=False, sxo=None):
    """_ce_fwd_kernel: the single block (the row in registers) or the stream (two passes, the second from L2)."""
    ptrs = {"X": PTR[dt], "T": PTR[dt] if soft else "*i64", "W": PTR[dt], "LOSS": "*fp32", "DX": PTR[dt],
            "DEN": "*fp32" if (mean and not soft) else PTR[dt], "RS": "*fp32" if row_scale else PTR[dt]}
    st = dict(sto=c, sti=0, stc=1) if soft else dict(sto=0, sti=0, stc=0)
    ints = dict(M=8192, C=c, INNER=1, sxo=c if sxo is None else sxo, sxi=0, sxc=1, **st, sdo=c, sdi=0, sdc=1,
                ignore_index=-100)
    cx = dict(BLOCK_M=block_m, BLOCK_N=block_n, SINGLE=single, SOFT=soft, HAS_WEIGHT=weight, SMOOTH=smooth,
              HAS_GRAD=grad, DEN_ON_DEVICE=mean and not soft, HAS_ROW_SCALE=row_scale, STAGES=stages)
    form = "single" if single else "stream"
    return launch("cross_entropy", f"fwd {form} {dt} {c} {name}".strip(), ce._ce_fwd_kernel, cx, ptrs, ints,
                  floats=("smoothing", "inv_den", "softcap"), num_warps=warps)


def _ce_persist(name, dt, c, block, warps, stages=4, weight=False, mean=True, row_scale=False, vec_win=0,
                sxo=None):
    """_ce_fwd_persist_kernel, the SMEM-pipelined form of 16-bit eager rows with a gradient, PHASE 2."""
    splits, piece = balanced(c + vec_win - 1 if vec_win else c, block)
    ptrs = {"X": PTR[dt], "T": "*i64", "W": PTR[dt], "LOSS": "*fp32", "DX": PTR[dt],
            "DEN": "*fp32" if mean else PTR[dt], "RS": "*fp32" if row_scale else PTR[dt], "SLOTS": "*i64"}
    ints = dict(M=8192, C=c, INNER=1, sxo=c if sxo is None else sxo, sxi=0, sxc=1, sdo=c, sdi=0, sdc=1,
                ignore_index=-100, SPLITS=splits, PIECE=piece, GROUPS=None)
    cx = dict(BLOCK_N=block, HAS_WEIGHT=weight, DEN_ON_DEVICE=mean, HAS_ROW_SCALE=row_scale, PHASE=2, STAGES=stages,
              VEC_WIN=vec_win)
    return launch("cross_entropy", f"fwd persistent {dt} {c} {name}".strip(), ce._ce_fwd_persist_kernel, cx, ptrs,
                  ints, floats=("inv_den",), num_warps=warps)


def _ce_tma(name, dt, c, weight, mean):
    """The Gluon TMA kernel holding the row in its ring: TMA_HOLD (SUB 16, BOX 256, NBUF 8, NOUT 1, 4 warps)."""
    desc = f"tensordesc<{dt}[1, 16, 256],{_gluon_layout(16 if dt != 'fp32' else 32, 3)}>"
    ptrs = {"X": PTR[dt], "T": "*i64", "W": PTR[dt], "DEN": "*fp32", "LOSS": "*fp32"}
    cx = dict(HAS_WEIGHT=weight, MEAN=mean, SUB=16, BOX=256, NBUF=8, NOUT=1, VEC=8)
    return launch("cross_entropy", f"fwd gluon tma {dt} {c} {name}".strip(), ce_gluon._ce_fwd_tma_kernel, cx, ptrs,
                  dict(M=8192, C=c, sx=c, ignore_index=-100), types={"x_desc": desc, "g_desc": desc}, num_warps=4)


def cross_entropy_cases() -> Iterator[Case]:
    # single block (the row in registers): SINGLE by width bucket, below 256 classes 4096 // C rows a program
    yield _ce_fwd("", "bf16", 10, 256, 16, 4, True)
    yield _ce_fwd("", "bf16", 256, 16, 256, 4, True)
    yield _ce_fwd("", "bf16", 1000, 4, 1024, 4, True)
    yield _ce_fwd("", "bf16", 4096, 1, 4096, 8, True)
    yield _ce_fwd("", "bf16", 16384, 1, 16384, 16, True)
    yield _ce_fwd("", "fp32", 16384, 1, 16384, 16, True)
    yield _ce_fwd("weight smoothing", "bf16", 4096, 1, 4096, 8, True, weight=True, smooth=True)
    yield _ce_fwd("soft targets", "fp32", 1000, 4, 1024, 4, True, soft=True)
    yield _ce_fwd("no grad", "bf16", 4096, 1, 4096, 8, True, grad=False)
    yield _ce_fwd("linear ce reduction none", "bf16", 4096, 1, 4096, 8, True, mean=False, row_scale=True)
    # stream, wider rows: STREAM (16-bit 4K x 8 warps x 4 stages; fp32 4K x 16 warps, a chunk prefetched)
    yield _ce_fwd("traced", "bf16", 50304, 1, 4096, 8, False, stages=4)
    yield _ce_fwd("", "fp32", 50304, 1, 4096, 16, False, stages=1)
    yield _ce_fwd("no grad", "bf16", 50304, 1, 4096, 8, False, stages=4, grad=False)
    yield _ce_fwd("weight smoothing", "bf16", 32000, 1, 4096, 8, False, stages=4, weight=True, smooth=True)
    yield _ce_fwd("stride 50264 no window", "bf16", 50257, 1, 4096, 8, False, stages=4, sxo=50264)
    # persistent, 16-bit eager rows with a gradient: PERSIST (4K x 4), PERSIST_BY_WIDTH up to 64K (2K x 2), VEC8
    yield _ce_persist("eager 2K x 2 warps", "bf16", 50304, 2048, 2)
    yield _ce_persist("eager", "bf16", 128256, 4096, 4)
    yield _ce_persist("eager weight sum", "fp16", 128256, 4096, 4, weight=True, mean=False)
    yield _ce_persist("linear ce reduction none", "bf16", 50304, 2048, 2, mean=False, row_scale=True)
    yield _ce_persist("eager misaligned vec8 window 64", "bf16", 50257, 2048, 2, vec_win=64)
    yield _ce_persist("eager stride 100285 vec8 window 8", "bf16", 100277, 4096, 4, vec_win=8, sxo=100285)
    # Gluon TMA, the row held in shared memory: TMA_HOLD (16-bit rows of at most 32,768 classes, a multiple of 256)
    if ce_gluon.HAS_GLUON:
        yield _ce_tma("eager mean", "bf16", 32000, False, True)
        yield _ce_tma("eager weight sum", "bf16", 32768, True, False)
        yield _ce_tma("eager mean", "fp16", 24576, False, True)
    # small kernels: the mean's denominator, the loss sum, the in-place gradient scale
    yield launch("cross_entropy", "den int64 targets", ce._ce_den_kernel, dict(HAS_WEIGHT=False, BLOCK=1024),
                 {"T": "*i64", "W": "*i64", "DEN": "*fp32"}, dict(M=None, C=None, ignore_index=None))
    yield launch("cross_entropy", "den uint8 targets weight", ce._ce_den_kernel, dict(HAS_WEIGHT=True, BLOCK=1024),
                 {"T": "*u8", "W": "*bf16", "DEN": "*fp32"}, dict(M=None, C=None, ignore_index=None))
    yield launch("cross_entropy", "loss sum bf16", ce._ce_sum_kernel, dict(BLOCK=1024),
                 {"LOSS": "*fp32", "OUT": "*bf16"}, dict(M=None))
    yield launch("cross_entropy", "grad scale bf16", ce._ce_scale_kernel, dict(BLOCK=4096),
                 {"G": "*bf16", "GO": "*bf16"}, dict(N=None), num_warps=8)


# --------------------------------------------------------------------------------------------------
# LayerNorm / RMSNorm (ops/layer_norm.py, layer_norm_config.py): 8,192 contiguous rows, 132 SMs
# --------------------------------------------------------------------------------------------------
def _norm(name, fn, cx, types, divisible, warps, stages=None) -> Case:
    return Case("norm", name, fn, cx, types, (), divisible, num_warps=warps, num_stages=stages)


def _norm_fwd(name, dt, n, rms, block_m, warps, has_b=None, store=True, wdt=None, ydt=None, cast=False):
    """The single-block forward: BLOCK_M rows of the width bucket n in registers."""
    has_b = (not rms) if has_b is None else has_b
    wdt = wdt or dt
    types = dict(X=f"*{dt}", Y=f"*{ydt or dt}", W=f"*{wdt}", B=f"*{wdt if has_b else dt}",
                 STATS="*fp32" if store else f"*{dt}", eps="fp32")
    cx = dict(IS_RMS=rms, HAS_W=True, HAS_B=has_b, STORE_STATS=store, BLOCK_M=block_m, BLOCK_N=n,
              CAST_BEFORE_W=cast)
    return _norm(name, ln._norm_fwd_kernel, cx, types, ("M", "N", "sx"), warps)


def _norm_fwd_chunks(name, dt, rms, chunk, warps, stages, wdt=None, ydt=None, cast=False):
    """The wide-row forward: a program a row, Welford over chunks."""
    wdt = wdt or dt
    types = dict(X=f"*{dt}", Y=f"*{ydt or dt}", W=f"*{wdt}", B=f"*{wdt if not rms else dt}", STATS="*fp32",
                 eps="fp32")
    cx = dict(IS_RMS=rms, HAS_W=True, HAS_B=not rms, STORE_STATS=True, BLOCK_N=chunk, CAST_BEFORE_W=cast,
              STAGES=stages)
    return _norm(name, ln._norm_fwd_loop_kernel, cx, types, ("M", "N", "sx"), warps)


def _norm_bwd(name, dt, n, rms, block_m, warps, stages, acc_rows=False, pair_sum=False, pdl=True, has_w=True,
              has_b=None, wdt=None, cast=False):
    """The single-block backward; ``stages`` 0: a width the rule covers (Triton's default num_stages)."""
    has_b = (not rms) if has_b is None else has_b
    wdt = wdt if has_w else dt
    types = dict(X=f"*{dt}", DY=f"*{dt}", DX=f"*{dt}", W=f"*{wdt or dt}", STATS="*fp32", PARTS="*fp32")
    cx = dict(IS_RMS=rms, HAS_W=has_w, HAS_B=has_b, BLOCK_M=block_m, BLOCK_N=n, CAST_BEFORE_W=cast,
              STAGES=max(1, stages), ACC_ROWS=acc_rows, PAIR_SUM=pair_sum and not rms, PDL_WAIT=pdl,
              PDL_TRIGGER=pdl and (has_w or has_b))
    return _norm(name, ln._norm_bwd_kernel, cx, types, ("M", "N", "sx", "sdy", "ROWS_PER_PROG"), warps,
                 stages or None)


def _norm_bwd_two_pass(name, dt, rms, chunk, warps) -> list[Case]:
    """The wide-row backward in two passes: the row sums, then the column chunks."""
    stats = _norm(f"{name} row sums", ln._norm_bwd_rowstats_kernel, dict(IS_RMS=rms, HAS_W=True, BLOCK_N=chunk),
                  dict(X=f"*{dt}", DY=f"*{dt}", W=f"*{dt}", STATS="*fp32", C="*fp32"), ("M", "N", "sx", "sdy"),
                  warps)
    loop = _norm(f"{name} chunks", ln._norm_bwd_loop_kernel,
                 dict(IS_RMS=rms, HAS_W=True, HAS_B=not rms, BLOCK_N=chunk, CAST_BEFORE_W=False),
                 dict(X=f"*{dt}", DY=f"*{dt}", DX=f"*{dt}", W=f"*{dt}", STATS="*fp32", PARTS="*fp32", C="*fp32"),
                 ("M", "N", "sx", "sdy", "ROWS_PER_PROG"), warps)
    return [stats, loop]


def _norm_persist(name, dt, rms, block, warps, hold, splits, cast=False, wdt=None):
    """The one-read wide-row backward: persistent programs exchanging row sums, PHASE 2, PERSIST_STAGES 3."""
    types = dict(X=f"*{dt}", DY=f"*{dt}", DX=f"*{dt}", W=f"*{wdt or dt}", STATS="*fp32", PARTS="*fp32", SLOTS="*i64")
    cx = dict(IS_RMS=rms, HAS_W=True, HAS_B=not rms, BLOCK_N=block, PHASE=2, CAST_BEFORE_W=cast, STAGES=3,
              HOLD=hold)
    div = ("M", "N", "sx", "sdy", "PIECE") + (("SPLITS",) if splits % 16 == 0 else ())
    return _norm(name, ln._norm_bwd_persist_kernel, cx, types, div, warps)


def _norm_gluon(name, dt, n, rms, has_w=True, has_b=None):
    """The Gluon row backward (BWD_GLUON): a row in shared memory through TMA, 16 warps, one CTA an SM."""
    has_b = (not rms) if has_b is None else has_b
    bits = 32 if dt == "fp32" else 16
    r = n // ln_gluon.BOX
    box = ln_gluon.box_rows(r)  # the descriptors' box: sub-rows a TMA copy

    def desc(block):
        return f"tensordesc<{dt}[{', '.join(map(str, block))}],{_gluon_layout(bits, len(block))}>"

    types = dict(X=f"*{dt}", DY=f"*{dt}", DX=f"*{dt}", W=f"*{dt}", STATS="*fp32", PARTS="*fp32",
                 x_desc=desc([1, box, 256]), dy_desc=desc([1, box, 256]),
                 w_desc=desc([box, 256]) if has_w else desc([1, box, 256]))
    cx = dict(IS_RMS=rms, HAS_W=has_w, HAS_B=has_b, R=r, VEC=128 // bits, STAGES=2, X_BITS=bits, W_BITS=bits,
              PDL_TRIGGER=has_w or has_b)
    return _norm(name, ln_gluon._norm_bwd_rows_gluon_kernel, cx, types, ("M", "N", "sx", "sdy"), 16)


def _norm_reduce(name, has_w, has_b, pdl, wdt="bf16", dxdt="bf16"):
    """The dW / dB reduce of the backward programs' partial rows (REDUCE_* of the config)."""
    types = dict(PARTS="*fp32", DW=f"*{wdt if has_w else dxdt}", DB=f"*{wdt if has_b else dxdt}")
    cx = dict(HAS_W=has_w, HAS_B=has_b, BLOCK_G=128, BLOCK_N=16, STAGES=3, PDL_WAIT=pdl)
    return _norm(name, ln._norm_reduce_partials_kernel, cx, types, ("N",), 4)


def norm_cases() -> Iterator[Case]:
    bf, f32, f16 = "bf16", "fp32", "fp16"
    # forward, single block: FWD entries (exact width, then bucket) and _fwd_rule (4,096 elements a program)
    yield _norm_fwd("fwd single ln bf16 768 exact-width entry", bf, 1024, False, 2, 2)
    yield _norm_fwd("fwd single rms bf16 768 bucket rule", bf, 1024, True, 4, 4)
    yield _norm_fwd("fwd single ln bf16 1024 rule", bf, 1024, False, 4, 4)
    yield _norm_fwd("fwd single ln bf16 2048 rule", bf, 2048, False, 2, 4)
    yield _norm_fwd("fwd single ln bf16 4096 rule", bf, 4096, False, 1, 4)
    yield _norm_fwd("fwd single rms bf16 4096 rule", bf, 4096, True, 1, 4)
    yield _norm_fwd("fwd single ln bf16 8192 rule", bf, 8192, False, 1, 8)
    yield _norm_fwd("fwd single ln bf16 16384 rule", bf, 16384, False, 1, 16)
    yield _norm_fwd("fwd single rms bf16 32768 rule", bf, 32768, True, 1, 32)
    yield _norm_fwd("fwd single ln fp32 1024 entry", f32, 1024, False, 4, 8)
    yield _norm_fwd("fwd single ln fp32 4096 entry", f32, 4096, False, 1, 16)
    yield _norm_fwd("fwd single rms fp32 8192 rule", f32, 8192, True, 1, 8)
    yield _norm_fwd("fwd single ln fp32 16384 entry", f32, 16384, False, 2, 16)
    yield _norm_fwd("fwd single ln fp16 1024 rule", f16, 1024, False, 4, 4)
    yield _norm_fwd("fwd single ln bf16 1024 fp32 params", bf, 1024, False, 4, 4, wdt=f32)
    yield _norm_fwd("fwd single ln bf16 768 no grad (no stats)", bf, 1024, False, 2, 2, store=False)
    yield _norm_fwd("fwd single rms bf16 4096 no grad (no stats)", bf, 4096, True, 1, 4, store=False)
    yield _norm_fwd("fwd single ln bf16 1024 no bias", bf, 1024, False, 4, 4, has_b=False)
    yield _norm_fwd("fwd single rms variant bf16 4096 cast before w, fp32 w/y", bf, 4096, True, 1, 4, wdt=f32,
                    ydt=f32, cast=True)
    # forward, wide rows (a program a row, Welford over chunks): FWD entries at 64K and FWD_CHUNK past the limit
    yield _norm_fwd_chunks("fwd chunks ln bf16 65536 entry", bf, False, 4096, 8, 3)
    yield _norm_fwd_chunks("fwd chunks rms bf16 65536 entry", bf, True, 4096, 8, 3)
    yield _norm_fwd_chunks("fwd chunks ln bf16 131072 rule", bf, False, 8192, 16, 1)
    yield _norm_fwd_chunks("fwd chunks ln fp32 32768 rule", f32, False, 8192, 16, 1)
    yield _norm_fwd_chunks("fwd chunks ln fp32 65536 entry", f32, False, 4096, 8, 1)
    yield _norm_fwd_chunks("fwd chunks rms variant bf16 65536 cast before w", bf, True, 4096, 8, 3, wdt=f32,
                           ydt=f32, cast=True)
    # backward, single block, eager on sm_90 (programmatic dependent launch): BWD entries and _bwd_rule
    yield _norm_bwd("bwd single ln bf16 512 rule eager", bf, 512, False, 8, 4, 0)
    yield _norm_bwd("bwd single ln bf16 768 exact-width entry eager", bf, 1024, False, 4, 4, 4, acc_rows=True)
    yield _norm_bwd("bwd single rms bf16 768 exact-width entry eager", bf, 1024, True, 8, 8, 4)
    yield _norm_bwd("bwd single ln bf16 1024 entry eager", bf, 1024, False, 4, 4, 3)
    yield _norm_bwd("bwd single ln bf16 2048 entry eager", bf, 2048, False, 2, 8, 3, acc_rows=True, pair_sum=True)
    yield _norm_bwd("bwd single rms bf16 2048 entry eager", bf, 2048, True, 1, 8, 4)
    yield _norm_bwd("bwd single ln bf16 4096 entry eager", bf, 4096, False, 2, 16, 3, acc_rows=True, pair_sum=True)
    yield _norm_bwd("bwd single rms bf16 4096 entry eager", bf, 4096, True, 2, 16, 3, acc_rows=True)
    yield _norm_bwd("bwd single ln bf16 8192 entry eager", bf, 8192, False, 1, 16, 3, pair_sum=True)
    yield _norm_bwd("bwd single rms bf16 8192 entry eager", bf, 8192, True, 1, 16, 3)
    yield _norm_bwd("bwd single ln fp32 1024 entry eager", f32, 1024, False, 4, 4, 2)
    yield _norm_bwd("bwd single ln fp32 2048 rule eager", f32, 2048, False, 2, 4, 0)
    yield _norm_bwd("bwd single ln fp32 8192 rule eager", f32, 8192, False, 1, 16, 0)
    yield _norm_bwd("bwd single rms fp16 1024 entry eager", f16, 1024, True, 4, 4, 3)
    yield _norm_bwd("bwd single ln bf16 1024 no affine eager", bf, 1024, False, 4, 4, 3, has_w=False, has_b=False)
    yield _norm_bwd("bwd single rms variant bf16 4096 cast before w, fp32 w eager", bf, 4096, True, 2, 16, 3,
                    acc_rows=True, wdt=f32, cast=True)
    # backward, single block, traced calls and GPUs before sm_90 (no programmatic dependent launch)
    yield _norm_bwd("bwd single ln bf16 768 exact-width entry traced", bf, 1024, False, 4, 4, 4, acc_rows=True,
                    pdl=False)
    yield _norm_bwd("bwd single rms bf16 4096 entry traced", bf, 4096, True, 2, 16, 3, acc_rows=True, pdl=False)
    yield _norm_bwd("bwd single ln fp32 4096 rule traced", f32, 4096, False, 1, 16, 0, pdl=False)
    # backward, wide rows in two passes (traced calls, fp32): the 16K entry and BWD_CHUNK past BWD_MAX_SINGLE
    yield from _norm_bwd_two_pass("bwd two-pass ln bf16 16384 entry", bf, False, 4096, 8)
    yield from _norm_bwd_two_pass("bwd two-pass rms bf16 32768 rule", bf, True, 4096, 16)
    yield from _norm_bwd_two_pass("bwd two-pass ln fp32 16384 rule", f32, False, 4096, 16)
    # backward, wide 16-bit rows in one read, eager: BWD_PERSIST (pieces, warps, hold) by width and norm
    yield _norm_persist("bwd persistent ln bf16 16384", bf, False, 2048, 4, False, 8)
    yield _norm_persist("bwd persistent rms bf16 16384 and 32768 hold", bf, True, 1024, 2, True, 16)
    yield _norm_persist("bwd persistent ln bf16 32768", bf, False, 2048, 4, False, 16)
    yield _norm_persist("bwd persistent ln bf16 65536 hold", bf, False, 2048, 4, True, 32)
    yield _norm_persist("bwd persistent rms bf16 65536 hold", bf, True, 2048, 4, True, 32)
    yield _norm_persist("bwd persistent ln bf16 131072", bf, False, 8192, 16, False, 16)
    yield _norm_persist("bwd persistent rms bf16 131072 hold", bf, True, 4096, 8, True, 32)
    yield _norm_persist("bwd persistent rms variant bf16 16384 cast before w hold", bf, True, 1024, 2, True, 16,
                        cast=True, wdt=f32)
    # backward, 16-bit rows of 16K in Gluon, eager on sm_90: BWD_GLUON (12K: when forced, gluon=True)
    if ln_gluon.HAS_GLUON:
        yield _norm_gluon("bwd gluon ln bf16 16384 eager", bf, 16384, False)
        yield _norm_gluon("bwd gluon rms bf16 16384 eager", bf, 16384, True)
        yield _norm_gluon("bwd gluon ln fp16 16384 eager", f16, 16384, False)
        yield _norm_gluon("bwd gluon ln bf16 16384 no affine eager", bf, 16384, False, has_w=False, has_b=False)
        yield _norm_gluon("bwd gluon rms fp16 12288 eager (3 boxes a row)", f16, 12288, True)
        yield _norm_gluon("bwd gluon ln bf16 12288 eager (3 boxes a row)", bf, 12288, False)
    # dW / dB reduce of the partial rows: after an eager single-block backward (PDL) or another backward
    yield _norm_reduce("reduce ln bf16 eager", True, True, True)
    yield _norm_reduce("reduce rms bf16 eager", True, False, True)
    yield _norm_reduce("reduce ln bf16 traced or persistent", True, True, False)
    yield _norm_reduce("reduce ln fp32 params eager", True, True, True, wdt="fp32")


# --------------------------------------------------------------------------------------------------
# Attention (ops/attention.py, attention_gluon.py, attention_config.py): dense (B, H, S, D) contiguous with B 2,
# H 16, S 2048 (grouped-query: 4 query heads a key / value head); packed varlen (total, H, D), 4,000 tokens, longest
# sequence 1,000; a key-padding bias from a (B, 1, 1, Sk) mask.  Unused pointers get q's type (the launchers pass q).
# --------------------------------------------------------------------------------------------------
B, H, S = 2, 16, 2048
TOTAL, MAXLEN = 4000, 1000

# (BLOCK_M, BLOCK_N, num_warps, num_stages) of 2-byte dtypes by (kernel, head-dim bucket, causal), of fp32 by
# (kernel, bucket); the backward's preprocess: 64 rows, Triton's default 4 warps and 3 stages.
TILES = {
    ("fwd", 64, False): (128, 64, 8, 4), ("fwd", 64, True): (128, 64, 8, 3),
    ("fwd", 128, False): (128, 64, 8, 3), ("fwd", 128, True): (128, 64, 8, 3), ("fwd", 256, None): (64, 64, 4, 2),
    ("dkdv", 64, False): (32, 128, 4, 3), ("dkdv", 64, True): (64, 64, 4, 3),
    ("dkdv", 128, False): (64, 128, 8, 3), ("dkdv", 128, True): (64, 128, 8, 3), ("dkdv", 256, None): (32, 64, 4, 2),
    ("dq", 64, False): (128, 64, 8, 3), ("dq", 64, True): (64, 64, 4, 3),
    ("dq", 128, False): (128, 64, 8, 3), ("dq", 128, True): (128, 64, 8, 3), ("dq", 256, None): (64, 32, 4, 2),
}
TILES_FP32 = {("fwd", 128): (64, 64, 4, 2), ("fwd", 256): (64, 32, 4, 2), ("dkdv", 128): (32, 64, 4, 2),
              ("dkdv", 256): (32, 64, 4, 2), ("dq", 128): (64, 32, 4, 2), ("dq", 256): (64, 32, 4, 2)}
PREPROCESS = (64, None, 4, None)


def _attn_tiles(kind, dt, d, causal):
    bucket = min(256, max(64, p2(max(16, d))))
    if dt == "fp32":
        return TILES_FP32[(kind, 256 if bucket == 256 else 128)]
    return TILES[(kind, bucket, None if bucket == 256 else causal)]


def _attn_strides(varlen, heads, d):
    """(batch, head, seq, dim) strides of a q-like tensor with ``heads`` heads, dense contiguous or packed varlen."""
    return (0, d, heads * d, 1) if varlen else (heads * S * d, S * d, d, 1)


def _attn_label(kind, dt, d, causal, flags):
    return f"{kind} {dt} D{d} {'causal' if causal else 'full'}" + "".join(f" {k}" for k, v in sorted(flags.items())
                                                                       if v)


def _attn(kind, fn, dt, d, causal, gqa=False, varlen=False, bias=False, dropout=False, tma=False, window=0,
          softcap=0.0) -> Case:
    """A Triton attention kernel at the launch geometry above; each kernel takes its own part of the arguments.
    ``window`` / ``softcap``: the WINDOW / SOFTCAP constexprs (0: off, the default launch)."""
    bd = max(16, p2(d))
    hkv = H // 4 if gqa else H
    q_st, kv_st = _attn_strides(varlen, H, d), _attn_strides(varlen, hkv, d)
    seq = MAXLEN if varlen else S
    types = {n: "*" + dt for n in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "KB", "CU_Q", "CU_K", "SEED")}
    types.update(LSE="*fp32", DELTA="*fp32")
    types.update({n: "fp32" for n in ("qk_scale", "sm_scale", "dropout_p", "dropout_scale")})
    if bias:
        types["KB"] = "*fp32"
    if varlen:
        types.update(CU_Q="*i32", CU_K="*i32")
    if dropout:
        types["SEED"] = "*i64"
    ints = {}
    for prefix, st in (("sq", q_st), ("sk", kv_st), ("sv", kv_st), ("so", q_st), ("sdo", q_st), ("sdq", q_st),
                       ("sdk", kv_st), ("sdv", kv_st)):
        ints.update(zip((prefix + c for c in "bhsd"), st))
    lse_st = (0, TOTAL) if varlen else (H * S, S)
    kb_st = (seq, 0, 1) if bias else (0, 0, 0)
    ints.update(slb=lse_st[0], slh=lse_st[1], skbb=kb_st[0], skbh=kb_st[1], skbn=kb_st[2], H=H, HKV=hkv,
                GROUP=H // hkv, SQ=seq, SK=seq, HEAD_DIM=d)
    m, n, warps, stages = PREPROCESS if kind == "pre" else _attn_tiles(kind, dt, d, causal)
    if kind == "pre":
        cx = dict(VARLEN=varlen, BLOCK_M=m, BLOCK_D=bd)
    else:
        cx = dict(VARLEN=varlen, CAUSAL=causal, HAS_KB=bias, BLOCK_D=bd, EVEN_D=d == bd,
                  INPUT_PRECISION="ieee" if dt == "fp32" else "tf32", BLOCK_M=m, BLOCK_N=n, HAS_DROPOUT=dropout)
    if kind == "dkdv":
        cx["USE_TMA"] = tma
    if window or softcap:
        cx.update(WINDOW=window, SOFTCAP=float(softcap))
    args = set(Case.kernel_args(fn))
    return launch("attention", _attn_label(kind, dt, d, causal, dict(gqa=gqa, varlen=varlen, bias=bias,
                                                                     dropout=dropout, tma=tma, window=window,
                                                                     softcap=softcap)),
                  fn, cx, {k: v for k, v in types.items() if k in args}, {k: v for k, v in ints.items() if k in args},
                  num_warps=warps, num_stages=stages)


# (dtype, head dim, causal, flags) of each kernel: every tile entry, fp32, odd head dims, and each feature
ATTN_FWD = [("bf16", 64, False, {}), ("bf16", 64, True, {}), ("bf16", 128, False, {}), ("bf16", 128, True, {}),
            ("fp16", 128, True, {}), ("fp32", 64, True, {}), ("bf16", 32, True, {}), ("bf16", 80, False, {}),
            ("bf16", 256, True, {}), ("fp32", 256, False, {}), ("bf16", 128, True, dict(gqa=True)),
            ("bf16", 128, True, dict(gqa=True, varlen=True)), ("bf16", 64, True, dict(dropout=True)),
            ("bf16", 128, False, dict(bias=True)),
            # a sliding window (Mistral-like 4,096 would span the whole S; 512) and Gemma 2's soft-capping
            ("bf16", 128, True, dict(window=512)), ("bf16", 128, True, dict(window=512, softcap=50.0)),
            ("bf16", 64, False, dict(softcap=30.0, gqa=True, varlen=True))]
ATTN_DKDV = [("bf16", 64, False, {}), ("bf16", 64, True, {}), ("bf16", 128, False, {}), ("bf16", 128, True, {}),
             ("fp16", 64, True, {}), ("fp32", 128, True, {}), ("bf16", 80, True, dict(gqa=True)),
             ("bf16", 256, True, {}), ("bf16", 128, True, dict(gqa=True, varlen=True)),
             ("bf16", 128, True, dict(dropout=True)), ("bf16", 64, False, dict(bias=True)),
             # Q / dO through TMA (_use_bwd_tma): dense bf16, Sk >= 4096, head-dim bucket 64, or 128 not causal
             ("bf16", 64, False, dict(tma=True)), ("bf16", 64, True, dict(tma=True)),
             ("bf16", 128, False, dict(tma=True)), ("bf16", 64, True, dict(tma=True, gqa=True, dropout=True)),
             ("bf16", 128, False, dict(tma=True, bias=True)),
             ("bf16", 128, True, dict(window=512)), ("bf16", 128, True, dict(window=512, softcap=50.0)),
             ("bf16", 64, False, dict(softcap=30.0, gqa=True, varlen=True))]
ATTN_DQ = [("bf16", 64, False, {}), ("bf16", 64, True, {}), ("bf16", 128, False, {}), ("bf16", 128, True, {}),
           ("fp16", 128, True, dict(gqa=True)), ("fp32", 64, False, {}), ("bf16", 256, True, {}),
           ("bf16", 80, False, dict(varlen=True)), ("bf16", 64, True, dict(dropout=True)),
           ("bf16", 128, True, dict(bias=True)),
           ("bf16", 128, True, dict(window=512)), ("bf16", 128, True, dict(window=512, softcap=50.0)),
           ("bf16", 64, False, dict(softcap=30.0, gqa=True, varlen=True))]
ATTN_PREPROCESS = [("bf16", 64, False, {}), ("bf16", 128, False, dict(varlen=True)), ("fp32", 80, False, {})]


def _gluon_desc(dt, block, d):
    from triton.experimental.gluon import language as gl

    layout = gl.NVMMASharedLayout.get_default_for([block, d], {"bf16": gl.bfloat16, "fp16": gl.float16}[dt])
    return f"tensordesc<{dt}[{block},{d}],{layout!r}>"


def _gluon_geometry(gqa):
    """Head-major contiguous layouts: (RB, RH, CH) = (H S, S, 0), the key / value heads' likewise."""
    hkv = H // 4 if gqa else H
    return dict(S=S, BH=B * H, H=H, RB=H * S, RH=S, CH=0, G=H // hkv, RBk=hkv * S, RHk=S, CHk=0)


def _gluon_case(kind, fn, dt, d, causal, gqa, cx, descs, warps, extra_types=()):
    """A Gluon attention kernel: ``descs`` {descriptor argument: box rows}, ``kind`` the case's label."""
    args = set(Case.kernel_args(fn))
    types = {"LSE": "*fp32", "qk_scale": "fp32", **{k: "*fp32" if k in ("DELTA", "DQ") else "fp32"
                                                     for k in extra_types}}
    types.update({k: _gluon_desc(dt, rows, d) for k, rows in descs.items()})
    ints = {k: v for k, v in _gluon_geometry(gqa).items() if k in args}
    return launch("attention", "gluon " + _attn_label(kind, dt, d, causal, dict(gqa=gqa)), fn, cx,
                  {k: v for k, v in types.items() if k in args}, ints, num_warps=warps)


def _gluon_fwd(dt, d, causal, gqa=False):
    """The one-warpgroup forward."""
    bm, bn, warps, stages = {64: (64, 128, 4, 3), 128: (64, 64, 4, 3)}[d]
    cx = dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, CAUSAL=causal, STAGES=stages)
    return _gluon_case("fwd", attn_gluon._attn_fwd_gluon_kernel, dt, d, causal, gqa, cx,
                       dict(q_desc=bm, k_desc=bn, v_desc=bn, o_desc=bm), warps)


def _gluon_fwd_ws(dt, d, causal, persistent, gqa=False):
    """The warp-specialized ping-pong forward (two consumer warpgroups, one producer), optionally persistent."""
    cx = dict(BLOCK_N=128, HEAD_D=d, CAUSAL=causal, STAGES=2, CONSUMER_REGS=232, PRODUCER_REGS=40,
              PERSISTENT=persistent)
    return _gluon_case("fwd_ws_persistent" if persistent else "fwd_ws", attn_gluon._attn_fwd_gluon_ws_kernel, dt, d,
                       causal, gqa, cx, dict(q_desc=64, k_desc=128, v_desc=128, o_desc=64), 4)


def _gluon_dkdv(dt, d, causal, gqa=False):
    """The dK / dV kernel."""
    cx = dict(BLOCK_M=64, BLOCK_N=64, HEAD_D=d, CAUSAL=causal, STAGES=2, GQA=gqa)
    descs = dict(q_desc=64, do_desc=64, k_desc=64, v_desc=64, dk_desc=64, dv_desc=64)
    return _gluon_case("dkdv", attn_gluon._attn_bwd_dkdv_gluon_kernel, dt, d, causal, gqa, cx, descs, 4,
                       extra_types=("DELTA", "DQ", "sm_scale"))


def attention_cases() -> Iterator[Case]:
    # Triton kernels: forward, dK / dV, dQ at every tile entry, fp32, odd head dims and each feature; preprocess
    for kind, fn, table in (("fwd", attn._attn_fwd_kernel, ATTN_FWD), ("dkdv", attn._attn_bwd_dkdv_kernel, ATTN_DKDV),
                            ("dq", attn._attn_bwd_dq_kernel, ATTN_DQ), ("pre", attn._attn_bwd_preprocess,
                                                                         ATTN_PREPROCESS)):
        for dt, d, causal, flags in table:
            yield _attn(kind, fn, dt, d, causal, **flags)
    # the keep mask of attention_dropout_mask: 64 x 64 tiles
    yield launch("attention", "dropout mask", attn._dropout_mask_kernel, dict(BLOCK_M=64, BLOCK_N=64),
                 {"SEED": "*i64", "OUT": "*i8"}, dict(SQ=S, SK=S), floats=("dropout_p",))
    if not attn_gluon.HAS_GLUON:
        return
    # Gluon forwards as routed on sm_90: one warpgroup (D64 full above 4K; D128 at odd multiples of 64), ping-pong
    # (D128, D64 causal above 2K), ping-pong on a persistent grid (short rows)
    yield _gluon_fwd("bf16", 64, False)
    yield _gluon_fwd("fp16", 64, False)
    yield _gluon_fwd("bf16", 128, True, gqa=True)
    yield _gluon_fwd_ws("bf16", 128, False, False)
    yield _gluon_fwd_ws("bf16", 128, True, False)
    yield _gluon_fwd_ws("bf16", 64, True, False)
    yield _gluon_fwd_ws("fp16", 128, True, False, gqa=True)
    yield _gluon_fwd_ws("bf16", 64, False, True)
    yield _gluon_fwd_ws("bf16", 64, True, True, gqa=True)
    yield _gluon_fwd_ws("bf16", 128, False, True)
    # Gluon dK / dV (D128 at any length, D64 up to 4K), grouped-query heads too
    for d in (64, 128):
        for causal in (False, True):
            yield _gluon_dkdv("bf16", d, causal)
    yield _gluon_dkdv("bf16", 128, True, gqa=True)
    yield _gluon_dkdv("fp16", 64, False, gqa=True)


# --------------------------------------------------------------------------------------------------
# The decoder-layer ops (ops/gated_activation.py, residual_norm.py, rope.py) at Llama shapes: 4 x 2,048 tokens,
# intermediate 11,008, hidden 4,096; heads of Llama 3 8B (32 query, 8 key of 128), q / k in HF's transposed layout
# --------------------------------------------------------------------------------------------------
def _gated(direction, act, dt="bf16", n=11008, stride=None, gated_=True):
    """One program a (row, 1,024 columns): gated_activation_config FWD / BWD (1,024 x 4 warps); "bwd_y": the
    backward that also writes the product (fused_gated_activation_linear); ``gated_=False``: the activation alone
    (fused_activation_linear: GATED=False, at ViT-B's / GPT-2's 3,072)."""
    st = n if stride is None else stride
    label = f"{'' if gated_ else 'act '}{direction} {act} {dt} {n}" + ("" if stride is None else " halves of gate_up")
    if direction == "fwd":
        return launch("decoder", f"gated {label}", gated._gated_fwd_kernel,
                      dict(ACT=gated.ACTIVATIONS[act], BLOCK_N=1024, GATED=gated_),
                      {"G": PTR[dt], "U": PTR[dt], "Y": PTR[dt]}, dict(N=n, sg=st, su=st), num_warps=4)
    return launch("decoder", f"gated {label}", gated._gated_bwd_kernel,
                  dict(ACT=gated.ACTIVATIONS[act], WRITE_Y=direction == "bwd_y", BLOCK_N=1024, GATED=gated_),
                  {"DY": PTR[dt], "G": PTR[dt], "U": PTR[dt], "DG": PTR[dt], "DU": PTR[dt], "Y": PTR[dt]},
                  dict(N=n, sdy=n, sg=st, su=st, sdg=st, sdu=st), num_warps=4)


def _res_norm(direction, n, block_m, warps, dt="bf16", rdt=None, wdt="bf16", cast=True, rows_per_prog=None):
    """Residual add + RMSNorm: the single-block shapes of layer_norm_config at the width (no LayerNorm bias)."""
    rdt = rdt or dt
    hdt = "fp32" if "fp32" in (dt, rdt) else dt
    ydt = "fp32" if "fp32" in (hdt, wdt) else hdt
    cx = dict(IS_RMS=True, HAS_W=True, HAS_B=False, BLOCK_M=block_m, BLOCK_N=p2(n), CAST_BEFORE_W=cast)
    label = f"residual rms {direction} {dt}" + (f" + {rdt} residual" if rdt != dt else "") + f" {n}"
    if direction == "fwd":
        return launch("decoder", label, resn._res_norm_fwd_kernel, cx,
                      {"X": PTR[dt], "R": PTR[rdt], "H": PTR[hdt], "Y": PTR[ydt], "W": PTR[wdt], "B": PTR[dt],
                       "STATS": "*fp32"}, dict(M=8192, N=n, sx=n, sr=n), floats=("eps",), num_warps=warps)
    return launch("decoder", label, resn._res_norm_bwd_kernel, cx,
                  {"H": PTR[hdt], "DY": PTR[ydt if ydt == hdt else hdt], "DH": PTR[hdt], "DX": PTR[hdt],
                   "W": PTR[wdt], "STATS": "*fp32", "PARTS": "*fp32"},
                  dict(M=8192, N=n, sdy=n, sdh=n, ROWS_PER_PROG=rows_per_prog), num_warps=warps)


def _rope(direction, interleaved, d=128, d_rot=128, dt="bf16", cdt="bf16"):
    """A program a (batch, position): 32 query and 8 key heads in one 32 x 128 tile each (rope_config TILE, 8 warps)."""
    s, hq, hk = 2048, 32, 8
    odt = "fp32" if "fp32" in (dt, cdt) and direction == "fwd" else dt
    label = f"rope {direction} {'interleaved' if interleaved else 'half-split'} {dt} D{d} rot{d_rot}" + (
        f" {cdt} cos" if cdt != dt else "")
    ints = dict(S=s, HQ=hq, HK=hk, sqb=s * hq * d, sqs=hq * d, sqh=d, skb=s * hk * d, sks=hk * d, skh=d,
                sob=s * hq * d, sos=hq * d, soh=d, skob=s * hk * d, skos=hk * d, skoh=d, scb=s * d_rot, scs=d_rot,
                D=d, D_ROT=d_rot)
    return launch("decoder", label, rope._rope_kernel,
                  dict(INTERLEAVED=interleaved, BACKWARD=direction == "bwd", WRITE_PASS=True, BLOCK_H=32,
                       BLOCK_D=p2(d)),
                  {"Q": PTR[dt], "K": PTR[dt], "QO": PTR[odt], "KO": PTR[odt], "COS": PTR[cdt], "SIN": PTR[cdt]},
                  ints, num_warps=8)


def decoder_cases() -> Iterator[Case]:
    for act in ("silu", "gelu", "gelu_tanh"):
        yield _gated("fwd", act)
        yield _gated("bwd", act)
        yield _gated("bwd_y", act)
    yield _gated("fwd", "silu", n=8192, stride=16384)  # Phi-3 mini's gate_up_proj output, chunked in two
    yield _gated("bwd", "silu", n=8192, stride=16384)
    yield _gated("bwd_y", "silu", n=8192, stride=16384)
    for act in ("gelu", "gelu_tanh"):  # plain MLPs: ViT's nn.GELU, GPT-2's tanh GELU
        yield _gated("fwd", act, n=3072, gated_=False)
        yield _gated("bwd_y", act, n=3072, gated_=False)
    # residual + RMSNorm, Llama's order: fwd FwdTile, bwd BwdTile (G = 132 SMs x progs_per_sm, whole tiles)
    yield _res_norm("fwd", 4096, 1, 4)
    yield _res_norm("bwd", 4096, 2, 16, rows_per_prog=64)
    yield _res_norm("fwd", 8192, 1, 8)
    yield _res_norm("bwd", 8192, 1, 16, rows_per_prog=64)
    yield _res_norm("fwd", 4096, 1, 4, rdt="fp32", wdt="fp32")  # autocast: a float32 residual stream and weight
    yield _res_norm("bwd", 4096, 2, 16, rdt="fp32", wdt="fp32", rows_per_prog=64)
    for direction in ("fwd", "bwd"):
        yield _rope(direction, False)
        yield _rope(direction, True)
        yield _rope(direction, False, d=96, d_rot=48)  # Phi-3-like partial rotary
    yield _rope("fwd", False, cdt="fp32")  # autocast: float32 cos / sin, a float32 result


OPS = {"softmax": softmax_cases, "cross_entropy": cross_entropy_cases, "norm": norm_cases,
       "attention": attention_cases, "decoder": decoder_cases}
