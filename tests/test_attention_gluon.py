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
    lse = torch.zeros(1, 2, 128)
    with pytest.raises(ValueError, match="attention_dq_gluon"):
        AG.attention_dq_gluon(q, q, q, q, lse, lse, torch.empty_like(q), False, 0.125)
    with pytest.raises(ValueError, match="attention_dkdv_gluon"):
        AG.attention_dkdv_gluon(q, q, q, q, lse, lse, torch.empty_like(q), torch.empty_like(q), False, 0.125)


def test_forward_kernel_choice():
    """fwd_kernel: auto mode takes the persistent ping-pong up to FWD_PERSIST_MAX_S, else the kernel FWD_KERNEL names;
    the ping-pong forms only where S is a multiple of 128 (else the one-warpgroup kernel); explicit modes win."""
    for (D, causal), top in AG.FWD_PERSIST_MAX_S.items():
        assert AG.fwd_kernel(D, top, causal) == "ws_persistent"
        above = "ws" if AG.FWD_KERNEL[(D, causal)] == "ws" else "plain"
        assert AG.fwd_kernel(D, 2 * top, causal) == above
    assert AG.fwd_kernel(128, 16384, True) == ("ws_persistent" if AG.FWD_PERSIST_MAX_S.get((128, True), 0) >= 16384
                                               else "ws")
    assert AG.fwd_kernel(64, 1024 + 64, True, mode=3) == "plain"  # not a multiple of 128
    assert AG.fwd_kernel(64, 1024, False, mode=3) == "ws_persistent"
    assert AG.fwd_kernel(64, 1024, False, mode=2) == "ws"
    assert AG.fwd_kernel(128, 1024, False, mode=1) == "plain"


def test_auto_mode_takes_large_calls_where_the_kernel_won():
    """Auto mode (the variants' default): the forward from GLUON_MIN_WORK up, the dK / dV kernel only at the head dims
    and lengths of DKDV_MAX_S, the dQ kernel only where DQ_MAX_S lists it; small calls stay on the Triton kernels and
    their C++ fast path (the Gluon launch is Python's)."""
    def shape(B, H, S, D):
        return torch.empty(B, H, S, D, device="meta")

    big, small = shape(2, 16, 2048, 128), shape(1, 1, 128, 64)
    assert 2 * 16 * 2048 * 2048 * 64 // 2 >= AG.GLUON_MIN_WORK
    assert AG.auto_ok("fwd_gluon", big, True) and not AG.auto_ok("fwd_gluon", small, False)
    assert AG.auto_ok("bwd_gluon_dkdv", big, True) == (128 in AG.DKDV_MAX_S)
    long64 = shape(1, 16, 16384, 64)
    assert AG.auto_ok("bwd_gluon_dkdv", long64, False) == (AG.DKDV_MAX_S.get(64, 0) is None or 16384 <= AG.DKDV_MAX_S[64])
    assert AG.auto_ok("bwd_gluon_dq", big, False) == (128 in AG.DQ_MAX_S)


def test_layouts_the_descriptors_read():
    """_layout: head-major (contiguous (B, H, S, D)) and sequence-major ((B, S, H, D) memory, packed q / k / v
    slices) views; anything else (D strided, heads not side by side, unaligned row stride) is None."""
    B, H, S, D = 2, 3, 64, 16
    x = torch.empty(B, H, S, D)
    assert AG._layout(x, B, H, S, D) == (0, B * H * S, D, D)
    t = torch.empty(B, S, H, D).transpose(1, 2)
    assert AG._layout(t, B, H, S, D) == (1, B * S, H * D, H * D)
    q = torch.empty(B, S, 3, H, D)[:, :, 0].transpose(1, 2)  # a slice of one packed projection
    assert AG._layout(q, B, H, S, D) == (1, B * S, H * D, 3 * H * D)
    assert AG._layout(torch.empty(B, H, S, 2 * D)[..., ::2], B, H, S, D) is None
    assert AG._layout(torch.empty(B, S, D, H).permute(0, 3, 1, 2), B, H, S, D) is None
    assert AG._layout(torch.empty(B, S, H * D + 4)[..., : H * D].view(B, S, H, D).transpose(1, 2), B, H, S, D) is None
    one = torch.empty(1, S, 1, D).transpose(1, 2)  # size-1 dims: their strides do not matter
    assert AG._layout(one, 1, 1, S, D) is not None


