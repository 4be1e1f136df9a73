"""The gated MLP activation act(gate) * up (ops/gated_activation.py): outputs and both gradients against a float64
reference, the concatenated gate_up input, strided halves, what autograd saves, errors; GPU: realistic sizes.
The activation with the down projection (fused_gated_activation_linear): every gradient against float64 and
PyTorch's own chain, autocast, what it saves (no product), its fallbacks and errors.  A plain MLP's activation with
its second linear (fused_activation_linear) likewise."""
from __future__ import annotations

import pytest
import torch
from _tol import assert_within_torch
from conftest import TOL

from fused_layers import (
    fused_activation_linear,
    fused_gated_activation,
    fused_gated_activation_linear,
    fused_geglu,
    fused_swiglu,
)
from fused_layers.ops.gated_activation import (
    activation_linear_reference,
    activation_reference,
    frozen_gated_mlp,
    gated_activation_reference,
)

ACTS = ["silu", "gelu", "gelu_tanh"]


def _ref64(gate, up, activation):
    return gated_activation_reference(gate.detach().double(), None if up is None else up.detach().double(), activation)


def _check(gate, up, activation, dtype):
    """Forward and every gradient of the fused op against autograd through the float64 reference."""
    atol, rtol = TOL[dtype]
    leaves = [t for t in (gate, up) if t is not None]
    y = fused_gated_activation(gate, up, activation)
    g64 = [t.detach().double().requires_grad_() for t in leaves]
    y64 = gated_activation_reference(g64[0], g64[1] if up is not None else None, activation)
    assert y.dtype == dtype and y.shape == y64.shape
    torch.testing.assert_close(y.double(), y64, atol=atol, rtol=rtol)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy)
    grads64 = torch.autograd.grad(y64, g64, dy.double())
    for got, want in zip(grads, grads64):
        assert got.dtype == dtype and got.shape == want.shape
        # the gradient's scale is |dy * u| ~ a few units: 16-bit tolerances with a proportionate absolute floor
        torch.testing.assert_close(got.double(), want, atol=4 * atol, rtol=rtol)


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64(device, activation, dtype):
    # ragged: 37 columns (one partial block), 3 x 5 rows; values past |4| reach the activations' flat tails
    gate = (torch.randn(3, 5, 37, device=device) * 3).to(dtype).requires_grad_()
    up = torch.randn(3, 5, 37, device=device, dtype=dtype, requires_grad=True)
    _check(gate, up, activation, dtype)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_concatenated_gate_up(device, activation):
    """Phi-3's gate_up_proj output as one tensor: the result is chunk(2)'s, the gradient one [..., 2N] tensor."""
    gu = torch.randn(4, 2 * 19, device=device, requires_grad=True)
    _check(gu, None, activation, torch.float32)
    gate, up = gu.detach().chunk(2, dim=-1)
    torch.testing.assert_close(fused_gated_activation(gu, None, activation),
                               fused_gated_activation(gate, up, activation), atol=0, rtol=0)


def test_strided_halves_and_copies(device):
    """The two halves of a projection output (row stride 2N, no copy), a transposed gate (copied), a leading-dim
    slice (row-strided)."""
    base = torch.randn(6, 2 * 24, device=device)
    gate = base[:, :24].clone().requires_grad_()
    gh, uh = base.chunk(2, dim=-1)  # views with row stride 48
    gh.requires_grad_(False)
    torch.testing.assert_close(fused_swiglu(gh, uh).double(), _ref64(gh, uh, "silu"), atol=1e-5, rtol=1e-5)
    gt = torch.randn(24, 6, device=device).t()  # unit row stride: a copy
    ut = torch.randn(6, 24, device=device)[::1]
    torch.testing.assert_close(fused_geglu(gt, ut).double(), _ref64(gt, ut, "gelu_tanh"), atol=1e-5, rtol=1e-5)
    big = torch.randn(10, 24, device=device)
    gs, us = big[::2], big[1::2]  # row stride 48
    torch.testing.assert_close(fused_geglu(gs, us, approximate="none").double(), _ref64(gs, us, "gelu"),
                               atol=1e-5, rtol=1e-5)
    _check(gate, torch.randn(6, 24, device=device).t().contiguous().t().contiguous().requires_grad_(), "silu",
           torch.float32)


