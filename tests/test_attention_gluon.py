"""The Gluon attention kernels (fused_layers/ops/attention_gluon.py): GPU only (Gluon has no interpreter).

On the CPU: what they refuse and how they say so, the routing rules (which forward, which calls), the layouts the
descriptors read.  On an sm_90 GPU: each forward kernel's O and base-2 LSE against float32 (and the Triton backward fed
its O / LSE), the persistent ping-pong bit-identical to one program a tile, the dK / dV kernel's gradients, GQA and
the sequence-major layouts through ``fused_attention``.  The tests reach every kernel at small sizes by lowering the
routing thresholds (``GLUON_MIN_WORK``, ``GLUON_DKDV_MAX_S``) or fixing the forward ``fwd_kernel`` names.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from fused_layers.ops import _cpp
from fused_layers.ops import attention as A
from fused_layers.ops import attention_gluon as AG


def test_refuses_what_it_does_not_take():
    """``supported`` names why (CPU tensors here; on an sm_90 GPU the shape rules below), and the checked entry points
    raise ValueError with that reason instead of a Triton trace."""
    q = torch.randn(1, 2, 128, 64)
    assert AG.supported(q, q, q, False) is not None
    with pytest.raises(ValueError, match="attention_forward_gluon"):
        AG.attention_forward_gluon(q, q, q, False)
    lse = torch.zeros(1, 2, 128)
    with pytest.raises(ValueError, match="attention_dkdv_gluon"):
        AG.attention_dkdv_gluon(q, q, q, q, lse, lse, torch.empty_like(q), torch.empty_like(q), False, 0.125)


def test_off_the_gpu_the_triton_kernels_run(device):
    """Under the interpreter (or off sm_90) no call goes to the Gluon kernels."""
    q = torch.randn(1, 2, 128, 64, device=device)
    if A.INTERPRET or not q.is_cuda or torch.cuda.get_device_capability()[0] != 9:
        assert not A._gluon_takes(q, q, q, True, "fwd") and not A._gluon_takes(q, q, q, True, "dkdv")


def test_forward_kernel_choice():
    """fwd_kernel: the persistent ping-pong up to GLUON_FWD_PERSISTENT_MAX_S, else the kernel GLUON_FWD_KERNEL names;
    the ping-pong forms only where S is a multiple of 128 (else the one-warpgroup kernel)."""
    for (D, causal), top in AG.GLUON_FWD_PERSISTENT_MAX_S.items():
        assert AG.fwd_kernel(D, top, causal) == "ws_persistent"
        assert AG.fwd_kernel(D, 2 * top, causal) == AG.GLUON_FWD_KERNEL[(D, causal)]
    assert AG.fwd_kernel(128, 16384, True) == "ws"
    assert AG.fwd_kernel(64, 16384, False) == "plain"
    assert AG.fwd_kernel(128, 1024 + 64, True) == "plain"  # not a multiple of 128
    assert AG.fwd_kernel(128, 4096 + 64, False) == "plain"


def test_auto_mode_takes_large_calls_where_the_kernel_won():
    """The forward from GLUON_MIN_WORK up, the dK / dV kernel only to the lengths of GLUON_DKDV_MAX_S; small calls stay
    on the Triton kernels and their C++ launch path (the Gluon launch is Python's)."""
    def shape(B, H, S, D):
        return torch.empty(B, H, S, D, device="meta")

    big, small = shape(2, 16, 2048, 128), shape(1, 1, 128, 64)
    assert 2 * 16 * 2048 * 2048 * 64 // 2 >= AG.GLUON_MIN_WORK
    assert AG.auto_ok("fwd", big, True) and not AG.auto_ok("fwd", small, False)
    assert AG.auto_ok("dkdv", big, True) and not AG.auto_ok("dkdv", small, False)
    long64, long128 = shape(1, 16, 16384, 64), shape(1, 16, 16384, 128)
    assert AG.auto_ok("fwd", long64, False) and not AG.auto_ok("dkdv", long64, False)  # D64 dK / dV: to S 4K
    assert AG.auto_ok("dkdv", long128, False)


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


def _spy(monkeypatch):
    """(forward kinds launched, dK / dV launches): lists that grow as the Gluon kernels launch."""
    fwd, dkdv = [], []
    orig_fwd, orig_dkdv = AG._forward, AG.dkdv

    def spied_fwd(*a, **kw):
        fwd.append(a[5])
        return orig_fwd(*a, **kw)

    def spied_dkdv(*a, **kw):
        dkdv.append(1)
        return orig_dkdv(*a, **kw)

    monkeypatch.setattr(AG, "_forward", spied_fwd)
    monkeypatch.setattr(AG, "dkdv", spied_dkdv)
    return fwd, dkdv


def _route_small_calls(monkeypatch, kind=None):
    """Every supported call to the Gluon kernels (forward and dK / dV), whatever its size; ``kind``: the forward."""
    monkeypatch.setattr(AG, "GLUON_MIN_WORK", 0)
    monkeypatch.setattr(AG, "GLUON_DKDV_MAX_S", {64: None, 128: None})
    if kind is not None:
        monkeypatch.setattr(AG, "fwd_kernel", lambda D, S, causal: kind)


def test_cpp_fast_path_leaves_gluon_calls_to_python(monkeypatch):
    """The C++ fast path launches the Triton kernels: a dense layout the Gluon forward takes (the sm_90 check patched
    in, the thresholds lowered) is never registered with it, nor, for a call with autograd, one the Gluon dK / dV
    kernel takes, even where a Triton plan exists for the layout (a call Gluon did not take made it); layouts they do
    not take, and dropout calls, are registered."""
    registered = []
    monkeypatch.setattr(_cpp, "register", lambda kernel, *a: registered.append(kernel) or len(registered) - 1)
    monkeypatch.setattr(_cpp, "_is_compiled", lambda kernel, key: True)  # (nothing is compiled on the CPU)
    monkeypatch.setattr(_cpp, "register_plan", lambda name, *handles: ("plan", name))
    monkeypatch.setattr(A, "INTERPRET", False)
    monkeypatch.setattr(AG, "HAS_GLUON", True)
    monkeypatch.setattr(AG, "_on_sm90", lambda t: True)
    monkeypatch.setattr(AG, "_SUPPORTED", {})  # no verdict for the patched device outlives the test
    B, H, S, D = 2, 3, 128, 64
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.bfloat16) for _ in range(3))

    def register(grad, dropout=False):
        registered.clear()
        plan = A._fwd_plan(A._fwd_key(q, k, v, S, S, True, dropout))
        return A._cpp_attention_register(plan, q, k, v, S, S, True, 0.125, grad, 0.1 if dropout else 0.0)

    assert AG.supported(q, q, q, True) is None and not A._gluon_takes(q, k, v, True, "fwd")  # below GLUON_MIN_WORK
    assert register(False) == ("plan", "register_attention") and len(registered) == 1
    _route_small_calls(monkeypatch)
    assert A._gluon_takes(q, k, v, True, "fwd") and A._gluon_takes(q, k, v, True, "dkdv")
    assert register(False) is False and register(True) is False and registered == []
    assert register(False, dropout=True) == ("plan", "register_attention")  # the Gluon kernels have no dropout
    monkeypatch.setattr(AG, "auto_ok", lambda kernel, q, causal: kernel == "dkdv")  # the dK / dV kernel alone
    assert register(False) == ("plan", "register_attention")
    assert register(True) is False and registered == []


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and AG.HAS_GLUON