# What the spies watch: the launchers every path reaches (the public functions check, then call these; ops/attention.py
# calls them directly once its own checks passed).  "ws" / "plain": the forward's two kernels; "ws_persistent": the
# ping-pong on a persistent grid (its config's fifth entry).
_SPIED = {"ws": ("_forward", lambda a: a[5]), "plain": ("_forward", lambda a: not a[5]),
          "ws_persistent": ("_forward", lambda a: a[5] and len(a[6]) > 4 and a[6][4] != 0),
          "dkdv": ("_dkdv", None), "dq": ("_dq", None)}


def _spy(monkeypatch, what):
    """A list that gets a 1 each time the Gluon kernel ``what`` (a key of _SPIED) launches."""
    name, when = _SPIED[what]
    calls, orig = [], getattr(AG, name)

    def spied(*a, **kw):
        if when is None or when(a):
            calls.append(1)
        return orig(*a, **kw)

    monkeypatch.setattr(AG, name, spied)
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
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, D) memory: sequence-major, taken
    assert AG.supported(qt, qt, qt, False) is None
    assert "must all be" in AG.supported(q, qt, qt, False)  # one layout for the three
    qs = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16)[..., ::2]  # D not contiguous
    assert "must all be" in AG.supported(qs, qs, qs, False)


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
    """fwd_gluon=1, bwd_gluon_dkdv=1, bwd_gluon_dq=1 and bwd_gluon_gqa=1 where the Gluon kernels cannot run (here: the interpreter / no sm_90) leave
    every call on the Triton kernels, with the same results."""
    from fused_layers import fused_attention

    q, k, v = (torch.randn(1, 2, 37, 16, device=device, requires_grad=True) for _ in range(3))
    ref = fused_attention(q, k, v, is_causal=True)
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    with A.config_override("attention", fwd_gluon=1, bwd_gluon_dkdv=1, bwd_gluon_dq=1, bwd_gluon_gqa=1):
        got = fused_attention(q, k, v, is_causal=True)
        grads = torch.autograd.grad(got.sum(), (q, k, v))
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("D,S,causal", [(64, 256, True), (128, 640, False), (128, 1024, True)])
def test_gpu_variant_through_fused_attention(D, S, causal, monkeypatch):
    """fwd_gluon=1 through the public API: the Gluon forward runs (spied), the Triton backward uses its LSE, and
    output and gradients match float32; a call it does not take (a key-padding mask) stays on the Triton forward."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    calls = _spy(monkeypatch, "plain")
    q, k, v = (torch.randn(2, 4, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with A.config_override("attention", fwd_gluon=1):
        out = fused_attention(q, k, v, is_causal=causal)
        do = torch.randn_like(out)
        out.backward(do)
        assert calls == [1]
        pad = torch.ones(2, 1, 1, S, device="cuda", dtype=torch.bool)
        fused_attention(q.detach(), k.detach(), v.detach(), attn_mask=pad, is_causal=causal)
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
@pytest.mark.parametrize("S,causal", [(128, False), (256, True), (384, True), (768, False), (1024, True)])
@pytest.mark.parametrize("programs", [1, -3, -1])
@pytest.mark.parametrize("groups", [1, 3])
def test_gpu_warp_specialized_persistent(D, S, causal, programs, groups):
    """The ping-pong on a persistent grid (one program an SM, or -n: n programs in all, so each walks many tiles and
    its ring, turn and Q phases run on across tiles of different lengths and heads): bit-identical to one program a
    tile (the same operations in the same order), and against float32; grouped-query heads too."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    q = torch.randn(2, 3 * groups, S, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    base = AG.WS_CONFIGS[D][:4]
    out, lse = AG.attention_forward_gluon_ws(q, k, v, causal, config=base + (programs,))
    ref_out, ref_lse = AG.attention_forward_gluon_ws(q, k, v, causal, config=base)
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=0, rtol=0)
    kf, vf = (t.float().repeat_interleave(groups, dim=1) for t in (k, v))
    ref = F.scaled_dot_product_attention(q.float(), kf, vf, is_causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (128, True), (384, True), (640, False), (1024, True)])
def test_gpu_dkdv_kernel(D, S, causal, monkeypatch):
    """The Gluon dK / dV kernel (bwd_gluon_dkdv) through fused_attention: it runs (spied), the Triton dQ kernel
    after it; every gradient against float32 and against the Triton backward."""
    _check_backward_variant(D, S, causal, monkeypatch, "dkdv", bwd_gluon_dkdv=1, bwd_gluon_dq=0)


