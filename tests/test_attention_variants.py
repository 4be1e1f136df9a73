"""The attention kernels' shape-dependent code paths: the dK/dV kernel's TMA loads (``USE_TMA``: its Q and dO tiles
through tensor descriptors, then the usual dQ kernel) and the forward's scale folded into exp2 (no key bias) against
the scaled scores (with one).

The TMA path runs by default only for dense bf16 with Sk >= 4096 on a GPU (``attention._use_bwd_tma``); the tests
turn its rule on by monkeypatching it, so that the interpreter runs the same kernel (``tl.make_tensor_descriptor``
loads are emulated, out-of-bounds zero fill included) on ragged shapes, GQA, varlen, a key-padding bias, dropout,
float32 and bf16, against the float64 reference, checking which kernel launched.
"""

import pytest
import torch
from test_attention import F32_TOL, _assert_matches_reference

from fused_layers import fused_attention, fused_attention_varlen
from fused_layers.ops import _library
from fused_layers.ops import attention as A
from fused_layers.ops.attention import attention_reference, attention_varlen_reference, config_override

TMA_LAUNCH = "_attn_bwd_dkdv_kernel(USE_TMA=True)"  # how `launched` records the TMA launch


def _rule_on(dtype, max_seqlen_k, causal, block_d, varlen):
    """_use_bwd_tma with every condition met but the kernel's own (descriptors need unit head-dim strides)."""
    return A.HAS_TMA_DESCRIPTORS


@pytest.fixture
def tma(monkeypatch):
    """The TMA dK/dV kernel for every backward planned in the test (a fresh plan epoch)."""
    monkeypatch.setattr(A, "_use_bwd_tma", _rule_on)
    with config_override("attention"):  # a new override epoch: fresh plans
        yield


@pytest.fixture
def launched(monkeypatch):
    """The Triton functions launched (successfully) through Kernel during the test."""
    fns = []
    orig = _library.Kernel.__call__

    def spy(self, *args):
        out = orig(self, *args)
        fns.append(TMA_LAUNCH if self.meta.get("USE_TMA") else self.fn)
        return out

    monkeypatch.setattr(_library.Kernel, "__call__", spy)
    return fns


def _assert_tma_ran(launched):
    assert TMA_LAUNCH in launched and A._attn_bwd_dq_kernel in launched
    assert A._attn_bwd_dkdv_kernel not in launched


def _check_bf16(q, k, v, causal=False, gqa=False):
    """bf16 inputs: relative error (Frobenius) of out and every gradient against float64 below 2e-2 (bf16 rounds each
    element to 8 bits: elementwise float32 tolerances do not apply)."""
    do = torch.randn(q.shape[:-1] + (v.shape[-1],), device=q.device, dtype=q.dtype)
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    out = fused_attention(qa, ka, va, is_causal=causal, enable_gqa=gqa)
    got = (out, *torch.autograd.grad(out, (qa, ka, va), do))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out = attention_reference(q64, k64, v64, None, causal, None, gqa)
    ref = (ref_out, *torch.autograd.grad(ref_out, (q64, k64, v64), do.double()))
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert g.dtype == torch.bfloat16, name
        rel = ((g.double() - r).norm() / r.norm()).item()
        assert rel < 2e-2, f"{name}: relative error {rel:.2e}"


def _dropout_results(q, k, v, do):
    """One causal dropout call (seed 7: the same Philox mask every time): the output and every gradient."""
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    torch.manual_seed(7)
    out = fused_attention(qa, ka, va, dropout_p=0.3, is_causal=True)
    return (out, *torch.autograd.grad(out, (qa, ka, va), do))


# (B, Hq, Hkv, Sq, Sk, D, causal): one query row, GQA with Sq < Sk and D = 80 (padded to 128), MQA with
# Sq > Sk (the last rows see every key), a one-tile head dim.  float32 (ieee dots).
SHAPES = [
    (1, 2, 2, 1, 37, 16, True),
    (1, 4, 2, 37, 130, 80, True),
    (1, 2, 1, 130, 37, 64, False),
]


def _check_shape(shape, device, q_scale=1.0):
    """Outputs and gradients of fresh float32 q (times ``q_scale``), k, v of one SHAPES entry against float64."""
    B, Hq, Hkv, Sq, Sk, D, causal = shape
    q = torch.randn(B, Hq, Sq, D, device=device) * q_scale
    k = torch.randn(B, Hkv, Sk, D, device=device)
    v = torch.randn(B, Hkv, Sk, D, device=device)
    _assert_matches_reference(q, k, v, causal=causal, gqa=Hq != Hkv)


@pytest.mark.parametrize("shape", SHAPES)
def test_bwd_tma_matches_reference(shape, device, tma, launched):
    _check_shape(shape, device)
    _assert_tma_ran(launched)


