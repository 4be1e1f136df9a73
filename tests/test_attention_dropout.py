"""Attention dropout inside the Triton kernels: forward and backward against a float64 reference that
applies the SAME keep mask (materialized by ``attention_dropout_mask``, a debug helper running the kernels'
own Philox draw), the mask's statistics, reproducibility under ``torch.manual_seed``, SDPA's signature.

CPU: Triton interpreter (16 x 16 tiles, so small shapes still span several tiles); ``gpu`` variants on CUDA.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fused_layers import fused_attention
from fused_layers.ops.attention import attention_dropout_mask, draw_dropout_seed

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _dev(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device(device)


def _reference(q, k, v, keep, p, causal=False, key_keep=None, scale=None):
    """float64: softmax(q k^T * scale [+ masks]) * keep / (1 - p) @ v, GQA by repeating k / v heads."""
    q, k, v = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * sc
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    if key_keep is not None:
        s = s.masked_fill(~key_keep, float("-inf"))
    prob = s.softmax(-1).nan_to_num(0.0)
    return (prob * keep / (1 - p)) @ v


CASES = [  # (B, Hq, Hkv, Sq, Sk, D, causal, key padding)
    (2, 2, 2, 37, 37, 16, False, False),
    (1, 4, 2, 33, 33, 24, True, False),  # GQA, head dim not a power of two, causal
    (2, 2, 1, 19, 41, 16, False, True),  # MQA, Sq != Sk, key-padding mask
    (1, 2, 2, 40, 23, 32, True, True),
]


def _case_id(c):
    return "B{}H{}/{}S{}x{}D{}{}{}".format(*c[:6], "c" if c[6] else "", "m" if c[7] else "")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_dropout_matches_reference_with_same_mask(case, dtype, device):
    dev = _dev(device)
    B, Hq, Hkv, Sq, Sk, D, causal, padded = case
    p = 0.1  # not a multiple of 1/256: the kept values are scaled by 1 / (1 - p rounded to the mask's steps)
    p_eff = round(p * 256) / 256
    q = torch.randn(B, Hq, Sq, D, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dtype, requires_grad=True)
    mask = None
    if padded:
        mask = torch.rand(B, 1, 1, Sk, device=dev) > 0.3
        mask[..., 0] = True
    torch.manual_seed(1234)
    out = fused_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, enable_gqa=Hq != Hkv)
    torch.manual_seed(1234)
    keep = attention_dropout_mask(draw_dropout_seed(dev), B, Hq, Sq, Sk, p)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _reference(qr, kr, vr, keep, p_eff, causal, mask)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    refs = torch.autograd.grad(ref, (qr, kr, vr), g.double())
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    for name, a, b in zip("qkv", grads, refs):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.double(), b, atol=tol * scale * 2, rtol=tol * 2, msg=f"d{name}")


def test_mask_statistics():
    """The keep mask keeps 1 - p (p in steps of 1/256) with no structure along rows, columns or heads; another seed
    gives another mask."""
    p = 0.2
    seed = torch.tensor([123456789], dtype=torch.int64)
    keep = attention_dropout_mask(seed, 2, 4, 64, 64, p)
    n = keep.numel()
    frac = keep.float().mean().item()
    p_eff = round(p * 256) / 256
    assert abs(frac - (1 - p_eff)) < 5 * math.sqrt(p * (1 - p) / n)
    for d in (2, 3):  # each slice keeps about 1 - p
        fr = keep.float().mean(dim=d)
        assert (fr - (1 - p)).abs().max() < 0.25
    heads = keep.flatten(2)
    assert all(not torch.equal(heads[0, 0], heads[b, h]) for b in range(2) for h in range(4) if (b, h) != (0, 0))
    other = attention_dropout_mask(torch.tensor([123456790], dtype=torch.int64), 2, 4, 64, 64, p)
    assert 0.2 < (keep != other).float().mean().item() < 0.45  # a new seed, a new mask (2 p (1 - p) = 0.32)
    assert attention_dropout_mask(seed, 1, 1, 8, 8, 0.0).all()


def test_reproducible_under_manual_seed():
    q, k, v = (torch.randn(1, 2, 20, 16, requires_grad=True) for _ in range(3))
    torch.manual_seed(7)
    a = fused_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(7)
    b = fused_attention(q, k, v, dropout_p=0.5)
    c = fused_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)
    ga = torch.autograd.grad(a.square().sum(), (q, k, v))
    gb = torch.autograd.grad(b.square().sum(), (q, k, v))
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))


def test_p_zero_one_and_bad_values():
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    assert torch.equal(fused_attention(q, k, v, dropout_p=0.0), fused_attention(q, k, v))
    assert not fused_attention(q, k, v, dropout_p=1.0).any()  # SDPA: everything dropped
    with pytest.raises(ValueError, match="dropout_p"):
        fused_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match="dropout_p"):
        fused_attention(q, k, v, dropout_p=-0.1)
    with pytest.raises(TypeError, match="dropout_p"):
        fused_attention(q, k, v, dropout_p=True)


def test_sdpa_positional_signature():
    q, k, v = (torch.randn(2, 2, 11, 16) for _ in range(3))
    # (query, key, value, attn_mask, dropout_p, is_causal, *, scale, enable_gqa), as F.scaled_dot_product_attention
    torch.testing.assert_close(fused_attention(q, k, v, None, 0.0, True, scale=0.3),
                               F.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.3),
                               atol=2e-5, rtol=2e-5)
    with pytest.raises(TypeError):
        fused_attention(q, k, v, None, 0.0, True, 0.3)  # scale is keyword-only, as in SDPA


def test_multihead_attention_dropout_in_training_runs_fused(recwarn):
    from fused_layers import swap_modules

    mha = nn.MultiheadAttention(32, 4, dropout=0.3, batch_first=True)
    swap_modules(mha)
    x = torch.randn(2, 9, 32)
    mha.train()
    y, _ = mha(x, x, x, need_weights=False)
    assert not [w for w in recwarn if "FusedMultiheadAttention" in str(w.message)]
    mha.eval()
    torch.testing.assert_close(mha(x, x, x, need_weights=False)[0],
                               nn.MultiheadAttention.forward(mha, x, x, x, need_weights=False)[0], atol=2e-5, rtol=2e-5)
    assert not torch.allclose(y, mha(x, x, x, need_weights=False)[0])  # training dropped something


@pytest.mark.gpu
def test_dropout_under_torch_compile_draws_a_new_mask_each_call():
    dev = _dev("cuda")
    q, k, v = (torch.randn(2, 4, 256, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    fn = torch.compile(lambda a, b, c: fused_attention(a, b, c, dropout_p=0.1, is_causal=True), fullgraph=True)
    torch.manual_seed(3)
    a = fn(q, k, v)
    b = fn(q, k, v)
    assert not torch.equal(a, b)  # the seed is drawn inside the graph, not baked in
    torch.manual_seed(3)
    assert torch.equal(fn(q, k, v), a)
    a.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_dropout_p_that_rounds_to_one_drops_everything_without_nan():
    """p = 0.999 rounds to 256/256: every probability is dropped; the output and gradients are 0 (F.dropout with
    p = 1), not NaN from a 1 / (1 - 1) scale."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(1, 2, 20, 16, requires_grad=True, device=dev) for _ in range(3))
    out = fused_attention(q, k, v, dropout_p=0.999)
    out.sum().backward()
    assert torch.equal(out, torch.zeros_like(out))
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all() and t.grad.abs().max() == 0
