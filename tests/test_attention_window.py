"""Sliding windows (``window``) and logit soft-capping (``softcap``) in the attention kernels.

Semantics (transformers'): query i sees key j only if ``j > i - window`` (``sliding_window_overlay``), with and
without the causal mask; soft-capping ``softcap * tanh(scale * q . k / softcap)`` after the scale and before any
mask (Gemma 2's ``eager_attention_forward``).  Reference: the float64 PyTorch math (``_math_reference``), itself
checked against transformers' own masks and Gemma 2's eager attention when transformers is installed.
CPU: the interpreter, 16 x 16 tiles, small shapes; GPU: bf16 at S 1K-4K, asserting the Triton kernels ran.
"""

import importlib

import pytest
import torch
from test_attention_variants import launched  # noqa: F401  (fixture)

from fused_layers import fused_attention, fused_attention_varlen
from fused_layers.ops import attention as A
from fused_layers.ops.attention import attention_varlen_reference, config_override

TOL = dict(atol=2e-5, rtol=2e-5)


def _grads(fn, tensors, do):
    ts = [t.detach().requires_grad_() for t in tensors]
    out = fn(*ts)
    return (out, *torch.autograd.grad(out, ts, do))


def _check(q, k, v, causal, window, softcap, mask=None, tol=TOL):
    """Out, dq, dk, dv of fused_attention against the float64 reference."""
    gqa = q.shape[1] != k.shape[1]
    do = torch.randn(q.shape, device=q.device, dtype=q.dtype)
    got = _grads(lambda a, b, c: fused_attention(a, b, c, mask, is_causal=causal, enable_gqa=gqa, window=window,
                                                 softcap=softcap), (q, k, v), do)
    ref = _grads(lambda a, b, c: A._math_reference(a, b, c, mask, causal, None, 0.0, window, softcap),
                 (q.double(), k.double(), v.double()), do.double())
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert g.dtype == q.dtype, name
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m: f"{name}: {m}")


# (B, Hq, Hkv, Sq, Sk, D, causal, window, softcap): windows smaller than a tile, a few tiles, larger than the
# sequence; Sq != Sk both ways; GQA; soft-capping alone and with a window; ragged lengths and head dims.
CASES = [
    (1, 2, 2, 37, 37, 16, True, 5, None),
    (1, 4, 2, 45, 45, 24, True, 20, 2.0),  # GQA, D 24 padded to 32
    (1, 2, 2, 37, 37, 16, True, None, 1.5),
    (1, 2, 1, 33, 41, 16, False, 7, 3.0),  # not causal: keys right of the query all visible
    (2, 2, 2, 29, 29, 16, True, 100, None),  # window larger than the sequence: plain causal
    (1, 2, 2, 50, 20, 16, True, 3, None),  # Sq > Sk: the last rows see no key (output 0)
    (1, 2, 2, 20, 50, 16, False, 1, 0.5),  # window 1
]


@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,causal,window,softcap", CASES)
def test_window_softcap_match_reference(B, Hq, Hkv, Sq, Sk, D, causal, window, softcap, device):
    q = torch.randn(B, Hq, Sq, D, device=device)
    k, v = torch.randn(B, Hkv, Sk, D, device=device), torch.randn(B, Hkv, Sk, D, device=device)
    with config_override("attention", block_m=16, block_n=16):
        _check(q, k, v, causal, window, softcap)


def test_window_softcap_key_padding_and_strides(device):
    """With a key-padding mask (fully padded rows give 0), on (B, S, H, D) transposed views, default tiles."""
    B, H, S, D = 2, 2, 45, 32
    q, k, v = (torch.randn(B, S, H, D, device=device).transpose(1, 2) for _ in range(3))
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool, device=device)
    keep[0, ..., :7] = False
    _check(q, k, v, True, 9, 5.0, mask=keep)