def test_bwd_tma_bf16(device, tma, launched):
    """bf16 (on a GPU the real TMA + tensor-core path; the interpreter runs float32 copies)."""
    q = torch.randn(1, 4, 37, 80, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 130, 80, device=device, dtype=torch.bfloat16) for _ in range(2))
    _check_bf16(q, k, v, causal=True, gqa=True)
    _assert_tma_ran(launched)


def test_bwd_tma_key_padding_bias_and_empty_rows(device, tma, launched):
    """Key-padding mask fused as a bias (a batch with every key masked: 0 outputs, 0 gradients)."""
    B, H, Sq, Sk, D = 3, 2, 19, 25, 16
    q, k, v = (torch.randn(B, H, s, D, device=device) for s in (Sq, Sk, Sk))
    keep = torch.ones(B, 1, 1, Sk, dtype=torch.bool, device=device)
    keep[0, ..., 7:] = False
    keep[1] = False
    keep[2, ..., ::3] = False
    out, dq, dk, dv = _assert_matches_reference(q, k, v, mask=keep, causal=True)
    assert torch.all(out[1] == 0) and torch.all(dq[1] == 0) and torch.all(dk[1] == 0)
    _assert_tma_ran(launched)


def test_bwd_tma_dropout_matches_pointer_loads(device, monkeypatch, launched):
    """Same seed, same Philox mask: the TMA kernel gives the pointer-load kernel's gradients."""
    q, k, v = (torch.randn(1, 2, s, 32, device=device) for s in (29, 41, 41))
    do = torch.randn_like(q)
    with config_override("attention"):
        ref = _dropout_results(q, k, v, do)
    assert A._attn_bwd_dkdv_kernel in launched and TMA_LAUNCH not in launched
    monkeypatch.setattr(A, "_use_bwd_tma", _rule_on)
    with config_override("attention"):
        got = _dropout_results(q, k, v, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ref, got):
        torch.testing.assert_close(b, a, **F32_TOL, msg=lambda m: f"{name}: {m}")
    assert TMA_LAUNCH in launched


def test_bwd_tma_varlen(device, tma, launched):
    """Packed sequences (one empty, one of length 1), GQA, causal."""
    lens_q, lens_k = [5, 17, 1, 0, 23], [9, 17, 4, 0, 30]
    cu_q = torch.tensor([0] + lens_q, device=device).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, device=device).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu_q[-1]), 4, 32, device=device)
    k, v = (torch.randn(int(cu_k[-1]), 2, 32, device=device) for _ in range(2))
    do = torch.randn_like(q)
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    out = fused_attention_varlen(qa, ka, va, cu_q, cu_k, max(lens_q), max(lens_k), True)
    got = (out, *torch.autograd.grad(out, (qa, ka, va), do))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out = attention_varlen_reference(q64, k64, v64, cu_q, cu_k, True)
    ref = (ref_out, *torch.autograd.grad(ref_out, (q64, k64, v64), do.double()))
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(g.double(), r, **F32_TOL, msg=lambda m: f"{name}: {m}")
    _assert_tma_ran(launched)


@pytest.mark.parametrize("layout", ["head_dim_major", "misaligned"])
def test_bwd_tma_not_where_descriptors_cannot_serve(layout, device, tma, launched):
    """A head dim that is not innermost, or data not 16-byte aligned: the pointer-load kernel runs."""
    if layout == "head_dim_major":
        q, k, v = (torch.randn(1, 2, 16, s, device=device).transpose(-1, -2) for s in (19, 23, 23))
    else:
        q, k, v = (torch.randn(1 * 2 * s * 16 + 1, device=device)[1:].view(1, 2, s, 16) for s in (19, 23, 23))
        assert q.data_ptr() % 16
    _assert_matches_reference(q, k, v, causal=True)
    assert A._attn_bwd_dkdv_kernel in launched and TMA_LAUNCH not in launched


def test_bwd_tma_that_fails_to_launch_falls_back(device, tma, monkeypatch):
    """On a GPU a TMA kernel whose first launch fails (a compile error of the installed Triton) is dropped from its
    plan with a warning and the pointer-load kernel runs, with correct gradients; under the interpreter failures
    propagate.  The failure is injected (no config fails on every Triton build)."""
    fns = []
    orig = _library.Kernel.__call__
    token = f"injected failure {id(fns)}"  # a fresh warning (warn_once) for every run of this test

    def call(self, *args):
        if self.fn is A._attn_bwd_dkdv_kernel and self.meta.get("USE_TMA"):
            raise RuntimeError(f"PassManager::run failed ({token})")
        out = orig(self, *args)
        fns.append(self.fn)
        return out

    monkeypatch.setattr(_library.Kernel, "__call__", call)
    monkeypatch.setattr(A, "ensure_triton_allocator", lambda: None)
    q, k, v = (torch.randn(1, 2, s, 16, device=device) for s in (19, 23, 23))
    if A.INTERPRET:
        with pytest.raises(RuntimeError, match="PassManager"):
            out = fused_attention(*(t.detach().requires_grad_() for t in (q, k, v)), is_causal=True)
            out.backward(torch.randn_like(out))  # (not out.sum(): its stride-0 gradient refuses descriptors)
        monkeypatch.setattr(A, "INTERPRET", False)
    with config_override("attention"), pytest.warns(UserWarning, match="TMA loads failed to launch.*injected failure"):
        _assert_matches_reference(q, k, v, causal=True)
    assert A._attn_bwd_dkdv_kernel in fns and A._attn_bwd_dq_kernel in fns


