"""FusedLayerNorm / FusedRMSNorm: outputs and all gradients against float64, layouts, dtypes, API, compile.

On a CPU-only machine the kernels run under the Triton interpreter: grids stay tiny (a few rows) and
``config_override("layer_norm", ...)`` forces a width's kernel (chunked, persistent, several tiles and programs)
onto rows of a few dozen columns.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from _tol import assert_within_torch, kernel_names, launched, ran, rms_variant_refs
from conftest import BIG, TOL
from torch import nn

from fused_layers import FusedLayerNorm, FusedRMSNorm, fused_layer_norm, fused_rms_norm
from fused_layers.ops import layer_norm as ln_ops
from fused_layers.ops import layer_norm_config as lnc
from fused_layers.ops.layer_norm import config_override, layer_norm_reference, rms_norm_reference
from fused_layers.ops.layer_norm_config import BwdChunks, BwdPersist, BwdTile, FwdChunks, FwdTile

WIDE = dict(fwd=FwdChunks(16, 4), bwd=BwdChunks(16, 4, 1))  # the chunked kernels, 16-column chunks
NARROW_TILES = dict(fwd=FwdTile(2, 4), bwd=BwdTile(2, 4, 1), programs=3)  # several tiles and programs per call


def _grad_tol(dtype, n_rows):
    """float32 (atol, rtol) for gradients: the dtype's output tolerance, dW/dB scaled by the rows summed (dx, a per-row
    quantity, is called with n_rows=1)."""
    atol, rtol = TOL[dtype]
    return atol * max(4, n_rows ** 0.5) * 4, rtol * 4


def _run(fn, x, w, b, dy):
    leaves = [t for t in (x, w, b) if t is not None]
    y = fn(x, w, b)
    grads = torch.autograd.grad(y, leaves, dy)
    return y, grads


def _check(rms, shape, k, dtype, device, param_dtype=None, affine=True, bias=True, make_x=None, dy_fn=None,
           w_fn=None):
    """Compare our forward and every gradient with a float64 reference on the same inputs (``w_fn`` maps the random
    weights, ``dy_fn`` the random upstream gradient)."""
    norm_shape = tuple(shape[len(shape) - k:])
    pdt = param_dtype or dtype
    x = (make_x(shape, dtype, device) if make_x else torch.randn(shape, dtype=dtype, device=device) * 2 + 0.5)
    x.requires_grad_(True)
    w = (torch.randn(norm_shape, dtype=pdt, device=device) if affine else None)
    if w is not None and w_fn is not None:
        w = w_fn(w).to(pdt)
    b = (torch.randn(norm_shape, dtype=pdt, device=device) if affine and bias and not rms else None)
    for t in (w, b):
        if t is not None:
            t.requires_grad_(True)
    dy = torch.randn(shape, dtype=dtype, device=device)
    if dy_fn is not None:
        dy = dy_fn(dy)
    eps = 1e-5
    if rms:
        ours = lambda x, w, b: fused_rms_norm(x, norm_shape, w, eps)  # noqa: E731
        ref = lambda x, w, b: F.rms_norm(x, norm_shape, w, eps)  # noqa: E731
    else:
        ours = lambda x, w, b: fused_layer_norm(x, norm_shape, w, b, eps)  # noqa: E731
        ref = lambda x, w, b: F.layer_norm(x, norm_shape, w, b, eps)  # noqa: E731
    y, grads = _run(ours, x, w, b, dy)
    d64 = lambda t: None if t is None else t.detach().double().requires_grad_(True)  # noqa: E731
    y64, grads64 = _run(ref, d64(x), d64(w), d64(b), dy.double())
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    leaves = [t for t in (x, w, b) if t is not None]
    for g, leaf in zip(grads, leaves):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape
    if dtype in (torch.float16, torch.bfloat16):  # within K x PyTorch's own error in the same dtypes (tests/_tol.py)
        same = lambda t: None if t is None else t.detach().requires_grad_(True)  # noqa: E731
        torch_ref = ref
        if not rms and affine and pdt != dtype:
            # CUDA's layer_norm rejects a 16-bit x with float32 weights (torch 2.11): PyTorch's run is then the
            # float32 math autocast runs for it, rounded to x's dtype like our output.
            torch_ref = lambda x, w, b: F.layer_norm(x.float(), norm_shape, w, b, eps).to(x.dtype)  # noqa: E731
        y_t, grads_t = _run(torch_ref, same(x), same(w), same(b), dy)
        scales = {}
        if rms and math.prod(norm_shape) == 1:
            # One column: dx = rstd w dy (1 - y_hat^2) with y_hat^2 = x^2 / (x^2 + eps) ~ 1, the cancellation of two
            # terms of size rstd |w dy|, which any float32 arithmetic (ours, PyTorch's) leaves ~eps32 of: dx's
            # scale is that of the terms (seen: 2.8 float16 subnormal steps off where PyTorch's happened to be 0.8)
            x64 = x.detach().double()
            rstd = (x64 * x64 + eps).rsqrt()
            terms = (rstd * (w.detach().double() if w is not None else 1.0) * dy.double()).abs().max().item()
            scales["dx"] = terms * torch.finfo(torch.float32).eps / torch.finfo(dtype).eps
        for name, a, r, t in zip(("y", "dx", "dW", "dB"), (y, *grads), (y64, *grads64), (y_t, *grads_t)):
            assert_within_torch(a, r, t, what=name, scale=scales.get(name))
        return y, grads
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.double(), y64, atol=atol * 4, rtol=rtol * 2)
    n_rows = x.numel() // max(1, w.numel() if w is not None else x[(0,) * (x.dim() - k)].numel())
    for g, g64, leaf in zip(grads, grads64, leaves):
        gatol, grtol = _grad_tol(dtype, 1 if leaf is x else n_rows)
        torch.testing.assert_close(g.double(), g64, atol=gatol * max(1.0, g64.abs().max().item() ** 0.5), rtol=grtol)
    return y, grads


# --------------------------------------------------------------------------------------------------
# Correctness: widths, dtypes, single block and chunked kernels
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [1, 7, 64, 257])
def test_single_block(rms, dtype, n, device):
    with config_override("layer_norm", **NARROW_TILES):
        _check(rms, (5, n), 1, dtype, device)


@pytest.mark.parametrize("rms,n,dtype,bwd", [
    (False, 8192, torch.bfloat16, "_norm_bwd_kernel"),  # the widest single-block backward (3-stage)
])
def test_production_widths_16bit_default_plans(rms, n, dtype, bwd, device):
    """The default plan of 16-bit rows users run, on two rows of production width (about 5 s on the interpreter):
    y, dx, dW, dB within the rule of tests/_tol.py, and the backward kernel that ran named.  The default persistent
    backward: test_wide_rows_default_persistent_backward (16,401 columns); wider rows and the Gluon backward: GPU
    tests (test_gpu_production_widths_16bit)."""
    with launched("layer_norm") as seen:
        _check(rms, (2, n), 1, dtype, device)
    assert bwd in kernel_names(seen), kernel_names(seen)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [17, 48, 131])  # just past a chunk, whole chunks, prime with a ragged tail
def test_wide_rows_chunked(rms, dtype, n, device):
    with config_override("layer_norm", **WIDE, programs=2):
        _check(rms, (5, n), 1, dtype, device)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("wide", [False, True], ids=["single", "chunked"])
def test_one_row(rms, wide, device):
    cfg = WIDE if wide else {}
    with config_override("layer_norm", **cfg):
        _check(rms, (1, 53), 1, torch.float32, device)


def test_large_mean_welford_numerics(device):
    """Rows with a mean far from 0 and a small spread: the chunked Welford path must not cancel.

    float32 inputs near 1000 carry an ulp of 6e-5 against a spread of 1e-2, so any float32 method has
    errors of ~1e-3 after normalizing; compare with PyTorch's own float32 error on the same input.
    """
    x = 1000.0 + 0.01 * torch.randn(3, 100, device=device)
    ref = layer_norm_reference(x.double(), (100,))
    err_torch = (F.layer_norm(x, (100,)).double() - ref).abs().max().item()
    for cfg in (WIDE, {}):
        with config_override("layer_norm", **cfg):
            y = fused_layer_norm(x, 100)
        err = (y.double() - ref).abs().max().item()
        assert err <= 2 * err_torch + 1e-4, (cfg, err, err_torch)
    assert 0.9 < y.std().item() < 1.1  # normalized: unit variance, not noise from cancellation


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("n", [17, 53])
def test_wide_rows_pipelined(rms, n, device):
    """The wide-row forward with both chunk loops pipelined 3 deep (bf16 64K's default): same results."""
    with config_override("layer_norm", **dict(WIDE, fwd=FwdChunks(16, 4, stages=3)), programs=2):
        _check(rms, (7, n), 1, torch.float32, device)


PERSIST = dict(WIDE, persist=BwdPersist(16, 1))  # 16-column pieces of wide rows


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms_hold"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [37, 16 * 20 + 5])  # 3 ragged pieces; 21 pieces (two wait chunks)
def test_wide_rows_persistent_backward(rms, dtype, n, device):
    """The one-read persistent backward (_norm_bwd_persist_kernel: a row's pieces held by programs that exchange their
    partial row sums, the SMEM-pipelined row loop) in the forms of bf16 16K / 32K, LayerNorm's packed sums and
    RMSNorm's HOLD, against float64: dx, dW, dB, with more rows than row groups (the interpreter runs 3 groups) and
    without parameters."""
    with config_override("layer_norm", **WIDE, persist=BwdPersist(16, 1, hold=rms)):
        ln_ops._BWD_PLANS.clear()
        _check(rms, (7, n), 1, dtype, device)
        plans = [p for p in ln_ops._BWD_PLANS.values() if p.persist is not None]
        # (the interpreter runs 3 row groups; a GPU as many as it holds, at most one per row)
        from fused_layers.ops._common import INTERPRET

        assert plans and all(p.persist["kernel"] is not None and p.persist["groups"] == (3 if INTERPRET else 7)
                             and p.persist["meta"]["HOLD"] == rms for p in plans)
        if dtype == torch.float32:
            _check(rms, (4, n), 1, dtype, device, affine=False)
            _check(rms, (1, n), 1, dtype, device)  # one row, one group


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_wide_rows_persistent_backward_packed_sums(dtype, device):
    """LayerNorm's two partial sums packed in one word (_rowsync.pack_sums): 41 pieces a row (two wait chunks), rows
    whose dy is 0 (both sums 0: the word must still read as published, a zero sum goes out as -0.0) and dy = 0 on one
    column only."""
    def dy_fn(dy):
        dy[1:3] = 0.0
        dy[4, 0] = 0.0
        return dy

    with config_override("layer_norm", **PERSIST):
        ln_ops._BWD_PLANS.clear()
        _check(False, (7, 16 * 40 + 5), 1, dtype, device, dy_fn=dy_fn)
        assert any(p.persist is not None for p in ln_ops._BWD_PLANS.values())
        _check(False, (3, 37), 1, dtype, device, affine=False)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_wide_rows_persistent_backward_hold(rms, dtype, device):
    """HOLD (publish row k, then wait for row k - 1 and write its dx from its pieces held in registers; RMSNorm's form
    and LayerNorm 64K's): 7 rows over the interpreter's 3 row groups (3, 2 and 2 rows: the iteration past the last
    row), ragged pieces, a zero-gradient row, no parameters, and one row (one group)."""
    def dy_fn(dy):
        dy[2] = 0.0
        return dy

    with config_override("layer_norm", **WIDE, persist=BwdPersist(16, 1, hold=True)):
        ln_ops._BWD_PLANS.clear()
        _check(rms, (7, 16 * 2 + 5), 1, dtype, device, dy_fn=dy_fn)
        plans = [p for p in ln_ops._BWD_PLANS.values() if p.persist is not None]
        assert plans and all(p.persist["meta"]["HOLD"] and p.persist["kernel"] is not None for p in plans)
        if dtype == torch.float32:
            _check(rms, (5, 37), 1, dtype, device, affine=False)
            _check(rms, (1, 37), 1, dtype, device)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_dw_db_reduce_ragged_strips(rms, device):
    """The dW / dB partial sums (_norm_reduce_partials_kernel) over a ragged 53-wide row: 16-column strips (4 programs,
    the last one 5 columns) over 4 partial rows."""
    with config_override("layer_norm", bwd=BwdTile(1, 4, 1), programs=5):
        ln_ops._BWD_PLANS.clear()
        _check(rms, (7, 53), 1, torch.float32, device)
        plans = list(ln_ops._BWD_PLANS.values())
        assert plans and all(p.g == 4 and p.reduce_kernel.grid[0] == 4 for p in plans)


def test_programmatic_dependent_launch_is_eager_only(monkeypatch):
    """On sm_90 and newer (forced here) eager launches take the programmatic-dependent kernels (launch_pdl: the row
    kernel waiting on its predecessor and triggering its reduce); a traced backward (FakeTensors: torch.compile)
    launches the plain ones, whose arguments Inductor can analyse."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(ln_ops, "_use_pdl", lambda device_index: True)
    launched = []
    x, w, b = torch.randn(6, 40), torch.randn(40), torch.randn(40)
    with config_override("layer_norm", programs=2):  # (a plan of its own)
        y, stats = ln_ops.norm_forward(x, w, b, 1, 1e-5, False)
        # recorded, not run: the interpreter has no griddepcontrol
        monkeypatch.setattr(ln_ops.Kernel, "__call__", lambda self, *a: launched.append(self.meta))
        dy = torch.randn_like(y)
        with FakeTensorMode() as mode:
            f = [mode.from_tensor(t) for t in (dy, x, w, b, stats)]
            launched.clear()
            ln_ops.norm_backward(*f, 1, False)
        assert len(launched) == 2 and not any(m.get("launch_pdl") or m.get("PDL_WAIT") or m.get("PDL_TRIGGER")
                                              for m in launched)
        launched.clear()
        ln_ops.norm_backward(dy, x, w, b, stats, 1, False)
    row, red = launched
    assert row["PDL_TRIGGER"] and red["PDL_WAIT"] and red.get("launch_pdl")
    assert row["PDL_WAIT"] and row.get("launch_pdl")


def test_dw_db_reduce_config():
    """The reduce's shape: REDUCE_BLOCK_N-column strips (GPT-2's 768 columns take 48 programs), tiles of at most
    REDUCE_TILE floats, no more rows a tile than partial rows."""
    for n, g in ((768, 264), (1024, 264), (8192, 132), (131072, 66), (5, 3)):
        block_n, block_g = lnc.reduce_config(n, g)
        assert block_n == min(lnc.REDUCE_BLOCK_N, 1 << (n - 1).bit_length()), (n, block_n)
        assert block_n * block_g <= lnc.REDUCE_TILE and block_g <= 1 << (g - 1).bit_length(), (n, g, block_g)
    assert -(-768 // lnc.reduce_config(768, 264)[0]) == 48


def test_wide_rows_persistent_backward_zero_grads_and_strided(device):
    """dy = 0 on some rows (published partial sums of 0: the flagged words are never 0, so no wait hangs) and a
    row-strided x."""
    def dy_fn(dy):
        dy[1:3] = 0.0
        return dy

    with config_override("layer_norm", **PERSIST):
        _check(False, (5, 53), 1, torch.float32, device, dy_fn=dy_fn)
        x = (torch.randn(6, 80, device=device) * 2)[:, 3:56].requires_grad_()  # row stride 80
        w = torch.randn(53, device=device, requires_grad=True)
        b = torch.randn(53, device=device, requires_grad=True)
        dy = torch.randn(6, 53, device=device)
        grads = torch.autograd.grad(fused_layer_norm(x, 53, w, b), (x, w, b), dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    grads64 = torch.autograd.grad(F.layer_norm(x64, (53,), w64, b64), (x64, w64, b64), dy.double())
    for g, g64 in zip(grads, grads64):
        torch.testing.assert_close(g.double(), g64, atol=1e-4, rtol=1e-4)


def test_wide_rows_persistent_backward_traced_plan_is_two_pass():
    """Only eager calls (real tensors) take the persistent kernel: the traced plan (persist_ok False) stays on the
    two-pass kernels, and the persistent plan keeps that plan as its fallback."""
    shape = torch.Size((4, 40))
    with config_override("layer_norm", **PERSIST):
        eager = ln_ops._bwd_plan(shape, (40, 1), (40, 1), torch.float32, 1, True, True, False, -1, persist_ok=True)
        traced = ln_ops._bwd_plan(shape, (40, 1), (40, 1), torch.float32, 1, True, True, False, -1)
    assert eager.persist is not None and eager.persist["splits"] == 3 and eager.fallback is traced
    assert traced.persist is None and traced.stats_kernel is not None


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_wide_rows_default_persistent_backward(rms, device):
    """The BWD_PERSIST defaults themselves (bf16, no override): a 16,401-wide row (bucket 32K) takes the persistent
    plan, right against float64: LayerNorm nine 2,048-column pieces (the last ragged), RMSNorm the HOLD form in
    1,024-column pieces."""
    ln_ops._BWD_PLANS.clear()
    _check(rms, (2, 16401), 1, torch.bfloat16, device)
    plans = [p for p in ln_ops._BWD_PLANS.values() if p.persist is not None]
    splits, piece = (17, 1024) if rms else (9, 2048)
    assert plans and all(p.persist["splits"] == splits and p.persist["meta"]["BLOCK_N"] == piece
                         and p.persist["meta"]["HOLD"] == rms and p.persist["kernel"] is not None for p in plans)


@pytest.mark.parametrize("n_pow2,rms,hold,piece", [(16384, False, False, 2048), (16384, True, True, 1024),
                                                     (65536, False, True, 2048), (65536, True, True, 2048),
                                                     (131072, True, True, 4096), (131072, False, False, 8192)])
def test_persistent_backward_table(n_pow2, rms, hold, piece):
    """BWD_PERSIST gives each norm its own piece shape and HOLD; float32 and narrow rows have no entry."""
    got = lnc.persist_config(n_pow2, n_pow2, 2, rms)
    assert (got.block, got.hold) == (piece, hold)
    assert lnc.persist_config(n_pow2, n_pow2, 4, rms) is None and lnc.persist_config(8192, 8192, 2, rms) is None


@pytest.mark.parametrize("n", [40, 768])
def test_backward_plan_without_persistent_kernel_is_shared(n):
    """A row the persistent kernel does not take (narrow, or no BWD_PERSIST entry) has one backward plan for
    eager and traced callers: the kernels the Python path compiles are the ones the C++ fast path registers
    (it asks with persist_ok False)."""
    shape = torch.Size((4, n))
    eager = ln_ops._bwd_plan(shape, (n, 1), (n, 1), torch.bfloat16, 1, True, True, False, -1, persist_ok=True)
    traced = ln_ops._bwd_plan(shape, (n, 1), (n, 1), torch.bfloat16, 1, True, True, False, -1)
    assert eager is traced and eager.persist is None


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", [dict(acc_rows=True), dict(pair_sum=True), dict(acc_rows=True, pair_sum=True)],
                         ids=["acc_rows", "pair_sum", "both"])
@pytest.mark.parametrize("n", [7, 131])
def test_single_block_backward_tuned_forms(rms, dtype, form, n, device):
    """The single-block backward's forms in the table (acc_rows: one-row dW/dB accumulators; pair_sum: LayerNorm's
    two row sums in one reduction; the row loop pipelined): every gradient against float64, on a ragged row count
    (the last tile of a program is partly masked)."""
    with config_override("layer_norm", fwd=FwdTile(2, 4), bwd=BwdTile(2, 4, 1, stages=2, **form), programs=3):
        _check(rms, (7, n), 1, dtype, device)
    with config_override("layer_norm", fwd=FwdTile(2, 4), bwd=BwdTile(2, 4, 1, **form), programs=3):
        _check(rms, (7, n), 1, dtype, device, bias=False)  # no bias, no affine: the other branches
        _check(rms, (5, n), 1, dtype, device, affine=False)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_2d_normalized_shape(rms, device):
    _check(rms, (2, 3, 4, 5), 2, torch.float32, device)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_no_affine(rms, device):
    _check(rms, (4, 33), 1, torch.float32, device, affine=False)


def test_layer_norm_no_bias(device):
    with config_override("layer_norm", **WIDE):
        _check(False, (4, 40), 1, torch.bfloat16, device, bias=False)
    _check(False, (4, 40), 1, torch.bfloat16, device, bias=False)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mixed_dtype_params(rms, dtype, device):
    """float32 parameters with a half-precision input (AMP): output in the input's dtype like torch."""
    y, grads = _check(rms, (6, 40), 1, dtype, device, param_dtype=torch.float32)
    x = torch.randn(6, 40, dtype=dtype, device=device)
    mod = nn.RMSNorm(40, device=device) if rms else nn.LayerNorm(40, device=device)
    assert y.dtype == dtype and grads[1].dtype == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that mixed dtypes take its slow path
        try:
            ref_dtype = mod(x).dtype
        except RuntimeError:  # torch 2.11's CUDA layer_norm rejects a bf16 input with fp32 params
            return
    assert ref_dtype == dtype