def test_backward_recomputes_the_activation(device):
    """Autograd holds gate and up only (the inputs), no activation-sized intermediate."""
    gate = torch.randn(4, 32, device=device, requires_grad=True)
    up = torch.randn(4, 32, device=device, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = fused_swiglu(gate, up)
    assert len(saved) == 2 and all(any(s is t for t in (gate, up)) for s in saved)
    y.sum().backward()
    assert gate.grad is not None and up.grad is not None


def test_special_values(device):
    """The activations' flat tails, overflow of exp / tanh's exp, NaN; +inf gives +inf (torch's CPU gelu gives NaN
    there, the limit is inf), -inf gives NaN (-inf * 0) as torch does."""
    g = torch.tensor([[-1e4, -80.0, 0.0, 80.0, 1e4, float("nan"), float("-inf")]], device=device)
    u = torch.ones_like(g)
    for act in ACTS:
        got = fused_gated_activation(g, u, act)
        torch.testing.assert_close(got, gated_activation_reference(g, u, act), equal_nan=True)
        assert fused_gated_activation(torch.tensor([float("inf")], device=device),
                                      torch.ones(1, device=device), act).item() == float("inf")


def test_empty_and_no_grad(device):
    g = torch.randn(0, 8, device=device, requires_grad=True)
    assert fused_swiglu(g, torch.randn(0, 8, device=device)).shape == (0, 8)
    with torch.no_grad():
        y = fused_swiglu(torch.randn(3, 8, device=device, requires_grad=True), torch.randn(3, 8, device=device))
    assert not y.requires_grad


def test_errors(device):
    g = torch.randn(3, 8, device=device)
    with pytest.raises(ValueError, match="'activation'"):
        fused_gated_activation(g, g, "relu")
    with pytest.raises(ValueError, match="same shape") as e:
        fused_swiglu(g, torch.randn(3, 4, device=device))
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(TypeError, match="same dtype"):
        fused_swiglu(g, g.half())
    with pytest.raises(ValueError, match="even"):
        fused_swiglu(torch.randn(3, 7, device=device))
    with pytest.raises(TypeError, match="dtype torch.int64") as e:
        fused_swiglu(torch.ones(3, 8, dtype=torch.long, device=device))
    assert isinstance(e.value, NotImplementedError)
    with pytest.raises(TypeError, match="'gate' must be a torch.Tensor"):
        fused_swiglu([1.0, 2.0])
    with pytest.raises(ValueError, match="'approximate'"):
        fused_geglu(g, g, approximate="erf")


def test_float64_runs_the_reference(device):
    g = torch.randn(3, 8, device=device, dtype=torch.float64)
    torch.testing.assert_close(fused_swiglu(g, g), torch.nn.functional.silu(g) * g)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ACTS)
