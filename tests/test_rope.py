"""RoPE (ops/rope.py) against transformers' own apply_rotary_pos_emb (Llama: half-split; Phi-3: partial rotary;
GLM: partial + interleaved), forward and the gradients of q and k, and against float64; layouts, broadcast cos,
in place, errors; GPU: Llama 8B head shapes in bf16."""
from __future__ import annotations

import pytest
import torch
from conftest import TOL

from fused_layers import fused_rope
from fused_layers.ops.rope import rope_reference

transformers = pytest.importorskip("transformers")


def _hf(name):
    import importlib

    return importlib.import_module(f"transformers.models.{name}.modeling_{name}").apply_rotary_pos_emb


def _cos_sin(b, s, d_rot, device, dtype=torch.float32, base=10000.0):
    """HF's rotary embedding (default type): cat(freqs, freqs), positions 0..S-1 shifted per batch row."""
    inv = 1.0 / (base ** (torch.arange(0, d_rot, 2, device=device, dtype=torch.float32) / d_rot))
    pos = torch.arange(s, device=device, dtype=torch.float32)[None] + 7 * torch.arange(b, device=device)[:, None]
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _qk(b, hq, hk, s, d, device, dtype=torch.float32, layout=1):
    shape = (lambda h: (b, h, s, d)) if layout == 1 else (lambda h: (b, s, h, d))
    # HF's layout: a projection's output (B, S, H * D) viewed and transposed to (B, H, S, D)
    if layout == 1:
        q = torch.randn(b, s, hq, d, device=device, dtype=dtype).transpose(1, 2)
        k = torch.randn(b, s, hk, d, device=device, dtype=dtype).transpose(1, 2)
    else:
        q, k = torch.randn(shape(hq), device=device, dtype=dtype), torch.randn(shape(hk), device=device, dtype=dtype)
    return q.requires_grad_(), k.requires_grad_()


def _against(fn_ref, q, k, cos, sin, interleaved=False, unsqueeze_dim=1, atol=1e-5, rtol=1e-5):
    """fused_rope vs fn_ref(q, k, cos, sin, unsqueeze_dim): outputs and the gradients of q and k."""
    qe, ke = fused_rope(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=unsqueeze_dim)
    q2, k2 = (t.detach().clone().requires_grad_() for t in (q, k))
    qr, kr = fn_ref(q2, k2, cos, sin, unsqueeze_dim=unsqueeze_dim)
    assert qe.shape == q.shape and ke.shape == k.shape and qe.stride() == q.stride()
    torch.testing.assert_close(qe, qr, atol=atol, rtol=rtol)
    torch.testing.assert_close(ke, kr, atol=atol, rtol=rtol)
    dq, dk = torch.randn_like(qe), torch.randn_like(ke)
    got = torch.autograd.grad((qe, ke), (q, k), (dq, dk))
    want = torch.autograd.grad((qr, kr), (q2, k2), (dq, dk))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


def test_llama_half_split(device):
    q, k = _qk(2, 4, 2, 9, 16, device)  # GQA: 4 query heads, 2 key heads
    cos, sin = _cos_sin(2, 9, 16, device)
    _against(_hf("llama"), q, k, cos, sin)


def test_phi3_partial_rotary(device):
    q, k = _qk(2, 3, 3, 5, 24, device)
    cos, sin = _cos_sin(2, 5, 12, device)  # half of the head rotates
    _against(_hf("phi3"), q, k, cos, sin)


def test_glm_interleaved_partial(device):
    q, k = _qk(1, 2, 1, 6, 32, device)
    cos, sin = _cos_sin(1, 6, 16, device)
    _against(_hf("glm"), q, k, cos, sin, interleaved=True)


def test_layouts_and_broadcast(device):
    """(B, S, H, D) with unsqueeze_dim=2; cos broadcast over the batch as (1, S, D) and (S, D); cos / sin whose
    halves do not repeat (HF's formula holds for any cos / sin, forward and backward)."""
    q, k = _qk(2, 3, 1, 7, 16, device, layout=2)
    cos, sin = _cos_sin(1, 7, 16, device)
    _against(_hf("llama"), q, k, cos, sin, unsqueeze_dim=2)
    q, k = _qk(3, 2, 2, 7, 16, device)
    ref2d = lambda q, k, c, s, unsqueeze_dim: _hf("llama")(q, k, c[None], s[None], unsqueeze_dim)  # noqa: E731
    _against(ref2d, q, k, cos[0], sin[0])
    _against(_hf("llama"), q, k, torch.randn(3, 7, 16, device=device), torch.randn(3, 7, 16, device=device))
    _against(_hf("glm"), q, k, torch.randn(3, 7, 8, device=device), torch.randn(3, 7, 8, device=device),
             interleaved=True)