# ----------------------------------------------------------------------------------------------
# The rule (H200 measurements, attention_config.BWD_TMA_CASES)
# ----------------------------------------------------------------------------------------------
# (dtype, max seqlen_k, causal, BLOCK_D, on?): on iff dense bf16, Sk >= 4096, BLOCK_D 64 or (128, not causal):
# exactly the cases where it was measured faster on the H200.
RULE_CASES = [
    (torch.bfloat16, 4096, False, 64, True),
    (torch.bfloat16, 4096, True, 64, True),
    (torch.bfloat16, 16384, False, 128, True),
    (torch.bfloat16, 16384, True, 128, False),  # D128 causal: lost on the H200
    (torch.bfloat16, 4095, False, 64, False),  # short keys: lost at S1024
    (torch.bfloat16, 1024, False, 128, False),
    (torch.float16, 16384, True, 64, False),  # not measured
    (torch.float32, 16384, False, 64, False),  # not measured
    (torch.bfloat16, 16384, False, 32, False),  # not measured
    (torch.bfloat16, 8192, False, 256, False),  # not measured (and spills at D256)
]


@pytest.mark.parametrize("dtype,sk,causal,bd,on", RULE_CASES)
def test_bwd_tma_rule(dtype, sk, causal, bd, on, monkeypatch):
    monkeypatch.setattr(A, "INTERPRET", False)
    monkeypatch.setattr(A, "HAS_TMA_DESCRIPTORS", True)
    assert A._use_bwd_tma(dtype, sk, causal, bd, False) is on
    assert A._use_bwd_tma(dtype, sk, causal, bd, True) is False  # never varlen
    monkeypatch.setattr(A, "HAS_TMA_DESCRIPTORS", False)
    assert A._use_bwd_tma(dtype, sk, causal, bd, False) is False  # never without descriptors
    monkeypatch.setattr(A, "HAS_TMA_DESCRIPTORS", True)
    monkeypatch.setattr(A, "INTERPRET", True)
    assert A._use_bwd_tma(dtype, sk, causal, bd, False) is False  # never under the interpreter


def test_bwd_tma_rule_reaches_the_plan(device, monkeypatch, launched):
    """The backward plan asks the rule with the call's dtype, seqlen_k, causal flag, BLOCK_D and layout."""
    seen = []

    def rule(dtype, sk, causal, bd, varlen):
        seen.append((dtype, sk, causal, bd, varlen))
        return A.HAS_TMA_DESCRIPTORS

    monkeypatch.setattr(A, "_use_bwd_tma", rule)
    q, k, v = (torch.randn(1, 2, s, 16, device=device) for s in (19, 23, 23))
    with config_override("attention"):  # a new override epoch: a fresh plan
        _assert_matches_reference(q, k, v, causal=True)
    assert (torch.float32, 23, True, 16, False) in seen
    if A.HAS_TMA_DESCRIPTORS:
        _assert_tma_ran(launched)


# ----------------------------------------------------------------------------------------------
# The forward's scale: inside exp2's FMA and on the row max without a key bias; scores scaled first with one
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_with_large_scores(shape, device, launched):
    _check_shape(shape, device, q_scale=3)  # large scores: the max and the exponent both matter
    assert A._attn_fwd_kernel in launched


def test_forward_key_bias_and_none(device):
    """The same inputs without a mask, with a key-padding mask (the scaled-scores path), and with an all-keep mask:
    each against float64, and the all-keep mask gives the unmasked result."""
    q, k, v = (torch.randn(2, 2, 19, 16, device=device) * 2 for _ in range(3))
    mask = torch.ones(2, 1, 1, 19, dtype=torch.bool, device=device)
    plain = _assert_matches_reference(q, k, v)[0]
    kept = _assert_matches_reference(q, k, v, mask=mask)[0]
    mask[1, ..., 11:] = False
    _assert_matches_reference(q, k, v, mask=mask)
    torch.testing.assert_close(kept, plain, **F32_TOL)
