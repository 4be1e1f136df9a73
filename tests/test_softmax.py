"""FusedSoftmax / fused_softmax against a float64 reference: outputs and gradients.

Small rows on the interpreter: ``config_override("softmax", ...)`` shrinks the single-block limit and the tiles so
that the default wide-row kernels run at small widths; eager calls take the persistent kernels, traced calls (the
launchers with ``persist_ok=False``, what Inductor emits) the piece-wise ones."""

import pytest
import torch
from _tol import assert_within_torch, kernel_names, launched, ran, softmax_backward_refs
from conftest import TOL
from torch import nn

from fused_layers import FusedSoftmax, fused_softmax
from fused_layers.ops import softmax as sm
from fused_layers.ops._common import config_override
from fused_layers.ops._rows import rows_misaligned, vec8_window

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 1), (1, 7), (3, 31), (4, 64), (5, 65), (2, 129), (6, 257)]
# Wide rows at small widths: 16-column pieces and chunks.
WIDE = dict(max_single_block=8, eager_max_single_block=8, persist_block=16, wide_block=8, wide_piece=16)


def _check(x: torch.Tensor, dim: int, fn=fused_softmax, grad=True, traced=False):
    """Output and input gradient of fn(x, dim) against float64 torch.softmax; ``traced``: through the launchers on
    the route of a traced call (the piece-wise kernels for wide rows)."""
    atol, rtol = TOL[x.dtype]
    half = x.dtype in (torch.float16, torch.bfloat16)  # 16-bit: within K x PyTorch's own error (tests/_tol.py)
    xr = x.detach().double().requires_grad_(grad)
    xt = x.detach()
    x = x.detach().requires_grad_(grad and not traced)
    d = dim % max(x.dim(), 1)
    y = sm._forward(x, d, False) if traced else fn(x, dim)
    yr = torch.softmax(xr, dim)
    yt = torch.softmax(xt, dim)
    assert y.dtype == x.dtype and y.shape == x.shape
    if half:
        assert_within_torch(y, yr, yt, what="softmax", relative=True)
    else:
        torch.testing.assert_close(y.double(), yr, atol=atol, rtol=rtol)
    if grad:
        dy = torch.randn_like(y)
        if traced:
            dx = sm._backward(y, dy, d, False)
        else:
            y.backward(dy)
            dx = x.grad
        yr.backward(dy.double())
        assert dx.dtype == x.dtype
        if half:  # float64 and PyTorch's backward from our y: the backward alone (tests/_tol.py)
            assert_within_torch(dx, *softmax_backward_refs(y, dy, d), what="softmax dx")
        else:
            torch.testing.assert_close(dx.double(), xr.grad, atol=atol, rtol=rtol)