# --------------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_row_strided_input_no_copy(rms, device):
    """A slice of wider rows (row stride 64, unit column stride) runs without a copy; a transpose of
    leading dims too when they merge, else it is copied."""
    sliced = lambda s, dt, dev: torch.randn(s[0], 64, dtype=dt, device=dev)[:, 3 : 3 + s[1]]  # noqa: E731
    probe = sliced((5, 37), torch.float32, device)
    xv, m, n, sx = ln_ops._as_rows(probe, 1)
    assert xv.data_ptr() == probe.data_ptr() and (m, n, sx) == (5, 37, 64)
    _check(rms, (5, 37), 1, torch.float32, device, make_x=sliced)
    tr = lambda s, dt, dev: torch.randn(s[1], s[0], s[2], dtype=dt, device=dev).transpose(0, 1)  # noqa: E731
    _check(rms, (3, 4, 40), 1, torch.float32, device, make_x=tr)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_column_strided_input_and_dy_copy(rms, device):
    """A strided last dim (copied) and a non-contiguous incoming gradient."""
    make = lambda s, dt, dev: torch.randn(s[1], s[0], dtype=dt, device=dev).t()  # noqa: E731
    _check(rms, (6, 21), 1, torch.float32, device, make_x=make, dy_fn=lambda d: d.t().contiguous().t())
    xv, *_ = ln_ops._as_rows(make((6, 21), torch.float32, device), 1)
    assert xv.is_contiguous()


