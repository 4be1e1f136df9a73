"""Drop-in behaviour on bad input and at the edges, on the CPU interpreter.

The fused modules raise the exception type PyTorch's module raises for the same bad input (our classes
subclass both ours and torch's, so ``except ValueError`` / ``except TypeError`` keep working), keep their
clearer messages, fall back to SDPA's answer where only SDPA supports a case, and print no numpy noise.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from _tol import launched
from torch import nn

from fused_layers import FusedLayerNorm, FusedSoftmax, fused_attention
from fused_layers.ops._common import FusedDtypeError, FusedShapeError


def _torch_raises(fn) -> type[BaseException]:
    with pytest.raises(Exception) as e:
        fn()
    return type(e.value)


def test_layer_norm_shape_mismatch_raises_like_torch():
    x = torch.randn(3, 7)
    torch_type = _torch_raises(lambda: nn.LayerNorm(8)(x))
    with pytest.raises(torch_type, match="normalized_shape") as e:  # RuntimeError, as nn.LayerNorm
        FusedLayerNorm(8)(x)
    assert isinstance(e.value, FusedShapeError) and isinstance(e.value, ValueError)  # and what we raised before
    assert "expected input of shape [*, 8], got [3, 7]" in str(e.value)


def test_softmax_integer_input_raises_like_torch():
    x = torch.ones(2, 5, dtype=torch.long)
    torch_type = _torch_raises(lambda: nn.Softmax(-1)(x))
    with pytest.raises(torch_type, match="'input' has dtype torch.int64") as e:  # NotImplementedError, as nn.Softmax
        FusedSoftmax(-1)(x)
    assert isinstance(e.value, FusedDtypeError) and isinstance(e.value, TypeError)


def test_attention_value_head_dim_fallback_gives_sdpa_answer():
    """dv != dq: SDPA accepts it, the kernels do not; the fallback (one warning) must give SDPA's answer
    and gradients."""
    q = torch.randn(2, 3, 7, 16, dtype=torch.float32, requires_grad=True)
    k = torch.randn(2, 3, 9, 16, dtype=torch.float32, requires_grad=True)
    v = torch.randn(2, 3, 9, 24, dtype=torch.float32, requires_grad=True)
    for causal in (False, True):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with warnings.catch_warnings(record=True), launched("attention") as seen:
            warnings.simplefilter("always")
            out = fused_attention(q, k, v, is_causal=causal)
        assert seen == []  # SDPA ran: no kernel launched
        assert out.shape == (2, 3, 7, 24)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        g = torch.randn_like(ref)
        got = torch.autograd.grad(out, (q, k, v), g)
        want = torch.autograd.grad(ref, (q, k, v), g)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fallbacks_count_every_call_warn_once_reports():
    """``fused_layers.fallbacks()``: each fallback message once, with how many calls took it (the warning is given
    once); the count goes on after the warning."""
    import fused_layers

    q = torch.randn(1, 2, 5, 16)
    k = torch.randn(1, 2, 5, 16)
    v = torch.randn(1, 2, 5, 8)  # value head dim != query's: SDPA runs
    def dv_fallbacks():  # (one entry per fallback: the message of its first call, e.g. another test's shapes)
        return {m: n for m, n in fused_layers.fallbacks().items() if "value head dim" in m}

    before = dv_fallbacks()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for _ in range(3):
            fused_attention(q, k, v)
    found = dv_fallbacks()
    assert len(found) == 1 and "is not fused; using SDPA" in next(iter(found)), found
    assert sum(found.values()) == sum(before.values()) + 3, (before, found)


def test_softmax_under_interpreter_prints_no_numpy_warnings():
    """Masked-out lanes of the interpreter (numpy) compute -inf - -inf; the kernels never store those
    lanes, and no RuntimeWarning may leak to the user."""
    x = torch.randn(5, 37, requires_grad=True)  # 37 columns in a 64-wide block: masked lanes in every row
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        y = FusedSoftmax(-1)(x)
        y.backward(torch.randn_like(y))
    torch.testing.assert_close(y, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