def _persist_plans():
    return [p for p in sm._PLANS.values() if p.persist is not None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_single_block(shape, dtype, device):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    _check(x, -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [17, 64, 100, 257])
def test_piecewise_traced(n, dtype, device):
    """Traced calls' wide rows: the one-launch piece-wise kernels, online softmax over chunks and pieces (one piece
    a row, and several)."""
    x = torch.randn(3, n, device=device, dtype=dtype) * 4
    with config_override("softmax", max_single_block=8, wide_block=8):
        sm._PLANS.clear()
        _check(x, -1, traced=True)
        assert not _persist_plans() and all(p.wide for p in sm._PLANS.values())
    with config_override("softmax", max_single_block=8, wide_block=8, wide_piece=8):  # several pieces per row
        _check(x, -1, traced=True)


@pytest.mark.parametrize("dtype,n,hold", [(torch.float32, 17, False), (torch.float32, 64, False),
                                          (torch.float32, 100, False), (torch.float16, 48, False),
                                          (torch.bfloat16, 112, False), (torch.bfloat16, 112, True),
                                          (torch.float16, 48, True)])
def test_wide_persistent(dtype, n, hold, device):
    """Eager wide rows: persistent programs exchanging their partials (ops/_rowsync.py), forward statistics and the
    backward's dot; balanced ragged pieces; several rows per program (two launches on the interpreter).  Forms by
    dtype, as the defaults: float32 the register form, 16-bit the SMEM-pipelined form (aligned widths here: VEC8 is
    below), the 16-bit backward with HOLD past hold_min_n."""
    x = torch.randn(7, n, device=device, dtype=dtype) * 4
    with config_override("softmax", **WIDE, **(dict(hold_min_n=1) if hold else {})):
        sm._PLANS.clear()
        _check(x, -1)
        bound = _persist_plans()
        assert len(bound) == 2 and all(p.kernel is not None and p.groups >= 1 for p in bound)  # fwd and bwd ran
        stages = 1 if dtype == torch.float32 else 3
        assert all(p.persist[2]["STAGES"] == stages and p.persist[2]["VEC_WIN"] == 0 for p in bound)
        assert [p.persist[2].get("HOLD", False) for p in bound].count(True) == (1 if hold else 0)  # the backward's
        _check(torch.randn(3, n, 5, device=device, dtype=dtype), 1)  # rows along a non-last dim
        _check(torch.randn(n, 6, device=device, dtype=dtype).t(), -1)  # strided rows
        x = x.float()
        x[0, :] = float("-inf")  # all -inf: NaN row
        x[1, 5] = float("inf")  # +inf: NaN row
        x[2, : n // 2] = float("-inf")  # first pieces all -inf, later finite
        x[3, 3] = float("nan")
        y = fused_softmax(x.to(dtype), -1)
    x = x.to(dtype)
    if dtype == torch.float32:
        torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), equal_nan=True, atol=TOL[dtype][0],
                                   rtol=TOL[dtype][1])
    else:
        assert_within_torch(y, torch.softmax(x.double(), -1), torch.softmax(x, -1), what="softmax", relative=True)
    assert torch.isnan(y[0]).all() and torch.isnan(y[1]).all() and torch.isnan(y[3]).all()


def _rotating_wide_cases(k=2):
    """The (dtype, width, HOLD) cases of the grid that test_wide_persistent does not list, k of them a day:
    seeded from the UTC date (so a day's CI runs agree and a failure names its case in the test id), covering the
    grid over successive days at the CPU cost of two cases."""
    import datetime
    import random

    listed = {(torch.float32, 17, False), (torch.float32, 64, False), (torch.float32, 100, False),
              (torch.float16, 48, False), (torch.bfloat16, 112, False), (torch.bfloat16, 112, True),
              (torch.float16, 48, True)}
    grid = [(d, n, h) for d in DTYPES for n in (17, 48, 64, 100, 112) for h in (False, True)
            if (d, n, h) not in listed and not (h and d == torch.float32)  # HOLD: the 16-bit backward's form
            and (d == torch.float32 or n % 8 == 0)]  # 16-bit: aligned rows (unaligned ones: test_vec8_rows)
    day = datetime.datetime.now(datetime.timezone.utc).date()
    picks = random.Random(day.toordinal()).sample(grid, k)
    return [pytest.param(*c, id=f"{day.isoformat()}-{str(c[0])[6:]}-{c[1]}-{'hold' if c[2] else 'nohold'}")
            for c in picks]


@pytest.mark.parametrize("dtype,n,hold", _rotating_wide_cases())
def test_wide_persistent_rotating(dtype, n, hold, device):
    """Two more cases of test_wide_persistent's grid a day, picked by the date (the id names the date and case)."""
    test_wide_persistent(dtype, n, hold, device)


