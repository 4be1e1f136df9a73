"""fused_cross_entropy / FusedCrossEntropyLoss against float64 F.cross_entropy: loss and input gradient."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import TOL
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
    weight = kw.pop("weight", None)
    xr = x.detach().double().requires_grad_(grad)
    x = x.detach().requires_grad_(grad)
    tr = target.double() if target.is_floating_point() else target
    lr = F.cross_entropy(xr, tr, weight=None if weight is None else weight.double(), **kw)
    loss = fn(x, target, weight=weight, **kw)
    assert loss.dtype == x.dtype and loss.shape == lr.shape
    # Losses are sums over C classes: scale the tolerance with log(C)-sized terms.
    torch.testing.assert_close(loss.double(), lr, atol=atol * 4, rtol=rtol, equal_nan=True)
    if grad:
        go = torch.randn_like(lr) if go is None else go
        loss.backward(go.to(loss.dtype))
        lr.backward(go)
        assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
        torch.testing.assert_close(x.grad.double(), xr.grad, atol=atol, rtol=rtol, equal_nan=True)
    return loss


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 31), (4, 64), (5, 65), (2, 257), (9, 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_single_block(shape, dtype, reduction, device):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    t = torch.randint(0, shape[1], shape[:1], device=device)
    _check(x, t, reduction=reduction)


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
    with config_override("cross_entropy", max_single=16, block_n=32, block_m=2):  # two rows per program
        _check(x, t, reduction="sum", weight=torch.rand(c, device=device, dtype=dtype))


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


def test_kernel_formula_matches_torch(device):
    """The A/B form of the docstring (cross_entropy_rows_reference) is F.cross_entropy, in float64."""
    c = 11
    x = torch.randn(5, c, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.rand(c, dtype=torch.float64, device=device)
    for t in (torch.tensor([1, -100, 3, 10, 0], device=device), torch.softmax(torch.randn(5, c, dtype=torch.float64), -1)):
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
    x = torch.randn(4, 5, device=device)
    with pytest.raises(IndexError, match="out of range"):
        fused_cross_entropy(x, torch.tensor([0, 1, 5, 2], device=device))
    with pytest.raises(IndexError, match="out of range"):
        fused_cross_entropy(x, torch.tensor([0, -3, 1, 2], device=device))
    with pytest.raises(ValueError, match="reduction"):
        fused_cross_entropy(x, torch.tensor([0, 1, 2, 3]), reduction="avg")
    with pytest.raises(RuntimeError, match="label_smoothing"):
        fused_cross_entropy(x, torch.tensor([0, 1, 2, 3]), label_smoothing=1.5)
    with pytest.raises(RuntimeError, match="weight"):
        fused_cross_entropy(x, torch.tensor([0, 1, 2, 3]), weight=torch.ones(4))
    with pytest.raises(RuntimeError, match="Long"):
        fused_cross_entropy(x, torch.tensor([0, 1, 2, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="batch_size"):
        fused_cross_entropy(x, torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="shape"):
        fused_cross_entropy(x, torch.rand(4, 6))
    with pytest.raises(TypeError, match="input"):
        fused_cross_entropy([1.0], torch.tensor([0]))


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
    for red in ("mean", "none"):
        torch.library.opcheck(op, (x, t, None, -100, red, 0.1, True, torch.float32),
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
