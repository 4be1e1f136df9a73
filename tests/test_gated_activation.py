"""The gated MLP activation act(gate) * up (ops/gated_activation.py): outputs and both gradients against a float64
reference, the concatenated gate_up input, strided halves, what autograd saves, errors; GPU: realistic sizes."""
from __future__ import annotations

import pytest
import torch
from conftest import TOL

from fused_layers import fused_gated_activation, fused_geglu, fused_swiglu
from fused_layers.ops.gated_activation import gated_activation_reference

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
