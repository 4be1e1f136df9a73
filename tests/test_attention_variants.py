"""Opt-in Hopper variants of the attention kernels (issue 13): TMA descriptors, warp specialization,
persistent forward, dQ by atomics in the dK/dV pass.

Every variant against the float64 reference (outputs and all gradients) on ragged shapes, and that the
variant kernel is the one launched (or, where it cannot serve a call, that the default one is).  Under
the interpreter ``tl.make_tensor_descriptor`` loads / stores are emulated (out-of-bounds zero fill and
clipping included) and ``warp_specialize`` is ignored (the single masked key loop it uses still runs);
what only a GPU shows (TMA hardware, warp-specialized schedules, speed) is for ``bench_attention.py
--variants``.
"""

import pytest
import torch

from fused_layers import fused_attention, fused_attention_varlen
from fused_layers.ops import _library
from fused_layers.ops import attention as A
from fused_layers.ops.attention import attention_reference, attention_varlen_reference, config_override

F32_TOL = dict(atol=2e-5, rtol=2e-5)

# Warp specialization takes effect on Hopper with 4 warps only (the interpreter ignores both).
VARIANTS = {
    "tma": dict(fwd_tma=1),
    "ws": dict(fwd_ws=1, fwd_num_warps=4),
    "persistent": dict(fwd_persistent=1),
    "tma_ws_persistent": dict(fwd_tma=1, fwd_ws=1, fwd_persistent=2, fwd_num_warps=4),
    "dq_atomic": dict(bwd_dq_atomic=1),
    "bwd_tma": dict(bwd_tma=1),
    "bwd_tma_dq_atomic": dict(bwd_tma=1, bwd_dq_atomic=1),
}


@pytest.fixture
def launched(monkeypatch):
    """The Triton functions launched (successfully) through Kernel during the test.  On a GPU a variant
    whose first launch fails falls back to the default kernels with a warning: that fails the test too."""
    fns = []
    orig = _library.Kernel.__call__
    n_failures = len(A._VARIANT_FAILURES)

    def spy(self, *args):
        out = orig(self, *args)
        fns.append(self.fn)
        return out

    monkeypatch.setattr(_library.Kernel, "__call__", spy)
    yield fns
    assert A._VARIANT_FAILURES[n_failures:] == [], "a variant failed to launch and fell back"


def _expected_kernels(ov, varlen=False, dtype=torch.float32):
    ws = ov.get("fwd_ws") and (dtype != torch.float32 or A.INTERPRET)  # a GPU refuses fp32 warp specialization
    fwd = A._attn_fwd_kernel_v if (ov.get("fwd_tma") or ws or (ov.get("fwd_persistent") and not varlen)) else A._attn_fwd_kernel
    bwd = A._attn_bwd_dkdv_dq_kernel if ov.get("bwd_dq_atomic") or ov.get("bwd_tma") else A._attn_bwd_dq_kernel
    return fwd, bwd


def _check(q, k, v, ov, mask=None, causal=False, gqa=False):
    do = torch.randn(q.shape[:-1] + (v.shape[-1],), device=q.device, dtype=q.dtype)
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    with config_override("attention", **ov):
        out = fused_attention(qa, ka, va, mask, is_causal=causal, enable_gqa=gqa)
        got = (out, *torch.autograd.grad(out, (qa, ka, va), do))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    m64 = mask.double() if mask is not None and mask.dtype != torch.bool else mask
    ref_out = attention_reference(q64, k64, v64, m64, causal, None, gqa)
    ref = (ref_out, *torch.autograd.grad(ref_out, (q64, k64, v64), do.double()))
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        torch.testing.assert_close(g.double(), r, **F32_TOL, msg=lambda m: f"{name}: {m}")
    return got


