"""The TMA cross-entropy (fused_layers/ops/cross_entropy_gluon.py), the default of 16-bit rows of at most 32,768
classes on an sm_90 GPU: GPU only (Gluon has no interpreter).  On the CPU: what it declines.  On an sm_90 GPU: loss
and gradient against F.cross_entropy, directly and through fused_cross_entropy."""

import pytest
import torch

from fused_layers.ops import cross_entropy_config as cfg
from fused_layers.ops import cross_entropy_gluon as CG


def test_declines_what_it_does_not_take():
    """CPU tensors, float32 and unaligned rows are declined with a reason; ce_launch then launches nothing."""
    x = torch.randn(4, 256)
    assert CG.supported(x) is not None
    assert CG.supported(x.bfloat16()) is not None  # (a CPU tensor)
    t = torch.zeros(4, dtype=torch.int64)
    assert not CG.ce_launch(x.bfloat16(), t, None, -100, torch.ones(2), True, torch.empty(4), torch.empty_like(x),
                            cfg.TMA_HOLD[2])


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and CG.HAS_GLUON


@pytest.mark.gpu
@pytest.mark.parametrize("M,C", [(1, 4096), (37, 32000), (300, 32768), (5, 24576)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gpu_ce_launch(M, C, weighted, reduction):
    """ce_launch's per-row losses and gradient against F.cross_entropy on float32 logits, with ignored rows (one row
    in three) and class weights."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers.ops.cross_entropy import launch_den

    x = torch.randn(M, C, device="cuda", dtype=torch.bfloat16) * 3
    t = torch.randint(0, C, (M,), device="cuda")
    t[1::3] = -100
    w = (torch.rand(C, device="cuda") + 0.5).to(x.dtype) if weighted else None
    den = launch_den(t, w, M, C, -100)
    rows = torch.empty(M, dtype=torch.float32, device="cuda")
    grad = torch.empty_like(x)
    assert CG.ce_launch(x, t, w, -100, den, reduction == "mean", rows, grad, cfg.TMA_HOLD[2])
    xf = x.float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xf, t, weight=None if w is None else w.float(), reduction=reduction)
    ref.backward()
    torch.testing.assert_close(rows.sum(), ref.detach(), atol=2e-2 * max(1.0, ref.abs().item()), rtol=1e-2)
    torch.testing.assert_close(grad.float(), xf.grad, atol=8e-3 * max(1e-6, xf.grad.abs().max().item()), rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,C", [(1, 32000), (37, 32000), (300, 32768), (5, 24576), (9, 16640)])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_tma_hold_default(M, C, dtype, weighted, monkeypatch):
    """fused_cross_entropy with its backward runs the TMA kernel (spied) on 16-bit rows of
    cross_entropy_config.TMA_HOLD; loss and gradient against F.cross_entropy on float32 logits, with ignored rows,
    class weights, both reductions, rows sliced from a wider buffer, special values (a -inf logit, a -inf target
    logit, a +inf logit, a NaN, an all -inf row); reduction 'none' takes the persistent kernel; an all-ignored batch
    matches torch (a NaN mean, a zero gradient)."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from fused_layers import fused_cross_entropy

    calls = []
    orig = CG.ce_launch
    monkeypatch.setattr(CG, "ce_launch", lambda *a, **kw: calls.append(a[-1]) or orig(*a, **kw))
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
            assert calls == ([] if reduction == "none" else [cfg.TMA_HOLD[2]]), (name, reduction, calls)
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
