"""fused_cross_entropy / FusedCrossEntropyLoss against float64 F.cross_entropy: loss and input gradient.

Small rows on the interpreter: ``config_override("cross_entropy", ...)`` shrinks the single-block limit and the tiles
so that the default wide-row kernels run at small widths (the stream for float32, label smoothing and probabilities;
the persistent kernel for 16-bit class-index rows with a gradient)."""

import warnings
from contextlib import nullcontext
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from _tol import assert_within_torch, launched, ran
from conftest import BIG, TOL

from fused_layers.ops.cross_entropy import (
    config_override,
    cross_entropy_rows_reference,
    fused_cross_entropy,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy inf/nan warnings of the interpreter


def _check(x, target, fn=fused_cross_entropy, grad=True, go=None, tol=None, **kw):
    """Loss and d(loss)/d(input) of fn against F.cross_entropy in float64 (NaN where torch has NaN)."""
    atol, rtol = tol or TOL[x.dtype]
    half = tol is None and x.dtype in (torch.float16, torch.bfloat16)  # K x PyTorch's own error (tests/_tol.py)
    weight = kw.pop("weight", None)
    xr = x.detach().double().requires_grad_(grad)
    xt = x.detach().requires_grad_(grad)
    x = x.detach().requires_grad_(grad)
    tr = target.double() if target.is_floating_point() else target
    lr = F.cross_entropy(xr, tr, weight=None if weight is None else weight.double(), **kw)
    loss = fn(x, target, weight=weight, **kw)
    assert loss.dtype == x.dtype and loss.shape == lr.shape
    if half:
        lt = F.cross_entropy(xt, target, weight=weight, **kw)
        assert_within_torch(loss, lr, lt, what="loss")
    else:  # losses are sums over C classes: the tolerance scales with log(C)-sized terms
        torch.testing.assert_close(loss.double(), lr, atol=atol * 4, rtol=rtol, equal_nan=True)
    if grad:
        if go is None and half:
            # A power of two: the gradient is stored in 16 bits by the forward and scaled by go in place, a second
            # rounding PyTorch's single one does not have (1 ulp), which the rule would charge to the kernel.  The
            # scaling itself is still checked (exactly).
            go = torch.sign(torch.randn_like(lr)) * 2.0 ** torch.randint_like(lr, -2, 3)
        go = (torch.randn_like(lr) if go is None else go).to(loss.dtype)  # the reference sees the rounded go
        loss.backward(go)
        lr.backward(go.double())
        assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
        if half:  # the gradient's scale is its own (about 1/rows under mean reduction), never an absolute atol
            lt.backward(go)
            assert_within_torch(x.grad, xr.grad, xt.grad, what="dlogits")
        else:
            torch.testing.assert_close(x.grad.double(), xr.grad, atol=atol, rtol=rtol, equal_nan=True)
    return loss


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 31), (4, 64), (5, 65), (2, 257), (9, 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_single_block(shape, dtype, reduction, device):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    t = torch.randint(0, shape[1], shape[:1], device=device)
    _check(x, t, reduction=reduction)


@pytest.mark.parametrize("c,dtype,vec8", [(32000, torch.bfloat16, False), (50257, torch.float16, True),
                                           (131072, torch.bfloat16, False)])
def test_production_vocab_16bit_default_plans(c, dtype, vec8, device):
    """The default plan of 16-bit logits at vocabularies users run (Llama-2 32,000, GPT-2 50,257: the VEC8 form
    of its unaligned rows, 128K), three rows (one ignored) on the interpreter: the loss and the gradient within the rule
    of tests/_tol.py, relative to the gradient's own scale (~1/rows), and the persistent kernel named.  262K and the
    TMA kernel are GPU tests (test_gpu_production_vocab_16bit)."""
    x = torch.randn(3, c, device=device, dtype=dtype) * 3
    t = torch.randint(0, c, (3,), device=device)
    t[1] = -100
    with launched("cross_entropy") as seen:
        _check(x, t)
    wins = [m["VEC_WIN"] for name, m in seen if name == "_ce_fwd_persist_kernel"]
    assert wins and all((w > 0) == vec8 for w in wins), seen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [17, 64, 97, 129])  # prime, one chunk exactly, just past a chunk, many chunks
def test_streaming_chunks(c, dtype, device):
    """Rows wider than the single-tile limit: online softmax over chunks (forced small here)."""
    x = torch.randn(3, c, device=device, dtype=dtype) * 4
    t = torch.randint(0, c, (3,), device=device)
    t[1] = -100
    with config_override("cross_entropy", max_single=16, block_n=16):
        _check(x, t)
        _check(x, t, reduction="none", label_smoothing=0.3)
        _check(x, torch.softmax(torch.randn(3, c, device=device), -1).to(dtype), label_smoothing=0.1)
        _check(x, t, reduction="sum", weight=torch.rand(c, device=device, dtype=dtype))


# Wide rows at small widths: 16-column chunks (the stream) and pieces (the persistent kernel).
WIDE = dict(max_single=16, block_n=16, persist_block=16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [17, 41, 48])  # a piece / chunk + 1 column, 3 ragged pieces / chunks, 3 whole ones
def test_wide_rows(c, dtype, device):
    """Wide-row kernels on their default routes: the streaming kernel (float32; smoothing, probabilities, no gradient
    in any dtype) and the persistent kernel (16-bit class-index rows: VEC8 at 17 and 41 columns, the plain SMEM form
    at 48), ragged pieces and chunks."""
    x = torch.randn(5, c, device=device, dtype=dtype) * 4
    t = torch.randint(0, c, (5,), device=device)
    t[2] = -100
    with config_override("cross_entropy", **WIDE):
        _check(x, t)
        _check(x, t, reduction="none", label_smoothing=0.2, weight=torch.rand(c, device=device, dtype=dtype))
        _check(x, torch.softmax(torch.randn(5, c, device=device), -1).to(dtype), reduction="sum", label_smoothing=0.1)
        _check(x, t, grad=False, reduction="none")  # no gradient: the one-pass streaming kernel


@pytest.mark.parametrize("dtype", DTYPES)
def test_persistent_kernel_is_taken(dtype, device):
    """16-bit class-index targets (weights, ignore_index, every reduction) run the persistent kernel (its SMEM form,
    4 stages), rows over several row groups; smoothing and probabilities stream, and so does float32."""
    from fused_layers.ops import cross_entropy as ce

    x = torch.randn(11, 48, device=device, dtype=dtype) * 4
    t = torch.randint(0, 48, (11,), device=device)
    t[4] = -100
    t[7] = 47  # the last column
    persistent = dtype != torch.float32
    with config_override("cross_entropy", **WIDE):
        w = torch.rand(48, device=device, dtype=dtype)
        for kw in (dict(), dict(reduction="none"), dict(reduction="sum", weight=w)):
            ce._PLANS.clear()
            _check(x, t, **kw)
            bound = [p for p in ce._PLANS.values() if p.persist is not None]
            assert len(bound) == (1 if persistent else 0)
            if persistent:
                assert bound[0].kernel is not None and bound[0].splits == 3
                assert bound[0].persist["STAGES"] == 4 and bound[0].persist["VEC_WIN"] == 0
        ce._PLANS.clear()
        _check(x, t, label_smoothing=0.1)
        assert not any(p.persist is not None for p in ce._PLANS.values())


