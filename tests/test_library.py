"""The shared launch path (fused_layers/ops/_library.py): every launch through ``Kernel`` names each of its
kernel's constexpr parameters, defaulted ones included.  Two things depend on it:

* torch.compile: Inductor's ``wrap_triton`` rejects a launch that leaves a parameter to its default
  (``USE_TMA`` of the attention dK/dV kernel did, and compiled attention backward failed on the GPU);
* the eager fast path: ``Kernel._bind`` binds a direct launch only when the arguments after the runtime
  ones are all in the plan's meta; otherwise every call pays Triton's own dispatch (tens of microseconds).

One forward + backward of every op and mode (dropout, key bias, causal) on ragged shapes, under the
interpreter; the spy records each launch's positional arguments and its meta."""
from __future__ import annotations

import inspect

import pytest
import torch

from fused_layers import functional as FF
from fused_layers.ops import _library


@pytest.fixture
def launches(monkeypatch):
    rec = {}
    orig = _library.Kernel.__call__

    def spy(self, *args):
        rec[(self.fn.__name__, tuple(sorted(self.meta.items())))] = (self, len(args))
        return orig(self, *args)

    monkeypatch.setattr(_library.Kernel, "__call__", spy)
    return rec


def _run_every_op(device):
    x = torch.randn(5, 37, device=device, requires_grad=True)
    w = torch.randn(37, device=device, requires_grad=True)
    b = torch.randn(37, device=device, requires_grad=True)
    FF.fused_layer_norm(x, (37,), w, b, 1e-5).square().sum().backward()
    FF.fused_rms_norm(x, (37,), w, 1e-5).square().sum().backward()
    FF.fused_softmax(x, -1).square().sum().backward()
    for act in ("silu", "gelu", "gelu_tanh"):
        FF.fused_gated_activation(x, b.expand(5, 37), act).square().sum().backward()
    for hy in (FF.fused_add_rms_norm(x, b.expand(5, 37), w), FF.fused_add_layer_norm(x, b.expand(5, 37), w, b)):
        sum(t.square().sum() for t in hy).backward()
    qr, kr = (torch.randn(1, 9, h, 16, device=device).transpose(1, 2).requires_grad_() for h in (2, 1))
    for inter in (False, True):
        sum(t.square().sum() for t in FF.fused_rope(qr, kr, *torch.randn(2, 1, 9, 8, device=device), inter)).backward()
    t = torch.randint(0, 37, (5,), device=device)
    FF.fused_cross_entropy(x, t).backward()
    FF.fused_cross_entropy(x, t, label_smoothing=0.1, reduction="sum").backward()
    q, k, v = (torch.randn(1, 2, 9, 16, device=device, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 1, 1, 9, dtype=torch.bool, device=device)
    mask[..., 6:] = False
    FF.fused_attention(q, k, v, is_causal=True).square().sum().backward()
    FF.fused_attention(q, k, v, attn_mask=mask).square().sum().backward()
    FF.fused_attention(q, k, v, dropout_p=0.1).square().sum().backward()
    # the wide-row kernels (persistent: ops/_rowsync.bind_persistent), VEC8 (16-bit rows of 45 columns) and plain (48)
    from fused_layers.ops._common import config_override

    for n in (45, 48):
        xb = torch.randn(5, n, device=device, dtype=torch.bfloat16, requires_grad=True)
        tb = torch.randint(0, n, (5,), device=device)
        with config_override("cross_entropy", max_single=16, persist_block=16):
            FF.fused_cross_entropy(xb, tb).backward()
            FF.fused_cross_entropy(x, t).backward()
        with config_override("softmax", max_single_block=8, persist_block=16):
            FF.fused_softmax(xb, -1).square().sum().backward()
            FF.fused_softmax(x, -1).square().sum().backward()


def _constexprs(fn) -> list[str]:
    """Names of the parameters annotated ``tl.constexpr`` (JITFunction on a GPU, InterpretedFunction here)."""
    if hasattr(fn, "params"):
        return [p.name for p in fn.params if p.is_constexpr]
    sig = inspect.signature(fn.fn)
    return [n for n, p in sig.parameters.items() if "constexpr" in str(p.annotation)]


def test_every_launch_names_all_its_constexprs(launches, device):
    _run_every_op(device)
    names = {n for n, _ in launches}
    for want in ("_norm_fwd_kernel", "_norm_bwd_kernel", "_softmax_fwd_kernel", "_softmax_bwd_kernel",
                 "_attn_fwd_kernel", "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel", "_ce_fwd_persist_kernel",
                 "_softmax_fwd_persist_kernel", "_softmax_bwd_persist_kernel", "_gated_fwd_kernel",
                 "_gated_bwd_kernel", "_res_norm_fwd_kernel", "_res_norm_bwd_kernel", "_rope_kernel"):
        assert want in names, f"{want} was not launched through Kernel"
    for (name, _), (kern, n_args) in launches.items():
        params = list(kern.fn.arg_names)
        constexprs = _constexprs(kern.fn)
        left_out = [p for p in constexprs if p not in kern.meta]
        assert not left_out, f"{name}: constexpr(s) {left_out} left to their defaults (wrap_triton rejects that)"
        tail = params[n_args:]
        assert all(p in kern.meta for p in tail), f"{name}: runtime argument(s) after position {n_args} unbound"
        assert not any(p in kern.meta for p in params[:n_args]), f"{name}: a meta entry shadows a runtime argument"


# --------------------------------------------------------------------------------------------------
# The fast launch path's device handling, with Triton and CUDA simulated (FAST_LAUNCH is off on the CPU)
# --------------------------------------------------------------------------------------------------
class _FakeCompiled:
    packed_metadata = None
    function = 0

    def __init__(self, log, device):
        self.log, self.device = log, device

        def run(g0, g1, g2, stream, function, *rest):  # Triton's launcher: no ``launch`` attribute (generic path)
            log.append(("bound", _STATE["current"], stream))

        self.run = run


_STATE = {"current": 0}


class _FakeJIT:
    arg_names = ["X", "N", "BLOCK"]

    def __init__(self, log):
        self.log = log
        self.__name__ = "fake"

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.log.append(("triton", _STATE["current"]))  # Triton launches on the *current* device
            return _FakeCompiled(self.log, _STATE["current"])

        return launch


def test_fast_launch_goes_to_the_tensors_device(monkeypatch):
    """A tensor on device 1 while device 0 is current: the launch switches to device 1 (Triton launches on
    the current device), and binaries bound on one device are never fired for another."""
    import contextlib

    monkeypatch.setattr(_library, "FAST_LAUNCH", True)
    monkeypatch.setattr(_library, "_get_device", lambda: _STATE["current"])
    monkeypatch.setattr(_library, "_get_stream", lambda d: 100 + d)
    monkeypatch.setattr(_library, "_hooks_idle", lambda: True)
    _STATE["current"] = 0

    @contextlib.contextmanager
    def fake_device(d):
        prev, _STATE["current"] = _STATE["current"], d
        try:
            yield
        finally:
            _STATE["current"] = prev

    monkeypatch.setattr(torch.cuda, "device", fake_device)
    where = {}
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: where.get(id(self), -1))
    log = []
    kern = _library.Kernel(_FakeJIT(log), (1,), check=(0,), BLOCK=16)
    x1, x0 = torch.zeros(4), torch.zeros(4)
    where[id(x1)], where[id(x0)] = 1, 0

    kern(x1, 4)  # first call on device 1: Triton compiles and launches there, then binds
    assert log == [("triton", 1)] and _STATE["current"] == 0
    kern(x1, 4)  # bound: fired on device 1's stream, with device 1 current
    assert log[-1] == ("bound", 1, 101)
    kern(x0, 4)  # device 0: not device 1's binary
    assert log[-1] == ("triton", 0)
    kern(x0, 4)
    assert log[-1] == ("bound", 0, 100)
    assert sorted(k[0] for k in kern._bins) == [0, 1]
