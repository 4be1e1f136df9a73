"""Issue 13's Gluon forward candidate (fused_layers/ops/attention_gluon.py): opt-in, GPU only (Gluon has no
interpreter).  On the CPU: what it refuses and how it says so.  On an sm_90 GPU: O and the base-2 LSE against a float32
reference on ragged block counts (one key block, several, causal diagonals), and the Triton backward fed its O / LSE
against float32 gradients (the two forwards are interchangeable)."""

import math

import pytest
import torch
import torch.nn.functional as F

from fused_layers.ops import attention as A
from fused_layers.ops import attention_gluon as AG


def test_refuses_what_it_does_not_take():
    """``supported`` names why (CPU tensors here; on an sm_90 GPU the shape rules below), and the launcher raises
    ValueError with that reason instead of a Triton trace."""
    q = torch.randn(1, 2, 128, 64)
    why = AG.supported(q, q, q, False)
    assert why is not None
    with pytest.raises(ValueError, match="attention_forward_gluon"):
        AG.attention_forward_gluon(q, q, q, False)


def _spy(monkeypatch, name):
    """A list that gets a 1 each time attention_gluon.<name> runs."""
    calls, orig = [], getattr(AG, name)
    monkeypatch.setattr(AG, name, lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    return calls


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and AG.HAS_GLUON


@pytest.mark.gpu
def test_gpu_refusals():
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    assert AG.supported(q, q, q, True) is None
    assert "multiple" in AG.supported(q[:, :, :200], q[:, :, :200], q[:, :, :200], True)
    q96 = torch.randn(1, 2, 256, 96, device="cuda", dtype=torch.bfloat16)
    assert "head dim" in AG.supported(q96, q96, q96, False)
    assert "dtype" in AG.supported(q.float(), q.float(), q.float(), False)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, D) memory
    assert "contiguous" in AG.supported(qt, qt, qt, False)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (128, True), (384, True), (640, False), (1024, True)])
def test_gpu_forward_and_triton_backward(D, S, causal):
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    B, H = 2, 3
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = AG.attention_forward_gluon(q, k, v, causal)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    s = qf.detach() @ kf.detach().transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1) / math.log(2.0), atol=1e-3, rtol=1e-4)
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    torch.testing.assert_close(out.float(), ref.detach(), atol=2e-2, rtol=2e-2)
    do = torch.randn_like(q)
    ref.backward(do.float())
    grads = A.attention_backward(do, q, k, v, out, lse, None, None, None, S, S, causal, 1.0 / math.sqrt(D))
    for g, t in zip(grads, (qf, kf, vf)):
        torch.testing.assert_close(g.float(), t.grad, atol=5e-2 * max(1.0, t.grad.abs().max().item()), rtol=5e-2)


def test_variants_off_the_gpu_run_the_triton_kernels(device):
    """fwd_gluon=1 and bwd_gluon_dkdv=1 where the Gluon kernels cannot run (here: the interpreter / no sm_90) leave
    every call on the Triton kernels, with the same results."""
    from fused_layers import fused_attention

    q, k, v = (torch.randn(1, 2, 37, 16, device=device, requires_grad=True) for _ in range(3))
    ref = fused_attention(q, k, v, is_causal=True)
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    with A.config_override("attention", fwd_gluon=1, bwd_gluon_dkdv=1):
        got = fused_attention(q, k, v, is_causal=True)
        grads = torch.autograd.grad(got.sum(), (q, k, v))
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("D,S,causal", [(64, 256, True), (128, 640, False), (128, 1024, True)])
def test_gpu_variant_through_fused_attention(D, S, causal, monkeypatch):
    """fwd_gluon=1 through the public API: the Gluon forward runs (spied), the Triton backward uses its LSE, and
    output and gradients match float32; a call it does not take (GQA) stays on the Triton forward."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    calls = _spy(monkeypatch, "attention_forward_gluon")
    q, k, v = (torch.randn(2, 4, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with A.config_override("attention", fwd_gluon=1):
        out = fused_attention(q, k, v, is_causal=causal)
        do = torch.randn_like(out)
        out.backward(do)
        assert calls == [1]
        kv = torch.randn(2, 2, S, D, device="cuda", dtype=torch.bfloat16)
        fused_attention(q.detach(), kv, kv, is_causal=causal, enable_gqa=True)
        assert calls == [1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    ref.backward(do.float())
    torch.testing.assert_close(out.float(), ref.detach(), atol=2e-2, rtol=2e-2)
    for t, r in ((q, qf), (k, kf), (v, vf)):
        torch.testing.assert_close(t.grad.float(), r.grad, atol=5e-2 * max(1.0, r.grad.abs().max().item()), rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("per_sm", [1, 2])
def test_gpu_persistent_grid(D, causal, per_sm):
    """The persistent grid (candidate): per_sm programs an SM walk the query blocks heaviest first, several blocks a
    program (B4 H8 S1024: 512 to 256 blocks against 132-264 programs), the K / V ring's slots and mbarrier phases
    carried across blocks; the same O and LSE as one program a block."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    q, k, v = (torch.randn(4, 8, 1024, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = AG.attention_forward_gluon(q, k, v, causal, per_sm=per_sm)
    ref_out, ref_lse = AG.attention_forward_gluon(q, k, v, causal, per_sm=0)
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=0, rtol=0)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (128, True), (256, True), (768, False), (1024, True)])
def test_gpu_warp_specialized_ping_pong(D, S, causal):
    """Candidate 2 (two consumer warpgroups taking turns at the tensor cores, a producer warp; mbarrier ring with
    ready / empty barriers): O and LSE against the one-warpgroup forward (same math, so close to it) and float32."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    if S % 128:
        pytest.skip("128-row query tiles")
    q, k, v = (torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = AG.attention_forward_gluon_ws(q, k, v, causal)
    ref_out, ref_lse = AG.attention_forward_gluon(q, k, v, causal)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (128, True), (384, True), (640, False), (1024, True)])
def test_gpu_dkdv_kernel(D, S, causal, monkeypatch):
    """The Gluon dK / dV candidate (bwd_gluon_dkdv) through fused_attention: it runs (spied), the Triton dQ kernel
    after it; every gradient against float32 and against the default Triton backward."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    calls = _spy(monkeypatch, "attention_dkdv_gluon")
    q, k, v = (torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16)
    ref_grads = torch.autograd.grad(fused_attention(q, k, v, is_causal=causal), (q, k, v), do)
    with A.config_override("attention", bwd_gluon_dkdv=1):
        grads = torch.autograd.grad(fused_attention(q, k, v, is_causal=causal), (q, k, v), do)
    assert calls == [1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    f32 = torch.autograd.grad(F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal), (qf, kf, vf), do.float())
    for g, r, t in zip(grads, ref_grads, f32):
        tol = 5e-2 * max(1.0, t.abs().max().item())
        torch.testing.assert_close(g.float(), t, atol=tol, rtol=5e-2)
        torch.testing.assert_close(g.float(), r.float(), atol=tol, rtol=5e-2)