def test_tma_hold_routing():
    """16-bit rows that fit the TMA kernel's ring (cross_entropy_config.TMA_HOLD: C <= 32,768, a multiple of 256) plan
    the TMA kernel with the persistent kernel behind it (taken where the TMA kernel declines the call: no sm_90 GPU, a
    layout it does not take); wider or ragged rows, float32, smoothing, probabilities, no gradient, a row scale and
    traced calls (persist_ok False) do not; 16-bit rows not 16-element aligned take the persistent kernel's VEC8 form
    where the gradient's rows share their window, else stream."""
    from fused_layers.ops import cross_entropy as ce
    from fused_layers.ops import cross_entropy_config as cfg

    hold = cfg.TMA_HOLD[2]
    assert cfg.tma_hold(32000, 2) == hold and cfg.tma_hold(32768, 2) == hold
    assert cfg.tma_hold(32001, 2) is None and cfg.tma_hold(50304, 2) is None
    assert cfg.tma_hold(32000, 4) is None

    def plan(c, dtype=torch.bfloat16, soft=False, smooth=False, has_grad=True, persist_ok=True, row_scale=False):
        ce._PLANS.clear()
        return ce._plan((64, c), (c, 1), (c, 1) if soft else None, dtype, soft, False, smooth, -100, True, row_scale,
                        has_grad, persist_ok)

    for c in (24576, 32000, 32768):
        p = plan(c)
        assert p.tma and p.persist is not None
    for c in (50304, 131072):
        p = plan(c)
        assert not p.tma and p.persist is not None  # the persistent default
        # its CTA shape by width bucket (cross_entropy_config.PERSIST_BY_WIDTH): 2K x 2 warps up to 64K columns
        shape = cfg.persistent(2, 65536 if c <= 65536 else 131072)
        assert (p.persist["BLOCK_N"], p.persist["num_warps"], p.persist["per_sm"]) == (shape.block_n, shape.num_warps,
                                                                                       shape.per_sm), c
    assert plan(50304).persist["BLOCK_N"] == 2048 and plan(131072).persist["BLOCK_N"] == cfg.PERSIST[2].block_n
    for c in (32001, 30522, 50257, 32008):  # not 16-element aligned: the persistent kernel's VEC8 form
        p = plan(c)
        assert not p.tma and p.persist is not None and p.persist["VEC_WIN"] == 64, c
        assert p.splits * p.piece >= c + 63, c  # the pieces cover the row's 128-byte window
        assert p.persist["STAGES"] > 1
    ce._PLANS.clear()  # a sliced 32,000-class view of 32,008-wide rows: the row stride is misaligned, the gradient's
    p = ce._plan((64, 32000), (32008, 1), None, torch.bfloat16, False, False, False, -100, True, False, True, True)
    assert not p.tma and p.persist["VEC_WIN"] == 8  # rows 32,000 apart: the same offsets mod 8
    ce._PLANS.clear()  # 32,003 apart: they do not, so the stream
    p = ce._plan((64, 32000), (32003, 1), None, torch.bfloat16, False, False, False, -100, True, False, True, True)
    assert not p.tma and p.persist is None
    assert plan(50257, dtype=torch.float32).persist is None  # float32 streams
    assert not plan(32000, dtype=torch.float32).tma
    assert not plan(32000, smooth=True).tma and not plan(32000, soft=True).tma
    assert not plan(32000, has_grad=False).tma and not plan(32000, persist_ok=False).tma
    p = plan(32000, row_scale=True)  # the fused linear cross-entropy's 'none': the persistent kernel only
    assert not p.tma and p.persist is not None
    ce._PLANS.clear()


# Small VEC8 pieces under the interpreter: 16-column pieces.
VEC8 = dict(max_single=16, persist_block=16)


# bf16 and fp16 share the VEC8 window arithmetic (2-byte elements): both at 45 and 53 + 8, bf16 alone elsewhere
# (CPU time).
@pytest.mark.parametrize("c,pad,dtype", [(c, p, d) for c, p in [(17, 0), (45, 0), (53, 8), (40, 0), (33, 16)]
                                         for d in (torch.bfloat16, torch.float16)
                                         if d == torch.bfloat16 or (c, p) in ((45, 0), (53, 8))])
def test_vec8_rows(c, pad, dtype, device):
    """The persistent kernel's VEC8 form (16-bit rows at any alignment: whole 16-byte vectors on the row's window, the
    head and tail columns as edge lanes): row offsets cycling through every value mod 8, targets in the head, the tail
    and the last column, an ignored row, class weights, every reduction, against float64 F.cross_entropy."""
    from fused_layers.ops import cross_entropy as ce

    x = (torch.randn(9, c + pad, device=device, dtype=dtype) * 4)[:, :c]
    t = torch.randint(0, c, (9,), device=device)
    t[1], t[2], t[3], t[4] = 0, c - 1, -100, 2  # row 1 starts c mod 8 into a vector: column 0 is a head column
    with config_override("cross_entropy", **VEC8):
        ce._PLANS.clear()
        _check(x, t)
        _check(x, t, reduction="none", weight=torch.rand(c, device=device, dtype=dtype))
        _check(x, t, reduction="sum")
        assert [p.persist["VEC_WIN"] > 0 for p in ce._PLANS.values() if p.persist is not None] == [True] * 3


def test_vec8_special_values(device):
    """VEC8 rows with -inf / +inf / NaN logits in the head, the tail and the body, a row all -inf, an all-ignored
    batch: as torch (NaN rows where torch has them)."""
    x = torch.randn(6, 45, device=device, dtype=torch.bfloat16) * 3
    x[1, 0] = float("-inf")  # row 1 starts 5 into a vector: columns 0-2 are its head
    x[2, 44] = float("inf")  # a tail column
    x[3, 20] = float("nan")
    x[4, :] = float("-inf")
    x[5, 1] = float("inf")
    t = torch.tensor([3, 7, 1, 0, 9, 1], device=device)
    with config_override("cross_entropy", **VEC8):
        _check(x, t, reduction="none")
        _check(x, torch.full_like(t, -100))


def test_persistent_smem_many_pieces(device):
    """The SMEM form's called wait combines the row's words 32 at a time: 41 pieces a row (two chunks), targets in
    both chunks, an ignored row, a row all -inf in its first chunk of pieces."""
    c = 16 * 41
    x = torch.randn(5, c, device=device, dtype=torch.bfloat16) * 4
    x[3, : 16 * 33] = float("-inf")
    t = torch.tensor([0, 600, -100, 640, 5], device=device)
    with config_override("cross_entropy", **WIDE):
        _check(x, t)
        _check(x, t, reduction="none", weight=torch.rand(c, device=device, dtype=torch.bfloat16))