@pytest.mark.parametrize("interleaved", [False, True])
def test_bf16_against_float64(device, interleaved):
    q, k = _qk(2, 4, 2, 5, 32, device, dtype=torch.bfloat16)
    cos, sin = _cos_sin(2, 5, 24, device, dtype=torch.bfloat16)
    qe, ke = fused_rope(q, k, cos, sin, interleaved=interleaved)
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    qr, kr = rope_reference(q64, k64, cos.double(), sin.double(), interleaved)
    atol, rtol = TOL[torch.bfloat16]
    torch.testing.assert_close(qe.double(), qr, atol=atol, rtol=rtol)
    torch.testing.assert_close(ke.double(), kr, atol=atol, rtol=rtol)
    dq, dk = torch.randn_like(qe), torch.randn_like(ke)
    got = torch.autograd.grad((qe, ke), (q, k), (dq, dk))
    want = torch.autograd.grad((qr, kr), (q64, k64), (dq.double(), dk.double()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, atol=atol, rtol=rtol)


def test_float32_cos_with_bf16_q(device):
    """Under autocast HF's rotary embedding may return float32 cos / sin for bf16 q and k: ``q * cos`` promotes, so
    the result is float32 (HF's values), the gradients bf16."""
    q, k = _qk(1, 2, 1, 5, 16, device, dtype=torch.bfloat16)
    cos, sin = _cos_sin(1, 5, 16, device)
    qe, ke = fused_rope(q, k, cos, sin)
    hq, hk = _hf("llama")(q.detach(), k.detach(), cos, sin)
    assert qe.dtype == ke.dtype == hq.dtype == torch.float32
    torch.testing.assert_close(qe, hq, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ke, hk, atol=1e-6, rtol=1e-6)
    gq, gk = torch.autograd.grad((qe, ke), (q, k), (torch.ones_like(qe), torch.ones_like(ke)))
    assert gq.dtype == gk.dtype == torch.bfloat16


def test_inplace_without_grad_and_one_output_used(device):
    q, k = _qk(1, 2, 2, 4, 16, device)
    cos, sin = _cos_sin(1, 4, 8, device)
    want = rope_reference(q.detach(), k.detach(), cos, sin)
    qd, kd = q.detach().clone(), k.detach().clone()
    with torch.no_grad():
        qe, ke = fused_rope(qd, kd, cos, sin, inplace=True)
    assert qe.data_ptr() == qd.data_ptr() and ke.data_ptr() == kd.data_ptr()
    torch.testing.assert_close(qd, want[0])
    torch.testing.assert_close(kd, want[1])
    qe, ke = fused_rope(q, k, cos, sin, inplace=True)  # needs a gradient: out of place
    assert qe.data_ptr() != q.data_ptr()
    qe.sum().backward()  # k's output unused: its gradient is zero
    assert torch.count_nonzero(k.grad) == 0 and q.grad is not None


def test_cos_with_grad_runs_the_reference(device):
    q, k = _qk(1, 1, 1, 3, 8, device)
    cos, sin = (t.requires_grad_() for t in _cos_sin(1, 3, 8, device))
    qe, ke = fused_rope(q, k, cos, sin)
    (qe.sum() + ke.sum()).backward()
    assert cos.grad is not None and sin.grad is not None


def test_errors(device):
    q, k = _qk(1, 2, 2, 4, 16, device)
    cos, sin = _cos_sin(1, 4, 16, device)
    with pytest.raises(ValueError, match="'unsqueeze_dim'"):
        fused_rope(q, k, cos, sin, unsqueeze_dim=3)
    with pytest.raises(ValueError, match="must be 4-D") as e:
        fused_rope(q[0], k[0], cos, sin)
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(ValueError, match="'cos' and 'sin'"):
        fused_rope(q, k, cos[:, :3], sin[:, :3])
    with pytest.raises(ValueError, match="even"):
        fused_rope(q, k, cos[..., :5], sin[..., :5])
    with pytest.raises(ValueError, match="even"):
        fused_rope(q, k, torch.ones(1, 4, 18, device=device), torch.ones(1, 4, 18, device=device))
    with pytest.raises(TypeError, match="same dtype"):
        fused_rope(q, k.half(), cos, sin)
    with pytest.raises(TypeError, match="'sin' must be a torch.Tensor"):
        fused_rope(q, k, cos, None)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True])