def test_as_rows_merges_leading_dims():
    t = torch.randn(3, 4, 10)[:, ::2]  # leading dims with strides (40, 20): merge into one stride 20
    xv, m, n, sx = ln_ops._as_rows(t, 1)
    assert xv.data_ptr() == t.data_ptr() and (m, n, sx) == (6, 10, 20)
    t2 = torch.randn(4, 3, 10).transpose(0, 1)  # strides (10, 30): do not merge
    xv2, m2, n2, sx2 = ln_ops._as_rows(t2, 1)
    assert xv2.is_contiguous() and (m2, n2, sx2) == (12, 10, 10)


def test_empty_input(device):
    x = torch.randn(0, 8, device=device, requires_grad=True)
    ln = FusedLayerNorm(8, device=device)
    y = ln(x)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert torch.equal(ln.weight.grad, torch.zeros(8, device=device))


# --------------------------------------------------------------------------------------------------
# Accuracy of dW / dB in bf16 against PyTorch eager's own error
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_bf16_param_grad_error_vs_eager(rms, device):
    m, n = 96, 40
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, device=device, dtype=torch.bfloat16)
    b = None if rms else torch.randn(n, device=device, dtype=torch.bfloat16)
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)

    def grads(fn, x, w, b, dy):
        leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, w, b)]
        y = fn(*leaves)
        return torch.autograd.grad(y, [t for t in leaves[1:] if t is not None], dy)

    if rms:
        ours = grads(lambda x, w, b: fused_rms_norm(x, (n,), w, 1e-6), x, w, b, dy)
        eager = grads(lambda x, w, b: F.rms_norm(x, (n,), w, 1e-6), x, w, b, dy)
        ref = grads(lambda x, w, b: F.rms_norm(x, (n,), w, 1e-6), x.double(), w.double(), None, dy.double())
    else:
        ours = grads(lambda x, w, b: fused_layer_norm(x, (n,), w, b), x, w, b, dy)
        eager = grads(lambda x, w, b: F.layer_norm(x, (n,), w, b), x, w, b, dy)
        ref = grads(lambda x, w, b: F.layer_norm(x, (n,), w, b), x.double(), w.double(), b.double(), dy.double())
    # Both errors are dominated by the final rounding to bfloat16 (ours accumulates in float32); on the CPU too, since
    # conftest.py makes the interpreter round float32 -> bfloat16 to nearest, as the GPU does.
    for o, e, r in zip(ours, eager, ref):
        err_ours = (o.double() - r).norm().item()
        err_eager = (e.double() - r).norm().item()
        bound = err_eager
        print(f"bf16 grad error: ours {err_ours:.4g}, eager {err_eager:.4g}, ratio {err_ours / err_eager:.3f}")
        assert err_ours <= 1.1 * bound + 1e-4 * r.norm().item(), (err_ours, err_eager, bound)