def test_persistent_form_by_width():
    """softmax_config.PERSIST_BY_WIDTH: the float32 forward takes the SMEM form (4K x 4 warps x 3 stages) in the 128K
    bucket only, the register form elsewhere; the 16-bit forward 2K x 2 warps in the 32K bucket; the backward forms
    unchanged; persist_block still shrinks the pieces."""

    def form(n, dtype=torch.float32, fwd=True):
        shape = torch.Size([2, n])
        st = ((n, 1),) if fwd else ((n, 1), (n, 1))
        meta = sm._plan(shape, st, dtype, 1, True).persist[2]
        return meta["BLOCK_N"], meta["STAGES"]

    sm._PLANS.clear()
    assert form(100003) == (4096, 3) and form(131072) == (4096, 3)  # the 128K bucket
    assert form(65536) == (2048, 1) and form(262144) == (2048, 1)  # the register form
    assert form(100003, fwd=False) == (4096, 1)  # the float32 backward keeps its form
    assert form(100352, torch.bfloat16) == (4096, 3) and form(262144, torch.bfloat16) == (4096, 3)
    sm._PLANS.clear()
    meta = sm._plan(torch.Size([2, 30000]), ((30000, 1),), torch.bfloat16, 1, True).persist[2]
    assert (meta["BLOCK_N"], meta["num_warps"], meta["STAGES"]) == (2048, 2, 3)
    meta = sm._plan(torch.Size([2, 40000]), ((40000, 1),), torch.bfloat16, 1, True).persist[2]
    assert (meta["BLOCK_N"], meta["num_warps"]) == (4096, 4)
    with config_override("softmax", persist_block=1024):
        assert form(100003) == (1024, 3)


def test_misaligned_rows_routing(device):
    """16-bit rows whose width or row stride is not a multiple of 16 elements (ops/_rows.py): eager forward and
    backward rows whose inputs share the output's offsets mod 64 or 8 take the persistent kernels' VEC8 form; other
    such forward rows take the piece-wise kernels (the backward its plain persistent form); aligned rows, float32 and
    strided columns keep their routes."""

    def plan(n, dtype=torch.bfloat16, stride=None, fwd=True, dy_stride=None):
        sm._PLANS.clear()
        st = ((stride or n, 1),) if fwd else ((stride or n, 1), (dy_stride or n, 1))
        return sm._plan(torch.Size([2, n]), st, dtype, 1, True)

    def vec8(p):
        return p.persist is not None and p.persist[2]["VEC_WIN"] > 0

    assert rows_misaligned(torch.Size([2, 50257]), ((50257, 1),), 1, 2)
    assert rows_misaligned(torch.Size([2, 50304]), ((50312, 1),), 1, 2)  # aligned width, row stride 8 mod 16
    assert not rows_misaligned(torch.Size([2, 50304]), ((50304, 1),), 1, 2)
    assert not rows_misaligned(torch.Size([2, 50257]), ((50257, 1),), 1, 4)  # float32: unchanged
    assert not rows_misaligned(torch.Size([2, 50257, 3]), ((150771, 3, 1),), 1, 2)  # strided columns: unchanged
    assert vec8_window(torch.Size([2, 50257]), ((50265, 1), (50257, 1)), 1, 2) == 8
    assert vec8_window(torch.Size([2, 50257]), ((50257, 1), (50260, 1)), 1, 2) == 0
    for n, stride, win in ((50257, None, 64), (32001, None, 64), (100277, None, 64), (50304, 50312, 8),
                           (50257, 50265, 8), (50257, 50321, 64)):
        p = plan(n, stride=stride)
        assert vec8(p) and p.persist[2]["VEC_WIN"] == win, (n, stride)  # a 128-byte window where the rows share it
        assert p.splits * p.ints[-1] >= n + win - 1, (n, stride)  # pieces cover the row's window
        pb = plan(n, stride=stride, fwd=False)
        assert vec8(pb) or not pb.wide, (n, stride)
    p = plan(50257, stride=50260)  # a row stride not congruent to the output's: piece-wise forward
    assert p.persist is None and p.wide
    p = plan(50257, fwd=False, dy_stride=50260)  # ... the backward keeps its plain persistent form
    assert p.persist is not None and not vec8(p)
    assert not vec8(plan(50304)) and plan(50304).persist is not None  # aligned rows: unchanged
    assert not vec8(plan(50257, torch.float32)) and plan(50257, torch.float32).persist is not None
    sm._PLANS.clear()
    # rows along a non-last dim of a layout that is copied first: the copy's columns are strided, so no VEC8
    x = (torch.randn(2, 3, 45, 2, device=device) * 3).permute(0, 2, 3, 1).to(torch.bfloat16)  # (2, 45, 2, 3)
    with config_override("softmax", max_single_block=8, eager_max_single_block=8, persist_block=16):
        p = sm._plan(x.shape, (x.stride(),), x.dtype, 1, True)
        assert p.copy == [True] and p.persist is not None and p.persist[2]["VEC_WIN"] == 0
        _check(x, 1)
    sm._PLANS.clear()
    # right answers on the piece-wise route (small shapes under the interpreter: the rule is the same at any width)
    with config_override("softmax", max_single_block=64, eager_max_single_block=64):
        x = (torch.randn(5, 206, device=device, dtype=torch.bfloat16) * 4)[:, :203]  # rows 206 apart: no window
        _check(x, -1)
        eager = {len(k[1]): p for k, p in sm._PLANS.items() if k[4] and p.wide}  # by the number of inputs
        assert eager[1].persist is None and eager[2].persist[2]["VEC_WIN"] == 64  # fwd piece-wise, bwd VEC8