def test_llama_mlp_size_bf16(activation):
    """4 x 2,048 tokens x 11,008 (Llama 2 7B's intermediate size), bf16, against float64; and the halves of one
    gate_up output at Phi-3 mini's 8,192."""
    gate = (torch.randn(4, 2048, 11008, device="cuda") * 2).bfloat16().requires_grad_()
    up = torch.randn(4, 2048, 11008, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    _check(gate, up, activation, torch.bfloat16)
    gu = torch.randn(2, 1024, 2 * 8192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    _check(gu, None, activation, torch.bfloat16)


def test_opcheck(device):
    """The registered ops' schema, fake kernel and autograd registration (what torch.compile relies on)."""
    g = torch.randn(3, 8, device=device, requires_grad=True)
    u = torch.randn(3, 8, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fused_layers.gated_activation_fwd.default, (g, u, 0))
    torch.library.opcheck(torch.ops.fused_layers.gated_activation_fwd.default, (torch.randn(3, 16, device=device),
                                                                              None, 2))
    torch.library.opcheck(torch.ops.fused_layers.gated_activation_bwd.default,
                          (torch.randn(3, 8, device=device), g.detach(), u.detach(), 1))


# --------------------------------------------------------------------------------------------------
# fused_gated_activation_linear: linear(act(gate) * up, weight, bias), the product not saved
# --------------------------------------------------------------------------------------------------
def _linear_chain(gate, up, weight, bias, activation, acc=None):
    """PyTorch's eager MLP chain (act, product, linear), in ``acc`` (float64: the reference) or the inputs' dtype."""
    def cast(t):
        return t if t is None or acc is None else t.double()

    g, u = cast(gate), cast(up)
    if u is None:
        g, u = g.chunk(2, dim=-1)
    return torch.nn.functional.linear(activation_reference(g, activation) * u, cast(weight), cast(bias))


def _check_against_chain(fused, chain, inputs, names):
    """``fused(*inputs)`` and the gradient of each tensor input within K x PyTorch's own error (``chain`` in the
    inputs' dtypes) of ``chain`` run in float64; ``names`` name the inputs' gradients."""
    leaves = [t for t in inputs if t is not None]
    y = fused(*inputs)
    dy = torch.randn_like(y)
    got = (y, *torch.autograd.grad(y, leaves, dy))
    refs = []
    for acc in (torch.float64, None):  # the float64 reference, then PyTorch's own chain in the inputs' dtype
        copies = [(t.detach().double() if acc else t.detach().clone()).requires_grad_() for t in leaves]
        it = iter(copies)
        out = chain(*(next(it) if t is not None else None for t in inputs))
        refs.append((out, *torch.autograd.grad(out, copies, dy.to(out.dtype))))
    names = ["y"] + [n for n, t in zip(names, inputs) if t is not None]
    for name, o, r, t in zip(names, got, refs[0], refs[1]):
        assert o.dtype == t.dtype and o.shape == t.shape, name
        assert_within_torch(o, r, t, what=name)


def _check_linear(gate, up, weight, bias, activation):
    _check_against_chain(lambda *a: fused_gated_activation_linear(*a, activation),
                         lambda *a: _linear_chain(*a, activation), (gate, up, weight, bias),
                         ("dgate", "dup", "dweight", "dbias"))


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_float64(device, activation, dtype):
    """Ragged 3 x 5 tokens, a 37-wide product (one partial block), 11 outputs, with and without a bias."""
    for bias in (False, True):
        gate = (torch.randn(3, 5, 37, device=device) * 3).to(dtype).requires_grad_()
        up = torch.randn(3, 5, 37, device=device, dtype=dtype, requires_grad=True)
        w = (torch.randn(11, 37, device=device) / 6).to(dtype).requires_grad_()
        b = torch.randn(11, device=device, dtype=dtype, requires_grad=True) if bias else None
        _check_linear(gate, up, w, b, activation)


def test_linear_concatenated_and_strided(device):
    """Phi-3's concatenated gate_up (its gradient one [..., 2N] tensor), the two halves of one projection output
    (row stride 2N), and a transposed weight."""
    gu = torch.randn(6, 2 * 24, device=device, requires_grad=True)
    w = torch.randn(24, 9, device=device).t().requires_grad_()  # (9, 24), column-major
    _check_linear(gu, None, w, None, "gelu_tanh")
    base = torch.randn(6, 48, device=device, requires_grad=True)
    g, u = base.chunk(2, dim=-1)
    _check_linear(g, u, torch.randn(9, 24, device=device, requires_grad=True), None, "silu")


def test_linear_saves_no_product(device):
    """Autograd holds gate, up and the weight: nothing of the product's size, as the unfused chain holds."""
    gate = torch.randn(4, 32, device=device, requires_grad=True)
    up = torch.randn(4, 32, device=device, requires_grad=True)
    w = torch.randn(8, 32, device=device, requires_grad=True)
    for fn, want in ((fused_gated_activation_linear, 3), (lambda g, u, w: torch.nn.functional.linear(
            fused_swiglu(g, u), w), 4)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = fn(gate, up, w)
        assert len(saved) == want, [tuple(t.shape) for t in saved]
        assert sum(t.shape == (4, 32) and not any(t is x for x in (gate, up)) for t in saved) == want - 3
        y.sum().backward()


@pytest.mark.parametrize("plain", [False, True], ids=["gated", "plain"])
def test_linear_backward_writes_the_product_over_its_gradient(device, plain, monkeypatch):
    """The backward recomputes the product (a(x) for the plain MLP) over d(loss)/d(product), which the kernel reads
    at each element just before: it allocates dgate and dup (dx) and nothing else of that size, one intermediate-width
    tensor less at the backward's peak, and every gradient still matches float64."""
    m, n = 5, 40
    gate, up = (torch.randn(m, n, device=device, requires_grad=True) for _ in range(2))
    w = torch.randn(6, n, device=device, requires_grad=True)
    b = torch.randn(6, device=device, requires_grad=True)
    inputs, names = ((gate, w, b), ("dx", "dweight", "dbias")) if plain else ((gate, up, w, b),
                                                                             ("dgate", "dup", "dweight", "dbias"))
    fused = (lambda *a: fused_activation_linear(*a, "gelu_tanh")) if plain else \
        (lambda *a: fused_gated_activation_linear(*a, "gelu_tanh"))
    chain = (lambda *a: activation_linear_reference(*a, "gelu_tanh")) if plain else \
        (lambda *a: _linear_chain(*a, "gelu_tanh"))
    y = fused(*inputs)
    made, empty = [], torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: made.append(tuple(a[0]) if a else None) or empty(*a, **k))
    y.backward(torch.randn_like(y))
    monkeypatch.undo()
    assert made.count((m, n)) == (1 if plain else 2), made
    _check_against_chain(fused, chain, inputs, names)


@pytest.mark.parametrize("plain", [False, True], ids=["gated", "plain"])
def test_linear_reuse_inputs(device, plain, monkeypatch):
    """``reuse_inputs=True`` on intermediates (a projection's fresh output): the backward writes d gate and d up (dx)
    over them and allocates nothing of their size, its gradients are those of the allocating path bit for bit and
    match float64; a copy of them saved
    by another op and read after this backward raises (autograd's version check) instead of reading gradients;
    leaves are never overwritten."""
    m, n = 6, 40
    x = torch.randn(m, 12, device=device, requires_grad=True)
    w1 = torch.randn(2 * n, 12, device=device, requires_grad=True)
    w2 = torch.randn(5, n, device=device, requires_grad=True)

    def mlp(x, w1, w2, reuse, dtype=None):
        h = torch.nn.functional.linear(x, w1)
        g, u = h[..., :n], h[..., n:]  # views of an intermediate: overwritable
        if dtype is not None:  # the float64 chain
            return (torch.nn.functional.linear(activation_reference(g, "silu"), w2) if plain
                    else _linear_chain(g, u, w2, None, "silu"))
        return (fused_activation_linear(g, w2, None, "silu", reuse_inputs=reuse) if plain
                else fused_gated_activation_linear(g, u, w2, None, "silu", reuse_inputs=reuse))

    y = mlp(x, w1, w2, True)
    dy = torch.randn_like(y)
    made, empty = [], torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: made.append(tuple(a[0]) if a else None) or empty(*a, **k))
    got = torch.autograd.grad(y, (x, w1, w2), dy)
    monkeypatch.undo()
    assert (m, n) not in made, made
    assert all(torch.equal(a, b) for a, b in zip(got, torch.autograd.grad(mlp(x, w1, w2, False), (x, w1, w2), dy)))
    leaves64 = [t.detach().double().requires_grad_() for t in (x, w1, w2)]
    refs = torch.autograd.grad(mlp(*leaves64, False, torch.float64), leaves64, dy.double())
    for name, a, r in zip(("dx", "dw1", "dw2"), got, refs):
        torch.testing.assert_close(a.double(), r, atol=1e-4, rtol=1e-4, msg=name)
    # another op saved the overwritten tensor before this call: reading it after the backward raises
    h = torch.nn.functional.linear(x, w1)
    side = h.pow(2).sum()  # saves h
    y = (fused_activation_linear(h[..., :n], w2, None, "silu", reuse_inputs=True) if plain
         else fused_gated_activation_linear(h[..., :n], h[..., n:], w2, None, "silu", reuse_inputs=True))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (y.sum() + side).backward()
    if not plain:  # one intermediate passed as both gate and up: each gradient needs its own tensor
        h = torch.nn.functional.linear(x, w1)[..., :n]
        y = fused_gated_activation_linear(h, h, w2, None, "silu", reuse_inputs=True)
        got = torch.autograd.grad(y, (x, w1, w2), dy)
        hr = torch.nn.functional.linear(x.detach().double(), w1.detach().double())[..., :n].requires_grad_()
        yr = _linear_chain(hr, hr, w2.detach().double(), None, "silu")
        (gh,) = torch.autograd.grad(yr, (hr,), dy.double())
        torch.testing.assert_close(got[0].double(), gh @ w1.detach().double()[:n], atol=1e-4, rtol=1e-4)
    # leaves are read, never written
    g0 = torch.randn(m, n, device=device, requires_grad=True)
    u0 = torch.randn(m, n, device=device, requires_grad=True)
    keep = (g0.detach().clone(), u0.detach().clone())
    y = (fused_activation_linear(g0, w2, None, "silu", reuse_inputs=True) if plain
         else fused_gated_activation_linear(g0, u0, w2, None, "silu", reuse_inputs=True))
    y.sum().backward()
    assert torch.equal(g0.detach(), keep[0]) and torch.equal(u0.detach(), keep[1])


def test_linear_frozen_weight(device):
    """A frozen down projection (an adapter trains elsewhere): gate and up get their gradients, the weight none, and
    the backward runs the kernel without the product."""
    from fused_layers.ops import gated_activation as ga

    gate = torch.randn(4, 24, device=device, requires_grad=True)
    up = torch.randn(4, 24, device=device, requires_grad=True)
    w = torch.randn(6, 24, device=device)
    y = fused_gated_activation_linear(gate, up, w)
    y.backward(torch.ones_like(y))
    assert w.grad is None
    g64, u64 = (t.detach().double().requires_grad_() for t in (gate, up))
    _linear_chain(g64, u64, w.double(), None, "silu").backward(torch.ones(4, 6, dtype=torch.float64, device=device))
    torch.testing.assert_close(gate.grad.double(), g64.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(up.grad.double(), u64.grad, atol=1e-5, rtol=1e-5)
    assert not any(k[0] == "bwd_y" for k in ga._PLANS if k[1] == (4, 24))


def _frozen_chain(x, wg, wu, wd, activation):
    """PyTorch's eager gated MLP in x's dtype (the weights cast to it)."""
    wg, wu, wd = (w.to(x.dtype) for w in (wg, wu, wd))
    F = torch.nn.functional
    return F.linear(activation_reference(F.linear(x, wg), activation) * F.linear(x, wu), wd)


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frozen_mlp_matches_float64_and_keeps_the_input(device, activation, dtype):
    """``frozen_gated_mlp`` (ragged 3 x 5 tokens, 16 -> 37 -> 11, the weights frozen): y and dx within PyTorch's own
    error of float64; autograd keeps x and the three weights, nothing of the intermediate width."""
    x = torch.randn(3, 5, 16, device=device, dtype=dtype, requires_grad=True)
    wg, wu = ((torch.randn(37, 16, device=device) / 3).to(dtype) for _ in range(2))
    wd = (torch.randn(11, 37, device=device) / 6).to(dtype)
    y = frozen_gated_mlp(x, wg, wu, wd, activation)
    assert [tuple(t.shape) for t in y.grad_fn.saved_tensors] == [(3, 5, 16), (37, 16), (37, 16), (11, 37)]
    _check_against_chain(lambda t: frozen_gated_mlp(t, wg, wu, wd, activation),
                         lambda t: _frozen_chain(t, wg, wu, wd, activation), (x,), ("dx",))


def test_frozen_mlp_declines(device):
    """None (the caller runs its default path) where keeping x alone is not the whole story: a weight that trains,
    no gradient to x, a saved-tensor hook at work (activation checkpointing), autocast, mixed dtypes, an unknown
    activation."""
    x = torch.randn(4, 8, device=device, requires_grad=True)
    ws = [torch.randn(12, 8, device=device), torch.randn(12, 8, device=device), torch.randn(5, 12, device=device)]
    assert frozen_gated_mlp(x, *ws) is not None
    assert frozen_gated_mlp(x, ws[0], ws[1], ws[2].requires_grad_()) is None
    ws[2].requires_grad_(False)
    assert frozen_gated_mlp(x.detach(), *ws) is None
    with torch.no_grad():
        assert frozen_gated_mlp(x, *ws) is None
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert frozen_gated_mlp(x, *ws) is None
    assert frozen_gated_mlp(x, ws[0].bfloat16(), ws[1], ws[2]) is None  # mixed dtypes outside autocast
    assert frozen_gated_mlp(x, ws[0].double(), ws[1], ws[2]) is None
    assert frozen_gated_mlp(x, *ws, activation="relu") is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_frozen_mlp_under_autocast(device, dtype):
    """Under bf16 autocast (the HF Trainer's ``bf16=True``), a bf16 or a float32 MLP: x and the weights cast as
    ``F.linear`` casts them there, y bf16 and dx in x's dtype, within PyTorch's own error of float64 (the autocast
    chain); autograd keeps the bf16 x."""
    x = torch.randn(2, 7, 16, device=device, dtype=dtype, requires_grad=True)
    wg, wu = ((torch.randn(24, 16, device=device) / 3).to(dtype) for _ in range(2))
    wd = (torch.randn(9, 24, device=device) / 5).to(dtype)

    def under_autocast(fn):
        def run(t):
            with torch.autocast(device, dtype=torch.bfloat16):
                return fn(t)
        return run

    with torch.autocast(device, dtype=torch.bfloat16):
        y = frozen_gated_mlp(x, wg, wu, wd, "silu")
    assert y is not None and y.dtype == torch.bfloat16
    saved = y.grad_fn.saved_tensors[0]
    assert saved.shape == x.shape and saved.dtype == torch.bfloat16
    _check_against_chain(under_autocast(lambda t: frozen_gated_mlp(t, wg, wu, wd, "silu")),
                         under_autocast(lambda t: _frozen_chain(t, wg, wu, wd, "silu")), (x,), ("dx",))


def test_linear_autocast(device):
    """float32 weights under bf16 autocast: the matmuls in bf16, y bf16 as F.linear's, the weight's gradient
    float32; within PyTorch's own error of the autocast chain."""
    gate = torch.randn(5, 16, device=device).bfloat16().requires_grad_()
    up = torch.randn(5, 16, device=device).bfloat16().requires_grad_()
    w = torch.randn(6, 16, device=device, requires_grad=True)
    b = torch.randn(6, device=device, requires_grad=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = fused_gated_activation_linear(gate, up, w, b)
        want = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w, b)
    assert y.dtype == want.dtype == torch.bfloat16
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, (gate, up, w, b), dy)
    ref = torch.autograd.grad(want, (gate, up, w, b), dy)
    assert [t.dtype for t in got] == [t.dtype for t in ref] == [torch.bfloat16] * 2 + [torch.float32] * 2
    r64 = _linear_chain(*(t.detach().double().requires_grad_() for t in (gate, up, w, b)), "silu", torch.float64)
    assert_within_torch(y, r64, want, what="y")


def test_linear_empty_batch_and_strided_grad(device):
    """No tokens: an empty output, zero weight and bias gradients; an upstream gradient that is a transposed view."""
    g = torch.randn(0, 8, device=device, requires_grad=True)
    u = torch.randn(0, 8, device=device, requires_grad=True)
    w = torch.randn(5, 8, device=device, requires_grad=True)
    b = torch.randn(5, device=device, requires_grad=True)
    y = fused_gated_activation_linear(g, u, w, b)
    assert y.shape == (0, 5)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))
    g2, u2 = (torch.randn(6, 8, device=device, requires_grad=True) for _ in range(2))
    dy = torch.randn(5, 6, device=device).t()  # (6, 5), column-major
    got = torch.autograd.grad(fused_gated_activation_linear(g2, u2, w), (g2, u2, w), dy)
    want = torch.autograd.grad(_linear_chain(g2, u2, w, None, "silu"), (g2, u2, w), dy)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def test_linear_fallbacks_and_errors(device):
    g, u, w = (torch.randn(3, 8, device=device), torch.randn(3, 8, device=device), torch.randn(5, 8, device=device))
    with torch.no_grad():  # nothing to save: the fused activation, then F.linear
        torch.testing.assert_close(fused_gated_activation_linear(g, u, w), torch.nn.functional.linear(
            fused_swiglu(g, u), w))
    d = [t.double().requires_grad_() for t in (g, u, w)]  # float64: PyTorch's chain
    torch.testing.assert_close(fused_gated_activation_linear(*d), _linear_chain(*d, None, "silu"))
    with pytest.raises(RuntimeError, match="'weight' must be \\(out, 8\\)"):
        fused_gated_activation_linear(g, u, torch.randn(5, 7, device=device))
    with pytest.raises(RuntimeError, match="'bias' must have shape \\[5\\]"):
        fused_gated_activation_linear(g, u, w, torch.randn(4, device=device))
    with pytest.raises(RuntimeError, match="one dtype outside autocast"):
        fused_gated_activation_linear(g.requires_grad_(), u, w.double())
    with pytest.raises(TypeError, match="'weight' must be a torch.Tensor"):
        fused_gated_activation_linear(g, u, [1.0])
    with pytest.raises(ValueError, match="'activation'"):
        fused_gated_activation_linear(g, u, w, activation="relu")