def test_window_covering_every_row_runs_the_windowless_kernels(device, monkeypatch):
    """window >= Sq cuts no key (row i < Sq <= window sees every j > i - window): the call runs the kernels without
    a window (on Hopper the Gluon ones take it), the windowless call's result exactly; window = Sq - 1 does cut."""
    from fused_layers.ops import _library

    metas = []
    orig = _library.Kernel.__call__

    def spy(self, *args):
        metas.append(self.meta.get("WINDOW", 0))
        return orig(self, *args)

    monkeypatch.setattr(_library.Kernel, "__call__", spy)
    q, k, v = (torch.randn(1, 2, 20, 16, device=device) for _ in range(3))
    plain = fused_attention(q, k, v, is_causal=True)
    for w in (20, 21, 100):
        assert torch.equal(fused_attention(q, k, v, is_causal=True, window=w), plain), w
    cu = torch.tensor([0, 20], dtype=torch.int32, device=device)
    varlen = fused_attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 20,
                                    20, True, window=20)
    torch.testing.assert_close(varlen.transpose(0, 1), plain[0], **TOL)
    assert metas and set(metas) == {0}, metas
    fused_attention(q, k, v, is_causal=True, window=19)
    assert 19 in metas


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the rows that do read the NaN tiles (not checked)
def test_window_skips_key_tiles_left_of_it(device):
    """The kernels never read whole tiles left of a block's window: NaN in keys / values 0..31 leaves the rows
    48..63 (window 16: keys from 33 on) finite and exact, forward and dQ; NaN in the queries and dO of rows
    48..63 leaves dK / dV of keys 0..15 (seen by rows up to 30) finite and exact."""
    S, D, w = 64, 16, 16
    q, k, v, do = (torch.randn(1, 1, S, D, device=device) for _ in range(4))
    kp, vp = k.clone(), v.clone()
    kp[..., :32, :] = float("nan")
    vp[..., :32, :] = float("nan")
    qp, dop = q.clone(), do.clone()
    qp[..., 48:, :] = float("nan")
    dop[..., 48:, :] = float("nan")
    ref = _grads(lambda a, b, c: A._math_reference(a, b, c, None, True, None, 0.0, w, None),
                 (q.double(), k.double(), v.double()), do.double())
    with config_override("attention", block_m=16, block_n=16):
        out, dq, _, _ = _grads(lambda a, b, c: fused_attention(a, b, c, is_causal=True, window=w), (q, kp, vp), do)
        _, _, dk, dv = _grads(lambda a, b, c: fused_attention(a, b, c, is_causal=True, window=w), (qp, k, v), dop)
    torch.testing.assert_close(out[..., 48:, :].double(), ref[0][..., 48:, :], **TOL)
    torch.testing.assert_close(dq[..., 48:, :].double(), ref[1][..., 48:, :], **TOL)
    torch.testing.assert_close(dk[..., :16, :].double(), ref[2][..., :16, :], **TOL)
    torch.testing.assert_close(dv[..., :16, :].double(), ref[3][..., :16, :], **TOL)


@pytest.mark.parametrize("causal,window,softcap", [(True, 4, None), (False, 6, 2.0), (True, None, 1.5)])
def test_varlen_window_softcap(causal, window, softcap, device):
    cu = torch.tensor([0, 5, 22, 55], dtype=torch.int32, device=device)
    q = torch.randn(55, 4, 16, device=device)
    k, v = torch.randn(55, 2, 16, device=device), torch.randn(55, 2, 16, device=device)
    do = torch.randn_like(q)

    def fused(a, b, c):
        return fused_attention_varlen(a, b, c, cu, cu, 33, 33, causal, window=window, softcap=softcap)

    with config_override("attention", block_m=16, block_n=16):
        got = _grads(fused, (q, k, v), do)
    ref = _grads(lambda a, b, c: attention_varlen_reference(a, b, c, cu, cu, causal, None, window, softcap),
                 (q.double(), k.double(), v.double()), do.double())
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(g.double(), r, **TOL, msg=lambda m: f"{name}: {m}")


