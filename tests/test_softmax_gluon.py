"""Issue 10's TMA wide-row softmax forward (fused_layers/ops/softmax_gluon.py): GPU only (Gluon has no interpreter).
On the CPU: what it refuses and how it says so.  On an sm_90 GPU: y against a float32 torch.softmax on ragged shapes
(a last chunk with a partial box and whole boxes past N, one row, fewer rows than programs, several chunks and rows a
program), strided rows, special values."""

import pytest
import torch

from fused_layers.ops import softmax_gluon as SG


def test_refuses_what_it_does_not_take():
    """CPU tensors, wrong dtypes and unaligned rows get a ValueError naming the launcher and the reason."""
    with pytest.raises(ValueError, match="softmax_forward_tma"):
        SG.softmax_forward_tma(torch.randn(4, 64))
    assert SG.supported(torch.randn(4, 64)) is not None


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and SG.HAS_GLUON


def _check(x, y):
    ref = torch.softmax(x.float(), dim=1)
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 2e-3}[x.dtype]
    torch.testing.assert_close(y.float(), ref, atol=tol * max(1.0, ref.abs().max().item()), rtol=tol, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("M,N", [(1, 4104), (5, 50304), (300, 32768), (7, 131336), (2, 262144), (1000, 8)])
def test_gpu_matches_torch(M, N, dtype):
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    x = torch.randn(M, N, device="cuda", dtype=dtype) * 4
    _check(x, SG.softmax_forward_tma(x))
    _check(x, SG.softmax_forward_tma(x, (8, 256, 8, 2, 4, 2, 1, 4)))  # split rows (and HOLD where a segment fits)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [(16, 256, 8, 2, 4, 2), (8, 256, 4, 1, 4, 1), (4, 128, 12, 3, 4, 3), (32, 256, 4, 2, 8, 1),
                                    (16, 256, 8, 2, 4, 2, 1), (8, 256, 12, 2, 4, 2, 1), (16, 256, 8, 2, 4, 2, 0, 4),
                                    (16, 256, 8, 2, 4, 2, 1, 2), (4, 256, 4, 2, 4, 2, 1, 8), (16, 256, 8, 2, 4, 2, 0, 1, 1),
                                    (32, 128, 8, 2, 4, 2, 0, 1, 1), (16, 256, 8, 2, 4, 2, 1, 4, 1), (16, 256, 8, 2, 4, 2, 0, 1, 1, 0),
                                    (16, 256, 8, 2, 8, 2, 0, 1, 1), (4, 256, 8, 2, 8, 2, 0, 1, 1), (16, 256, 8, 2, 4, 2, 1, 1, 1),
                                    (32, 256, 4, 2, 4, 2, 1, 1, 1)])
@pytest.mark.parametrize("N", [20000, 32768, 50304])
def test_gpu_configs(config, N):
    """Other ring depths, chunk shapes, warps and CTAs an SM (the sweep's candidates), HOLD (a 7th entry of 1: the
    row kept in the ring where it fits, else streamed), split rows (an 8th entry K: K programs a row exchanging their
    (max, sum)), FLAT (a 9th entry 1: one (1, SUB, BOX) box a chunk where N % BOX == 0) and plain stores (a
    10th entry 0) give the same answer."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    x = torch.randn(523, N, device="cuda", dtype=torch.bfloat16) * 4
    _check(x, SG.softmax_forward_tma(x, config))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, (16, 256, 8, 2, 4, 2, 1, 4), (16, 256, 10, 2, 4, 2, 1)])
def test_gpu_strided_rows_and_special_values(config):
    """Rows of a wider buffer (16-byte aligned stride) read in place; an all -inf row gives NaN, a row with +inf or NaN
    is NaN, a row of -inf then finite values and huge finite logits are exact, as torch.softmax."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    base = torch.randn(9, 40000, device="cuda", dtype=torch.bfloat16) * 4
    x = base[:, 8:33008]
    x[0] = -float("inf")
    x[1, 5] = float("inf")
    x[2, 30000] = float("nan")
    x[3, :20000] = -float("inf")
    x[4] = x[4] * 1e4
    x[5, 20000:] = -float("inf")  # a segment of only -inf (split rows) in a finite row
    _check(x, SG.softmax_forward_tma(x, config))