# (B, Hq, Hkv, Sq, Sk, D, causal): one query row, GQA with Sq < Sk and D = 80 (padded to 128), MQA with
# Sq > Sk (the last rows see every key), a one-tile head dim.
SHAPES = [
    (1, 2, 2, 1, 37, 16, True),
    (1, 4, 2, 37, 130, 80, True),
    (1, 2, 1, 130, 37, 64, False),
]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,causal", SHAPES)
def test_variant_matches_reference(variant, B, Hq, Hkv, Sq, Sk, D, causal, device, launched):
    ov = VARIANTS[variant]
    q = torch.randn(B, Hq, Sq, D, device=device)
    k = torch.randn(B, Hkv, Sk, D, device=device)
    v = torch.randn(B, Hkv, Sk, D, device=device)
    _check(q, k, v, ov, causal=causal, gqa=Hq != Hkv)
    fwd, bwd = _expected_kernels(ov)
    assert fwd in launched and bwd in launched
    if ov.get("bwd_dq_atomic"):
        assert A._attn_bwd_dq_kernel not in launched and A._attn_bwd_dkdv_kernel not in launched


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_bf16(variant, device, launched):
    """bf16 (on a GPU the variants' real tensor-core and warp-specialized paths; the interpreter runs
    float32 copies): relative error of out and every gradient against float64."""
    q = torch.randn(1, 4, 37, 80, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 130, 80, device=device, dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    with config_override("attention", **VARIANTS[variant]):
        out = fused_attention(qa, ka, va, is_causal=True, enable_gqa=True)
        got = (out, *torch.autograd.grad(out, (qa, ka, va), do))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out = attention_reference(q64, k64, v64, None, True, None, True)
    ref = (ref_out, *torch.autograd.grad(ref_out, (q64, k64, v64), do.double()))
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert g.dtype == torch.bfloat16, name
        rel = ((g.double() - r).norm() / r.norm()).item()
        assert rel < 2e-2, f"{name}: relative error {rel:.2e}"
    fwd, bwd = _expected_kernels(VARIANTS[variant], dtype=torch.bfloat16)
    assert fwd in launched and bwd in launched


@pytest.mark.parametrize("variant", ["tma_ws_persistent", "bwd_tma_dq_atomic"])
def test_variant_key_padding_bias_and_empty_rows(variant, device, launched):
    """Key-padding mask fused as a bias (a batch with every key masked: 0 outputs, 0 gradients)."""
    B, H, Sq, Sk, D = 3, 2, 19, 25, 16
    q, k, v = (torch.randn(B, H, s, D, device=device) for s in (Sq, Sk, Sk))
    keep = torch.ones(B, 1, 1, Sk, dtype=torch.bool, device=device)
    keep[0, ..., 7:] = False
    keep[1] = False
    keep[2, ..., ::3] = False
    out, dq, dk, dv = _check(q, k, v, VARIANTS[variant], mask=keep, causal=True)
    assert torch.all(out[1] == 0) and torch.all(dq[1] == 0) and torch.all(dk[1] == 0)
    assert _expected_kernels(VARIANTS[variant])[0] in launched


@pytest.mark.parametrize("variant", ["tma_ws_persistent", "bwd_tma_dq_atomic"])
def test_variant_dropout_matches_default_kernels(variant, device):
    """Same seed, same Philox mask: a variant gives the default kernels' outputs and gradients."""
    q, k, v = (torch.randn(1, 2, s, 32, device=device) for s in (29, 41, 41))
    do = torch.randn_like(q)
    res = []
    for ov in ({}, VARIANTS[variant]):
        qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
        torch.manual_seed(7)
        with config_override("attention", **ov):
            out = fused_attention(qa, ka, va, dropout_p=0.3, is_causal=True)
            res.append((out, *torch.autograd.grad(out, (qa, ka, va), do)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *res):
        torch.testing.assert_close(b, a, **F32_TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("variant", ["tma_ws_persistent", "dq_atomic", "bwd_tma"])
def test_variant_varlen(variant, device, launched):
    """Packed sequences (one empty, one of length 1): TMA and atomics serve varlen; the persistent grid
    does not (the forward then runs the one-tile-per-program grid of the variant kernel)."""
    lens_q, lens_k = [5, 17, 1, 0, 23], [9, 17, 4, 0, 30]
    cu_q = torch.tensor([0] + lens_q, device=device).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, device=device).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu_q[-1]), 4, 32, device=device)
    k, v = (torch.randn(int(cu_k[-1]), 2, 32, device=device) for _ in range(2))
    do = torch.randn_like(q)
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    with config_override("attention", **VARIANTS[variant]):
        out = fused_attention_varlen(qa, ka, va, cu_q, cu_k, max(lens_q), max(lens_k), True)
        got = (out, *torch.autograd.grad(out, (qa, ka, va), do))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out = attention_varlen_reference(q64, k64, v64, cu_q, cu_k, True)
    ref = (ref_out, *torch.autograd.grad(ref_out, (q64, k64, v64), do.double()))
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(g.double(), r, **F32_TOL, msg=lambda m: f"{name}: {m}")
    fwd, bwd = _expected_kernels(VARIANTS[variant], varlen=True)
    assert fwd in launched and bwd in launched


