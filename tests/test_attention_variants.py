"""The bwd_tma variant of the attention backward (issue 13): the dK/dV kernel with its Q and dO tiles
loaded through TMA tensor descriptors (``_attn_bwd_dkdv_kernel`` with ``USE_TMA``), then the usual dQ kernel.

Forced on (``bwd_tma=1``) against the float64 reference (outputs and all gradients) on ragged shapes, GQA,
varlen, a key-padding bias, dropout, float32 and bf16, checking that the variant kernel is the one launched
(or, where descriptors cannot serve a call, that the default one is); the first-launch fallback; the auto
rule that turns it on by default (H200 measurements, attention_config._bwd_tma_auto).  Under the
interpreter ``tl.make_tensor_descriptor`` loads are emulated (out-of-bounds zero fill included); what only
a GPU shows (TMA hardware, speed) is for ``bench_attention.py --variants``.  The other variants of issue 13
(TMA / warp-specialized / persistent forwards, dQ by atomics) were measured slower and removed.
"""

import pytest
import torch

from fused_layers import fused_attention, fused_attention_varlen
from fused_layers.ops import _library
from fused_layers.ops import attention as A
from fused_layers.ops import attention_config as AC
from fused_layers.ops.attention import attention_reference, attention_varlen_reference, config_override
from test_attention import F32_TOL, _assert_matches_reference
TMA = dict(bwd_tma=1)
TMA_LAUNCH = "_attn_bwd_dkdv_kernel(USE_TMA=True)"  # how `launched` records the bwd_tma launch


@pytest.fixture
def launched(monkeypatch):
    """The Triton functions launched (successfully) through Kernel during the test.  On a GPU a variant
    whose first launch fails falls back to the default kernels with a warning: that fails the test too."""
    fns = []
    orig = _library.Kernel.__call__
    n_failures = len(A._VARIANT_FAILURES)

    def spy(self, *args):
        out = orig(self, *args)
        fns.append(TMA_LAUNCH if self.meta.get("USE_TMA") else self.fn)
        return out

    monkeypatch.setattr(_library.Kernel, "__call__", spy)
    yield fns
    assert A._VARIANT_FAILURES[n_failures:] == [], "a variant failed to launch and fell back"


def _assert_tma_ran(launched):
    assert TMA_LAUNCH in launched and A._attn_bwd_dq_kernel in launched
    assert A._attn_bwd_dkdv_kernel not in launched


def _assert_same_dropout_results(device, base: dict, variant: dict):
    """One causal dropout call (same seed: same Philox mask) under the attention configs ``base`` and
    ``variant``: the output and every gradient agree."""
    q, k, v = (torch.randn(1, 2, s, 32, device=device) for s in (29, 41, 41))
    do = torch.randn_like(q)
    res = []
    for ov in (base, variant):
        qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
        torch.manual_seed(7)
        with config_override("attention", **ov):
            out = fused_attention(qa, ka, va, dropout_p=0.3, is_causal=True)
            res.append((out, *torch.autograd.grad(out, (qa, ka, va), do)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *res):
        torch.testing.assert_close(b, a, **F32_TOL, msg=lambda m: f"{name}: {m}")


@pytest.fixture
def kernel_calls(monkeypatch):
    """(kernel function, launch meta) of every launch through Kernel during the test."""
    calls = []
    orig = _library.Kernel.__call__

    def spy(self, *args):
        calls.append((self.fn, self.meta))
        return orig(self, *args)

    monkeypatch.setattr(_library.Kernel, "__call__", spy)
    return calls


def _check(q, k, v, ov, mask=None, causal=False, gqa=False):
    """Outputs and every gradient under the attention config ``ov`` against the float64 reference."""
    with config_override("attention", **ov):
        return _assert_matches_reference(q, k, v, mask=mask, causal=causal, gqa=gqa)


def _check_bf16(q, k, v, ov, causal=False, gqa=False):
    """bf16 inputs under the attention config ``ov``: relative error (Frobenius) of out and every gradient
    against float64 below 2e-2 (bf16 rounds each element to 8 bits: elementwise float32 tolerances do
    not apply)."""
    do = torch.randn(q.shape[:-1] + (v.shape[-1],), device=q.device, dtype=q.dtype)
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    with config_override("attention", **ov):
        out = fused_attention(qa, ka, va, is_causal=causal, enable_gqa=gqa)
        got = (out, *torch.autograd.grad(out, (qa, ka, va), do))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out = attention_reference(q64, k64, v64, None, causal, None, gqa)
    ref = (ref_out, *torch.autograd.grad(ref_out, (q64, k64, v64), do.double()))
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert g.dtype == torch.bfloat16, name
        rel = ((g.double() - r).norm() / r.norm()).item()
        assert rel < 2e-2, f"{name}: relative error {rel:.2e}"


# (B, Hq, Hkv, Sq, Sk, D, causal): one query row, GQA with Sq < Sk and D = 80 (padded to 128), MQA with
# Sq > Sk (the last rows see every key), a one-tile head dim.  float32 (ieee dots).
SHAPES = [
    (1, 2, 2, 1, 37, 16, True),
    (1, 4, 2, 37, 130, 80, True),
    (1, 2, 1, 130, 37, 64, False),
]


def _check_shape(shape, ov, device, q_scale=1.0):
    """``_check`` on fresh float32 q (times ``q_scale``), k, v of one SHAPES entry under the attention config ``ov``."""
    B, Hq, Hkv, Sq, Sk, D, causal = shape
    q = torch.randn(B, Hq, Sq, D, device=device) * q_scale
    k = torch.randn(B, Hkv, Sk, D, device=device)
    v = torch.randn(B, Hkv, Sk, D, device=device)
    _check(q, k, v, ov, causal=causal, gqa=Hq != Hkv)


@pytest.mark.parametrize("shape", SHAPES)
def test_bwd_tma_matches_reference(shape, device, launched):
    _check_shape(shape, TMA, device)
    _assert_tma_ran(launched)


def test_bwd_tma_bf16(device, launched):
    """bf16 (on a GPU the real TMA + tensor-core path; the interpreter runs float32 copies)."""
    q = torch.randn(1, 4, 37, 80, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 130, 80, device=device, dtype=torch.bfloat16) for _ in range(2))
    _check_bf16(q, k, v, TMA, causal=True, gqa=True)
    _assert_tma_ran(launched)