def _check_backward_variant(D, S, causal, monkeypatch, spied, **variants):
    """fused_attention's gradients with ``variants`` on: the kernel ``spied`` runs once; every gradient against
    float32 and against the Triton kernels (every Gluon variant off)."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    calls = _spy(monkeypatch, spied)
    q, k, v = (torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16)
    with A.config_override("attention", fwd_gluon=0, bwd_gluon_dkdv=0, bwd_gluon_dq=0):
        ref_grads = torch.autograd.grad(fused_attention(q, k, v, is_causal=causal), (q, k, v), do)
    with A.config_override("attention", **variants):
        grads = torch.autograd.grad(fused_attention(q, k, v, is_causal=causal), (q, k, v), do)
    assert calls == [1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    f32 = torch.autograd.grad(F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal), (qf, kf, vf), do.float())
    for g, r, t in zip(grads, ref_grads, f32):
        tol = 5e-2 * max(1.0, t.abs().max().item())
        torch.testing.assert_close(g.float(), t, atol=tol, rtol=5e-2)
        torch.testing.assert_close(g.float(), r.float(), atol=tol, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (128, True), (384, True), (640, False), (1024, True)])
def test_gpu_fused_dq(D, S, causal, monkeypatch):
    """bwd_gluon_fused_dq: the dK / dV kernel also accumulates dQ (atomics into fp32), no dQ kernel runs; every
    gradient against float32 and the Triton backward."""
    _check_backward_variant(D, S, causal, monkeypatch, "dkdv", bwd_gluon_dkdv=1, bwd_gluon_fused_dq=1)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_fused_dq_grouped_and_sequence_major(causal):
    """bwd_gluon_fused_dq with grouped-query heads (each program adds into the dQ rows of its G query heads) and q / k
    / v in the sequence-major layout (the fp32 buffer is head-major; dQ is cast back into q's layout)."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    B, S, H, G, D = 2, 512, 6, 3, 64
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    k, v = (torch.randn(B, S, H // G, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
            for _ in range(2))
    do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    with A.config_override("attention", bwd_gluon_dkdv=1, bwd_gluon_fused_dq=1):
        grads = torch.autograd.grad(fused_attention(q, k, v, is_causal=causal, enable_gqa=True), (q, k, v), do)
    assert grads[0].stride() == q.stride()
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, enable_gqa=True)
    for g, r in zip(grads, torch.autograd.grad(ref, (qf, kf, vf), do.float())):
        tol = 5e-2 * max(1.0, r.abs().max().item())
        torch.testing.assert_close(g.float(), r, atol=tol, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (128, True), (384, True), (640, False), (1024, True)])
def test_gpu_dq_kernel(D, S, causal, monkeypatch):
    """The Gluon dQ kernel (bwd_gluon_dq) after the Gluon dK / dV kernel, through fused_attention: it runs (spied);
    every gradient against float32 and against the Triton backward (one key block, several, causal diagonals)."""
    _check_backward_variant(D, S, causal, monkeypatch, "dq", bwd_gluon_dkdv=1, bwd_gluon_dq=1)