# --------------------------------------------------------------------------------------------------
# Modules: drop-in API, state_dict, autocast
# --------------------------------------------------------------------------------------------------
def test_modules_are_drop_in(device):
    ln = FusedLayerNorm((3, 5), eps=1e-3, elementwise_affine=True, bias=False, device=device, dtype=torch.bfloat16)
    assert isinstance(ln, nn.LayerNorm) and ln.bias is None and ln.weight.dtype == torch.bfloat16
    assert ln.normalized_shape == (3, 5) and ln.eps == 1e-3
    rms = FusedRMSNorm(16, device=device)
    assert isinstance(rms, nn.RMSNorm) and rms.eps is None and rms.weight.shape == (16,)
    assert FusedLayerNorm(8, elementwise_affine=False).weight is None
    assert FusedRMSNorm(8, elementwise_affine=False).weight is None
    assert set(dict(FusedLayerNorm(8).named_parameters())) == set(dict(nn.LayerNorm(8).named_parameters()))


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_state_dict_round_trip(rms, device):
    ref_cls, our_cls = (nn.RMSNorm, FusedRMSNorm) if rms else (nn.LayerNorm, FusedLayerNorm)
    ref = ref_cls(24, device=device)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_()
    ours = our_cls(24, device=device)
    ours.load_state_dict(ref.state_dict(), strict=True)
    back = ref_cls(24, device=device)
    back.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(3, 24, device=device)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(back(x), ref(x), atol=0, rtol=0)