def _check_in_place(x, t, vec_win):
    """cross_entropy_forward with the gradient written over the logits (``grad_out=input``, as the fused linear
    cross-entropy does): each row's loss and gradient (upstream 1) against float64 F.cross_entropy of the logits."""
    from fused_layers.ops import cross_entropy as ce

    xr = x.double().requires_grad_()
    ref = F.cross_entropy(xr, t, reduction="none")
    ref.backward(torch.ones_like(ref))
    xi = x.clone()
    ce._PLANS.clear()
    loss, _ = ce.cross_entropy_forward(xi, t, reduction="none", out_dtype=torch.float32, grad_out=xi)
    assert [p.persist["VEC_WIN"] for p in ce._PLANS.values() if p.persist is not None] == [vec_win]
    torch.testing.assert_close(loss.double(), ref.detach(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(xi.double(), xr.grad, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("c", [37, 48])
def test_persistent_in_place(c, device):
    """The gradient written over the logits: the program that writes the target's column reads its logit first, and
    no other program writes that column -- in the VEC8 form (37: 16-position pieces on the row's 64-element window)
    the target's column is often not in piece t // PIECE, and a head or tail column is the first piece's.  Rows at
    16 offsets mod 64, targets in the last 8 columns (VEC8: the tail columns where a row has them), then spread over
    the row (the head, the piece boundaries), ignored rows; the plain form at 48."""
    m = 16
    x = torch.randn(m, c, device=device, dtype=torch.bfloat16) * 4
    r = torch.arange(m, device=device)
    with config_override("cross_entropy", **VEC8):
        for t in (c - 1 - r % 8, r * 7 % c):
            t[5::6] = -100
            _check_in_place(x, t, 64 if c % 16 else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wide_rows_special_values_and_layouts(dtype, device):
    """Special values, (N, C, d) and column-major logits and an out-of-range target on the wide-row routes: the
    stream (float32) and the persistent kernel (bf16: VEC8 for the contiguous 40-column rows, the plain form for
    strided columns)."""
    x = torch.randn(6, 40, device=device)
    x[0, 3] = float("-inf")
    x[1, :] = float("-inf")
    x[2, 33] = float("inf")
    x[3, 20] = float("nan")
    x[4, 7] = float("-inf")
    x[5, 12] = 1e30  # huge finite: exact through the max subtraction
    x = x.to(dtype)
    t = torch.tensor([3, 0, 1, 2, 7, 39], device=device)
    with config_override("cross_entropy", **WIDE):
        _check(x, t, reduction="none")
        _check(x, torch.full((6,), -100, device=device))  # all ignored: NaN mean, 0 * p gradients
        _check(torch.randn(3, 40, 2, device=device, dtype=dtype), torch.randint(0, 40, (3, 2), device=device))
        _check(torch.randn(40, 8, device=device, dtype=dtype).t(), torch.randint(0, 40, (8,), device=device))
        with pytest.raises(IndexError, match="out of range"):
            from fused_layers.ops.cross_entropy import check_cross_entropy_errors

            fused_cross_entropy(x.requires_grad_(), torch.tensor([3, 0, 1, 40, 7, 39], device=device))
            check_cross_entropy_errors()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("weighted", [False, True])
def test_ignore_weight_smoothing(reduction, smoothing, weighted, device):
    c = 23
    x = torch.randn(7, c, device=device) * 2
    t = torch.randint(0, c, (7,), device=device)
    t[[0, 4]] = 5  # ignore_index below
    w = torch.rand(c, device=device) + 0.1 if weighted else None
    _check(x, t, weight=w, ignore_index=5, reduction=reduction, label_smoothing=smoothing)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_soft_targets(dtype, reduction, device):
    c = 19
    x = torch.randn(6, c, device=device, dtype=dtype) * 2
    q = torch.softmax(torch.randn(6, c, device=device) * 2, -1).to(dtype)
    _check(x, q, reduction=reduction)
    _check(x, q, reduction=reduction, label_smoothing=0.2, weight=torch.rand(c, device=device, dtype=dtype))


def _check_capped(x, t, cap, **kw):
    """Loss and gradient of the soft-capped cross-entropy against float64: F.cross_entropy(cap * tanh(x / cap))."""
    atol, rtol = TOL[x.dtype]
    xr = x.detach().double().requires_grad_()
    xf = x.detach().requires_grad_()
    lr = F.cross_entropy(torch.tanh(xr / cap) * cap, t, **kw)
    loss = fused_cross_entropy(xf, t, softcap=cap, **kw)
    assert loss.dtype == x.dtype and loss.shape == lr.shape
    torch.testing.assert_close(loss.double(), lr, atol=atol * 4, rtol=rtol, equal_nan=True)
    go = torch.randn_like(lr)
    loss.backward(go.to(loss.dtype))
    lr.backward(go)
    torch.testing.assert_close(xf.grad.double(), xr.grad, atol=atol, rtol=rtol, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c,wide", [(33, False), (41, True)])  # the single block; the stream (16-column chunks)
def test_softcap(c, wide, dtype, device):
    """Soft-capped logits (Gemma 2's final_logit_softcapping): capped in the kernel, gradient w.r.t. the raw logits,
    on both of the main kernel's forms; 16-bit rows wider than a block stream instead of taking the persistent kernel
    (which does not cap).  Logits well past the cap (x 40 against cap 5), -inf and an ignored row."""
    from fused_layers.ops import cross_entropy as ce

    x = torch.randn(6, c, device=device, dtype=dtype) * 8
    x[0, :4] *= 5
    x[1, 2] = float("-inf")
    t = torch.randint(0, c, (6,), device=device)
    t[3] = -100
    with config_override("cross_entropy", **(WIDE if wide else {})):
        ce._PLANS.clear()
        _check_capped(x, t, 5.0)
        _check_capped(x, t, 30.0, reduction="none", label_smoothing=0.2)
        plans = [p for p in ce._PLANS.values() if p.M == 6]
        assert plans and all(p.persist is None and p.kernel.meta.get("SOFTCAP") for p in plans)


def test_softcap_errors_and_fallback(device):
    x = torch.randn(3, 7, device=device)
    t = torch.randint(0, 7, (3,), device=device)
    for bad, exc in ((0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError), ("5", TypeError)):
        with pytest.raises(exc, match="argument 'softcap'"):
            fused_cross_entropy(x, t, softcap=bad)
    xd = x.double().requires_grad_()  # float64 runs PyTorch, capped the same way
    torch.testing.assert_close(fused_cross_entropy(xd, t, softcap=2.0), F.cross_entropy(torch.tanh(xd / 2) * 2, t))


def test_kernel_formula_matches_torch(device):
    """The A/B form of the docstring (cross_entropy_rows_reference) is F.cross_entropy, in float64."""
    c = 11
    x = torch.randn(5, c, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.rand(c, dtype=torch.float64, device=device)
    q = torch.softmax(torch.randn(5, c, dtype=torch.float64, device=device), -1)
    for t in (torch.tensor([1, -100, 3, 10, 0], device=device), q):
        for e in (0.0, 0.3):
            loss, dx = cross_entropy_rows_reference(x.detach(), t, w, label_smoothing=e)
            ref = F.cross_entropy(x, t, weight=w, reduction="none", label_smoothing=e)
            (g,) = torch.autograd.grad(ref.sum(), x)
            torch.testing.assert_close(loss, ref.detach())
            torch.testing.assert_close(dx, g)


def test_k_dims_and_one_d(device):
    """(N, C, d1, d2) inputs (class dim 1, strided reads, no copy) and a (C,) input with a 0-d target."""
    x = torch.randn(3, 7, 4, 2, device=device)
    t = torch.randint(0, 7, (3, 4, 2), device=device)
    t[0, 1, 1] = -100
    for red in ("mean", "none"):
        _check(x, t, reduction=red, weight=torch.rand(7, device=device), label_smoothing=0.1)
    _check(x, torch.softmax(torch.randn(3, 7, 4, 2, device=device), 1))
    _check(x.permute(0, 1, 3, 2), t.permute(0, 2, 1))  # a layout copied to contiguous
    _check(torch.randn(9, device=device), torch.tensor(4, device=device), reduction="none")
    _check(torch.randn(9, device=device), torch.tensor(4, device=device))


def test_strided_inputs(device):
    base = torch.randn(12, 80, device=device)
    t = torch.randint(0, 40, (6,), device=device)
    _check(base[::2, ::2], t)  # both strides non-unit
    _check(base.t()[:40, :6].t(), t, reduction="none")  # column-major (N, C)
    _check(base[::2, :40], t[None].expand(2, 6).reshape(-1)[:6])  # a target that came from a view
    # Strided targets: a 1-D view (target[::2]: reshape(-1) keeps it strided; the kernel reads T + row) and
    # an (N, d) view.  The GPU test at 50,304 classes caught the 1-D case reading the wrong class indices.
    tt = torch.randint(0, 40, (12,), device=device)
    _check(base[::2, :40], tt[::2])
    _check(base[::2, :40], tt[::2], reduction="none", weight=torch.rand(40, device=device), label_smoothing=0.1)
    with config_override("cross_entropy", max_single=16, block_n=16):  # the streaming kernel
        _check(base[::2, :40], tt[::2])
    x3 = torch.randn(3, 7, 4, device=device)
    t3 = torch.randint(0, 7, (3, 8), device=device)[:, ::2]
    _check(x3, t3)
    q = torch.softmax(torch.randn(40, 6, device=device), 0).t()  # non-contiguous probabilities
    _check(base[::2, 1:41], q, label_smoothing=0.1)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_special_values(reduction, device):
    c = 10
    x = torch.randn(6, c, device=device)
    x[0, 3] = float("-inf")  # -inf elsewhere: finite
    x[1, :] = float("-inf")  # all -inf: NaN
    x[2, 4] = float("inf")  # +inf: NaN row
    x[3, 2] = float("nan")
    x[4, 7] = float("-inf")  # the target's logit is -inf: +inf loss, finite gradient
    x[5, 1] = 1e30  # huge finite
    t = torch.tensor([3, 0, 1, 2, 7, 1], device=device)
    _check(x, t, reduction="none")
    rows = [0, 4, 5]  # finite reductions need the NaN rows out
    _check(x[rows], t[rows], reduction=reduction)
    _check(x[rows], t[rows], reduction=reduction, label_smoothing=0.1)
    # ignored rows holding NaN/inf: loss 0, gradient NaN (0 * NaN), as torch
    _check(x, torch.full((6,), -100, device=device), reduction=reduction)


def test_all_ignored_and_zero_weight(device):
    x = torch.randn(4, 9, device=device)
    t = torch.full((4,), -100, device=device)
    for red in ("mean", "sum", "none"):
        _check(x, t, reduction=red)  # mean: 0 / 0 = NaN loss, gradient 0 (as torch)
    w = torch.ones(9, device=device)
    w[2] = 0
    _check(x, torch.tensor([2, 2, -100, 2], device=device), weight=w)  # D = 0 with rows left: NaN
    _check(torch.randn(0, 9, device=device), torch.zeros(0, dtype=torch.long, device=device))
    _check(torch.randn(0, 9, device=device), torch.zeros(0, dtype=torch.long, device=device), reduction="sum")


def test_grad_output_scaling_and_no_grad(device):
    x = torch.randn(5, 33, device=device)
    t = torch.randint(0, 33, (5,), device=device)
    _check(x, t, go=torch.tensor(1.0, dtype=torch.float64))  # the early-exit path of the scale kernel
    _check(x, t, go=torch.tensor(-2.5, dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(fused_cross_entropy(x, t), F.cross_entropy(x, t))
    _check(x, t, grad=False, reduction="none")
    # uint8 targets, like torch
    _check(x, t.to(torch.uint8))


def test_double_backward_through_retained_graph_raises(device):
    x = torch.randn(3, 8, device=device, requires_grad=True)
    loss = fused_cross_entropy(x, torch.tensor([1, 2, 3], device=device))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_errors(device):
    from fused_layers.ops.cross_entropy import check_cross_entropy_errors

    x = torch.randn(4, 5, device=device)

    def tensor(v, **kw):
        return torch.tensor(v, device=device, **kw)

    for bad in ([0, 1, 5, 2], [0, -3, 1, 2]):
        with pytest.raises(IndexError, match="out of range"):
            fused_cross_entropy(x, tensor(bad))
            check_cross_entropy_errors()  # CUDA: the flag is read without a sync, at the next call or here
    with pytest.raises(ValueError, match="reduction"):
        fused_cross_entropy(x, tensor([0, 1, 2, 3]), reduction="avg")
    with pytest.raises(RuntimeError, match="label_smoothing"):
        fused_cross_entropy(x, tensor([0, 1, 2, 3]), label_smoothing=1.5)
    with pytest.raises(RuntimeError, match="weight"):
        fused_cross_entropy(x, tensor([0, 1, 2, 3]), weight=torch.ones(4, device=device))
    with pytest.raises(RuntimeError, match="Long"):
        fused_cross_entropy(x, tensor([0, 1, 2, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="batch_size"):
        fused_cross_entropy(x, tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="shape"):
        fused_cross_entropy(x, torch.rand(4, 6, device=device))
    with pytest.raises(TypeError, match="input"):
        fused_cross_entropy([1.0], tensor([0]))


def test_float64_and_soft_target_grad_use_torch(device):
    x = torch.randn(3, 6, dtype=torch.float64, device=device)
    _check(x, torch.tensor([0, 1, 2], device=device), label_smoothing=0.1)
    q = torch.softmax(torch.randn(3, 6, device=device), -1).requires_grad_()
    loss = fused_cross_entropy(x.float(), q)
    loss.backward()
    assert q.grad is not None


def test_autocast_gives_float32_loss(device):
    x = torch.randn(4, 12, device=device, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, 12, (4,), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = fused_cross_entropy(x, t)
        ref = F.cross_entropy(x, t)
    assert loss.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(loss, ref, atol=1e-3, rtol=1e-3)
    loss.backward()
    assert x.grad.dtype == torch.bfloat16


def test_module_is_drop_in(device):
    from torch import nn

    from fused_layers import FusedCrossEntropyLoss

    w = torch.rand(7, device=device)
    ref = nn.CrossEntropyLoss(weight=w, ignore_index=2, reduction="sum", label_smoothing=0.1)
    mod = FusedCrossEntropyLoss(weight=w, ignore_index=2, reduction="sum", label_smoothing=0.1)
    assert isinstance(mod, nn.CrossEntropyLoss)
    assert mod.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(5, 7, device=device)
    t = torch.randint(0, 7, (5,), device=device)
    torch.testing.assert_close(mod(x, t), ref(x, t))


def test_opcheck(device):
    x = torch.randn(4, 9, device=device, requires_grad=True)
    t = torch.randint(0, 9, (4,), device=device)
    op = torch.ops.fused_layers.cross_entropy_fwd.default
    for red, cap in (("mean", 0.0), ("none", 4.0)):
        torch.library.opcheck(op, (x, t, None, -100, red, 0.1, True, torch.float32, cap),
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@pytest.mark.slow
def test_torch_compile_fullgraph(device):
    """Loss and gradient through torch.compile(fullgraph=True): the custom-op path, no graph break."""
    from torch import nn

    from fused_layers import FusedCrossEntropyLoss

    torch._dynamo.reset()
    lin = nn.Linear(16, 21).to(device)
    crit = FusedCrossEntropyLoss(label_smoothing=0.1)

    def step(h, t):
        return crit(lin(h), t)

    compiled = torch.compile(step, fullgraph=True)
    h = torch.randn(6, 16, device=device)
    t = torch.randint(0, 21, (6,), device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = compiled(h, t)
    ref = F.cross_entropy(lin(h), t, label_smoothing=0.1)
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    loss.backward()
    g = lin.weight.grad.clone()
    lin.weight.grad = None
    ref.backward()
    torch.testing.assert_close(g, lin.weight.grad, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# GPU (H200): vocabulary widths through the real kernels.
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [1000, 32000, 32768, 50304, 65537, 128256, 262144])
def test_gpu_vocab_widths(c, dtype):
    m = max(2, min(64, 2**23 // c))
    x = torch.randn(m, c, device="cuda", dtype=dtype) * 2
    t = torch.randint(0, c, (m,), device="cuda")
    t[::7] = -100
    _check(x, t)
    _check(x, t, reduction="none", label_smoothing=0.1, weight=torch.rand(c, device="cuda", dtype=dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("c,dtype,kernel,vec8", [
    (32000, torch.bfloat16, "_ce_fwd_tma_kernel", None),  # Llama-2: the TMA kernel (sm_90)
    (32000, torch.float16, "_ce_fwd_tma_kernel", None),
    (50257, torch.bfloat16, "_ce_fwd_persist_kernel", True),  # GPT-2: unaligned rows, the VEC8 form
    (50257, torch.float16, "_ce_fwd_persist_kernel", True),
    (128256, torch.bfloat16, "_ce_fwd_persist_kernel", False),  # Llama-3
    (262144, torch.float16, "_ce_fwd_persist_kernel", False),  # Gemma
], ids=["32K-bf16-tma", "32K-fp16-tma", "50257-bf16-vec8", "50257-fp16-vec8", "128K-bf16", "262K-fp16"])
def test_gpu_production_vocab_16bit(c, dtype, kernel, vec8):
    """16-bit logits at the vocabularies users run, 2^25 logits: the loss and the gradient within the 16-bit rule
    of tests/_tol.py, relative to the gradient's own scale (~1/rows: an all-zero or x 0.9 gradient fails), and the
    kernel that ran named."""
    if "tma" in kernel and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the TMA kernel runs on sm_90 only")
    m = max(16, min(1024, 2**25 // c))
    x = torch.randn(m, c, device="cuda", dtype=dtype) * 3
    t = torch.randint(0, c, (m,), device="cuda")
    t[::7] = -100
    with launched("cross_entropy") as seen:
        _check(x, t)
    assert ran(seen, kernel, **({} if vec8 is None else {"VEC_WIN": lambda w: (w > 0) == vec8})), seen


@pytest.mark.gpu
@pytest.mark.parametrize("c", [32000, 50304, 262144])
def test_gpu_wide_rows(c):
    """Every wide-row route at these widths: the stream (smoothing; float32), the persistent kernel or, at 32,000,
    the TMA kernel (bf16 class indices)."""
    x = torch.randn(256, c, device="cuda", dtype=torch.bfloat16) * 2
    t = torch.randint(0, c, (256,), device="cuda")
    t[::5] = -100
    _check(x, t, label_smoothing=0.1)
    _check(x, t)
    _check(x.float(), t, reduction="none", weight=torch.rand(c, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("c,pad", [(50257, 0), (30522, 0), (32001, 0), pytest.param(100277, 0, marks=BIG),
                                   pytest.param(262143, 0, marks=BIG), (50257, 8),
                                   (32000, 8), (50257, 64), (50257, 3)])
def test_gpu_vec8_rows(c, pad, dtype):
    """Misaligned 16-bit rows at real vocabulary sizes (GPT-2's 50,257, BERT's 30,522, cl100k's 100,277) through the
    default routes (the persistent kernel's VEC8 form; a row stride not congruent to the gradient's, pad 3, streams):
    more rows than row groups, every row offset mod 8, targets at column 0 and C - 1, ignored rows, weights,
    -inf / +inf logits and an all -inf row."""
    m = 512
    x = (torch.randn(m, c + pad, device="cuda", dtype=dtype) * 2)[:, :c]
    t = torch.randint(0, c, (m,), device="cuda")
    t[::7] = -100
    t[1], t[2], t[9] = 0, c - 1, 1
    _check(x, t)
    _check(x, t, reduction="sum", weight=torch.rand(c, device="cuda", dtype=dtype))
    x[1, 0] = float("-inf")
    x[2, c - 1] = float("inf")
    x[4, :] = float("-inf")
    _check(x, t, reduction="none")


@pytest.mark.gpu
def test_gpu_persistent_in_place():
    """The gradient written over the logits at GPT-2's 50,257 classes (the default VEC8 form: 2,048-position pieces on
    the row's 64-element window, one cooperative launch): targets up to 63 columns below a piece's end (in the next
    piece where the row's window phase passes them) and in the last 8 columns (the tail columns, the first piece's),
    every row offset mod 64, more rows than row groups."""
    c, m = 50257, 512
    x = torch.randn(m, c, device="cuda", dtype=torch.bfloat16) * 2
    r = torch.arange(m, device="cuda")
    for t in (2048 * (1 + r % 24) - 1 - r % 64, c - 1 - r % 8):
        t[::7] = -100
        _check_in_place(x, t, 64)


@pytest.mark.gpu
def test_gpu_special_strided_and_errors():
    x = torch.randn(64, 50304, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 50304, (64,), device="cuda")
    x[3, 5] = float("-inf")
    _check(x[::2], t[::2])
    _check(torch.randn(8, 21, 64, 64, device="cuda"), torch.randint(0, 21, (8, 64, 64), device="cuda"))
    from fused_layers.ops.cross_entropy import check_cross_entropy_errors

    loss = fused_cross_entropy(x.float(), torch.full((64,), 50304, device="cuda"))  # no sync, no raise yet
    with pytest.raises(IndexError, match="out of range"):
        check_cross_entropy_errors()
    assert loss.isnan()


@pytest.mark.gpu
@pytest.mark.parametrize("c", [1000, 50304])
def test_gpu_torch_compile_triton_op(c):
    """Under torch.compile the op is a torch.library.triton_op: Inductor traces into the launcher (FakeTensor /
    FunctionalTensor: no host reads, no pinned copies) and launches the kernels from its own code."""
    from torch import nn

    from fused_layers import FusedCrossEntropyLoss, FusedLinearCrossEntropyLoss

    torch._dynamo.reset()
    lin = nn.Linear(64, c, device="cuda", dtype=torch.bfloat16)
    crit = FusedCrossEntropyLoss(label_smoothing=0.1, ignore_index=3)

    def step(h, t):
        return crit(lin(h), t)

    h = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, c, (96,), device="cuda")
    t[::7] = 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = torch.compile(step, fullgraph=True)(h, t)
    ref = F.cross_entropy(lin(h).float(), t, label_smoothing=0.1, ignore_index=3)
    torch.testing.assert_close(loss.float(), ref, atol=2e-2, rtol=2e-2)
    (g,) = torch.autograd.grad(loss, lin.weight)
    (r,) = torch.autograd.grad(ref, lin.weight)
    torch.testing.assert_close(g.float(), r.float(), atol=2e-2, rtol=5e-2)
    # the fused LM head + loss (an opaque custom op) under compile, autocast as in the demo LM
    hid = torch.randn(96, 64, device="cuda", requires_grad=True)
    w = (torch.randn(c, 64, device="cuda") * 0.1).requires_grad_()
    lce = FusedLinearCrossEntropyLoss()
    with torch.autocast("cuda", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = torch.compile(lce, fullgraph=True)(hid, w, t)
        ref = F.cross_entropy(F.linear(hid, w).float(), t)
    torch.testing.assert_close(loss, ref, atol=2e-2, rtol=2e-2)
    g = torch.autograd.grad(loss, (hid, w))
    r = torch.autograd.grad(ref, (hid, w))
    for a, b in zip(g, r):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=5e-2)


# ------------------------------------------------------------------------------------------------
# Fused LM head + loss
# ------------------------------------------------------------------------------------------------
def _check_linear(n, h, v, bias=True, dtype=torch.float32, chunk_bytes=None, go=None, tol=None, **kw):
    from fused_layers import fused_linear_cross_entropy

    hid = torch.randn(n, h, dtype=dtype) * 2
    w = torch.randn(v, h, dtype=dtype) * 0.5
    b = torch.randn(v, dtype=dtype) if bias else None
    t = torch.randint(0, v, (n,))
    t[::5] = kw.get("ignore_index", -100)
    leaves = [hid, w] + ([b] if bias else [])
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    leaves = [x.detach().requires_grad_() for x in leaves]
    lr = F.cross_entropy(F.linear(ref_leaves[0], ref_leaves[1], ref_leaves[2] if bias else None), t, **kw)
    ctx = (config_override("linear_cross_entropy", chunk_bytes=chunk_bytes, min_rows=128) if chunk_bytes
           else warnings.catch_warnings())
    with ctx:
        loss = fused_linear_cross_entropy(leaves[0], leaves[1], t, leaves[2] if bias else None, **kw)
        go = (torch.randn_like(lr) if go is None else go).to(loss.dtype)  # the reference sees the rounded go
        loss.backward(go)
    lr.backward(go.double())
    for a in leaves:
        assert a.grad.dtype == a.dtype
    if tol is None and dtype in (torch.float16, torch.bfloat16):  # K x PyTorch's own error (tests/_tol.py)
        same = [x.detach().requires_grad_() for x in leaves]
        lt = F.cross_entropy(F.linear(same[0], same[1], same[2] if bias else None).float(), t, **kw)  # the usual
        lt.backward(go)
        assert_within_torch(loss, lr, lt, what="loss")
        for name, a, r, s in zip(("dhidden", "dweight", "dbias"), leaves, ref_leaves, same):
            assert_within_torch(a.grad, r.grad, s.grad, what=name)
        return
    atol, rtol = tol or TOL[dtype]
    torch.testing.assert_close(loss.double(), lr, atol=atol * 4, rtol=rtol)
    for a, r in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad.double(), r.grad, atol=atol * 4, rtol=rtol * 4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_chunks(reduction):
    # 300 rows x 37 classes x 4 bytes: chunk_bytes 20000 -> 135 rows -> chunks of 128 rows (3 chunks, ragged)
    _check_linear(300, 24, 37, chunk_bytes=20000, reduction=reduction)
    _check_linear(13, 8, 29, bias=False, reduction=reduction, label_smoothing=0.2, ignore_index=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_cross_entropy_half(dtype):
    """16-bit hidden states and weights: loss and the three gradients within K x PyTorch's own error."""
    _check_linear(300, 24, 37, dtype=dtype, chunk_bytes=10000)  # 3 chunks of 128 rows, the last ragged
    _check_linear(12, 8, 29, bias=False, dtype=dtype, reduction="sum", label_smoothing=0.1)


def test_linear_cross_entropy_pads_unaligned_rows():
    """Vocabularies whose rows are not 16-byte multiples (GPT-2's 50,257 in bf16) run the matmuls over a weight with
    zero classes up to a multiple of 64; the cross-entropy kernel reads the real classes of that logits buffer and
    overwrites them in place with its strides; aligned ones stay contiguous. Gradients against float64 with the
    padding (bias, ragged chunks): _check_linear (37 classes)."""
    from fused_layers import fused_linear_cross_entropy
    from fused_layers.ops import linear_cross_entropy as lce

    assert [lce.padded_vocab(v, e) for v, e in [(50257, 2), (32000, 2), (37, 4), (36, 4), (48, 2)]] == \
        [50304, 32000, 64, 36, 48]
    for v, stride in [(37, 64), (48, 48)]:
        hid = torch.randn(20, 8, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(v, 8, dtype=torch.bfloat16, requires_grad=True)
        with patch.object(lce, "cross_entropy_forward", wraps=lce.cross_entropy_forward) as ce_fwd:
            fused_linear_cross_entropy(hid, w, torch.randint(0, v, (20,))).backward()
        logits = ce_fwd.call_args.args[0]
        assert logits.shape == (20, v) and logits.stride() == (stride, 1)
        assert ce_fwd.call_args.kwargs["grad_out"] is logits
        assert w.grad.shape == (v, 8) and w.grad.is_contiguous()
    _check_linear(300, 24, 37, dtype=torch.bfloat16, chunk_bytes=10000)
    _check_linear(300, 24, 37, dtype=torch.bfloat16, bias=True, chunk_bytes=10000, label_smoothing=0.1)
    _check_linear(40, 24, 37, dtype=torch.bfloat16, bias=True)  # one chunk: grad_weight as one product
    for reduction in ("mean", "sum", "none"):  # no rows: zero gradients of the real classes' shapes
        hid, w, b = torch.randn(0, 8, requires_grad=True), torch.randn(37, 8, requires_grad=True), torch.randn(37)
        b.requires_grad_()
        fused_linear_cross_entropy(hid, w, torch.empty(0, dtype=torch.long), b, reduction=reduction).sum().backward()
        assert w.grad.shape == (37, 8) and b.grad.shape == (37,) and not w.grad.any() and not b.grad.any()


def test_linear_cross_entropy_grad_weight_sum_dtype():
    """Over several chunks grad_weight is summed in the weight's dtype when the weight is in the compute dtype (a bf16
    model: no float32 (V, H) buffer), and in float32 for float32 weights under bf16 autocast; both within the 16-bit
    rule against float64 (_check_linear)."""
    from fused_layers import fused_linear_cross_entropy
    from fused_layers.ops import linear_cross_entropy as lce

    for wdtype, autocast in [(torch.bfloat16, False), (torch.float32, True)]:
        hid = torch.randn(300, 16, dtype=wdtype, requires_grad=True)
        w = torch.randn(48, 16, dtype=wdtype, requires_grad=True)
        t = torch.randint(0, 48, (300,))
        with patch.object(lce, "_accumulate_grad_weight", wraps=lce._accumulate_grad_weight) as acc, \
                config_override("linear_cross_entropy", chunk_bytes=1, min_rows=128), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            fused_linear_cross_entropy(hid, w, t).backward()
        sums = {c.args[0].dtype for c in acc.call_args_list}
        assert acc.call_count == 3 and sums == ({torch.bfloat16} if not autocast else {torch.float32})
        assert w.grad.dtype == wdtype and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("frozen", ["weight", "hidden", "bias"])
def test_linear_cross_entropy_frozen_inputs(frozen, reduction, compiled):
    """A head that does not train (LoRA freezes it; a tied embedding that is frozen) gets no weight gradient computed:
    no (V, H) buffer is saved for the backward and the chunks run two matmuls, not three (the (V, H) weight gradient
    was 0.5 GiB at Gemma's head, kept and thrown away).  Likewise a hidden state or a bias without a gradient.  The
    gradients that are asked for match float64 over several ragged chunks, eager and compiled."""
    from fused_layers import fused_linear_cross_entropy
    from fused_layers.ops import linear_cross_entropy as lce

    n, h, v = 300, 24, 37
    hid, w, b = torch.randn(n, h) * 2, torch.randn(v, h) * 0.5, torch.randn(v)
    t = torch.randint(0, v, (n,))
    t[::7] = -100
    trains = {"hidden": frozen != "hidden", "weight": frozen != "weight", "bias": frozen != "bias"}
    leaves = [x.detach().requires_grad_(trains[k]) for k, x in zip(("hidden", "weight", "bias"), (hid, w, b))]
    ref = [x.detach().double().requires_grad_(trains[k]) for k, x in zip(("hidden", "weight", "bias"), (hid, w, b))]
    lr = F.cross_entropy(F.linear(*ref[:2], ref[2]), t, reduction=reduction)
    fn = fused_linear_cross_entropy
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True)
    saved = []
    with config_override("linear_cross_entropy", chunk_bytes=20000, min_rows=128), \
            patch.object(lce, "_accumulate_grad_weight", wraps=lce._accumulate_grad_weight) as acc, \
            torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(tuple(x.shape)) or x, lambda x: x), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = fn(leaves[0], leaves[1], t, leaves[2], reduction=reduction)
        go = torch.randn_like(lr).to(loss.dtype)
        loss.backward(go)
    lr.backward(go.double())
    torch.testing.assert_close(loss.double(), lr, atol=1e-4, rtol=1e-4)
    for k, a, r in zip(("hidden", "weight", "bias"), leaves, ref):
        if trains[k]:
            torch.testing.assert_close(a.grad.double(), r.grad, atol=1e-4, rtol=1e-4)
        else:
            assert a.grad is None
    assert (acc.call_count > 0) == trains["weight"]  # 3 chunks of 128 rows sum the weight gradient, or none runs
    if reduction == "mean" and not compiled:  # the forward's gradients are what the backward keeps
        assert ((v, h) in saved) == trains["weight"] and ((n, h) in saved) == trains["hidden"]


def test_linear_cross_entropy_frozen_weight_chunks():
    """Chunk sizes at the models' heads (bf16, 4,096 / 8,192 tokens): a trained weight takes at most 256 MiB of logits
    and 512+ rows (1,024+ where its gradient's sum weighs more: a float32 sum, a compiled step), a frozen one 32 MiB /
    256+ rows; and the head picks the pair by whether the weight trains (a frozen weight at a small size: 3 chunks of
    the frozen pair's 128 rows, a trained one: 1)."""
    from fused_layers import fused_linear_cross_entropy
    from fused_layers.ops import cross_entropy_config as cfg
    from fused_layers.ops import linear_cross_entropy as lce

    for n, v, trained, summed, frozen in ((4096, 256000, 512, 1024, 256), (8192, 151936, 768, 1024, 256),
                                          (8192, 128256, 1024, 1024, 256), (8192, 32000, 4096, 4096, 512),
                                          (8192, 50257, 2048, 2048, 256)):
        got = (lce.chunk_rows(n, v, 2), lce.chunk_rows(n, v, 2, sum_bound=True),
               lce.chunk_rows(n, v, 2, weight_grad=False))
        assert got == (trained, summed, frozen), (n, v, got)
    n, h, v = 300, 24, 37
    hid, w, t = torch.randn(n, h, requires_grad=True), torch.randn(v, h), torch.randint(0, v, (n,))
    for trains, chunks in ((False, 3), (True, 1)):
        w.requires_grad_(trains)
        with patch.object(cfg, "LINEAR_FROZEN_CHUNK_BYTES", 20000), patch.object(cfg, "LINEAR_FROZEN_MIN_ROWS", 128), \
                patch.object(lce, "cross_entropy_forward", wraps=lce.cross_entropy_forward) as ce:
            loss = fused_linear_cross_entropy(hid, w, t)
        assert ce.call_count == chunks, (trains, ce.call_count)
        ref = F.cross_entropy(F.linear(hid.double(), w.double()), t)
        torch.testing.assert_close(loss.double(), ref, atol=1e-4, rtol=1e-4)
    # A trained weight's floor: 128-row chunks for a bf16 sum; 256 for a float32 sum (a float32 weight) and for the
    # compiled ops, whatever the dtype
    w.requires_grad_(True)
    with patch.object(cfg, "LINEAR_CHUNK_BYTES", 1), patch.object(cfg, "LINEAR_MIN_ROWS", 128), \
            patch.object(cfg, "LINEAR_SUM_MIN_ROWS", 256), \
            patch.object(lce, "cross_entropy_forward", wraps=lce.cross_entropy_forward) as ce:
        for dt, compiled, chunks in ((torch.bfloat16, False, 3), (torch.float32, False, 2), (torch.bfloat16, True, 2)):
            ce.reset_mock()
            loss, *_ = lce.linear_cross_entropy_forward(hid.detach().to(dt), w.detach().to(dt), t, None, -100, "mean",
                                                        0.0, True, dt, dt, compiled=compiled)
            assert ce.call_count == chunks, (dt, compiled, ce.call_count)
            ref = F.cross_entropy(F.linear(hid.to(dt).double(), w.to(dt).double()), t)
            torch.testing.assert_close(loss.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("v", [37, 48])
def test_linear_cross_entropy_wide_row_kernels(v):
    """The logits chunk is overwritten by its gradient in place: the program that writes the target's column must read
    its logit first, and no other program write it.  The stream (float32 logits, smoothing; bf16 logits at 37
    classes, whose buffer rows are padded to 64 for cuBLAS) and the persistent kernel (bf16 logits under autocast at
    48 classes), targets in the last 8 columns on every other row: each row's loss (the pass with a gradient of
    'none', as its backward runs it) against float64 F.cross_entropy of the same bf16 logits."""
    from fused_layers import fused_linear_cross_entropy
    from fused_layers.ops import cross_entropy as ce
    from fused_layers.ops.linear_cross_entropy import linear_cross_entropy_forward

    with config_override("cross_entropy", **WIDE):
        _check_linear(12, 8, v, label_smoothing=0.1)
        hid = torch.randn(24, 16, requires_grad=True)
        w = torch.randn(v, 16, requires_grad=True)
        r = torch.arange(24)
        t = torch.where(r % 2 == 0, v - 1 - r // 2 % 8, torch.randint(0, v, (24,)))
        t[::5] = -100
        ce._PLANS.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fused_linear_cross_entropy(hid, w, t)
            logits = F.linear(hid, w)
            ref = F.cross_entropy(logits.float(), t)
        rows, *_ = linear_cross_entropy_forward(hid.detach(), w.detach(), t, None, -100, "none", 0.0, True,
                                                torch.bfloat16, torch.float32, row_scale=torch.ones(24))
        persist = [p.persist["VEC_WIN"] for p in ce._PLANS.values() if p.persist is not None]
        assert persist == ([] if v % 8 else [0, 0]), persist  # 37: a padded buffer streams
    torch.testing.assert_close(rows.double(), F.cross_entropy(logits.double(), t, reduction="none"), atol=1e-4,
                               rtol=1e-5)
    torch.testing.assert_close(loss, ref, atol=2e-2, rtol=2e-2)
    for a, b in zip(torch.autograd.grad(loss, (hid, w)), torch.autograd.grad(ref, (hid, w))):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_softcap(reduction):
    """The fused head with Gemma 2's final soft-capping, over 3 chunks, against float64 of the capped logits."""
    from fused_layers import fused_linear_cross_entropy

    hid = torch.randn(300, 24, dtype=torch.float64) * 2
    w = torch.randn(37, 24, dtype=torch.float64)
    t = torch.randint(0, 37, (300,))
    t[::7] = -100
    ref_leaves = [hid.clone().requires_grad_(), w.clone().requires_grad_()]
    leaves = [hid.float().requires_grad_(), w.float().requires_grad_()]
    lr = F.cross_entropy(torch.tanh(F.linear(*ref_leaves) / 3.0) * 3.0, t, reduction=reduction)
    with config_override("linear_cross_entropy", chunk_bytes=20000, min_rows=128):
        loss = fused_linear_cross_entropy(*leaves, t, reduction=reduction, softcap=3.0)
        go = torch.rand_like(lr)
        loss.backward(go.float())
    lr.backward(go)
    torch.testing.assert_close(loss.double(), lr, atol=1e-5, rtol=1e-5)
    for a, r in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad.double(), r.grad, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="argument 'softcap'"):
        fused_linear_cross_entropy(*leaves, t, softcap=-3.0)


def test_linear_cross_entropy_scaling_and_layouts():
    _check_linear(40, 16, 33, go=torch.tensor(1.0, dtype=torch.float64))
    _check_linear(40, 16, 33, go=torch.tensor(0.5, dtype=torch.float64), bias=False)
    from fused_layers import fused_linear_cross_entropy

    hid = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    t = torch.randint(0, 11, (2, 5))
    loss = fused_linear_cross_entropy(hid, w, t, reduction="none")
    ref = F.cross_entropy(F.linear(hid, w).reshape(-1, 11), t.reshape(-1), reduction="none").reshape(2, 5)
    torch.testing.assert_close(loss, ref)
    t2 = torch.randint(0, 11, (20,))[::2]  # a strided 1-D target
    loss = fused_linear_cross_entropy(hid.reshape(10, 8), w, t2)
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(hid.reshape(10, 8), w), t2))
    with pytest.raises(RuntimeError, match="do not match"):
        fused_linear_cross_entropy(hid, w[:, :4], t)
    with pytest.raises(ValueError, match="target"):
        fused_linear_cross_entropy(hid, w, t[:1])


def test_linear_cross_entropy_autocast():
    """Under autocast the logits are bf16 (as F.linear's), the loss float32, grads in the inputs' dtypes."""
    from fused_layers import fused_linear_cross_entropy

    hid = torch.randn(24, 16, requires_grad=True)
    w = torch.randn(45, 16, requires_grad=True)
    t = torch.randint(0, 45, (24,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fused_linear_cross_entropy(hid, w, t)
        ref = F.cross_entropy(F.linear(hid, w).float(), t)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, atol=2e-2, rtol=2e-2)
    (gh, gw) = torch.autograd.grad(loss, (hid, w))
    (rh, rw) = torch.autograd.grad(ref, (hid, w))
    assert gh.dtype == gw.dtype == torch.float32
    torch.testing.assert_close(gh, rh, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gw, rw, atol=2e-2, rtol=2e-2)


def test_linear_module_swap_and_state_dict():
    from fused_layers import FusedLinearCrossEntropyLoss, LinearCrossEntropyLoss, swap_modules
    from fused_layers.modules.loss import FusedCrossEntropyLoss

    ref = LinearCrossEntropyLoss(label_smoothing=0.1)
    fused = FusedLinearCrossEntropyLoss(label_smoothing=0.1)
    assert ref.state_dict().keys() == fused.state_dict().keys()
    swapped = LinearCrossEntropyLoss(label_smoothing=0.1)
    rep = swap_modules(swapped, kinds=["cross_entropy"])
    assert rep.names("cross_entropy") == ["loss_fn"] and type(swapped.loss_fn) is FusedCrossEntropyLoss
    hid = torch.randn(2, 6, 8)
    w = torch.randn(17, 8)
    t = torch.randint(0, 17, (2, 6))
    for m in (fused, swapped):
        torch.testing.assert_close(m(hid, w, t), ref(hid, w, t), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_demo_lm_swaps_head_loss_and_matches():
    import copy

    from fused_layers import swap_modules
    from lm_demo.model import GPT

    torch.manual_seed(0)
    ref = GPT(vocab_size=40, seq_len=8, d_model=16, n_layer=1, n_head=2)
    fused = copy.deepcopy(ref)
    rep = swap_modules(fused, kinds=["cross_entropy"])
    assert rep.names("cross_entropy") == ["loss.loss_fn"]
    assert fused.state_dict().keys() == ref.state_dict().keys()
    idx = torch.randint(0, 40, (2, 8))
    y = torch.randint(0, 40, (2, 8))
    lr, lf = ref(idx, y), fused(idx, y)
    torch.testing.assert_close(lf, lr, atol=1e-5, rtol=1e-5)
    lr.backward()
    lf.backward()
    torch.testing.assert_close(fused.wte.weight.grad, ref.wte.weight.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_linear_cross_entropy_torch_compile():
    from fused_layers import FusedLinearCrossEntropyLoss

    torch._dynamo.reset()
    crit = FusedLinearCrossEntropyLoss()
    hid = torch.randn(10, 8, requires_grad=True)
    w = torch.randn(19, 8, requires_grad=True)
    t = torch.randint(0, 19, (10,))
    for red in ("mean", "none"):
        crit.loss_fn.reduction = red
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = torch.compile(crit, fullgraph=True)(hid, w, t)
        ref = F.cross_entropy(F.linear(hid, w), t, reduction=red)
        torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
        go = torch.rand_like(ref)
        g = torch.autograd.grad(loss, (hid, w), go)
        r = torch.autograd.grad(ref, (hid, w), go)
        for a, b in zip(g, r):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def linear_ce_float64(hid, w, t, label_smoothing=0.0, rows=512):
    """(loss, dhidden, dweight) in float64 of the mean F.cross_entropy(F.linear(hid, w), t), from ``hid`` and ``w``
    rounded to bf16 as autocast multiplies them, ``rows`` rows at a time: rows are independent and dweight sums over
    them, so this is the whole-batch reference without its (rows, vocab) float64 logits, log-softmax and gradient all
    at once (about 12 GiB at 4,096 x 128,256: out of memory with 8 test workers on one GPU)."""
    hid64, w64 = (x.detach().to(torch.bfloat16).double().requires_grad_() for x in (hid, w))
    loss = torch.zeros((), dtype=torch.float64, device=hid.device)
    for i in range(0, len(t), rows):
        part = F.cross_entropy(F.linear(hid64[i:i + rows], w64), t[i:i + rows], label_smoothing=label_smoothing,
                               reduction="sum") / len(t)
        part.backward()
        loss += part.detach()
    return loss, hid64.grad, w64.grad


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_linear_ce_float64_reference_in_row_chunks(smoothing):
    """The GPU test's float64 reference, a chunk of rows at a time (one short), is the whole-batch one."""
    hid, w = torch.randn(37, 8), torch.randn(29, 8) * 0.5
    t = torch.randint(0, 29, (37,))
    leaves = [x.to(torch.bfloat16).double().requires_grad_() for x in (hid, w)]
    whole = F.cross_entropy(F.linear(*leaves), t, label_smoothing=smoothing)
    expected = (whole, *torch.autograd.grad(whole, leaves))
    for got, want in zip(linear_ce_float64(hid, w, t, smoothing, rows=8), expected):
        torch.testing.assert_close(got, want.detach(), atol=1e-12, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("v,smoothing,n", [(50304, 0.1, 4096), pytest.param(128256, 0.1, 4096, marks=BIG),
                                           (50257, 0.0, 4096), pytest.param(256000, 0.0, 4096, marks=BIG),
                                           pytest.param(128256, 0.0, 1024, marks=BIG)])
def test_gpu_linear_cross_entropy(v, smoothing, n):
    """The fused linear cross-entropy: over several small chunks (forced), and in the default plan, whose chunks
    are LINEAR_SUM_MIN_ROWS = 1,024 rows at these vocabularies (four at 4,096 rows: the float32 weight-gradient sum; one
    at 1,024: the weight gradient as one product). 50,257 classes: a logits buffer with rows padded to 50,304
    (cuBLAS's alignment), which the kernel overwrites in place by the gradient."""
    from fused_layers import fused_linear_cross_entropy
    from fused_layers.ops.linear_cross_entropy import chunk_rows

    h = 256
    hid = torch.randn(n, h, device="cuda", requires_grad=True)
    w = (torch.randn(v, h, device="cuda") * 0.05).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    forced = v != 256000 and n == 4096
    # the default plan these cases are meant to take (a float32 weight under autocast: its gradient summed in float32)
    assert forced or chunk_rows(n, v, 2, sum_bound=True) == min(n, 1024)
    ctx = config_override("linear_cross_entropy", chunk_bytes=64 * 2**20, min_rows=128) if forced else nullcontext()
    with ctx:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fused_linear_cross_entropy(hid, w, t, label_smoothing=smoothing)
            ref = F.cross_entropy(F.linear(hid, w).float(), t, label_smoothing=smoothing)
        g = torch.autograd.grad(loss, (hid, w))
        r = torch.autograd.grad(ref, (hid, w))
    # float64 from the bf16-rounded operands autocast multiplies; PyTorch's own error: the autocast reference's
    ref64, *r64 = linear_ce_float64(hid, w, t, smoothing)
    assert_within_torch(loss, ref64, ref, what="loss")
    for name, a, b, c in zip(("dhidden", "dweight"), g, r, r64):
        assert_within_torch(a, c, b, what=name)


@pytest.mark.gpu
@pytest.mark.parametrize("v", [50257, pytest.param(128256, marks=BIG)])
def test_gpu_linear_cross_entropy_bf16_model(v):
    """A bf16 model's head (bf16 hidden states and weight, no autocast) in the default plan: two 2,048-row chunks at
    50,257, four 1,024-row chunks at 128,256, grad_weight summed in bf16 (one rounding a chunk); at 50,257 over a
    weight padded with zero classes to 50,304.
    Loss and both gradients within the 16-bit rule against float64 and PyTorch's own bf16 head."""
    from fused_layers import fused_linear_cross_entropy
    from fused_layers.ops.linear_cross_entropy import chunk_rows

    n, h = 4096, 256
    hid = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(v, h, device="cuda") * 0.05).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    t[::11] = -100
    assert chunk_rows(n, v, 2) == (2048 if v == 50257 else 1024)
    loss = fused_linear_cross_entropy(hid, w, t)
    g = torch.autograd.grad(loss, (hid, w))
    ref = F.cross_entropy(F.linear(hid, w).float(), t)
    r = torch.autograd.grad(ref, (hid, w))
    keep = t != -100  # the float64 reference has no ignore_index: the mean is over the kept rows
    ref64, gh64, gw64 = linear_ce_float64(hid[keep], w, t[keep])
    gh64 = torch.zeros(n, h, dtype=torch.float64, device="cuda").index_put_((keep.nonzero()[:, 0],), gh64)
    assert g[1].dtype == torch.bfloat16 and g[1].shape == (v, h)
    assert_within_torch(loss, ref64, ref, what="loss")
    for name, a, b, c in zip(("dhidden", "dweight"), g, r, (gh64, gw64)):
        assert_within_torch(a, c, b, what=name)


@pytest.mark.gpu
@pytest.mark.parametrize("v", [32000, pytest.param(256000, marks=BIG)])
def test_gpu_softcap(v):
    """Gemma 2's soft-capped head (cap 30) at production vocabularies: the fused head under bf16 autocast over several
    chunks, and the loss on bf16 logits (the stream: soft-capped rows never take the persistent kernel), against the
    capped float32 logits."""
    from fused_layers import fused_linear_cross_entropy

    n, h = 2048, 256
    hid = torch.randn(n, h, device="cuda", requires_grad=True)
    w = (torch.randn(v, h, device="cuda") * 0.5).requires_grad_()  # logits well past the cap
    t = torch.randint(0, v, (n,), device="cuda")
    t[::9] = -100
    with config_override("linear_cross_entropy", chunk_bytes=64 * 2**20, min_rows=128):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fused_linear_cross_entropy(hid, w, t, softcap=30.0)
            logits = F.linear(hid, w)
        ref = F.cross_entropy(torch.tanh(logits.float() / 30.0) * 30.0, t)
        g = torch.autograd.grad(loss, (hid, w))
        r = torch.autograd.grad(ref, (hid, w))
    torch.testing.assert_close(loss, ref, atol=1e-2, rtol=1e-2)
    for a, b in zip(g, r):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=5e-2)
    x = logits.detach()[:512].requires_grad_()
    _check_capped(x, t[:512], 30.0)


def test_ledger_times_a_loss_module_call():
    """The ledger records a swapped loss module's (input, target) call and times it against nn.CrossEntropyLoss."""
    from torch import nn

    from fused_layers import swap_modules
    from fused_layers.ledger import Ledger

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 13)
            self.crit = nn.CrossEntropyLoss(label_smoothing=0.1)

        def forward(self, x, t):
            return self.crit(self.lin(x), t)

    net = Net()
    assert swap_modules(net, kinds=["cross_entropy"]).names() == ["crit"]
    ledger = Ledger(net)
    ledger.start_recording()
    net(torch.randn(4, 8), torch.randint(0, 13, (4,))).backward()
    ledger.stop_recording()
    (row,) = ledger.measure(max_seconds=1.0)
    assert row.kind == "cross_entropy" and row.max_err < 1e-5 and row.metric == "GB/s"


def test_fallback_without_triton(monkeypatch):
    """Where Triton cannot run, F.cross_entropy / the unfused head + loss compute it, with one warning."""
    import fused_layers.ops._common as common
    from fused_layers import fused_linear_cross_entropy

    monkeypatch.setattr(common, "INTERPRET", False)
    monkeypatch.setattr(common, "_warned", set())
    x = torch.randn(3, 10, requires_grad=True)
    t = torch.tensor([1, 2, 3])
    with pytest.warns(UserWarning, match="using the PyTorch reference"), launched("cross_entropy") as seen:
        loss = fused_cross_entropy(x, t, label_smoothing=0.1)
    assert seen == []  # the fallback ran: no kernel launched
    torch.testing.assert_close(loss, F.cross_entropy(x, t, label_smoothing=0.1), atol=0, rtol=0)
    loss.backward()
    h, w = torch.randn(3, 4), torch.randn(10, 4)
    with pytest.warns(UserWarning, match="using the PyTorch reference"), launched("linear_cross_entropy") as seen:
        loss = fused_linear_cross_entropy(h, w, t)
    assert seen == []
    torch.testing.assert_close(loss, F.cross_entropy(h @ w.t(), t))
