"""Residual add + RMSNorm / LayerNorm (ops/residual_norm.py): both outputs and every gradient (of x, the residual,
the weight and the bias, from gradients of both h and y) against float64 references; the HF weight orders; wide
rows (the composed path); strided inputs; errors; GPU: realistic sizes."""
from __future__ import annotations

import pytest
import torch
from conftest import BIG, TOL

from fused_layers import fused_add_layer_norm, fused_add_rms_norm
from fused_layers.ops._common import config_override
from fused_layers.ops.residual_norm import residual_norm_reference


def _run(fn, ref, x, r, params, dtype, out_dtype=None):
    """fn(x, r, *params) against float64 copies: h = x + r, and ref's norm of the h the kernel stored (the norm reads h
    as stored: its rounding to x's dtype passes gradients through); outputs and the gradients of every input."""
    atol, rtol = TOL[dtype]
    h, y = fn(x, r, *params)
    leaves64 = [t.detach().double().requires_grad_() for t in (x, r, *params)]
    h64 = leaves64[0] + leaves64[1]
    hq = h64 + (h.detach().double() - h64.detach())
    _, y64 = ref(hq, torch.zeros_like(hq), *leaves64[2:])
    assert h.dtype == dtype and y.dtype == (out_dtype or dtype)
    torch.testing.assert_close(h.double(), h64, atol=atol, rtol=rtol)
    torch.testing.assert_close(y.double(), y64, atol=atol, rtol=rtol)
    dh, dy = torch.randn_like(h), torch.randn_like(y)
    leaves = [x, r, *params]
    got = torch.autograd.grad((h, y), leaves, (dh, dy))
    want = torch.autograd.grad((h64, y64), leaves64, (dh.double(), dy.double()))
    for name, g, w in zip(["x", "residual", "weight", "bias"], got, want):
        scale = max(1.0, w.abs().max().item())  # dW sums over rows: its tolerance scales with it
        torch.testing.assert_close(g.double(), w, atol=4 * atol * scale, rtol=rtol, msg=lambda m: f"d{name}: {m}")


def _rms64(cast_before_weight=False, keep=False, offset=0.0):
    def ref(x, r, w):
        return residual_norm_reference(x, r, w.double() + offset if offset else w, None, 1e-6, True,
                                       cast_before_weight, keep)
    return ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [37, 256])