# --------------------------------------------------------------------------------------------------
# fused_activation_linear: linear(act(x), weight, bias), a plain MLP's second half, act(x) not saved
# --------------------------------------------------------------------------------------------------
def _check_act_linear(x, weight, bias, activation):
    _check_against_chain(lambda *a: fused_activation_linear(*a, activation),
                         lambda *a: activation_linear_reference(*a, activation), (x, weight, bias),
                         ("dx", "dweight", "dbias"))


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_linear_matches_float64(device, activation, dtype):
    """Ragged 3 x 5 tokens, a 37-wide activation (one partial block), 11 outputs, with and without a bias; GPT-2's
    Conv1D weight as its transposed (in, out) view."""
    for bias in (False, True):
        x = (torch.randn(3, 5, 37, device=device) * 3).to(dtype).requires_grad_()
        w = (torch.randn(11, 37, device=device) / 6).to(dtype).requires_grad_()
        b = torch.randn(11, device=device, dtype=dtype, requires_grad=True) if bias else None
        _check_act_linear(x, w, b, activation)
    conv1d_w = (torch.randn(37, 11, device=device) / 6).to(dtype).requires_grad_()  # (in, out)
    x = torch.randn(4, 37, device=device, dtype=dtype).requires_grad_()
    y = fused_activation_linear(x, conv1d_w.t(), None, activation)
    y.backward(torch.ones_like(y))
    c = conv1d_w.detach().double().requires_grad_()
    torch.addmm(torch.zeros(11, dtype=torch.float64, device=device), activation_reference(x.detach().double(),
                activation), c).backward(torch.ones(4, 11, dtype=torch.float64, device=device))
    assert conv1d_w.grad.shape == (37, 11)
    torch.testing.assert_close(conv1d_w.grad.double(), c.grad, atol=0.1 if dtype == torch.bfloat16 else 1e-4,
                               rtol=2e-2 if dtype == torch.bfloat16 else 1e-4)