def test_persistent_alone_refuses_varlen(device, launched):
    cu = torch.tensor([0, 3, 20], device=device, dtype=torch.int32)
    q, k, v = (torch.randn(20, 2, 16, device=device) for _ in range(3))
    with config_override("attention", fwd_persistent=1):
        out = fused_attention_varlen(q, k, v, cu, cu, 17, 17, True)
    torch.testing.assert_close(out.double(), attention_varlen_reference(q.double(), k.double(), v.double(), cu, cu, True),
                               **F32_TOL)
    assert A._attn_fwd_kernel in launched and A._attn_fwd_kernel_v not in launched


@pytest.mark.parametrize("variant", ["tma", "ws", "bwd_tma"])
@pytest.mark.parametrize("layout", ["head_dim_major", "misaligned"])
def test_tma_falls_back_where_descriptors_cannot_serve(variant, layout, device, launched):
    """A head dim that is not innermost, or data not 16-byte aligned: the default kernels run (warp
    specialization needs the descriptors too)."""
    if layout == "head_dim_major":
        q, k, v = (torch.randn(1, 2, 16, s, device=device).transpose(-1, -2) for s in (19, 23, 23))
    else:
        q, k, v = (torch.randn(1 * 2 * s * 16 + 1, device=device)[1:].view(1, 2, s, 16) for s in (19, 23, 23))
        assert q.data_ptr() % 16
    _check(q, k, v, VARIANTS[variant], causal=True)
    assert A._attn_fwd_kernel in launched and A._attn_fwd_kernel_v not in launched
    assert A._attn_bwd_dkdv_kernel in launched and A._attn_bwd_dkdv_dq_kernel not in launched


def test_variants_off_by_default():
    assert not any(A._VARIANTS.values())
    from fused_layers.ops.attention_config import _variant

    assert all(_variant(n) == 0 for n in A._VARIANTS)


def test_variant_that_fails_to_launch_falls_back(monkeypatch):
    """On a GPU a variant whose first launch fails (a compile error of the installed Triton) is disabled
    for its plan with a warning and the default kernels run; under the interpreter failures propagate."""

    class Boom:
        fn = A._attn_fwd_kernel_v
        meta = {"USE_TMA": True, "BLOCK_M": 16}

        def __call__(self, *args):
            raise RuntimeError("PassManager::run failed")

    class Plan:
        variant = Boom()
        variant_ok = False

    plan = Plan()
    with pytest.raises(RuntimeError):
        A._launch_variant(plan, "variant", ())
    monkeypatch.setattr(A, "INTERPRET", False)
    n = len(A._VARIANT_FAILURES)
    with pytest.warns(UserWarning, match="opt-in variant failed"):
        assert A._launch_variant(plan, "variant", ()) is False
    assert plan.variant is None and len(A._VARIANT_FAILURES) == n + 1