# Small VEC8 pieces under the interpreter: 16-column pieces, so a row of n columns spans ceil((n + 7) / 16) pieces.
VEC8 = dict(max_single_block=8, eager_max_single_block=8, persist_block=16)


# bf16 and fp16 share the VEC8 window arithmetic (2-byte elements): both at 45 and 53 + 8, bf16 alone elsewhere
# (CPU time).
@pytest.mark.parametrize("n,pad,dtype", [(n, p, d) for n, p in [(17, 0), (45, 0), (53, 8), (40, 0), (11, 0), (9, 16)]
                                         for d in (torch.bfloat16, torch.float16)
                                         if d == torch.bfloat16 or (n, p) in ((45, 0), (53, 8))])
def test_vec8_rows(n, pad, dtype, device):
    """The VEC8 persistent forms (rows at any 2-byte alignment read and written as whole 16-byte vectors on the row's
    window, the head and tail columns as edge lanes): ragged widths, rows whose offsets cycle through every value mod
    8 (a width of 45 or 53 + 8), a width of 40 (8 mod 16: no edge on aligned rows), rows narrower than a vector;
    forward and backward against float64, with dy sliced from a wider buffer as well."""
    x = (torch.randn(9, n + pad, device=device, dtype=dtype) * 4)[:, :n]
    with config_override("softmax", **VEC8):
        sm._PLANS.clear()
        _check(x, -1)
        assert [p.persist[2]["VEC_WIN"] > 0 for p in _persist_plans()] == [True, True]
        y = fused_softmax(x, -1)
        dy = (torch.randn(9, n + 8, device=device, dtype=dtype))[:, :n]  # row stride n + 8: the same window
        dx = sm.softmax_backward(y, dy, 1)
    assert_within_torch(dx, *softmax_backward_refs(y, dy, 1), what="softmax dx")


def test_vec8_special_values(device):
    """VEC8 rows with -inf / +inf / NaN in the head, the tail and the body, and a row all -inf: as torch.softmax."""
    x = torch.randn(6, 53, device=device, dtype=torch.float16) * 3
    x[0, 0] = float("-inf")  # the head (row 0 starts on a vector: no head; row 1 starts 5 into one)
    x[1, 1] = float("-inf")
    x[1, 52] = float("-inf")  # the tail
    x[2, 20] = float("inf")
    x[3, 51] = float("nan")
    x[4, :] = float("-inf")
    x[5, 2] = float("inf")  # +inf in the head
    with config_override("softmax", **VEC8):
        y = fused_softmax(x, -1)
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), equal_nan=True, atol=2e-3, rtol=2e-3)


