"""The 16-bit rule of tests/_tol.py can fail: wrong results built from correct ones are rejected at the suite's sizes.

Each test computes a fused op's output and gradients on the interpreter with the kernels the op tests force (chunked
and persistent LayerNorm pieces, VEC8 / persistent softmax, the persistent cross-entropy), checks that the rule
accepts them, then perturbs them the ways a wrong kernel would (a gradient x 0.95, a dropped last column, dx without
its projection terms, pieces that never exchange their row sums) and checks that the rule rejects every one, on
a fresh draw each run (RATIOS keeps each check's error / allowed error).
"""

import pytest
import torch
import torch.nn.functional as F
from _tol import attention_refs, softmax_backward_refs, tol_error, within_torch

from fused_layers import fused_attention, fused_cross_entropy, fused_layer_norm, fused_softmax
from fused_layers.ops._common import config_override
from fused_layers.ops.attention import attention_reference
from fused_layers.ops.layer_norm import config_override as ln_override
from fused_layers.ops.layer_norm_config import BwdChunks, FwdChunks

HALF = [torch.bfloat16, torch.float16]
DRAWS = 1  # a fresh draw every run (tests/conftest.py); the _tol.py docstring's numbers: 2 draws x 16 seeds
PIECE = 16  # the column pieces the op tests force


RATIOS: dict[str, list[float]] = {}  # error / allowed error per check, kept for the docstring's numbers in _tol.py


def _ratio(ours, ref, torch_ref, relative=False):
    """error / allowed error of the form that decides (the larger of the max and, with ``relative``, the per-entry
    form): <= 1 passes."""
    forms = (False, True) if relative else (False,)
    return max(e / max(a, 1e-30) for e, a in (tol_error(ours, ref, torch_ref, relative=r) for r in forms))


def _accepted(name, ours, ref, torch_ref, relative=False):
    RATIOS.setdefault("ok " + name, []).append(_ratio(ours, ref, torch_ref, relative))
    return within_torch(ours, ref, torch_ref, relative=relative)


def _rejected(name, wrong, ref, torch_ref, relative=False):
    """(rejected?, error / allowed error of the form that decides)."""
    ratio = _ratio(wrong, ref, torch_ref, relative)
    RATIOS.setdefault("bad " + name, []).append(ratio)
    return not within_torch(wrong, ref, torch_ref, relative=relative), ratio


def _ln_dx_pieces(x, w, dy, eps, piece=None, projection=True):
    """LayerNorm dx in float64; ``piece``: each column piece uses its own sums (no exchange); ``projection=False``:
    rstd * w * dy, the two projection terms missing."""
    x, w, dy = x.double(), w.double(), dy.double()
    mu = x.mean(-1, keepdim=True)
    rstd = (x.var(-1, unbiased=False, keepdim=True) + eps).rsqrt()
    xhat, wdy = (x - mu) * rstd, w * dy
    if not projection:
        return rstd * wdy
    if piece is None:
        return rstd * (wdy - wdy.mean(-1, keepdim=True) - xhat * (wdy * xhat).mean(-1, keepdim=True))
    n = x.shape[-1]
    outs = []
    for s in range(0, n, piece):
        a, b = wdy[:, s:s + piece], xhat[:, s:s + piece]
        outs.append(rstd * (a - a.sum(-1, keepdim=True) / n - b * (a * b).sum(-1, keepdim=True) / n))
    return torch.cat(outs, -1)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("n", [48, 131])
def test_layer_norm_rule_rejects_wrong_gradients(dtype, n, device):
    for _ in range(DRAWS):
        x = (torch.randn(7, n, dtype=dtype, device=device) * 2 + 0.5).requires_grad_(True)
        w = torch.randn(n, dtype=dtype, device=device).requires_grad_(True)
        b = torch.randn(n, dtype=dtype, device=device).requires_grad_(True)
        dy = torch.randn(7, n, dtype=dtype, device=device)
        with ln_override("layer_norm", fwd=FwdChunks(16, 4), bwd=BwdChunks(16, 4, 1), programs=2):
            y = fused_layer_norm(x, n, w, b, 1e-5)
            dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
        leaves64 = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
        y64 = F.layer_norm(leaves64[0], (n,), leaves64[1], leaves64[2], 1e-5)
        ref = (y64, *torch.autograd.grad(y64, leaves64, dy.double()))
        y_t = F.layer_norm(x, (n,), w, b, 1e-5)
        tor = (y_t, *torch.autograd.grad(y_t, (x, w, b), dy))
        for what, a, r, t in zip(("ln y", "ln dx", "ln dW", "ln dB"), (y, dx, dw, db), ref, tor):
            assert _accepted(what, a, r, t), (what, tol_error(a, r, t))
        wrong = {
            "dx x 0.95": (dx * 0.95, 1), "dW x 0.95": (dw * 0.95, 2), "dB x 0.95": (db * 0.95, 3),
            "y x 0.95": (y * 0.95, 0), "dx x 0.2": (dx * 0.2, 1),
            "dx without projection terms": (_ln_dx_pieces(x, w, dy, 1e-5, projection=False).to(dtype), 1),
            "dx pieces without exchange": (_ln_dx_pieces(x, w, dy, 1e-5, piece=PIECE).to(dtype), 1),
        }
        for name, (bad, i) in wrong.items():
            rej, ratio = _rejected("ln " + name, bad, ref[i], tor[i])
            assert rej, (name, ratio)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("n", [45, 112])