def test_bwd_tma_key_padding_bias_and_empty_rows(device, launched):
    """Key-padding mask fused as a bias (a batch with every key masked: 0 outputs, 0 gradients)."""
    B, H, Sq, Sk, D = 3, 2, 19, 25, 16
    q, k, v = (torch.randn(B, H, s, D, device=device) for s in (Sq, Sk, Sk))
    keep = torch.ones(B, 1, 1, Sk, dtype=torch.bool, device=device)
    keep[0, ..., 7:] = False
    keep[1] = False
    keep[2, ..., ::3] = False
    out, dq, dk, dv = _check(q, k, v, TMA, mask=keep, causal=True)
    assert torch.all(out[1] == 0) and torch.all(dq[1] == 0) and torch.all(dk[1] == 0)
    _assert_tma_ran(launched)


def test_bwd_tma_dropout_matches_default_kernels(device, launched):
    """Same seed, same Philox mask: bwd_tma gives the default kernels' gradients."""
    _assert_same_dropout_results(device, dict(bwd_tma=0), TMA)
    assert A._attn_bwd_dkdv_kernel in launched and TMA_LAUNCH in launched


def test_bwd_tma_varlen(device, launched):
    """Packed sequences (one empty, one of length 1), GQA, causal."""
    lens_q, lens_k = [5, 17, 1, 0, 23], [9, 17, 4, 0, 30]
    cu_q = torch.tensor([0] + lens_q, device=device).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, device=device).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu_q[-1]), 4, 32, device=device)
    k, v = (torch.randn(int(cu_k[-1]), 2, 32, device=device) for _ in range(2))
    do = torch.randn_like(q)
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    with config_override("attention", **TMA):
        out = fused_attention_varlen(qa, ka, va, cu_q, cu_k, max(lens_q), max(lens_k), True)
        got = (out, *torch.autograd.grad(out, (qa, ka, va), do))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out = attention_varlen_reference(q64, k64, v64, cu_q, cu_k, True)
    ref = (ref_out, *torch.autograd.grad(ref_out, (q64, k64, v64), do.double()))
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(g.double(), r, **F32_TOL, msg=lambda m: f"{name}: {m}")
    _assert_tma_ran(launched)


@pytest.mark.parametrize("layout", ["head_dim_major", "misaligned"])
def test_bwd_tma_falls_back_where_descriptors_cannot_serve(layout, device, launched):
    """A head dim that is not innermost, or data not 16-byte aligned: the default kernels run."""
    if layout == "head_dim_major":
        q, k, v = (torch.randn(1, 2, 16, s, device=device).transpose(-1, -2) for s in (19, 23, 23))
    else:
        q, k, v = (torch.randn(1 * 2 * s * 16 + 1, device=device)[1:].view(1, 2, s, 16) for s in (19, 23, 23))
        assert q.data_ptr() % 16
    _check(q, k, v, TMA, causal=True)
    assert A._attn_bwd_dkdv_kernel in launched and TMA_LAUNCH not in launched


