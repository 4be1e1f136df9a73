"""Row layouts shared by the row-wise ops (softmax, cross-entropy): how a tensor's rows along one dim are
addressed without a copy, and whether 16-bit rows can be read as 16-byte vectors.

A row of a tensor of shape (A..., N, C...) along the dim of size N is an (outer, inner) pair: ``outer`` runs
over A..., ``inner`` over C..., and element (o, i, n) lives at ``o * s_outer + i * s_inner + n * s_col``.  That
holds when the dims before ``dim`` merge into one stride and the dims after it into another: the last dim, any
dim of a contiguous tensor, transposes and slices.  Other layouts are copied to contiguous first.

Vectors.  Triton vectorizes a load only where it can prove 16-byte alignment, and it knows an integer's
divisibility by 16 only: a 16-bit row whose width or row stride is not a multiple of 16 elements
(``rows_misaligned``) gets 2-byte accesses.  The persistent kernels then read such rows through a window
aligned to ``VEC8_WINDOWS`` elements (ops/_rowsync.py, VEC8), which every tensor of the launch must share
(``vec8_window``).
"""

from __future__ import annotations

import torch

# The VEC8 window's alignment in elements, the first that every row shares: 64 (128-byte lines) before 8 (16-byte
# vectors): a warp's 512 bytes span 4 lines instead of 5; H200, bf16 at 50,257 columns, do_bench, 64 against 8:
# CE fwd + bwd 0.622 against 0.615 of copy, softmax forward 0.716 against 0.686, backward 0.871 against 0.819.
VEC8_WINDOWS = (64, 8)


def row_strides(shape: torch.Size, stride: tuple[int, ...], dim: int):
    """(OUTER, INNER, s_outer, s_inner, s_col) for rows along ``dim``, or None if a copy is needed.

    Rows are (outer, inner) pairs: dims before ``dim`` must merge into one stride and dims after it
    into another (true for the last dim, any dim of a contiguous tensor, transposes and slices).
    """
    groups = []
    for lo, hi in ((0, dim), (dim + 1, len(shape))):
        size, st = 1, 0
        for k in range(hi - 1, lo - 1, -1):  # merge from the innermost dim outwards
            if shape[k] == 1:
                continue
            if size == 1:
                st = stride[k]
            elif stride[k] != st * size:
                return None
            size *= shape[k]
        groups.append((size, st))
    (outer, so), (inner, si) = groups
    return outer, inner, so, si, (stride[dim] if shape else 1)


def last_dim_row_stride(shape, stride):
    """The row stride of a tensor viewed as rows of its last dim with unit column stride, or None (copy it)."""
    if len(shape) == 0:
        return None
    v = row_strides(shape, stride, len(shape) - 1)
    if v is None or (shape[-1] > 1 and v[4] != 1):
        return None
    return v[2] if v[0] > 1 else shape[-1]


def contiguous_strides(shape: torch.Size, dim: int) -> tuple[int, ...]:
    """``row_strides`` of a contiguous tensor of ``shape`` (the outputs, and inputs that were copied)."""
    out, acc = [], 1
    for k in range(len(shape) - 1, -1, -1):
        out.append(acc)
        acc *= shape[k]
    return row_strides(shape, tuple(reversed(out)), dim)


def rows_misaligned(shape, strides, dim: int, elem: int) -> bool:
    """16-bit rows with unit column stride whose width or row stride (of any input in ``strides``, in elements)
    is not a multiple of 16: no 16-byte vectors for them (an input to be copied counts as contiguous).  False for
    other dtypes and for strided columns (no vectors either way)."""
    if elem != 2 or not len(shape):
        return False
    n = shape[dim]
    outer_strides = []
    for st in strides:
        _, inner, so, _, sc = row_strides(shape, st, dim) or contiguous_strides(shape, dim)
        if inner != 1 or sc != 1:
            return False
        outer_strides.append(so)
    return bool(n % 16) or any(so % 16 for so in outer_strides)


def vec8_window(shape, strides, dim: int, elem: int) -> int:
    """The VEC8 window (elements) of misaligned rows (``rows_misaligned``): the first of ``VEC8_WINDOWS`` modulo
    which every input's row offsets are congruent to the contiguous output's (rows ``shape[dim]`` apart), so
    that one window phase serves every tensor of the launch; 0 for aligned rows, or when no window is shared."""
    if not rows_misaligned(shape, strides, dim, elem):
        return 0
    n = shape[dim]
    views = [row_strides(shape, st, dim) for st in strides]
    for win in VEC8_WINDOWS:
        if all(v is None or (v[2] - n) % win == 0 for v in views):  # (a copied input is contiguous)
            return win
    return 0