def test_softmax_rule_rejects_wrong_rows(dtype, n, device):
    for _ in range(DRAWS):
        x = torch.randn(9, n, dtype=dtype, device=device) * 4
        x[0, -1] = x[0].max() + 1  # one row's largest probability in the last column: a dropped column must show
        x.requires_grad_(True)
        dy = torch.randn(9, n, dtype=dtype, device=device)
        with config_override("softmax", max_single_block=8, eager_max_single_block=8, persist_block=16):
            y = fused_softmax(x, -1)
            (dx,) = torch.autograd.grad(y, x, dy)
        y64 = torch.softmax(x.detach().double(), -1)
        y_t = torch.softmax(x, -1)
        dx64, dx_t = softmax_backward_refs(y, dy)  # float64 and PyTorch's backward from our y (tests/_tol.py)
        assert _accepted("softmax y", y, y64, y_t, relative=True)
        assert _accepted("softmax dx", dx, dx64, dx_t)
        x_d = x.detach().double()
        dropped = torch.cat([torch.softmax(x_d[:, :-1], -1), torch.zeros_like(x_d[:, -1:])], -1)  # normalizer too
        zero_last = y.detach().clone()
        zero_last[:, -1] = 0
        local = torch.cat([torch.softmax(x_d[:, s:s + PIECE], -1) for s in range(0, n, PIECE)], -1)  # no exchange
        for name, bad, r, t, rel in [("dropped last column", dropped.to(dtype), y64, y_t, True),
                                ("last column zero", zero_last, y64, y_t, True),
                                ("pieces without exchange", local.to(dtype), y64, y_t, True),
                                ("dx x 0.95", dx * 0.95, dx64, dx_t, False)]:
            rej, ratio = _rejected("softmax " + name, bad, r, t, relative=rel)
            assert rej, (name, ratio)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_rule_rejects_wrong_gradients(dtype, reduction, device):
    c = 48
    for _ in range(DRAWS):
        x = (torch.randn(24, c, dtype=dtype, device=device) * 3).requires_grad_(True)
        t = torch.randint(0, c, (24,), device=device)
        t[::5] = -100
        with config_override("cross_entropy", max_single=16, block_n=16, persist_block=16):
            loss = fused_cross_entropy(x, t, reduction=reduction)
            (dx,) = torch.autograd.grad(loss, x)
        x64 = x.detach().double().requires_grad_(True)
        l64 = F.cross_entropy(x64, t, reduction=reduction)
        (dx64,) = torch.autograd.grad(l64, x64)
        l_t = F.cross_entropy(x, t, reduction=reduction)
        (dx_t,) = torch.autograd.grad(l_t, x)
        assert _accepted("ce loss", loss, l64, l_t) and _accepted("ce dlogits", dx, dx64, dx_t)
        for name, bad in [("dlogits x 0.95", dx * 0.95), ("dlogits x 0.9", dx * 0.9),
                          ("dlogits zero", torch.zeros_like(dx))]:
            rej, ratio = _rejected("ce " + name, bad, dx64, dx_t)
            assert rej, (name, ratio)
        assert _rejected("ce loss x 0.95", loss * 0.95, l64, l_t)[0]


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_attention_rule_rejects_wrong_results(dtype, device):
    """Our attention kernels (16-row tiles on the interpreter: several key tiles a row) against PyTorch's own SDPA:
    accepted; out / dq / dk / dv x 0.95 and a key dropped from every row that sees it rejected."""
    for _ in range(DRAWS):
        q, k, v = (torch.randn(1, 2, s, 32, dtype=dtype, device=device) for s in (21, 26, 26))
        do = torch.randn(1, 2, 21, 32, dtype=dtype, device=device)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fused_attention(*leaves, is_causal=True)
        ours = (out, *torch.autograd.grad(out, leaves, do))
        ref, tor = attention_refs(q, k, v, do, is_causal=True)
        for name, a, r, t in zip(("out", "dq", "dk", "dv"), ours, ref, tor):
            assert _accepted("attention " + name, a, r, t), (name, tol_error(a, r, t))
            rej, ratio = _rejected(f"attention {name} x 0.95", a * 0.95, r, t)
            assert rej, (name, ratio)
        keep = torch.ones(21, 26, dtype=torch.bool, device=device)
        keep[:, 3] = False  # key 3, which rows 3.. attend (causal: row i sees keys <= i)
        dropped = attention_reference(q.double(), k.double(), v.double(), keep, is_causal=True).to(dtype)
        rej, ratio = _rejected("attention out without key 3", dropped, ref[0], tor[0])
        assert rej, ratio