def test_wide_persistent_many_pieces(device):
    """41 pieces a row: the SMEM form's called wait combines the row's words 32 at a time (_rowsync.WAIT_CHUNK: two
    chunks, the second partial), the register form waits for all at once; with -inf / +inf rows and a row whose
    first chunk of pieces is all -inf."""
    x = torch.randn(4, 16 * 41, device=device, dtype=torch.bfloat16) * 4  # (float32 below)
    x[1, : 16 * 33] = float("-inf")  # the first chunk's pieces all -inf, the second finite
    with config_override("softmax", max_single_block=8, persist_block=16):
        _check(x, -1)
        x = x.float()
        x[0, :] = float("-inf")
        x[2, 600] = float("inf")
        y = fused_softmax(x, -1)
    torch.testing.assert_close(y, torch.softmax(x.double(), -1).float(), equal_nan=True, atol=1e-6, rtol=1e-5)
    assert torch.isnan(y[0]).all() and torch.isnan(y[2]).all()


def test_plan_shared_across_persist_flag(device):
    """A row that is not wide has one plan for eager and traced callers (so the C++ fast path registers the
    kernels the Python path launches); a wide float32 row has a persistent plan for eager calls only."""
    with config_override("softmax", max_single_block=8):
        for shape, wide in (((4, 8), False), ((4, 40), True)):
            st = (torch.empty(shape).stride(),)
            a = sm._plan(torch.Size(shape), st, torch.float32, 1, True)
            b = sm._plan(torch.Size(shape), st, torch.float32, 1, False)
            assert (a is b) != wide
            assert (a.persist is not None) == wide and b.persist is None


def test_eager_single_block_limit(device):
    """``eager_max_single_block`` (softmax_config.EAGER_MAX_SINGLE_BLOCK): eager calls take the persistent kernels
    from a narrower row on than traced ones, the traced plan stays single-block, the two plans are not shared either
    way round, and both give the right softmax."""
    shape = torch.Size((5, 37))
    st = (torch.empty(shape).stride(),)
    with config_override("softmax", max_single_block=64, eager_max_single_block=16, persist_block=16):
        for first in (True, False):  # whichever caller plans first
            sm._PLANS.clear()
            a = sm._plan(shape, st, torch.float32, 1, first)
            b = sm._plan(shape, st, torch.float32, 1, not first)
            eager, traced = (a, b) if first else (b, a)
            assert eager.wide and eager.persist is not None and not traced.wide and traced.persist is None
        x = torch.randn(shape, device=device) * 3
        _check(x, -1)  # eager (persistent), backward included
        assert any(p.persist is not None and p.kernel is not None for p in sm._PLANS.values())
        _check(x, -1, traced=True)  # traced (single block)


@pytest.mark.parametrize("n", [pytest.param(9001, marks=pytest.mark.gpu), 12289,  # (ragged on the interpreter;
                               pytest.param(16384, marks=pytest.mark.gpu)])  # 9001 on the GPU: the same bucket)