def test_act_linear_saves_no_activation(device):
    """Autograd holds x and the weight: nothing of x's size but x itself, where the unfused chain holds x and a(x);
    a frozen weight gets no gradient and no a(x) is written in the backward; a frozen x (an input that does not
    train) gets the weight gradient from a(x) recomputed by the forward kernel."""
    from fused_layers.ops import gated_activation as ga

    x = torch.randn(4, 32, device=device, requires_grad=True)
    w = torch.randn(8, 32, device=device, requires_grad=True)
    for fn, want in ((fused_activation_linear, 2), (activation_linear_reference, 3)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = fn(x, w)
        assert len(saved) == want, [tuple(t.shape) for t in saved]
        assert sum(t.shape == (4, 32) and t is not x for t in saved) == want - 2
        y.sum().backward()
    frozen = torch.randn(8, 32, device=device)
    x2 = torch.randn(5, 32, device=device, requires_grad=True)
    fused_activation_linear(x2, frozen).sum().backward()
    x64 = x2.detach().double().requires_grad_()
    activation_linear_reference(x64, frozen.double()).sum().backward()
    torch.testing.assert_close(x2.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)
    assert not any(k[0] == "act_bwd_y" for k in ga._PLANS if k[1] == (5, 32))
    w2 = torch.randn(8, 32, device=device, requires_grad=True)
    x3 = torch.randn(5, 32, device=device)
    fused_activation_linear(x3, w2, activation="gelu_tanh").sum().backward()
    w64 = w2.detach().double().requires_grad_()
    activation_linear_reference(x3.double(), w64, None, "gelu_tanh").sum().backward()
    torch.testing.assert_close(w2.grad.double(), w64.grad, atol=1e-5, rtol=1e-5)


def test_act_linear_autocast_empty_and_errors(device):
    """float32 weights under bf16 autocast (as F.linear: bf16 output, float32 weight gradient); no tokens; the
    fallbacks (no gradient, float64) and bad arguments."""
    x = torch.randn(5, 16, device=device).bfloat16().requires_grad_()
    w = torch.randn(6, 16, device=device, requires_grad=True)
    b = torch.randn(6, device=device, requires_grad=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = fused_activation_linear(x, w, b)
        want = torch.nn.functional.linear(torch.nn.functional.gelu(x), w, b)
    assert y.dtype == want.dtype == torch.bfloat16
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w, b), dy)
    ref = torch.autograd.grad(want, (x, w, b), dy)
    assert [t.dtype for t in got] == [t.dtype for t in ref] == [torch.bfloat16, torch.float32, torch.float32]
    r64 = activation_linear_reference(*(t.detach().double() for t in (x, w, b)))
    assert_within_torch(y, r64, want, what="y")
    e = torch.randn(0, 16, device=device, requires_grad=True)
    w1 = torch.randn(6, 16, device=device, requires_grad=True)
    out = fused_activation_linear(e, w1)
    assert out.shape == (0, 6)
    out.sum().backward()
    assert torch.equal(w1.grad, torch.zeros_like(w1))
    g, w3 = torch.randn(3, 8, device=device), torch.randn(5, 8, device=device)
    with torch.no_grad():
        torch.testing.assert_close(fused_activation_linear(g, w3), activation_linear_reference(g, w3))
    d = [t.double().requires_grad_() for t in (g, w3)]
    torch.testing.assert_close(fused_activation_linear(*d), activation_linear_reference(*d))
    with pytest.raises(RuntimeError, match="'weight' must be \\(out, 8\\)"):
        fused_activation_linear(g, torch.randn(5, 7, device=device))
    with pytest.raises(RuntimeError, match="'bias' must have shape \\[5\\]"):
        fused_activation_linear(g, w3, torch.randn(4, device=device))
    with pytest.raises(RuntimeError, match="one dtype outside autocast"):
        fused_activation_linear(g.requires_grad_(), w3.double())
    with pytest.raises(TypeError, match="'x' must be a torch.Tensor"):
        fused_activation_linear([1.0], w3)
    with pytest.raises(ValueError, match="'activation'"):
        fused_activation_linear(g, w3, activation="relu")