def test_variant_that_fails_to_launch_falls_back(device, monkeypatch):
    """On a GPU a variant whose first launch fails (a compile error of the installed Triton) is disabled
    for its plan with a warning and the default kernels run, with correct gradients; under the
    interpreter failures propagate.  The failure is injected (no config fails on every Triton build)."""
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
    monkeypatch.setattr(A, "_ensure_allocator", lambda: None)
    q, k, v = (torch.randn(1, 2, s, 16, device=device) for s in (19, 23, 23))
    if A.INTERPRET:
        with config_override("attention", **TMA), pytest.raises(RuntimeError, match="PassManager"):
            out = fused_attention(*(t.detach().requires_grad_() for t in (q, k, v)), is_causal=True)
            out.backward(torch.randn_like(out))  # (not out.sum(): its stride-0 gradient refuses descriptors)
        monkeypatch.setattr(A, "INTERPRET", False)
    n = len(A._VARIANT_FAILURES)
    with pytest.warns(UserWarning, match="variant kernel failed to launch.*injected failure"):
        _check(q, k, v, TMA, causal=True)
    assert len(A._VARIANT_FAILURES) == n + 1 and "'USE_TMA': True" in A._VARIANT_FAILURES[-1]
    assert A._attn_bwd_dkdv_kernel in fns and A._attn_bwd_dq_kernel in fns