def test_add_rms_norm(device, dtype, n):
    x = torch.randn(3, 7, n, device=device, dtype=dtype, requires_grad=True)
    r = torch.randn(3, 7, n, device=device, dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n, device=device)).to(dtype).requires_grad_()
    _run(lambda x, r, w: fused_add_rms_norm(x, r, w, 1e-6), _rms64(), x, r, [w], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_layer_norm(device, dtype):
    x = torch.randn(11, 45, device=device, dtype=dtype, requires_grad=True)
    r = (torch.randn(11, 45, device=device) + 3).to(dtype).requires_grad_()  # a mean to remove
    w = torch.randn(45, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(45, device=device, dtype=dtype, requires_grad=True)

    def ref(x, r, w, b):
        return residual_norm_reference(x, r, w, b, 1e-5, False)
    _run(lambda x, r, w, b: fused_add_layer_norm(x, r, w, b, 1e-5), ref, x, r, [w, b], dtype)


def test_hf_weight_orders(device):
    """Llama's order (round xhat to x's dtype, then a float32 weight: y float32) and Gemma's ((1 + w) in float32,
    y in x's dtype), bf16, against float64 references of the same order; and the Llama order against HF's own
    module applied to the bf16 h."""
    n = 64
    x = torch.randn(5, n, device=device, dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(5, n, device=device, dtype=torch.bfloat16, requires_grad=True)
    w32 = (1 + 0.1 * torch.randn(n, device=device)).requires_grad_()
    _run(lambda x, r, w: fused_add_rms_norm(x, r, w, 1e-6, cast_before_weight=True), _rms64(True), x, r, [w32],
         torch.bfloat16, out_dtype=torch.float32)
    wg = (0.1 * torch.randn(n, device=device)).bfloat16().requires_grad_()
    _run(lambda x, r, w: fused_add_rms_norm(x, r, w, 1e-6, keep_input_dtype=True, weight_offset=1.0),
         _rms64(False, True, 1.0), x, r, [wg], torch.bfloat16)
    # exactly HF's LlamaRMSNorm order on the same h (bitwise but for the float32 statistics' summation order)
    h, y = fused_add_rms_norm(x, r, w32, 1e-6, cast_before_weight=True)
    if x.is_cuda:  # the GPU's float32 -> bfloat16 rounds to nearest, as torch's add
        assert torch.equal(h, x + r)
    else:  # the interpreter's conversion may be one unit off
        torch.testing.assert_close(h, x + r, atol=0, rtol=2 ** -7)
    hf = h.float()
    want = w32 * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    torch.testing.assert_close(y, want, atol=1e-2, rtol=1e-2)


def test_autocast_dtypes(device):
    """A bf16 attention output meets a float32 residual stream and a float32 weight (HF under autocast): h and y in
    float32 as ``residual + x`` and LlamaRMSNorm give them, each input's gradient in its own dtype."""
    x = torch.randn(5, 48, device=device, dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(5, 48, device=device, requires_grad=True)
    w = (1 + 0.1 * torch.randn(48, device=device)).requires_grad_()
    h, y = fused_add_rms_norm(x, r, w, 1e-6, cast_before_weight=True)
    assert h.dtype == y.dtype == torch.float32
    hr = r + x  # (exact in float32)
    hf = hr.float()
    want = w * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(h, hr, atol=0, rtol=0)
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
    dh, dy = torch.randn_like(h), torch.randn_like(y)
    gx, gr, gw = torch.autograd.grad((h, y), (x, r, w), (dh, dy))
    x2, r2, w2 = (t.detach().clone().requires_grad_() for t in (x, r, w))
    h2 = r2 + x2
    y2 = w2 * (h2 * torch.rsqrt(h2.pow(2).mean(-1, keepdim=True) + 1e-6))
    ex, er, ew = torch.autograd.grad((h2, y2), (x2, r2, w2), (dh, dy))
    assert gx.dtype == torch.bfloat16 and gr.dtype == torch.float32
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gr, er, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw, ew, atol=1e-4, rtol=1e-5)


def test_wide_rows_compose_the_norm_kernels(device):
    """Past the single-block width (forced down here) the add runs first and the norm's own kernels follow."""
    from fused_layers.ops import residual_norm

    x = torch.randn(4, 40, device=device, requires_grad=True)
    r = torch.randn(4, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    b = torch.randn(40, device=device, requires_grad=True)
    with config_override("residual_norm", max_single=16):
        _run(lambda x, r, w: fused_add_rms_norm(x, r, w, 1e-6), _rms64(), x, r, [w], torch.float32)
        _run(lambda x, r, w, b: fused_add_layer_norm(x, r, w, b), lambda h, z, w, b: residual_norm_reference(
            h, z, w, b, 1e-5, False), x, r, [w, b], torch.float32)
        assert not any(p.single for k, p in residual_norm._PLANS.items() if k[1][-1] == 40)


def test_strided_inputs_one_output_used(device):
    """Row-strided and transposed inputs; only y reaches the loss (h's gradient is None), or only h."""
    base = torch.randn(6, 64, device=device)
    x = base[:, :32].requires_grad_(False).clone().requires_grad_()
    r = base[:, 32:]  # row stride 64
    w = torch.randn(32, device=device, requires_grad=True)
    h, y = fused_add_rms_norm(x, r, w)
    y.sum().backward()
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    _, y64 = residual_norm_reference(x64, r.double(), w64)
    y64.sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-4, rtol=1e-5)
    xt = torch.randn(32, 6, device=device).t().requires_grad_()
    h, _ = fused_add_layer_norm(xt, r)
    h.sum().backward()
    torch.testing.assert_close(xt.grad, torch.ones_like(xt.grad))


def test_errors(device):
    x = torch.randn(3, 8, device=device)
    with pytest.raises(ValueError, match="same shape") as e:
        fused_add_rms_norm(x, torch.randn(3, 4, device=device))
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(TypeError, match="'residual' has dtype torch.int64"):
        fused_add_rms_norm(x, x.long())
    with pytest.raises(ValueError, match="'weight' must be 1-D"):
        fused_add_rms_norm(x, x, torch.ones(4, device=device))
    with pytest.raises(TypeError, match="'residual' must be a torch.Tensor"):
        fused_add_layer_norm(x, 1.0)
    with pytest.raises(TypeError, match="dtype torch.int64"):
        fused_add_rms_norm(x.long(), x.long())


def test_float64_runs_the_reference(device):
    x = torch.randn(3, 8, device=device, dtype=torch.float64)
    h, y = fused_add_rms_norm(x, x, eps=1e-6)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(2 * x, (8,), eps=1e-6))
    assert torch.equal(h, 2 * x)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 5120, pytest.param(8192, marks=BIG), pytest.param(12288, marks=BIG)])
def test_decoder_sizes_bf16(n):
    """4 x 2,048 tokens at Llama hidden sizes (8B, 13B, 70B) and one past the single-block width, bf16, Llama's
    weight order, against float64."""
    x = torch.randn(4, 2048, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(4, 2048, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16().requires_grad_()
    _run(lambda x, r, w: fused_add_rms_norm(x, r, w, 1e-6, cast_before_weight=True), _rms64(True), x, r, [w],
         torch.bfloat16)


def test_opcheck(device):
    """The registered ops' schema, fake kernel and autograd registration (what torch.compile relies on)."""
    x = torch.randn(3, 16, device=device, requires_grad=True)
    r = torch.randn(3, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fused_layers.residual_norm_fwd.default, (x, r, w, None, 1e-6, True, True, False))
    h, y, stats = torch.ops.fused_layers.residual_norm_fwd.default(x.detach(), r.detach(), w.detach(), None, 1e-6,
                                                                  True, False, False)
    torch.library.opcheck(torch.ops.fused_layers.residual_norm_bwd.default,
                          (torch.randn_like(y), torch.randn_like(h), h, w.detach(), None, stats, True, False))


def test_empty_rows(device):
    x = torch.randn(0, 16, device=device, requires_grad=True)
    r = torch.randn(0, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    h, y = fused_add_rms_norm(x, r, w)
    (h.sum() + y.sum()).backward()
    assert h.shape == y.shape == x.grad.shape == (0, 16) and torch.count_nonzero(w.grad) == 0