# --------------------------------------------------------------------------------------------------
# Under torch.compile: the two projections' torch.library ops
# --------------------------------------------------------------------------------------------------
def test_linear_ops_opcheck(device):
    """The compiled path's ops: schema, fake kernels and autograd registration, with and without up and bias."""
    ops = torch.ops.fused_layers
    g, u = (torch.randn(3, 8, device=device, requires_grad=True) for _ in range(2))
    w, b = torch.randn(5, 8, device=device, requires_grad=True), torch.randn(5, device=device, requires_grad=True)
    gu = torch.randn(2, 3, 16, device=device, requires_grad=True)
    torch.library.opcheck(ops.gated_activation_linear_fwd.default, (g, u, w, b, 0))
    torch.library.opcheck(ops.gated_activation_linear_fwd.default, (gu, None, w, None, 2))
    torch.library.opcheck(ops.gated_activation_linear_bwd.default,
                          (torch.randn(3, 5, device=device), g.detach(), u.detach(), w.detach(), 1, [True, False]))
    torch.library.opcheck(ops.activation_linear_fwd.default, (g, w, b, 1))
    torch.library.opcheck(ops.activation_linear_bwd.default,
                          (torch.randn(3, 5, device=device), g.detach(), w.detach(), 0, [False, True, True]))