def test_bad_window_and_softcap(device):
    q = torch.randn(1, 1, 4, 8, device=device)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
    for fn in (lambda **kw: fused_attention(q, q, q, **kw),
               lambda **kw: fused_attention_varlen(q[0], q[0], q[0], cu, cu, 4, 4, **kw)):
        for kw, exc, match in [(dict(window=0), ValueError, "'window' must be >= 1"),
                               (dict(window=2.0), TypeError, "'window' must be a positive int"),
                               (dict(window=True), TypeError, "'window'"),
                               (dict(softcap=-1.0), ValueError, "'softcap' must be a finite float > 0"),
                               (dict(softcap=float("inf")), ValueError, "'softcap'"),
                               (dict(softcap="30"), TypeError, "'softcap' must be a positive float")]:
            with pytest.raises(exc, match=match):
                fn(**kw)


def test_reference_is_transformers_semantics():
    """_math_reference's window and soft-capping equal transformers' sliding-window causal mask with Gemma 2's
    eager attention (soft-capping after the scale, before the mask)."""
    try:
        mu = importlib.import_module("transformers.masking_utils")
        g2 = importlib.import_module("transformers.models.gemma2.modeling_gemma2")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"transformers not importable: {e}")
    S, D, w, cap = 12, 8, 5, 2.0
    q, k, v = (torch.randn(1, 2, S, D, dtype=torch.float64) for _ in range(3))
    fn = mu.sliding_window_causal_mask_function(w)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    keep = fn(0, 0, i, j)
    mask = torch.zeros(1, 1, S, S, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float64).min)

    class Mod(torch.nn.Module):
        num_key_value_groups = 1
        head_dim = D

    ref, _ = g2.eager_attention_forward(Mod().eval(), q, k, v, mask, scaling=0.3, softcap=cap)
    got = A._math_reference(q, k, v, None, True, 0.3, 0.0, w, cap)
    torch.testing.assert_close(got.transpose(1, 2), ref)


# --------------------------------------------------------------------------------------------------
# GPU: realistic sizes, bf16; the Triton kernels (never Gluon, never SDPA) ran.
# --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("S,D,Hq,Hkv,causal,window,softcap", [
    (1024, 64, 8, 8, True, 256, None),
    (2048, 128, 16, 4, True, 512, 50.0),
    (4096, 128, 8, 8, True, 4096 + 1, None),
    (4096, 64, 8, 2, True, None, 30.0),
    (2048, 128, 8, 8, False, 300, 20.0),
])
def test_gpu_bf16_window_softcap(S, D, Hq, Hkv, causal, window, softcap, launched):  # noqa: F811
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(1, Hq, S, D, device=dev, dtype=dt)
    k, v = torch.randn(1, Hkv, S, D, device=dev, dtype=dt), torch.randn(1, Hkv, S, D, device=dev, dtype=dt)
    do = torch.randn_like(q)
    got = _grads(lambda a, b, c: fused_attention(a, b, c, is_causal=causal, enable_gqa=Hq != Hkv, window=window,
                                                 softcap=softcap), (q, k, v), do)
    if window is None or window < S:  # (a window past the sequence cuts nothing: the windowless route, Gluon here)
        assert {A._attn_fwd_kernel, A._attn_bwd_dq_kernel} <= set(launched), launched
    ref = _grads(lambda a, b, c: A._math_reference(a, b, c, None, causal, None, 0.0, window, softcap),
                 (q.double(), k.double(), v.double()), do.double())
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert g.dtype == dt and torch.isfinite(g).all(), name
        rel = ((g.double() - r).norm() / r.norm()).item()
        assert rel < 2e-2, f"{name}: relative error {rel:.2e}"


@pytest.mark.gpu
def test_gpu_varlen_window_softcap_bf16(launched):  # noqa: F811
    lens = [1000, 17, 513, 2048]
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(int(cu[-1]), h, 128, device="cuda", dtype=torch.bfloat16) for h in (16, 4, 4))
    out = fused_attention_varlen(q, k, v, cu, cu, max(lens), max(lens), True, window=256, softcap=50.0)
    assert A._attn_fwd_kernel in launched
    ref = attention_varlen_reference(q.double(), k.double(), v.double(), cu, cu, True, None, 256, 50.0)
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < 2e-2, rel