def _close_to_float32(pairs):
    """Each (got, float32 reference) gradient pair within 5 % of the reference's largest magnitude."""
    for g, r in pairs:
        torch.testing.assert_close(g.float(), r, atol=5e-2 * max(1.0, r.abs().max().item()), rtol=5e-2)


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
    assert AG.supported(q, qt, qt, False) is None  # k and v may have a layout of their own
    assert "k and v alike" in AG.supported(q, q, qt, False)
    qs = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16)[..., ::2]  # D not contiguous
    assert "must each be" in AG.supported(qs, qs, qs, False)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["plain", "ws", "ws_persistent"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (128, True), (384, True), (640, False), (1024, True)])
def test_gpu_forward_and_triton_backward(kind, D, S, causal):
    """Each forward kernel: O and LSE against float32 on ragged block counts (one key block, several, causal
    diagonals); the Triton backward fed its O / LSE gives float32's gradients."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    if kind != "plain" and S % 128:
        pytest.skip("the ping-pong's 128-row query tiles")
    if kind == "plain" and S % AG.GLUON_FWD_TILES[D].block_n:
        pytest.skip("the one-warpgroup kernel's key tiles")
    B, H = 2, 3
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = AG._forward(q, k, v, causal, None, kind)
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
    _close_to_float32(zip(grads, (qf.grad, kf.grad, vf.grad)))


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (256, True), (384, True), (768, False), (1024, True)])
@pytest.mark.parametrize("programs", [1, 3, None])
@pytest.mark.parametrize("groups", [1, 3])
def test_gpu_warp_specialized_persistent(D, S, causal, programs, groups, monkeypatch):
    """The ping-pong on a persistent grid (one program an SM; ``programs`` SMs counted, so that each program walks many
    tiles and its ring, turn and Q phases run on across tiles of different lengths and heads): bit-identical to one
    program a tile (the same operations in the same order), and against float32; grouped-query heads too."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    if programs is not None:
        monkeypatch.setattr(AG, "_sm_count", lambda device: programs)
    q = torch.randn(2, 3 * groups, S, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = AG._forward(q, k, v, causal, None, "ws_persistent")
    ref_out, ref_lse = AG._forward(q, k, v, causal, None, "ws")
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=0, rtol=0)
    kf, vf = (t.float().repeat_interleave(groups, dim=1) for t in (k, v))
    ref = F.scaled_dot_product_attention(q.float(), kf, vf, is_causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S,causal", [(128, False), (128, True), (384, True), (640, False), (1024, True)])
def test_gpu_dkdv_kernel(D, S, causal, monkeypatch):
    """The Gluon dK / dV kernel through fused_attention (then the Triton dQ kernel): it runs (spied); every gradient
    against float32 and against the Triton backward."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    q, k, v = (torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(2, 3, S, D, device="cuda", dtype=torch.bfloat16)
    with monkeypatch.context() as m:
        m.setattr(A, "_gluon_takes", lambda *a: False)  # the Triton kernels alone
        ref_grads = torch.autograd.grad(fused_attention(q, k, v, is_causal=causal), (q, k, v), do)
    _route_small_calls(monkeypatch)
    fwd, dkdv = _spy(monkeypatch)
    # The reference pass left a Triton plan for this layout: the C++ fast path must still leave the call to Gluon.
    grads = torch.autograd.grad(fused_attention(q, k, v, is_causal=causal), (q, k, v), do)
    assert dkdv == [1] and len(fwd) == 1, (fwd, dkdv)
    if _cpp.ENABLED:  # declined for good, whether or not the extension had finished building
        assert A._FWD_PLANS[A._fwd_key(q, k, v, S, S, causal)].cpp.get((q.get_device(), True)) is False
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    f32 = torch.autograd.grad(F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal), (qf, kf, vf), do.float())
    _close_to_float32(zip(grads, f32))
    _close_to_float32((g, r.float()) for g, r in zip(grads, ref_grads))


@pytest.mark.gpu
@pytest.mark.parametrize("D,causal", [(64, False), (64, True), (128, False), (128, True)])
@pytest.mark.parametrize("groups", [1, 4])
def test_gpu_default_dispatch(D, causal, groups, monkeypatch):
    """The defaults: a large call runs the Gluon forward ``fwd_kernel`` names and, where GLUON_DKDV_MAX_S takes it,
    the Gluon dK / dV kernel (grouped-query attention too), with the right output and gradients; a small call (below
    GLUON_MIN_WORK) runs none."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    fwd, dkdv = _spy(monkeypatch)
    B, H, S = 2, 16, 2048
    q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for h in (H, H // groups, H // groups))
    assert AG.auto_ok("fwd", q, causal)
    out = fused_attention(q, k, v, is_causal=causal, enable_gqa=groups > 1)
    do = torch.randn_like(out)
    out.backward(do)
    assert fwd == [AG.fwd_kernel(D, S, causal)]
    assert dkdv == ([1] if AG.auto_ok("dkdv", q, causal) else [])
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, enable_gqa=groups > 1)
    ref.backward(do.float())
    torch.testing.assert_close(out.float(), ref.detach(), atol=2e-2, rtol=2e-2)
    _close_to_float32(((q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)))
    small = [torch.randn(1, 2, 256, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    fused_attention(*small, is_causal=causal).sum().backward()
    assert len(fwd) == 1 and len(dkdv) <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kind", ["plain", "ws"])
def test_gpu_sequence_major_layouts(D, causal, packed, kind, monkeypatch):
    """q, k, v as models make them, read in place by sequence-major descriptors: the transposes of (B, S, H, D)
    projections, or slices of one packed (B, S, 3, H, D) projection.  Both forwards and the dK / dV kernel run
    (spied); the output is laid out like q; output and gradients against float32."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    _route_small_calls(monkeypatch, kind)
    fwd, dkdv = _spy(monkeypatch)
    B, H, S = 2, 3, 384
    if packed:
        leaves = [torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)]
        q, k, v = (t.transpose(1, 2) for t in leaves[0].unbind(2))
    else:
        leaves = [torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
        q, k, v = (t.transpose(1, 2) for t in leaves)
    do = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    out = fused_attention(q, k, v, is_causal=causal)
    out.backward(do)
    assert (fwd, dkdv) == ([kind], [1])
    assert out.transpose(1, 2).is_contiguous()  # laid out like q: (B, S, H, D) memory
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    if packed:
        rq, rk, rv = (t.transpose(1, 2) for t in ref_leaves[0].unbind(2))
    else:
        rq, rk, rv = (t.transpose(1, 2) for t in ref_leaves)
    ref = F.scaled_dot_product_attention(rq, rk, rv, is_causal=causal)
    ref.backward(do.float())
    torch.testing.assert_close(out.float(), ref.detach(), atol=2e-2, rtol=2e-2)
    _close_to_float32((t.grad, r.grad) for t, r in zip(leaves, ref_leaves))


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["plain", "ws"])
@pytest.mark.parametrize("groups,seq_major", [(2, False), (4, True), (8, False)])
def test_gpu_grouped_query(D, causal, kind, groups, seq_major, monkeypatch):
    """Grouped-query attention (k, v with H / groups heads): both forwards read each query head's key / value head in
    place (head-major or sequence-major); the dK / dV kernel sums each key / value head's query heads (then the
    Triton dQ kernel); output and gradients against float32 with the heads repeated."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_attention

    _route_small_calls(monkeypatch, kind)
    fwd, dkdv = _spy(monkeypatch)
    B, H, S = 2, 8, 384

    def make(heads):
        if seq_major:
            return torch.randn(B, S, heads, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        return torch.randn(B, heads, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = make(H), make(H // groups), make(H // groups)
    out = fused_attention(q, k, v, is_causal=causal, enable_gqa=True)
    do = torch.randn_like(out)
    out.backward(do)
    assert fwd == [kind] and dkdv == [1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf.repeat_interleave(groups, 1), vf.repeat_interleave(groups, 1),
                                         is_causal=causal)
    ref.backward(do.float())
    torch.testing.assert_close(out.float(), ref.detach(), atol=2e-2, rtol=2e-2)
    _close_to_float32(((q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)))