def test_llama8b_heads_bf16(interleaved):
    """Llama 3 8B: 32 query heads, 8 key heads of 128, 4 x 2,048 positions, bf16, against float64; and HF's own
    function on the same inputs."""
    q, k = _qk(4, 32, 8, 2048, 128, "cuda", dtype=torch.bfloat16)
    cos, sin = _cos_sin(4, 2048, 128, "cuda", dtype=torch.bfloat16, base=500000.0)
    qe, ke = fused_rope(q, k, cos, sin, interleaved=interleaved)
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    qr, kr = rope_reference(q64, k64, cos.double(), sin.double(), interleaved)
    atol, rtol = TOL[torch.bfloat16]
    torch.testing.assert_close(qe.double(), qr, atol=atol, rtol=rtol)
    torch.testing.assert_close(ke.double(), kr, atol=atol, rtol=rtol)
    dq, dk = torch.randn_like(qe), torch.randn_like(ke)
    got = torch.autograd.grad((qe, ke), (q, k), (dq, dk))
    want = torch.autograd.grad((qr, kr), (q64, k64), (dq.double(), dk.double()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, atol=atol, rtol=rtol)
    if not interleaved:
        hq, hk = _hf("llama")(q.detach(), k.detach(), cos, sin)
        torch.testing.assert_close(qe, hq, atol=atol, rtol=rtol)
        torch.testing.assert_close(ke, hk, atol=atol, rtol=rtol)


def test_opcheck(device):
    """The registered ops' schema, fake kernel and autograd registration (what torch.compile relies on)."""
    q, k = _qk(1, 2, 1, 3, 8, device)
    cos, sin = _cos_sin(1, 3, 8, device)
    torch.library.opcheck(torch.ops.fused_layers.rope_fwd.default, (q, k, cos, sin, False, 1))
    torch.library.opcheck(torch.ops.fused_layers.rope_bwd.default,
                          (torch.randn_like(q), torch.randn_like(k), cos, sin, True, 1))


@pytest.mark.slow
def test_decoder_ops_compile_fullgraph(device):
    """RoPE, residual + norm and the gated activation through torch.compile(fullgraph=True) (the registered ops, their
    autograd, two differentiable outputs each for the first two): the eager results and gradients."""
    from fused_layers import fused_add_rms_norm, fused_swiglu

    def f(x, r, w, q, k, cos, sin, g, u):
        h, y = fused_add_rms_norm(x, r, w, 1e-6, cast_before_weight=True)
        q2, k2 = fused_rope(q, k, cos, sin)
        return h.sum() + y.square().sum() + q2.square().sum() + k2.sum() + fused_swiglu(g, u).square().sum()

    leaves = [torch.randn(4, 16, device=device), torch.randn(4, 16, device=device), torch.randn(16, device=device),
              *_qk(1, 2, 1, 3, 8, device)]
    leaves = [t.detach().requires_grad_() for t in leaves]
    g, u = (torch.randn(4, 8, device=device, requires_grad=True) for _ in range(2))
    cos, sin = _cos_sin(1, 3, 8, device)
    args = (*leaves, cos, sin, g, u)
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")(*args)
    grads = torch.autograd.grad(out, [*leaves, g, u])
    ref = f(*args)
    want = torch.autograd.grad(ref, [*leaves, g, u])
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-5)
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_empty_sequence(device):
    q, k = _qk(1, 2, 1, 0, 8, device)
    cos, sin = _cos_sin(1, 0, 8, device)
    qe, ke = fused_rope(q, k, cos, sin)
    (qe.sum() + ke.sum()).backward()
    assert qe.shape == q.shape and q.grad.shape == q.shape