def test_gpu_test_sizes_reject_the_simulations():
    """The GPU tests' comparisons reject wrong results at the GPU tests' own sizes, built here from PyTorch's own
    bf16 results (which the rule accepts by construction, at 1/K of the allowance): a LayerNorm dx x 0.2 and a dx
    whose 2,048-column pieces never exchange their sums at 1,200 rows x 16,384 (test_gpu_persistent_backward's
    inputs: weights about 1 and a gradient with a mean, where the sums matter; with zero-mean random weights they
    are ~1/sqrt(n) of dx and no tolerance sees them), an
    all-zero and a x 0.9 cross-entropy gradient at 256 x 32,000 (test_gpu_wide_rows), and a softmax whose last
    column is dropped at 64 x 32,768. PyTorch only: the GPU's kernels are not needed to show the checks can fail."""
    dt, rows, n = torch.bfloat16, 1200, 16384
    x = (torch.randn(rows, n, dtype=dt) * 2 + 0.5).requires_grad_(True)
    w, b = (1 + 0.1 * torch.randn(n)).to(dt), torch.randn(n, dtype=dt)  # weights about 1, as trained norms'
    dy = torch.randn(rows, n, dtype=dt) + 0.5  # a gradient with a mean
    x64 = x.detach().double().requires_grad_(True)
    (dx64,) = torch.autograd.grad(F.layer_norm(x64, (n,), w.double(), b.double(), 1e-5), x64, dy.double())
    (dx_t,) = torch.autograd.grad(F.layer_norm(x, (n,), w, b, 1e-5), x, dy)
    assert _accepted("gpu-size ln dx (torch's)", dx_t, dx64, dx_t)
    for name, bad in [("dx x 0.2", dx_t * 0.2),
                      ("dx pieces without exchange", _ln_dx_pieces(x, w, dy, 1e-5, piece=2048).to(dt))]:
        rej, ratio = _rejected("gpu-size ln " + name, bad, dx64, dx_t)
        assert rej, (name, ratio)
    del x, x64, dy, dx64, dx_t

    c = 32000
    logits = (torch.randn(256, c, dtype=dt) * 2).requires_grad_(True)
    t = torch.randint(0, c, (256,))
    l64 = logits.detach().double().requires_grad_(True)
    (g64,) = torch.autograd.grad(F.cross_entropy(l64, t), l64)
    (g_t,) = torch.autograd.grad(F.cross_entropy(logits.float(), t), logits)
    assert _accepted("gpu-size ce dlogits (torch's)", g_t, g64, g_t)
    for name, bad in [("all zero", torch.zeros_like(g_t)), ("x 0.9", g_t * 0.9)]:
        rej, ratio = _rejected("gpu-size ce dlogits " + name, bad, g64, g_t)
        assert rej, (name, ratio)

    c = 32768
    s = torch.randn(64, c, dtype=dt) * 4
    y64, y_t = torch.softmax(s.double(), -1), torch.softmax(s, -1)
    dropped = torch.cat([torch.softmax(s[:, :-1].double(), -1), torch.zeros(64, 1, dtype=torch.float64)], -1)
    assert _accepted("gpu-size softmax y (torch's)", y_t, y64, y_t, relative=True)
    rej, ratio = _rejected("gpu-size softmax dropped last column", dropped.to(dt), y64, y_t, relative=True)
    assert rej, ratio