def test_rms_eps_none_matches_torch(device):
    x = torch.randn(4, 32, device=device, dtype=torch.bfloat16) * 1e-2  # eps (bf16: 2^-7) matters here
    ours, ref = FusedRMSNorm(32, device=device), nn.RMSNorm(32, device=device)
    torch.testing.assert_close(ours(x).float(), ref(x).float(), atol=2e-2, rtol=2e-2)
    y_big = fused_rms_norm(x, (32,), None, torch.finfo(torch.bfloat16).eps)
    y_small = fused_rms_norm(x, (32,), None, torch.finfo(torch.float32).eps)
    assert not torch.allclose(y_big.float(), y_small.float(), atol=0.05)  # the input tells the two apart


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("ac_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_autocast_matches_torch(rms, ac_dtype, x_dtype, device):
    """Under autocast on the test device: same output dtype and values as torch's module (float32
    parameters, as under AMP), and the input gradient in the input's dtype."""
    mod_ref = nn.RMSNorm(16, device=device) if rms else nn.LayerNorm(16, device=device)
    with torch.no_grad():
        for p in mod_ref.parameters():
            p.normal_()
    mod = (FusedRMSNorm if rms else FusedLayerNorm)(16, device=device)
    mod.load_state_dict(mod_ref.state_dict())
    x = torch.randn(4, 16, device=device, dtype=x_dtype, requires_grad=True)
    with torch.autocast(device_type=torch.device(device).type, dtype=ac_dtype):
        y = mod(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch may warn about mixed dtypes
            y_ref = mod_ref(x)
    assert y.dtype == y_ref.dtype
    torch.testing.assert_close(y.float(), y_ref.float(), atol=2e-2, rtol=2e-2)
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == x.dtype


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("ac_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_policy_probe_matches_torch(op, ac_dtype, device, monkeypatch):
    """The policy is probed from torch's own op (not its dispatcher tables), cached, and not probed
    while Dynamo traces (cache or documented default only)."""
    dev = torch.device(device)
    fn = getattr(F, op)
    x = torch.randn(3, 8, device=device, dtype=ac_dtype)
    with torch.autocast(dev.type, dtype=ac_dtype):
        torch_fp32 = fn(x, (8,)).dtype == torch.float32
    monkeypatch.setattr(ln_ops, "_AUTOCAST_FP32", {})
    assert ln_ops.autocast_runs_in_float32(op, dev, ac_dtype) == torch_fp32
    assert ln_ops._AUTOCAST_FP32[(op, dev.type, ac_dtype)] == torch_fp32

    def no_probe(*a, **k):
        raise AssertionError("probed while compiling")

    monkeypatch.setattr(ln_ops, "_AUTOCAST_PROBES", {"layer_norm": no_probe, "rms_norm": no_probe})
    monkeypatch.setattr(ln_ops, "is_compiling", lambda: True)
    assert ln_ops.autocast_runs_in_float32(op, dev, ac_dtype) == torch_fp32  # cached answer
    ln_ops._AUTOCAST_FP32.clear()
    assert ln_ops.autocast_runs_in_float32(op, dev, ac_dtype) == ln_ops._autocast_default(op, dev.type)
    assert not ln_ops._AUTOCAST_FP32  # the default is not cached: an eager call probes later
    if dev.type == "cpu":  # CPU autocast leaves both norms alone
        assert not torch_fp32


def test_launch_plan_cache(device):
    """Plans are cached per (shape, strides, dtype, k, params, norm, override epoch): a new layout or an
    override gives a new plan, and each gives the right answer."""
    x = torch.randn(5, 37, device=device)
    xs = torch.randn(5, 64, device=device)[:, 3:40]
    p1 = ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, 1, False, False, False)
    assert p1 is ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, 1, False, False, False)
    p2 = ln_ops._fwd_plan(xs.shape, xs.stride(), xs.dtype, 1, False, False, False)
    assert p2 is not p1 and p2.ints == (5, 37, 64) and not p2.copy
    with config_override("layer_norm", **WIDE):
        p3 = ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, 1, False, False, False)
        assert p3 is not p1 and p3.kernel.meta["BLOCK_N"] == 16
        y3 = fused_layer_norm(x, 37)
    for y, inp in ((fused_layer_norm(x, 37), x), (fused_layer_norm(xs, 37), xs), (y3, x)):
        torch.testing.assert_close(y.double(), layer_norm_reference(inp.double(), (37,)), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# Errors and fallbacks
# --------------------------------------------------------------------------------------------------
def test_clear_errors():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="normalized_shape"):
        fused_layer_norm(x, (7,))
    with pytest.raises(ValueError, match="normalized_shape"):
        fused_rms_norm(x, (4, 4))
    with pytest.raises(TypeError, match="normalized_shape"):
        fused_layer_norm(x, "8")
    with pytest.raises(ValueError, match="'weight' must have shape"):
        fused_layer_norm(x, 8, torch.randn(7))
    with pytest.raises(ValueError, match="'bias' must have shape"):
        fused_layer_norm(x, 8, torch.randn(8), torch.randn(2, 4))
    with pytest.raises(TypeError, match="'input' has dtype torch.int64"):
        fused_layer_norm(torch.ones(4, 8, dtype=torch.long), 8)
    with pytest.raises(TypeError, match="'weight' has dtype torch.bfloat16"):
        fused_rms_norm(x, 8, torch.randn(8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="'input' must be a torch.Tensor"):
        fused_layer_norm([1.0, 2.0], 2)
    with pytest.raises(ValueError, match="same device"):
        fused_layer_norm(x, 8, torch.randn(8, device="meta"))


def test_float64_and_meta_use_pytorch():
    x = torch.randn(3, 10, dtype=torch.float64)
    torch.testing.assert_close(fused_layer_norm(x, 10), F.layer_norm(x, (10,)))
    torch.testing.assert_close(fused_rms_norm(x, 10), F.rms_norm(x, (10,)))
    m = torch.empty(5, 10, device="meta", dtype=torch.bfloat16)
    assert fused_layer_norm(m, 10).shape == (5, 10)
    assert fused_rms_norm(m, 10, torch.empty(10, device="meta")).dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------------
# torch.library registration: opcheck and torch.compile
# --------------------------------------------------------------------------------------------------
def test_opcheck(device):
    x = torch.randn(3, 20, device=device, requires_grad=True)
    w = torch.randn(20, device=device, requires_grad=True)
    b = torch.randn(20, device=device, requires_grad=True)
    fwd, bwd = ln_ops.norm_op.fwd_op, ln_ops.norm_op.bwd_op
    torch.library.opcheck(fwd, (x, w, b, 1, 1e-5, False))
    torch.library.opcheck(fwd, (x, w, None, 1, 1e-6, True))
    y, stats = fwd(x.detach(), w.detach(), b.detach(), 1, 1e-5, False)
    dy = torch.randn_like(y)
    torch.library.opcheck(
        bwd, (dy, x.detach(), w.detach(), b.detach(), stats, 1, False),
        test_utils=("test_schema", "test_faketensor"),
    )


@pytest.mark.slow
def test_compile_fullgraph_forward_backward(device):
    ln = FusedLayerNorm(24, device=device)
    rms = FusedRMSNorm(24, device=device)
    ref_ln, ref_rms = nn.LayerNorm(24, device=device), nn.RMSNorm(24, device=device)
    with torch.no_grad():
        for p in list(ln.parameters()) + list(rms.parameters()):
            p.normal_()
    ref_ln.load_state_dict(ln.state_dict())
    ref_rms.load_state_dict(rms.state_dict())

    def f(mods, x):
        return mods[1](mods[0](x) * 2.0)

    x = torch.randn(4, 24, device=device, requires_grad=True)
    compiled = torch.compile(f, fullgraph=True)
    y = compiled((ln, rms), x)
    y.square().sum().backward()
    gx, gw = x.grad.clone(), ln.weight.grad.clone()
    x.grad = None
    y_ref = f((ref_ln, ref_rms), x)
    y_ref.square().sum().backward()
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gx, x.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, ref_ln.weight.grad, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# GPU only
# --------------------------------------------------------------------------------------------------
def _assert_grads_bitwise_repeatable(rms, m, n, dtype, runs):
    """dx, dW (and dB) of the fused module on fixed inputs, ``runs`` times: bitwise equal each time."""
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    mod = (FusedRMSNorm if rms else FusedLayerNorm)(n, device="cuda")
    outs = []
    for _ in range(runs):
        mod.zero_grad(set_to_none=True)
        xr = x.clone().requires_grad_(True)
        mod(xr).backward(dy)
        outs.append([xr.grad] + [p.grad.clone() for p in mod.parameters()])
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_gpu_param_grads_bitwise_deterministic(rms):
    _assert_grads_bitwise_repeatable(rms, 8192, 1024, torch.bfloat16, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("n", [1, 1000, 4097, 16384, 65536, 100003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_widths(rms, n, dtype):
    rows = max(3, min(257, (1 << 22) // n))
    _check(rms, (rows, n), 1, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("n", [16384, 40000, pytest.param(65536, marks=BIG), pytest.param(131072, marks=BIG)])
def test_gpu_persistent_backward(rms, n):
    """The persistent wide-row backward on the GPU (co-resident programs, cooperative launch, the called wait in a
    pipelined row loop; LayerNorm's packed sums, HOLD where the table has it), the Gluon kernel turned off at 16K:
    right against float64 with more rows than row groups and zero-gradient rows, bitwise the same gradients run to
    run.  Weights about 1 and a gradient with a mean: there dx's row sums are large enough that pieces which skip
    their exchange fail the rule (test_tolerance.py shows it at these sizes)."""
    def dy_fn(dy):
        dy = dy + 0.5
        dy[5:9] = 0.0
        return dy

    with config_override("layer_norm", gluon=False):
        ln_ops._BWD_PLANS.clear()
        _check(rms, (1200, n), 1, torch.bfloat16, "cuda", dy_fn=dy_fn, w_fn=lambda w: 1 + 0.1 * w)
        plans = [p for p in ln_ops._BWD_PLANS.values() if p.persist is not None]
        assert plans and all(p.persist["kernel"] is not None and 1 <= p.persist["groups"] < 1200 for p in plans)
        _assert_grads_bitwise_repeatable(rms, 300, n, torch.bfloat16, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("n", [16384, 20011, 32768, pytest.param(65536, marks=BIG), pytest.param(100003, marks=BIG),
                               pytest.param(131072, marks=BIG)])
def test_gpu_persistent_backward_defaults(rms, n):
    """The BWD_PERSIST entries (bf16 16K-128K) with no override: the persistent plan is taken, and the gradients are
    right against float64 on aligned and prime widths.  Where the Gluon row backward takes the width (16K on sm_90),
    it runs instead."""
    ln_ops._BWD_PLANS.clear()
    _check(rms, (600, n), 1, torch.bfloat16, "cuda")
    if n % 4096 == 0 and lnc.gluon_config(n, 2) and _gluon_ok():
        assert any(p.gluon for p in ln_ops._BWD_PLANS.values())
        return
    plans = [p for p in ln_ops._BWD_PLANS.values() if p.persist is not None]
    assert plans and all(p.persist["kernel"] is not None and 1 <= p.persist["groups"] < 600 for p in plans)


@pytest.mark.gpu
@pytest.mark.gpu_memory
@pytest.mark.parametrize("gluon", [False, True], ids=["persistent", "gluon"])
def test_gpu_persistent_backward_in_cuda_graph_and_side_stream(gluon):
    """The one-CTA-an-SM backwards at bf16 16K (the persistent cooperative kernel; the Gluon row backward, the default
    on sm_90): a whole LayerNorm forward + backward captured in a CUDA graph and replayed on new inputs, and an eager
    backward while another stream's matmuls occupy the GPU: the same gradients as eager, bitwise."""
    if gluon and not _gluon_ok():
        pytest.skip("needs an sm_90 GPU and Gluon")
    with config_override("layer_norm", gluon=gluon):
        _graph_and_side_stream(gluon)


@pytest.mark.gpu
def test_gpu_single_block_backward_in_cuda_graph_and_side_stream():
    """The single-block backward at 1K (its kernels programmatic dependents on sm_90 and newer): a
    forward + backward captured in a CUDA graph and replayed, and run while another stream's matmuls hold SMs."""
    _graph_and_side_stream(False, 1024)


def _graph_and_side_stream(gluon: bool, n: int = 16384):
    mod = FusedLayerNorm(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1024, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def step():
        mod.weight.grad = mod.bias.grad = x.grad = None
        mod(x).backward(dy)
        return x.grad, mod.weight.grad, mod.bias.grad

    ln_ops._BWD_PLANS.clear()
    step()  # bind the plans outside the capture
    if gluon:
        assert any(p.gluon for p in ln_ops._BWD_PLANS.values())
    elif n > 8192:
        assert any(p.persist is not None and p.persist["kernel"] is not None for p in ln_ops._BWD_PLANS.values())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            mod(x).backward(dy)  # (the grads accumulate into the buffers the warm-up made)
    torch.cuda.current_stream().wait_stream(s)
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        dy.copy_(torch.randn_like(dy))
    grads = [t.grad for t in (x, mod.weight, mod.bias)]
    for t in grads:
        t.zero_()
    g.replay()
    torch.cuda.synchronize()
    got = [t.clone() for t in grads]
    want = step()
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    other = torch.randn(8192, 8192, device="cuda")
    with torch.cuda.stream(s):
        for _ in range(4):
            other = other @ other.t() * 1e-4  # keeps SMs busy on the side stream
    busy = step()
    torch.cuda.synchronize()
    for a, b in zip(busy, want):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("n", [768, 1000, 4096, 8192])
def test_gpu_backward_programmatic_dependent_launch(rms, n, monkeypatch):
    """The row kernel and its dW / dB reduce launched as programmatic dependents that wait on the device (the sm_90
    default): right against float64 and bitwise the gradients of plain launches, through the Python path, the C++
    node and replayed from a CUDA graph."""
    from fused_layers.ops import _cpp

    monkeypatch.setattr(_cpp, "ENABLED", True)
    if _cpp.extension(wait=True) is None:
        pytest.skip("the C++ fast path did not build here")
    if not ln_ops._use_pdl(torch.cuda.current_device()):
        pytest.skip("needs sm_90 or newer")
    ln_ops._BWD_PLANS.clear()
    _check(rms, (3000, n), 1, torch.bfloat16, "cuda")
    plans = list(ln_ops._BWD_PLANS.values())
    assert plans and all(p.eager_reduce.meta.get("launch_pdl") for p in plans)
    assert not any(p.reduce_kernel.meta.get("launch_pdl") or p.kernel.meta["PDL_WAIT"] for p in plans)
    x = torch.randn(4096, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    fn = (lambda: fused_rms_norm(x, (n,), w)) if rms else (lambda: fused_layer_norm(x, (n,), w))
    use_pdl = ln_ops._use_pdl
    monkeypatch.setattr(ln_ops, "_use_pdl", lambda device_index: False)
    with config_override("layer_norm"):  # (new plans: plain launches)
        want = torch.autograd.grad(fn(), (x, w), dy)
    monkeypatch.setattr(ln_ops, "_use_pdl", use_pdl)
    with config_override("layer_norm"):
        runs = [torch.autograd.grad(fn(), (x, w), dy) for _ in range(3)]  # the Python path, then the C++ node
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # (autograd runs the backward on the forward's stream: make it on the capture one)
            y = fn()
            torch.autograd.grad(y, (x, w), dy, retain_graph=True)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                replayed = torch.autograd.grad(y, (x, w), dy, retain_graph=True)
        torch.cuda.current_stream().wait_stream(s)
        g.replay()
        torch.cuda.synchronize()
    assert y.grad_fn.name() == "FusedNormBackward"  # the C++ node launched the PDL kernels
    for got in (*runs, replayed):
        for a, b in zip(want, got):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_gpu_autocast_and_mixed_match_torch(rms):
    ref = (nn.RMSNorm if rms else nn.LayerNorm)(256, device="cuda")
    ours = (FusedRMSNorm if rms else FusedLayerNorm)(256, device="cuda")
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    for ctx_dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cuda", dtype=ctx_dtype):
            a, r = ours(x), ref(x)
        # layer_norm runs in float32 under CUDA autocast (float32 out); rms_norm keeps the input dtype
        # on torch 2.11 (measured on the H200: bfloat16 out). Ours follows the installed torch.
        assert a.dtype == r.dtype
        if not rms:
            assert a.dtype == torch.float32
        torch.testing.assert_close(a.float(), r.float(), atol=2e-2, rtol=2e-2)
    a = ours(x)  # fp32 params, bf16 input, no autocast: output in the input's dtype
    assert a.dtype == torch.bfloat16
    ref64 = (rms_norm_reference if rms else layer_norm_reference)(x.double(), (256,), ours.weight.double())
    torch.testing.assert_close(a.double(), ref64, atol=2e-2, rtol=2e-2)

def test_tuning_table_exact_width_before_its_bucket(monkeypatch):
    """An entry for an exact width (768: GPT-2, ViT) is used for that width only; other widths of its
    bucket (1024) keep the bucket's entry; a norm's own entry comes before the shared one."""
    monkeypatch.setattr(lnc, "FWD", {(2, 1024, None): FwdTile(4, 4), (2, 768, None): FwdTile(8, 8)})
    monkeypatch.setattr(lnc, "BWD", {(2, 768, None): BwdTile(2, 2, 3, stages=3)})
    assert lnc.fwd_config(768, 1024, 2, False) == FwdTile(8, 8)
    assert lnc.fwd_config(1000, 1024, 2, False) == FwdTile(4, 4)
    assert lnc.bwd_config(768, 1024, 2, True) == BwdTile(2, 2, 3, stages=3)
    assert lnc.bwd_config(1000, 1024, 2, True) == lnc._bwd_rule(1024, 2)
    lnc.FWD[(2, 768, lnc.LN)] = FwdTile(2, 2)  # a LayerNorm-only entry: LayerNorm takes it, RMSNorm the shared one
    assert lnc.fwd_config(768, 1024, 2, False) == FwdTile(2, 2)
    assert lnc.fwd_config(768, 1024, 2, True) == FwdTile(8, 8)
    assert lnc.fwd_config(1000, 1024, 2, False) == FwdTile(4, 4)


def test_rules_and_table_pick_the_kernel():
    """Single block up to the rule's limits (forward 32K 16-bit / 16K fp32, backward 8K), chunked past them; the
    table's two-pass entry at bf16 16K."""
    assert isinstance(lnc.fwd_config(32768, 32768, 2, False), FwdTile)
    assert isinstance(lnc.fwd_config(32769, 65536, 4, True), FwdChunks)
    assert lnc.fwd_config(65536, 65536, 2, False) == FwdChunks(4096, 8, stages=3)
    assert isinstance(lnc.bwd_config(8192, 8192, 4, False), BwdTile)
    assert lnc.bwd_config(16384, 16384, 4, False) == lnc.BWD_CHUNK
    assert lnc.bwd_config(16000, 16384, 2, True) == BwdChunks(4096, 8, 2)


def _variant_run(cast_before_w, dy_rounded=True, device="cpu"):
    """The HF Llama-order RMSNorm variant with float32 weights (y in float32: the two orders differ by a bf16 unit
    of the normalized row, 2^16 float32 units) with one-row accumulators, the 4096 bucket's form."""
    from fused_layers.ops.norm_variants import fused_rms_norm_variant

    x = (torch.randn(7, 131, device=device) * 2 + 0.5).to(torch.bfloat16).requires_grad_(True)
    w = torch.randn(131, device=device, dtype=torch.float32).requires_grad_(True)
    dy = torch.randn(7, 131, device=device)
    if dy_rounded:
        dy = dy.to(torch.bfloat16).float()
    with config_override("layer_norm", fwd=FwdTile(2, 4), bwd=BwdTile(2, 4, 1, stages=2, acc_rows=True), programs=3):
        y = fused_rms_norm_variant(x, w, 1e-6, cast_before_weight=cast_before_w)
        gx, gw = torch.autograd.grad(y, (x, w), dy)
    assert y.dtype == torch.float32 and gx.dtype == x.dtype and gw.dtype == w.dtype
    return x, w, dy, (y, gx, gw)


@pytest.mark.parametrize("cast_before_w", [True, False], ids=["cast_first", "weight_first"])
def test_rms_variant_cast_order_own_reference(cast_before_w, device):
    """Each cast order against ITS OWN float64 reference, so a kernel that ignored the flag fails (one reference for
    both orders at atol 0.05 let it pass).  weight_first: y, dx, dW within the 16-bit rule of tests/_tol.py, and the
    other order's output rejected by it (about 300x the allowed error).  cast_first: y / w on the bf16 grid in every
    entry (the normalized row was rounded; without the cast it is not, in almost every entry), within one bf16 unit of
    the normalized row of its reference and within the rule, dx within the rule."""
    from _tol import within_torch

    x, w, dy, ours = _variant_run(cast_before_w, device=device)
    refs, tor = rms_variant_refs(x, w, dy, cast_before_w, y=ours[0])
    other_refs, other_tor = rms_variant_refs(x, w, dy, not cast_before_w)
    assert_within_torch(ours[1], refs[1], tor[1], what="dx")
    if not cast_before_w:
        for name, a, r, t in zip(("y", "dx", "dW"), ours, refs, tor):
            assert_within_torch(a, r, t, what=name)
        assert not within_torch(other_refs[0].to(torch.float32), refs[0], tor[0])  # the other order, rejected
        return
    y, _, gw = ours
    h = (y.double() / w.detach().double())
    on_grid = ((h - h.to(torch.bfloat16).double()).abs() <= 2.0 ** -20 * h.abs())
    assert on_grid.all(), f"y / w off the bf16 grid in {(~on_grid).sum().item()} of {h.numel()} entries"
    h_other = other_refs[0] / w.detach().double()
    assert not ((h_other - h_other.to(torch.bfloat16).double()).abs() <= 2.0 ** -20 * h_other.abs()).all()
    unit = 2.0 ** -7  # one bf16 unit (eps: relative, at the bottom of a binade)
    assert ((y.double() - refs[0]).abs() <= unit * refs[0].abs() + 1e-30).all()
    scale = (dy.double().abs() * (refs[0] / w.detach().double()).abs()).sum(0)  # sum over rows of |dy * h|
    assert ((gw.double() - refs[2]).abs() <= unit * scale + 1e-6 * scale.max()).all()
    for name, a, r, t in zip(("y", "dW"), (y, gw), (refs[0], refs[2]), (tor[0], tor[2])):
        assert_within_torch(a, r, t, what=name)


@pytest.mark.xfail(strict=True, reason="the variant's backward rounds a float32 dy to the input's bf16 "
                                       "(ops/layer_norm.norm_backward), so dW is ~2^-9 off PyTorch's float32 sum")
def test_rms_variant_float32_dy_weight_gradient(device):
    """float32 weights give a float32 y, so its incoming gradient is float32: PyTorch's dW sums dy * h in float32.
    Kept as a strict xfail: it passes (and so fails here) once the backward reads dy in its own dtype."""
    x, w, dy, ours = _variant_run(False, dy_rounded=False, device=device)
    refs, tor = rms_variant_refs(x, w, dy, False)
    assert_within_torch(ours[2], refs[2], tor[2], what="dW")


@pytest.mark.gpu
@pytest.mark.parametrize("rms,n,dtype,bwd,hold", [
    (False, 8192, torch.bfloat16, "_norm_bwd_kernel", None),  # the widest single-block backward
    (True, 12288, torch.float16, "_norm_bwd_persist_kernel", True),  # persistent (Gluon only forced at 12K)
    (False, 16384, torch.bfloat16, "_norm_bwd_rows_gluon_kernel", None),
    (False, 20011, torch.bfloat16, "_norm_bwd_persist_kernel", False),  # persistent (no Gluon: not 256-aligned)
    (True, 32768, torch.float16, "_norm_bwd_persist_kernel", True),  # persistent, HOLD
    (False, 65536, torch.bfloat16, "_norm_bwd_persist_kernel", True),
    (True, 65536, torch.bfloat16, "_norm_bwd_persist_kernel", True),
], ids=["ln-8K-tile", "rms-12K-hold", "ln-16K-gluon", "ln-20011-persist", "rms-32K-hold", "ln-64K-hold",
        "rms-64K-hold"])
def test_gpu_production_widths_16bit(rms, n, dtype, bwd, hold):
    """The default plans of 16-bit norm rows users run, at production sizes (2^24 elements): y, dx, dW, dB within
    the 16-bit rule of tests/_tol.py (dx per row: no sqrt(rows)), and the backward kernel that ran named (an H100 /
    H200: sm_90 for the Gluon rows)."""
    if "gluon" in bwd and not _gluon_ok():
        pytest.skip("the Gluon row backward runs on sm_90 only")
    rows = max(64, 2**24 // n)
    with launched("layer_norm") as seen:
        _check(rms, (rows, n), 1, dtype, "cuda")
    assert ran(seen, bwd, **({} if hold is None else {"HOLD": hold})), kernel_names(seen)


# --------------------------------------------------------------------------------------------------
# The Gluon row backward (ops/layer_norm_gluon.py): GPU only (Gluon has no interpreter)
# --------------------------------------------------------------------------------------------------
def _gluon_ok():
    from fused_layers.ops import layer_norm_gluon as lg

    return torch.cuda.is_available() and lg.HAS_GLUON and torch.cuda.get_device_capability()[0] == 9


def test_gluon_row_backward_refuses_what_it_does_not_take():
    """``supported`` names why (here: CPU tensors; on an sm_90 GPU the width, dtype and alignment rules)."""
    from fused_layers.ops import layer_norm_gluon as lg

    x = torch.randn(4, 16384)
    assert lg.supported(x, x, None) is not None


def _gluon_routed(forced):
    """(width, x dtype, weight dtype or None) of every row up to 2^17 wide that the eager backward sends to the Gluon
    row backward: layer_norm_config.gluon_config of the width (``forced``: config_override gluon=True, as
    the tests set it), then layer_norm_gluon's width, dtype and shared-memory rules (``supported`` less the GPU)."""
    from fused_layers.ops import layer_norm_gluon as lg

    out = []
    with config_override("layer_norm", **({"gluon": True} if forced else {})):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for n in range(1, 2**17 + 1):
                if not lnc.gluon_config(n, dtype.itemsize):
                    continue
                for w_dtype in dict.fromkeys((dtype, torch.float32, None)):
                    if lg.width_reason(n, dtype, w_dtype) is None:
                        out.append((n, dtype, w_dtype))
    return out


@pytest.mark.parametrize("forced", [False, True], ids=["default", "forced"])
def test_gluon_row_backward_tma_boxes_are_powers_of_two(forced):
    """Every width and dtype routed to the Gluon row backward gets TMA boxes whose every dimension is a power of two
    (Gluon's TensorDescriptor and the kernel's block types refuse others: 12,288-wide 16-bit rows crashed on an H100
    with a (1, 48, 256) box) that tile the row in whole slices of the kernel's warps; the descriptors are then built
    as the launch builds them, on CPU tensors of the same dtypes and strides, so Gluon's own check runs here too."""
    from fused_layers.ops import layer_norm_gluon as lg

    try:
        from triton._utils import validate_block_shape
    except ImportError:  # a Triton without it: the power-of-two check below still runs
        validate_block_shape = None
    routed = _gluon_routed(forced)
    widths = {n for n, _, _ in routed}
    if forced:  # every width the kernel takes: multiples of 4,096 up to 16K
        assert widths == {4096, 8192, 12288, 16384}
    else:  # the default: 16-bit rows of 16K (BWD_GLUON)
        assert widths == {16384} and {d for _, d, _ in routed} == {torch.bfloat16, torch.float16}
    for n, dtype, w_dtype in routed:
        m, r = 3, n // lg.BOX
        layouts = lg.descriptor_layouts(m, n, n, n, w_dtype is not None)
        for _, shape, strides, box in layouts:
            where = (n, dtype, w_dtype, box)
            assert all(0 < d <= 256 and d & (d - 1) == 0 for d in box), where
            if validate_block_shape is not None:
                validate_block_shape(box)
            assert box[-1] == lg.BOX and r % box[-2] == 0 and box[-2] % lg.WARPS == 0, where
            assert len(shape) == len(strides) == len(box) and all(b <= s for b, s in zip(box, shape)), where
        assert layouts[0][3][-2] == lg.box_rows(r) == (16 if n == 12288 else r)
        if lg.HAS_GLUON:
            x = torch.empty(m, n, dtype=dtype)
            w = None if w_dtype is None else torch.empty(n, dtype=w_dtype)
            descs = lg.host_descriptors(x, torch.empty_like(x), torch.empty_like(x), w)
            assert [list(d.block_shape) for d in descs] == [box for *_, box in layouts]
    with pytest.raises(ValueError, match="no TMA box"):
        lg.box_rows(0)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [12288, 16384], ids=["12K", "16K"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows", [1, 131, 600])
def test_gpu_gluon_row_backward(rms, dtype, rows, n, monkeypatch):
    """Rows of 16K (the default) and 12K (forced; 3 TMA boxes a row): the Gluon row backward runs (spied) and
    every gradient matches float64, for fewer rows than SMs (one row; 131), several rows a program, with and without
    the weight / bias, fp32 weights under bf16 x, two normalized dims."""
    if not _gluon_ok():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers.ops import layer_norm_gluon as lg

    calls = []
    orig = lg.norm_backward_rows
    monkeypatch.setattr(lg, "norm_backward_rows", lambda *a, **k: calls.append(1) or orig(*a, **k))
    if n != 16384:
        monkeypatch.setattr(lnc, "BWD_GLUON", lnc.BWD_GLUON | {(2, n)})
    ln_ops._BWD_PLANS.clear()
    _check(rms, (rows, n), 1, dtype, "cuda")
    assert calls, "the Gluon row backward did not run"
    _check(rms, (rows, n), 1, dtype, "cuda", affine=False)
    if dtype == torch.bfloat16:
        _check(rms, (rows, n), 1, dtype, "cuda", param_dtype=torch.float32)
        _check(rms, (2, rows, n // 4, 4), 2, dtype, "cuda")  # two normalized dims


@pytest.mark.gpu
def test_gpu_gluon_row_backward_falls_back():
    """Rows of the 16K bucket the Gluon row backward does not take (a width not a multiple of 4,096, a strided row)
    go to the Triton kernels: right answers."""
    if not _gluon_ok():
        pytest.skip("needs an sm_90 GPU and Gluon")
    _check(False, (64, 16384 - 256), 1, torch.bfloat16, "cuda")
    _check(True, (64, 12289), 1, torch.bfloat16, "cuda")
    _check(False, (64, 16384), 1, torch.bfloat16, "cuda", make_x=lambda s, d, dev: torch.randn(
        s[0], 2 * s[1], dtype=d, device=dev)[:, ::2] * 2 + 0.5)


@pytest.mark.gpu
def test_gpu_gluon_row_backward_deterministic():
    """The same inputs give bitwise the same gradients (fixed-order reduce, no atomics)."""
    if not _gluon_ok():
        pytest.skip("needs an sm_90 GPU and Gluon")
    mod = FusedLayerNorm(16384, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(512, 16384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    first = torch.autograd.grad(mod(x), (x, mod.weight, mod.bias), dy)
    again = torch.autograd.grad(mod(x), (x, mod.weight, mod.bias), dy)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