# ----------------------------------------------------------------------------------------------
# The auto rule (bwd_tma = -1, the default)
# ----------------------------------------------------------------------------------------------
# (dtype, max seqlen_k, causal, BLOCK_D, on?): on iff dense bf16, Sk >= 4096, D bucket 64 or (128, not causal):
# exactly the cases where it was measured faster on the H200.
AUTO_CASES = [
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


@pytest.mark.parametrize("dtype,sk,causal,bd,on", AUTO_CASES)
def test_bwd_tma_auto_rule(dtype, sk, causal, bd, on):
    assert AC._bwd_tma_auto(dtype, sk, causal, bd, has_tma=True, interpret=False) is on
    # never without descriptors, never under the interpreter
    assert AC._bwd_tma_auto(dtype, sk, causal, bd, has_tma=False, interpret=False) is False
    assert AC._bwd_tma_auto(dtype, sk, causal, bd, has_tma=True, interpret=True) is False
    assert AC._bwd_tma_auto(dtype, sk, causal, bd, has_tma=True, interpret=False, varlen=True) is False


def test_bwd_tma_knob():
    """-1 (auto) is the default and off under the interpreter; 1 forces it on (where descriptors exist),
    0 off even where the rule says on."""
    assert AC._VARIANTS["bwd_tma"] == -1
    assert AC._variant("bwd_tma") == -1
    assert AC._use_bwd_tma(torch.bfloat16, 16384, False, 64, True) is (not AC.INTERPRET)
    with config_override("attention", bwd_tma=1):
        assert AC._use_bwd_tma(torch.float32, 16, True, 128, True) is True
        assert AC._use_bwd_tma(torch.bfloat16, 16384, False, 64, False) is False
    with config_override("attention", bwd_tma=0):
        assert AC._use_bwd_tma(torch.bfloat16, 16384, False, 64, True) is False


def test_bwd_tma_auto_reaches_the_plan(device, monkeypatch, launched):
    """With the knob at auto the backward plan follows the rule (here forced to say yes)."""
    seen = []

    def rule(dtype, sk, causal, bd, has_tma, interpret=None, varlen=False):
        seen.append((dtype, sk, causal, bd))
        return has_tma

    monkeypatch.setattr(AC, "_bwd_tma_auto", rule)
    q, k, v = (torch.randn(1, 2, s, 16, device=device) for s in (19, 23, 23))
    with config_override("attention"):  # a new override epoch: a fresh plan
        _check(q, k, v, {}, causal=True)
    assert (torch.float32, 23, True, 16) in seen
    if A.HAS_TMA_DESCRIPTORS:
        _assert_tma_ran(launched)


# ----------------------------------------------------------------------------------------------
# fwd_fold_scale: the softmax scale inside exp2's FMA and on the row max (forward only)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_fwd_fold_scale_matches_reference(shape, device, launched):
    _check_shape(shape, dict(fwd_fold_scale=1), device, q_scale=3)  # large scores: the max and the exponent both matter
    assert any(getattr(fn, "__name__", "") == "_attn_fwd_kernel" for fn in launched)


def test_fwd_fold_scale_meta_and_key_bias(device, kernel_calls):
    """On when asked (the default) and no key-padding bias is given; a bias keeps the unfolded path (and stays right)."""
    q, k, v = (torch.randn(2, 2, 19, 16, device=device) for _ in range(3))
    mask = torch.ones(2, 1, 1, 19, dtype=torch.bool, device=device)
    mask[1, ..., 11:] = False
    _check(q, k, v, dict(fwd_fold_scale=1))
    _check(q, k, v, dict(fwd_fold_scale=1), mask=mask)
    _check(q, k, v, dict(fwd_fold_scale=0))
    assert [meta["FOLD_SCALE"] for fn, meta in kernel_calls if fn is A._attn_fwd_kernel] == [True, False, False]


# ----------------------------------------------------------------------------------------------
# bwd_dq_reduce: dQ accumulated in the dK/dV kernel (TMA reduce-add on a GPU, fp32 atomics here); no dQ kernel
# ----------------------------------------------------------------------------------------------
DQR = dict(bwd_dq_reduce=1)


@pytest.mark.parametrize("shape", SHAPES)
def test_bwd_dq_reduce_matches_reference(shape, device, kernel_calls):
    _check_shape(shape, DQR, device)
    fns = [fn for fn, _ in kernel_calls]
    assert A._attn_bwd_dq_kernel not in fns, "the dQ kernel ran: dQ should come from the dK/dV kernel"
    assert [m["DQ_REDUCE"] for fn, m in kernel_calls if fn is A._attn_bwd_dkdv_kernel] == [1 if A.INTERPRET else 2]


def test_bwd_dq_reduce_layouts_bias_and_bf16(device, kernel_calls):
    """q in (B, S, H, D) memory order (dQ is written back in that layout), a key-padding bias with an
    empty row, and bf16 (float32 accumulation of dQ across key blocks)."""
    q = torch.randn(2, 37, 4, 32, device=device).transpose(1, 2)  # strided: the layout dQ must keep
    k, v = (torch.randn(2, 4, 45, 32, device=device) for _ in range(2))
    mask = torch.ones(2, 1, 1, 45, dtype=torch.bool, device=device)
    mask[1, ..., 20:] = False
    _check(q, k, v, DQR, mask=mask, causal=True)
    with config_override("attention", **DQR):
        qa = q.detach().requires_grad_()
        out = fused_attention(qa, k, v, is_causal=True)
        (dq,) = torch.autograd.grad(out, qa, torch.randn_like(out))
    assert dq.stride() == q.stride()
    if device == "cuda":
        _check_bf16(*(t.to(torch.bfloat16) for t in (q, k, v)), DQR, causal=True)
    assert all(m["DQ_REDUCE"] for fn, m in kernel_calls if fn is A._attn_bwd_dkdv_kernel)


def test_bwd_dq_reduce_dropout_matches_default_kernels(device):
    """Same seed, same Philox mask: dQ from the dK/dV kernel equals the dQ kernel's."""
    _assert_same_dropout_results(device, dict(bwd_dq_reduce=0), DQR)


def test_bwd_dq_reduce_not_where_it_cannot_serve(device, kernel_calls):
    """Head dims that are not a multiple of 16 and packed (varlen) batches keep the dQ kernel."""
    q, k, v = (torch.randn(1, 2, 19, 24, device=device) for _ in range(3))
    _check(q, k, v, DQR, causal=True)
    assert A._attn_bwd_dq_kernel in [fn for fn, _ in kernel_calls]
    kernel_calls.clear()
    cu = torch.tensor([0, 7, 19], device=device, dtype=torch.int32)
    qv, kv, vv = (torch.randn(19, 2, 32, device=device, requires_grad=True) for _ in range(3))
    with config_override("attention", **DQR):
        out = fused_attention_varlen(qv, kv, vv, cu, cu, 12, 12, is_causal=True)
        grads = torch.autograd.grad(out, (qv, kv, vv), torch.randn_like(out))
    ref = attention_varlen_reference(qv.double(), kv.double(), vv.double(), cu, cu, is_causal=True)
    torch.testing.assert_close(out.double(), ref, **F32_TOL)
    assert all(torch.isfinite(g).all() for g in grads)
    assert A._attn_bwd_dq_kernel in [fn for fn, _ in kernel_calls]