@pytest.mark.gpu
@pytest.mark.parametrize("M,C", [(1, 4104), (37, 32000), (5, 50304), (3, 128256)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("config", [None, (16, 256, 8, 2, 4, 2, 0, 1, 1), (16, 256, 16, 2, 16, 1, 1, 1, 1)])
def test_gpu_cross_entropy(M, C, weighted, reduction, config):
    """cross_entropy_tma's loss and gradient against F.cross_entropy on float32 logits, with ignored rows (one row in
    three) and class weights; also FLAT boxes (where C % 256 == 0, else the (1, BOX) boxes) and HOLD in one 16-warp CTA
    an SM (the row kept in the ring where it fits: 4,104 and 32,000; streamed at 50,304 and 128,256)."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    x = torch.randn(M, C, device="cuda", dtype=torch.bfloat16) * 3
    t = torch.randint(0, C, (M,), device="cuda")
    t[1::3] = -100
    w = torch.rand(C, device="cuda") + 0.5 if weighted else None
    loss, grad = SG.cross_entropy_tma(x, t, w, reduction=reduction, config=config)
    xf = x.float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xf, t, weight=w, reduction=reduction)
    ref.backward()
    torch.testing.assert_close(loss.float(), ref.detach(), atol=2e-2 * max(1.0, ref.abs().item()), rtol=1e-2)
    torch.testing.assert_close(grad.float(), xf.grad, atol=8e-3 * max(1e-6, xf.grad.abs().max().item()), rtol=2e-2,
                               equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_through_the_public_ops(dtype, monkeypatch):
    """softmax_config.WIDE_MODE 3 and cross_entropy_config.WIDE_MODE 4 route fused_softmax (last dim, 3-D input; forward
    and backward) and fused_cross_entropy (with its backward) through the TMA kernels (spied); a softmax over another dim and a
    non-viewable layout stay on the Triton kernels; answers against float32 torch."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_cross_entropy, fused_softmax
    from fused_layers.ops import softmax as SM

    calls = []
    for name in ("softmax_forward_tma", "softmax_backward_tma", "ce_launch"):
        orig = getattr(SG, name)
        monkeypatch.setattr(SG, name, lambda *a, _o=orig, _n=name, **kw: calls.append(_n) or _o(*a, **kw))
    x = (torch.randn(3, 5, 70000, device="cuda", dtype=dtype) * 4).requires_grad_()
    with SM.config_override("softmax", wide_mode=3):
        y = fused_softmax(x, -1)
        dy = torch.randn_like(y)
        y.backward(dy)
        assert calls == ["softmax_forward_tma", "softmax_backward_tma"]
        _check(x.detach().reshape(15, -1), y.detach().reshape(15, -1))
        xf = x.detach().float().requires_grad_()
        torch.softmax(xf, -1).backward(dy.float())
        torch.testing.assert_close(x.grad.float(), xf.grad, atol=1e-2 * xf.grad.abs().max().item(), rtol=1e-2)
        x = x.detach()
        xt = x.transpose(0, 1)  # rows not viewable as (15, N) without a copy: the persistent kernels
        torch.testing.assert_close(fused_softmax(xt, -1).float(), torch.softmax(xt.float(), -1), atol=1e-2, rtol=1e-2)
        assert calls == ["softmax_forward_tma", "softmax_backward_tma"]
    logits = (torch.randn(64, 50304, device="cuda", dtype=dtype) * 3).requires_grad_()
    t = torch.randint(0, 50304, (64,), device="cuda")
    t[::5] = -100
    with SM.config_override("cross_entropy", wide_mode=4):
        loss = fused_cross_entropy(logits, t)
        loss.backward()
    assert calls[-1] == "ce_launch"
    xf = logits.detach().float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xf, t)
    ref.backward()
    torch.testing.assert_close(loss.float(), ref.detach(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(logits.grad.float(), xf.grad, atol=1e-2 * xf.grad.abs().max().item(), rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,N", [(1, 4104), (5, 50304), (300, 32768), (3, 262144)])
@pytest.mark.parametrize("config", [None, (16, 256, 4, 2, 4, 2, 0, 1, 1), (16, 256, 4, 2, 8, 2, 0, 1, 1)])
def test_gpu_backward(M, N, dtype, config):
    """softmax_backward_tma against torch's softmax backward in float32, y from a real softmax, dy random; also FLAT
    boxes (where N % 256 == 0)."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    y = torch.softmax(torch.randn(M, N, device="cuda") * 4, dim=1).to(dtype)
    dy = torch.randn(M, N, device="cuda", dtype=dtype)
    dx = SG.softmax_backward_tma(y, dy, config)
    ref = torch._softmax_backward_data(dy.float(), y.float(), 1, torch.float32)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(dx.float(), ref, atol=tol * ref.abs().max().item(), rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,C", [(1, 32000), (37, 32000), (300, 32768), (5, 24576), (9, 16640)])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_tma_hold_default(M, C, dtype, weighted, monkeypatch):
    """The default of 16-bit rows in cross_entropy_config.TMA_HOLD (session 23): fused_cross_entropy with its backward
    runs the TMA kernel with the row held (spied); loss and gradient against F.cross_entropy on float32 logits, with
    ignored rows, class weights, both reductions, rows sliced from a wider buffer, special values (a -inf logit, a -inf
    target logit, a +inf logit, a NaN, an all -inf row); reduction 'none' takes the persistent kernel; an all-ignored
    batch matches torch (a NaN mean, a zero gradient)."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_cross_entropy

    calls = []
    orig = SG.ce_launch
    monkeypatch.setattr(SG, "ce_launch", lambda *a, **kw: calls.append(a[-1] if len(a) > 8 else kw.get("config"))
                        or orig(*a, **kw))
    base = torch.randn(M, C + 256, device="cuda", dtype=torch.float32) * 3
    t = torch.randint(0, C, (M,), device="cuda")
    t[1::3] = -100
    w = (torch.rand(C, device="cuda") + 0.5).to(dtype) if weighted else None
    cases = [("plain", base[:, :C].to(dtype).contiguous()), ("sliced", base.to(dtype)[:, :C])]
    if M >= 9:
        sv = base[:, :C].clone()
        sv[0, 5] = float("-inf")  # an ordinary -inf logit
        sv[2, t[2]] = float("-inf")  # the target's logit -inf: loss inf
        sv[3, 7] = float("inf")  # +inf: NaN row
        sv[5, 11] = float("nan")
        sv[6] = float("-inf")  # all -inf
        cases.append(("special", sv.to(dtype)))
    for name, x in cases:
        for reduction in ("mean", "sum", "none"):
            calls.clear()
            xr = x.detach().requires_grad_()
            loss = fused_cross_entropy(xr, t, weight=w, reduction=reduction)
            (loss.sum() if reduction == "none" else loss).backward()
            assert calls == ([] if reduction == "none" else [_hold_config()]), (name, reduction, calls)
            xf = x.detach().float().requires_grad_()
            ref = torch.nn.functional.cross_entropy(xf, t, weight=None if w is None else w.float(), reduction=reduction)
            (ref.sum() if reduction == "none" else ref).backward()
            scale = max(1.0, ref.detach().abs().max().nan_to_num(0, 0, 0).item())
            torch.testing.assert_close(loss.float(), ref.detach(), atol=2e-2 * scale, rtol=1e-2, equal_nan=True,
                                       msg=lambda m: f"{name} {reduction} loss: {m}")
            g = xf.grad.nan_to_num(0, 0, 0).abs().max().item()
            torch.testing.assert_close(xr.grad.float(), xf.grad, atol=8e-3 * max(1e-6, g), rtol=2e-2, equal_nan=True,
                                       msg=lambda m: f"{name} {reduction} grad: {m}")
    tt = torch.full((M,), -100, device="cuda")  # every row ignored: mean is NaN (0 / 0), the gradient 0, as torch
    xr = cases[0][1].detach().requires_grad_()
    loss = fused_cross_entropy(xr, tt)
    loss.backward()
    xf = cases[0][1].detach().float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xf, tt)
    ref.backward()
    torch.testing.assert_close(loss.float(), ref.detach(), equal_nan=True)
    torch.testing.assert_close(xr.grad.float(), xf.grad, equal_nan=True)


def _hold_config():
    from fused_layers.ops import cross_entropy_config as cfg

    return cfg.TMA_HOLD[2][0][1]