_COMPILED_CASES = {  # name -> (fused call, how many token-sized tensors autograd keeps: the op's inputs)
    "plain": (lambda x, u, w, b: fused_activation_linear(x * 2, w, b, "gelu_tanh"), 1),
    "gated": (lambda x, u, w, b: fused_gated_activation_linear(x * 2, u * 3, w, b, "silu"), 2),
    "gate_up": (lambda x, u, w, b: fused_gated_activation_linear(torch.cat([x, u], -1) * 2, None, w, b, "gelu"), 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(_COMPILED_CASES))
def test_linear_ops_compiled_save_no_activation(device, case):
    """Compiled with Inductor's min-cut partitioner, the fused MLP ops save their inputs and the weight only (the
    PyTorch chain would keep the activation or the product too), and give eager's output and gradients; float32
    weights under bf16 autocast get float32 gradients, as F.linear's."""
    fn, kept = _COMPILED_CASES[case]
    x, u = (torch.randn(2, 5, 16, device=device).bfloat16().requires_grad_() for _ in range(2))
    w, b = torch.randn(8, 16, device=device, requires_grad=True), torch.randn(8, device=device, requires_grad=True)
    leaves = [x, u, w, b] if case != "plain" else [x, w, b]

    def step(f):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            with torch.autocast(device, dtype=torch.bfloat16):
                y = f(x, u, w, b)
        return y, torch.autograd.grad((y.float() ** 2).sum(), leaves), saved

    y, grads, _ = step(fn)
    torch._dynamo.reset()
    yc, gradsc, saved = step(torch.compile(fn, backend="aot_eager_decomp_partition", fullgraph=True))
    torch.testing.assert_close(yc, y)
    for a, c in zip(gradsc, grads):
        assert a.dtype == c.dtype
        torch.testing.assert_close(a, c)
    assert [g.dtype for g in gradsc[-2:]] == [torch.float32, torch.float32]
    token_sized = [t for t in saved if t.shape[:-1] == (2, 5)]
    assert len(token_sized) == kept, [(tuple(t.shape), t.dtype) for t in saved]


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(_COMPILED_CASES))
def test_gpu_linear_ops_compiled_by_inductor(case):
    """Inductor's compile of the MLP ops at GPT-2 / Llama widths (4,096 tokens), bf16 autocast with float32 weights:
    eager's output and gradients, and no activation or product kept."""
    fn, kept = _COMPILED_CASES[case]
    x, u = (torch.randn(2, 2048, 2816, device="cuda").bfloat16().requires_grad_() for _ in range(2))
    w = (torch.randn(1024, 2816, device="cuda") / 50).requires_grad_()
    b = torch.randn(1024, device="cuda", requires_grad=True)
    leaves = [x, u, w, b] if case != "plain" else [x, w, b]

    def step(f):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = f(x, u, w, b)
        return y, torch.autograd.grad((y.float() ** 2).sum(), leaves), saved

    y, grads, _ = step(fn)
    torch._dynamo.reset()
    yc, gradsc, saved = step(torch.compile(fn, fullgraph=True))
    torch.testing.assert_close(yc, y)
    for a, c in zip(gradsc, grads):
        assert a.dtype == c.dtype
        torch.testing.assert_close(a, c, atol=2e-2 * c.abs().max().item(), rtol=2e-2)
    assert len([t for t in saved if t.shape[:-1] == (2, 2048)]) == kept