@pytest.mark.gpu
@pytest.mark.parametrize("D,causal", [(64, False), (64, True), (128, False), (128, True)])
@pytest.mark.parametrize("groups", [1, 4])
def test_gpu_default_dispatch(D, causal, groups, monkeypatch):
    """The defaults (auto): a large call runs the Gluon forward FWD_KERNEL names and, where DKDV_MAX_S takes it, the
    Gluon dK / dV kernel (grouped-query attention too: bwd_gluon_gqa), with the right output and gradients; a small
    call (below GLUON_MIN_WORK) runs none."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    ws, plain, persistent = _spy(monkeypatch, "ws"), _spy(monkeypatch, "plain"), _spy(monkeypatch, "ws_persistent")
    dkdv = _spy(monkeypatch, "dkdv")
    B, H, S = 2, 16, 2048
    q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for h in (H, H // groups, H // groups))
    assert AG.auto_ok("fwd_gluon", q, causal)
    out = fused_attention(q, k, v, is_causal=causal, enable_gqa=groups > 1)
    do = torch.randn_like(out)
    out.backward(do)
    want_ws = AG.fwd_kernel(D, S, causal) != "plain"
    assert (ws, plain) == (([1], []) if want_ws else ([], [1]))
    assert persistent == ([1] if AG.fwd_kernel(D, S, causal) == "ws_persistent" else [])
    assert dkdv == ([1] if AG.auto_ok("bwd_gluon_dkdv", q, causal) else [])
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, enable_gqa=groups > 1)
    ref.backward(do.float())
    torch.testing.assert_close(out.float(), ref.detach(), atol=2e-2, rtol=2e-2)
    for t, r in ((q, qf), (k, kf), (v, vf)):
        torch.testing.assert_close(t.grad.float(), r.grad, atol=5e-2 * max(1.0, r.grad.abs().max().item()), rtol=5e-2)
    small = [torch.randn(1, 2, 256, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    fused_attention(*small, is_causal=causal).sum().backward()
    assert len(ws) + len(plain) == 1 and len(dkdv) <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("mode", [1, 2])
def test_gpu_sequence_major_layouts(D, causal, packed, mode, monkeypatch):
    """q, k, v as models make them, read in place by sequence-major descriptors: the transposes of (B, S, H, D)
    projections, or slices of one packed (B, S, 3, H, D) projection.  Both forwards (mode 1 one warpgroup, 2 the
    ping-pong), the dK / dV and dQ kernels run (spied); the output is laid out like q; output and gradients against
    float32."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    fwd = _spy(monkeypatch, "ws" if mode == 2 else "plain")
    dkdv, dq = _spy(monkeypatch, "dkdv"), _spy(monkeypatch, "dq")
    B, H, S = 2, 3, 384
    if packed:
        leaves = [torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)]
        q, k, v = (t.transpose(1, 2) for t in leaves[0].unbind(2))
    else:
        leaves = [torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
        q, k, v = (t.transpose(1, 2) for t in leaves)
    do = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    with A.config_override("attention", fwd_gluon=mode, bwd_gluon_dkdv=1, bwd_gluon_dq=1):
        out = fused_attention(q, k, v, is_causal=causal)
        out.backward(do)
    assert (fwd, dkdv, dq) == ([1], [1], [1])
    assert out.transpose(1, 2).is_contiguous()  # laid out like q: (B, S, H, D) memory
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    if packed:
        rq, rk, rv = (t.transpose(1, 2) for t in ref_leaves[0].unbind(2))
    else:
        rq, rk, rv = (t.transpose(1, 2) for t in ref_leaves)
    ref = F.scaled_dot_product_attention(rq, rk, rv, is_causal=causal)
    ref.backward(do.float())
    torch.testing.assert_close(out.float(), ref.detach(), atol=2e-2, rtol=2e-2)
    for t, r in zip(leaves, ref_leaves):
        torch.testing.assert_close(t.grad.float(), r.grad, atol=5e-2 * max(1.0, r.grad.abs().max().item()), rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("groups,seq_major", [(2, False), (4, True), (8, False)])
@pytest.mark.parametrize("gluon_bwd", [False, True])
def test_gpu_grouped_query_forward(D, causal, mode, groups, seq_major, gluon_bwd, monkeypatch):
    """Grouped-query attention (k, v with H / groups heads): both Gluon forwards (mode 1 one warpgroup, 2 the
    ping-pong) read each query head's key / value head in place (head-major or sequence-major); the backward is the
    Triton one, or with bwd_gluon_gqa=1 the Gluon dK / dV kernel summing each key / value head's query heads (then the
    Triton dQ kernel); output and gradients against float32 with the heads repeated."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    fwd = _spy(monkeypatch, "ws" if mode == 2 else "plain")
    dkdv = _spy(monkeypatch, "dkdv")
    B, H, S = 2, 8, 384

    def make(heads):
        if seq_major:
            return torch.randn(B, S, heads, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        return torch.randn(B, heads, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = make(H), make(H // groups), make(H // groups)
    with A.config_override("attention", fwd_gluon=mode, bwd_gluon_dkdv=1, bwd_gluon_gqa=int(gluon_bwd)):
        out = fused_attention(q, k, v, is_causal=causal, enable_gqa=True)
        do = torch.randn_like(out)
        out.backward(do)
    assert fwd == [1] and dkdv == ([1] if gluon_bwd else [])
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf.repeat_interleave(groups, 1), vf.repeat_interleave(groups, 1),
                                         is_causal=causal)
    ref.backward(do.float())
    torch.testing.assert_close(out.float(), ref.detach(), atol=2e-2, rtol=2e-2)
    for t, r in ((q, qf), (k, kf), (v, vf)):
        torch.testing.assert_close(t.grad.float(), r.grad, atol=5e-2 * max(1.0, r.grad.abs().max().item()), rtol=5e-2)