def test_varlen_dropout_is_the_dense_batchs(device):
    """Packed sequence b gets the dropout mask a dense batch draws for its row b (same seed): equal lengths packed
    give the dense batch's output and gradients."""
    B, H, S, D = 2, 2, 19, 16
    q, k, v = (torch.randn(B, H, S, D, device=device) for _ in range(3))
    do = torch.randn_like(q)
    cu = torch.tensor([0, S, 2 * S], dtype=torch.int32, device=device)

    def packed(t):
        return t.transpose(1, 2).reshape(B * S, H, D)

    torch.manual_seed(5)
    dense = _grads(lambda a, b, c: fused_attention(a, b, c, dropout_p=0.25, is_causal=True, window=6), (q, k, v), do)
    torch.manual_seed(5)
    var = _grads(lambda a, b, c: fused_attention_varlen(a, b, c, cu, cu, S, S, True, window=6, dropout_p=0.25),
                 tuple(packed(t) for t in (q, k, v)), packed(do))
    for name, d, p in zip(("out", "dq", "dk", "dv"), dense, var):
        torch.testing.assert_close(p, packed(d), atol=1e-6, rtol=1e-6, msg=lambda m: f"{name}: {m}")
    assert not torch.allclose(dense[0], fused_attention(q, k, v, is_causal=True, window=6))  # something was dropped
    with pytest.raises(ValueError, match="'dropout_p' must be in"):
        fused_attention_varlen(q[0], k[0], v[0], cu[:2], cu[:2], S, S, dropout_p=1.0)


# --------------------------------------------------------------------------------------------------
# SDPA's full signature: PyTorch's own OpInfo samples of F.scaled_dot_product_attention
# --------------------------------------------------------------------------------------------------
def _sdpa_samples():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception as e:  # noqa: BLE001 - torch's test helpers need expecttest
        pytest.skip(f"torch's OpInfo database not importable: {e}")
    (op,) = [o for o in op_db if o.name == "nn.functional.scaled_dot_product_attention"]
    return list(op.sample_inputs("cpu", torch.float32, requires_grad=True))


@pytest.mark.filterwarnings("ignore:fused_attention")
def test_sdpa_opinfo_samples(launched):  # noqa: F811
    """Every OpInfo sample (3-D queries with 4-D keys, dropout, a 2-D mask): fused_attention returns SDPA's shape
    and, without dropout, the values and gradients of float64 SDPA; our kernels ran for each, except the mask that
    varies along the query dim (SDPA ran: no launch)."""
    import torch.nn.functional as F

    samples, seen = _sdpa_samples(), set()
    assert len(samples) >= 20
    for s in samples:
        q, (k, v) = s.input, s.args
        kw = dict(s.kwargs)
        mask = kw.get("attn_mask")
        key = (q.shape, k.shape, v.shape, None if mask is None else mask.shape,
               tuple((n, x) for n, x in sorted(kw.items()) if n != "attn_mask"))
        if key in seen:  # (the samples come in pairs of one signature: the interpreter's time is the budget)
            continue
        seen.add(key)
        launched.clear()
        ins = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fused_attention(*ins, **kw)
        ref_ins = [t.detach().double().requires_grad_() for t in (q, k, v)]  # float64 SDPA: the reference
        if mask is not None and mask.is_floating_point():
            kw_ref = dict(kw, attn_mask=mask.double())
        else:
            kw_ref = kw
        ref = F.scaled_dot_product_attention(*ref_ins, **kw_ref)
        assert out.shape == ref.shape and out.dtype == q.dtype, (q.shape, k.shape, kw)
        assert bool(launched) == (mask is None or mask.shape[-2] == 1), (q.shape, k.shape, kw)
        if kw.get("dropout_p", 0.0) > 0.0:  # (another mask than SDPA's: the shape, and finite values)
            assert torch.isfinite(out).all()
            continue
        do = torch.randn_like(out)
        got = torch.autograd.grad(out, ins, do)
        exp = torch.autograd.grad(ref, ref_ins, do.double())
        # the samples' entries reach 9 in magnitude (scores to ~200): float32 tolerances scaled by it
        for g, e in zip((out, *got), (ref, *exp)):
            torch.testing.assert_close(g.double(), e, atol=1e-4 * max(1.0, e.abs().max().item()), rtol=1e-4)