def test_packed_single_block(n, device):
    """PACKED single-block forward (softmax_config.PACKED: the bf16 row held as loaded, converted at each pass,
    ptxas's register cap; the default of eager bf16 16K-bucket forwards): eager plans take it, traced plans and fp16
    do not; against float64 on ragged and aligned widths, with -inf runs, an all -inf row, +inf, NaN and huge
    logits."""
    x = torch.randn(7, n, device=device) * 3
    x[1, : n // 3] = float("-inf")
    x[2] = float("-inf")
    x[3, n // 2] = float("inf")
    x[4, n - 1] = float("nan")
    x[5] = x[5] * 1e4  # huge
    x = x.to(torch.bfloat16)
    st = (x.stride(),)
    eager = sm._plan(x.shape, st, x.dtype, 1, True)
    traced = sm._plan(x.shape, st, x.dtype, 1, False)
    assert eager.packed and eager.kernel.meta["PACKED"] and not eager.wide
    assert not traced.packed and not traced.kernel.meta["PACKED"] and "maxnreg" not in traced.kernel.meta
    assert not sm._plan(x.shape, st, torch.float16, 1, True).packed
    y = fused_softmax(x, -1)
    assert_within_torch(y, torch.softmax(x.double(), -1), torch.softmax(x, -1), what="softmax", relative=True)
    assert torch.isnan(y[2]).all() and torch.isnan(y[3]).all() and torch.isnan(y[4]).all()
    assert not torch.isnan(y[[0, 1, 5, 6]]).any()
    _check(x[[0, 1, 5, 6]].contiguous(), -1)  # and the backward after it


@pytest.mark.parametrize("dim", [0, 1, -2, 2])
def test_non_last_dim(dim, device):
    x = torch.randn(3, 11, 5, device=device)
    _check(x, dim)
    with config_override("softmax", max_single_block=4, persist_block=4, wide_block=4, wide_piece=8):
        _check(x, dim)
        _check(x, dim, traced=True)


def test_non_contiguous_inputs(device):
    base = torch.randn(6, 40, device=device)
    _check(base[:, ::3], -1)  # column stride 3
    _check(base.t(), -1)  # transposed: column stride 40, row stride 1
    _check(base.t(), 0)
    x4 = torch.randn(2, 3, 4, 5, device=device).permute(0, 2, 3, 1)  # needs the documented copy path
    _check(x4, 1)
    _check(torch.randn(4, 2, 9, device=device).transpose(0, 1)[:, 1:], -1)
    with config_override("softmax", max_single_block=4, persist_block=4, wide_block=4, wide_piece=8):
        _check(base[:, 1::2], -1)
        _check(base[:, 1::2], -1, traced=True)


def test_rank_and_empty(device):
    _check(torch.randn((), device=device), 0)
    _check(torch.randn(13, device=device), 0)
    _check(torch.randn(2, 3, 2, 7, device=device), -1)
    for shape, dim in [((0, 5), -1), ((3, 0), -1), ((0,), 0), ((2, 0, 3), 1)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        y = fused_softmax(x, dim)
        assert y.shape == torch.softmax(x, dim).shape
        y.sum().backward()
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("route", ["single", "persistent", "traced"])
def test_special_values(route, device):
    """-inf rows, +inf, NaN and huge logits follow torch.softmax exactly."""
    x = torch.randn(6, 23, device=device) * 2
    x[0] = float("-inf")  # all -inf: NaN row
    x[1, :11] = float("-inf")  # first pieces all -inf, later finite
    x[2, 5] = float("inf")  # +inf: NaN row
    x[3, 7] = float("nan")  # NaN: NaN row
    x[4] = x[4] * 1e37  # huge finite logits
    x[5, 20:] = float("-inf")  # trailing -inf
    ctx = config_override("softmax", max_single_block=4, persist_block=8, wide_block=4, wide_piece=8)
    with ctx if route != "single" else config_override("softmax"):
        y = sm._forward(x, 1, False) if route == "traced" else fused_softmax(x, -1)
    ref = torch.softmax(x.double(), -1).float()
    torch.testing.assert_close(y, ref, equal_nan=True, atol=1e-6, rtol=1e-5)
    assert torch.isnan(y[0]).all() and torch.isnan(y[2]).all() and torch.isnan(y[3]).all()


def test_module_is_drop_in(device):
    m = FusedSoftmax(dim=1)
    assert isinstance(m, nn.Softmax) and m.dim == 1 and m.extra_repr() == nn.Softmax(dim=1).extra_repr()
    x = torch.randn(2, 9, 4, device=device)
    torch.testing.assert_close(m(x), nn.Softmax(dim=1)(x))
    m.load_state_dict(nn.Softmax(dim=1).state_dict(), strict=True)
    legacy = FusedSoftmax()  # dim=None: PyTorch's implicit dim (1 for a 4-D input)
    x4 = torch.randn(2, 3, 4, 5, device=device)
    torch.testing.assert_close(legacy(x4), torch.softmax(x4, 1))


def test_bad_arguments(device):
    with pytest.raises(IndexError, match="dim"):
        fused_softmax(torch.randn(3, 4, device=device), 2)
    with pytest.raises(TypeError, match="'input' has dtype torch.int64"):
        fused_softmax(torch.ones(3, 4, dtype=torch.long, device=device), -1)
    with pytest.raises(TypeError, match="'input' must be a torch.Tensor"):
        fused_softmax([1.0, 2.0], -1)
    with pytest.raises(TypeError, match="'dim' must be an int"):
        fused_softmax(torch.randn(3, device=device), 0.5)


def test_float64_uses_reference(device):
    x = torch.randn(3, 17, dtype=torch.float64, device=device)
    _check(x, -1)


def test_opcheck(device):
    x = torch.randn(4, 33, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fused_layers.softmax_fwd.default, (x, 1))
    y = torch.softmax(x.detach(), -1)
    torch.library.opcheck(torch.ops.fused_layers.softmax_bwd.default, (y, torch.randn_like(y), 1))


@pytest.mark.slow
def test_torch_compile_fullgraph(device):
    """Forward and backward through torch.compile with no graph break (custom op path)."""
    torch._dynamo.reset()
    lin = nn.Linear(24, 24).to(device)
    model = nn.Sequential(lin, FusedSoftmax(dim=-1))
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(5, 24, device=device)
    y = compiled(x)
    y_ref = torch.softmax(lin(x), -1)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn_like(y)
    y.backward(dy)
    g = lin.weight.grad.clone()
    lin.weight.grad = None
    y_ref.backward(dy)
    torch.testing.assert_close(g, lin.weight.grad, atol=1e-5, rtol=1e-5)


def test_fallback_without_triton(monkeypatch):
    """On a device where Triton cannot run, the PyTorch reference computes it with one warning."""
    import fused_layers.ops._common as common

    monkeypatch.setattr(common, "INTERPRET", False)
    monkeypatch.setattr(common, "_warned", set())
    x = torch.randn(3, 10, requires_grad=True)
    with pytest.warns(UserWarning, match="using the PyTorch reference"), launched("softmax") as seen:
        y = fused_softmax(x, -1)
    assert seen == []  # the fallback ran: no kernel launched
    torch.testing.assert_close(y, torch.softmax(x, -1), atol=0, rtol=0)
    y.sum().backward()  # reference autograd works
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused_softmax(x, -1)  # warned once only


# ------------------------------------------------------------------------------------------------
# GPU (H200): realistic and wide rows through the real kernels.
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [256, 1000, 1024, 4097, 16384, 32768, 32769, 50304, 65536, 100003, 131072, 262144,
                               1048576])
def test_gpu_widths(n, dtype):
    """Every default route at real widths: single block (PACKED for bf16 16K), the persistent kernels (cooperative
    launches, co-resident programs really waiting on each other, more rows than row groups; the register and SMEM
    forms, HOLD) and the piece-wise kernels of traced calls."""
    m = max(1, min(512, 2**24 // n))
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
    _check(x, -1)
    _check(x, -1, traced=True)


_VEC8 = {"VEC_WIN": lambda w: w > 0}


@pytest.mark.gpu
@pytest.mark.parametrize("n,dtype,fwd,bwd", [
    (16384, torch.bfloat16, ("_softmax_fwd_kernel", {"PACKED": True}), None),  # PACKED: the bf16 16K single block
    (32000, torch.float16, ("_softmax_fwd_persist_kernel", {"VEC_WIN": 0}), None),  # aligned persistent
    (50257, torch.bfloat16, ("_softmax_fwd_persist_kernel", _VEC8), ("_softmax_bwd_persist_kernel", _VEC8)),  # VEC8
    (131072, torch.bfloat16, ("_softmax_fwd_persist_kernel", {}), ("_softmax_bwd_persist_kernel", {"HOLD": True})),
], ids=["16K-bf16-packed", "32K-fp16-persist", "50257-bf16-vec8", "128K-bf16-hold"])
def test_gpu_production_widths_16bit(n, dtype, fwd, bwd):
    """16-bit rows at production widths, 2^24 elements: probabilities (entry by entry too) and dx within the 16-bit
    rule of tests/_tol.py, and the forms that ran named: PACKED, VEC8 (forward and backward), HOLD."""
    m = max(1, min(512, 2**24 // n))
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
    with launched("softmax") as seen:
        _check(x, -1)
    assert ran(seen, fwd[0], **fwd[1]), seen
    assert bwd is None or ran(seen, bwd[0], **bwd[1]), seen
    assert kernel_names(seen)  # (a kernel ran: not the reference)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,pad", [(50257, 0), (32001, 0), (100277, 0), (30522, 0), (262143, 0), (50257, 8),
                                   (50304, 8), (50257, 64), (50257, 3)])
def test_gpu_vec8_rows(n, pad, dtype):
    """Misaligned 16-bit rows at real vocabulary widths through the default routes (the VEC8 persistent forms; a row
    stride not congruent to the output's, pad 3, takes the piece-wise forward): more rows than row groups, every row
    offset mod 8, forward and backward against float64."""
    m = max(1, min(512, 2**24 // n))
    x = (torch.randn(m, n + pad, device="cuda", dtype=dtype) * 3)[:, :n]
    x[1, 0] = float("-inf")
    x[2, n - 1] = float("inf")
    x[3, :] = float("-inf")
    y = fused_softmax(x, -1)
    assert_within_torch(y, torch.softmax(x.double(), -1), torch.softmax(x, -1), what="softmax", relative=True)
    _check(x[4:], -1)


@pytest.mark.gpu
def test_gpu_wide_persistent_in_cuda_graph_and_side_stream():
    """The persistent (cooperative) launch captured in a CUDA graph and replayed, and run on a side stream
    while another stream's kernels occupy the GPU: same results as eager."""
    x = torch.randn(4096, 65536, device="cuda")
    ref = torch.softmax(x, -1)
    fused_softmax(x, -1)  # bind the plan outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            y = fused_softmax(x, -1)
    torch.cuda.current_stream().wait_stream(s)
    x.copy_(torch.randn_like(x))
    ref = torch.softmax(x, -1)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=1e-5)
    other = torch.randn(8192, 8192, device="cuda")
    with torch.cuda.stream(s):
        for _ in range(4):
            other = other @ other.t() * 1e-4  # keeps SMs busy on the side stream
    y2 = fused_softmax(x, -1)
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_non_last_dim_and_strided():
    x = torch.randn(8, 4096, 33, device="cuda", dtype=torch.bfloat16)
    _check(x, 1)
    _check(torch.randn(512, 8192, device="cuda")[:, ::2], -1)


@pytest.mark.parametrize("n,dtype,hold", [(131072, torch.bfloat16, True), (65536, torch.bfloat16, False),
                                          (262144, torch.float32, False)])
def test_persistent_backward_hold_default(n, dtype, hold):
    """softmax_config.HOLD_MIN_N: the 16-bit backward's SMEM form takes HOLD above 64K columns, the forward and fp32
    never; hold_min_n moves the threshold (plans only: the kernels' results are tested above)."""
    shape, st = torch.Size((2, n)), (n, 1)
    bwd = sm._plan(shape, (st, st), dtype, -1, persist_ok=True)
    fwd = sm._plan(shape, (st,), dtype, -1, persist_ok=True)
    assert bwd.persist is not None and bwd.persist[2]["HOLD"] == hold
    assert fwd.persist is not None and "HOLD" not in fwd.persist[2]
    with config_override("softmax", hold_min_n=n + 1):
        assert not sm._plan(shape, (st, st), dtype, -1, persist_ok=True).persist[2]["HOLD"]