@pytest.mark.gpu
@pytest.mark.parametrize("activation,dtype,autocast", [("silu", torch.bfloat16, False),
                                                       ("gelu_tanh", torch.bfloat16, False),
                                                       ("silu", torch.float32, True)])
def test_gpu_frozen_mlp_gemma_size(activation, dtype, autocast):
    """``frozen_gated_mlp`` at Gemma's MLP (2,048 tokens, 1,024 -> 8,192 -> 1,024, frozen weights), bf16, and float32
    under bf16 autocast (the HF Trainer's ``bf16=True``): y and dx within PyTorch's own error of float64, the
    backward's gate and up computed again by cuBLAS."""
    x = torch.randn(2, 1024, 1024, device="cuda", dtype=dtype, requires_grad=True)
    wg, wu = ((torch.randn(8192, 1024, device="cuda") / 32).to(dtype) for _ in range(2))
    wd = (torch.randn(1024, 8192, device="cuda") / 90).to(dtype)

    def run(fn):
        def call(t):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                return fn(t)
        return call

    _check_against_chain(run(lambda t: frozen_gated_mlp(t, wg, wu, wd, activation)),
                         run(lambda t: _frozen_chain(t, wg, wu, wd, activation)), (x,), ("dx",))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ACTS)
def test_gpu_linear_llama_mlp_size_bf16(activation):
    """2,048 tokens x 11,008 -> 4,096 (Llama 2 7B's MLP), bf16: the output and all four gradients within PyTorch's
    own error of the float64 reference; the concatenated gate_up at Phi-3 mini's 8,192 -> 3,072."""
    gate = (torch.randn(2, 1024, 11008, device="cuda") * 2).bfloat16().requires_grad_()
    up = torch.randn(2, 1024, 11008, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(4096, 11008, device="cuda") / 100).bfloat16().requires_grad_()
    _check_linear(gate, up, w, None, activation)
    gu = torch.randn(1024, 2 * 8192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w2 = (torch.randn(3072, 8192, device="cuda") / 90).bfloat16().requires_grad_()
    _check_linear(gu, None, w2, None, activation)


@pytest.mark.gpu
@pytest.mark.parametrize("plain", [False, True], ids=["gated", "plain"])
def test_gpu_reuse_inputs_same_bits_at_llama_size(plain):
    """``reuse_inputs`` writes the gradients over the inputs (each element read, then written, by one program): at
    Llama 2 7B's MLP size in bf16 its gradients are bit for bit those of the allocating path (a program that read an
    element another had already overwritten would differ), and gate / up now hold them."""
    g0 = (torch.randn(2, 1024, 11008, device="cuda") * 2).bfloat16().requires_grad_()
    u0 = torch.randn(2, 1024, 11008, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(4096, 11008, device="cuda") / 100).bfloat16().requires_grad_()
    dy = torch.randn(2, 1024, 4096, device="cuda", dtype=torch.bfloat16)
    grads = []
    for reuse in (False, True):
        gate, up = g0 * 1, u0 * 1  # intermediates, as a projection's output
        y = (fused_activation_linear(gate, w, None, "silu", reuse_inputs=reuse) if plain
             else fused_gated_activation_linear(gate, up, w, None, "silu", reuse_inputs=reuse))
        grads.append(torch.autograd.grad(y, (g0, w) if plain else (g0, u0, w), dy))
        if reuse:
            assert torch.equal(gate, grads[-1][0])  # the gradient went over the input
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_gpu_act_linear_vit_and_gpt2_sizes_bf16(activation):
    """A plain MLP's second half at ViT-B's 64 x 197 tokens x 3,072 -> 768 and GPT-2's Conv1D (transposed weight) at
    2,048 tokens x 3,072 -> 768, bf16: output and every gradient within PyTorch's own error of float64."""
    x = (torch.randn(64, 197, 3072, device="cuda") * 2).bfloat16().requires_grad_()
    w = (torch.randn(768, 3072, device="cuda") / 55).bfloat16().requires_grad_()
    b = torch.randn(768, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    _check_act_linear(x, w, b, activation)
    conv1d_w = (torch.randn(3072, 768, device="cuda") / 55).bfloat16().requires_grad_()
    _check_act_linear(torch.randn(2, 1024, 3072, device="cuda", dtype=torch.bfloat16, requires_grad=True),
                      conv1d_w.t(), None, activation)