def test_sdpa_broadcasting(device):
    """Batch dims broadcast as SDPA's: a K/V head of 1 (MQA without enable_gqa), a batch of 1, five dims,
    2-D inputs, a 3-D query with grouped 4-D keys; shapes that do not broadcast raise as SDPA does (RuntimeError)."""
    import torch.nn.functional as F

    r = lambda *sh: torch.randn(*sh, device=device)  # noqa: E731
    for q, k, v, kw in [(r(2, 4, 5, 8), r(2, 1, 7, 8), r(2, 1, 7, 8), dict(is_causal=True)),
                        (r(2, 4, 5, 8), r(2, 1, 7, 8), r(2, 4, 7, 8), {}),
                        (r(1, 4, 5, 8), r(3, 4, 7, 8), r(3, 4, 7, 8), {}),
                        (r(2, 2, 2, 5, 8), r(2, 2, 7, 8), r(1, 2, 7, 8), {}),
                        (r(5, 8), r(7, 8), r(7, 8), dict(is_causal=True)),
                        (r(4, 5, 8), r(2, 2, 7, 8), r(2, 2, 7, 8), dict(enable_gqa=True))]:
        do = torch.randn(torch.broadcast_shapes(q.shape[:-1], k.shape[:-2] + (1,)) + (8,), device=device) \
            if not kw.get("enable_gqa") else torch.randn(2, 4, 5, 8, device=device)
        got = _grads(lambda a, b, c: fused_attention(a, b, c, **kw), (q, k, v), do)
        exp = _grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, **kw), (q, k, v), do)
        for g, e in zip(got, exp):
            assert g.shape == e.shape
            torch.testing.assert_close(g, e, **TOL)
    with pytest.raises(RuntimeError, match="do not broadcast"):
        fused_attention(r(2, 4, 5, 8), r(3, 4, 7, 8), r(3, 4, 7, 8))
    with pytest.raises(RuntimeError, match="at least 2 dims"):
        fused_attention(r(8), r(7, 8), r(7, 8))


def test_opcheck_window_softcap(device):
    """The registered op (torch.compile's view) with a window and soft-capping: schema, autograd registration,
    fake tensors; and the autograd path through it equals the eager one."""
    q = torch.randn(1, 2, 9, 16, device=device, requires_grad=True)
    k = torch.randn(1, 1, 12, 16, device=device, requires_grad=True)
    v = torch.randn(1, 1, 12, 16, device=device, requires_grad=True)
    args = (q, k, v, None, None, None, 9, 12, True, 0.25, 0.0, None, 4, 2.5)
    torch.library.opcheck(A.attention_op.fwd_op, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    out, lse = A.attention_op.fwd_op(*[a.detach() if isinstance(a, torch.Tensor) else a for a in args])
    ref = A._math_reference(q.double(), k.double(), v.double(), None, True, 0.25, 0.0, 4, 2.5)
    torch.testing.assert_close(out.double(), ref, **TOL)
    bwd = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, None, None, None, 9, 12, True, 0.25,
           0.0, None, 4, 2.5)
    torch.library.opcheck(A.attention_op.bwd_op, bwd, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
@pytest.mark.slow
def test_compile_fullgraph_window_softcap(device):
    """fullgraph torch.compile of a windowed, soft-capped call through Inductor (whose wrap_triton checks every
    kernel argument and constexpr): gradients as the reference's.  (On the CPU, test_opcheck_window_softcap
    covers the op's schema and fake tensors.)"""
    q = torch.randn(2, 2, 17, 16, device=device)
    k, v = torch.randn(2, 1, 20, 16, device=device), torch.randn(2, 1, 20, 16, device=device)

    def f(a, b, c):
        return fused_attention(a, b, c, is_causal=True, enable_gqa=True, window=5, softcap=3.0).square().sum()

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.compile(f, fullgraph=True, backend="inductor")(*leaves).backward()
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    A._math_reference(*ref, None, True, None, 0.0, 5, 3.0).square().sum().backward()
    for a, b in zip(leaves, ref):
        torch.testing.assert_close(a.grad.double(), b.grad, **TOL)
