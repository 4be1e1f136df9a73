"""The C++ fast path of the eager norms (fused_layers/ops/_cpp.py, fused_layers/csrc/fastpath.cpp).

On the CPU: the signature -> parameter-kind mapping, and that the extension compiles with this machine's
compiler and torch headers.  On a GPU: forward and every gradient through the C++ autograd node against
float64, the node actually used, and the fallbacks (misaligned or strided gradients, wide rows).
"""

import shutil
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from _tol import assert_within_torch, rms_variant_refs

from fused_layers import fused_attention, fused_layer_norm, fused_rms_norm, fused_softmax
from fused_layers.ops import _cpp
from fused_layers.ops import attention as at_ops
from fused_layers.ops import layer_norm as ln_ops
from fused_layers.ops import softmax as sm_ops

# The registration tests run the attention backward once on CPU tensors (to compile it): interpreter only;
# on a GPU the tests of the real C++ path (test_gpu_*) register the same kernels.
interpreter_only = pytest.mark.skipif(not at_ops.INTERPRET,
                                      reason="launches kernels on CPU tensors: TRITON_INTERPRET=1 only")


def _compiled(signature):
    return types.SimpleNamespace(src=types.SimpleNamespace(signature=signature))


def _fn(*names):
    return types.SimpleNamespace(arg_names=list(names))


def test_kinds_follow_the_compiled_signature():
    """Pointers, i32 / i64 ints, fp32 floats in the kernel's order; an int Triton specialized into a constant
    (signature 'constexpr', e.g. a value of 1) is '-' (consumed, not passed); trailing constexprs ignored."""
    sig = {"X": "*bf16", "Y": "*bf16", "M": "constexpr", "N": "i32", "sx": "i64", "eps": "fp32", "BLOCK": "constexpr"}
    fn = _fn("X", "Y", "M", "N", "sx", "eps", "BLOCK")
    assert _cpp._kinds(_compiled(sig), fn, _cpp.roles(2, 3, 1)) == "pp-ilf"


def test_roles_of_attention_launches():
    """Attention kernels take their floats before their ints."""
    assert _cpp.roles(2, 3, 1) == "ppiiif"
    assert _cpp.roles(2, 2, 1, floats_first=True) == "ppfii"


@pytest.mark.parametrize("bad", [
    {"X": "i32"},  # a pointer slot that is not a pointer
    {"N": "fp32"},  # an int slot that is a float
    {"eps": "fp64"},  # a float the launcher does not pack
    {"N": "i1"},  # a bool: not packed
])
def test_kinds_refuse_what_the_launcher_cannot_pack(bad):
    sig = {"X": "*fp32", "N": "i32", "eps": "fp32", **bad}
    assert _cpp._kinds(_compiled(sig), _fn("X", "N", "eps"), "pif") is None


def test_kinds_need_a_signature():
    assert _cpp._kinds(types.SimpleNamespace(), _fn("X"), "p") is None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("env,on", [({}, True), ({"FUSED_LAYERS_CPP": "0"}, False), ({"FUSED_LAYERS_CPP": "1"}, True),
                                    ({"TRITON_INTERPRET": "1"}, False),
                                    ({"TRITON_INTERPRET": "1", "FUSED_LAYERS_CPP": "1"}, True)])
def test_fast_path_is_on_by_default(env, on):
    """On unless FUSED_LAYERS_CPP=0, or under the Triton interpreter (nothing compiled to register)."""
    assert _cpp.enabled_by(env) is on


def test_no_cpp_node_under_compiled_autograd(monkeypatch):
    """Compiled autograd cannot trace the C++ nodes: while it is on, eager_ok() sends forwards to the Python
    path (its autograd.Function traces) and fast_call declines."""


    assert _cpp.eager_ok()
    fake = types.SimpleNamespace(compiled_autograd_enabled=True, in_compiled_autograd_region=False)
    monkeypatch.setitem(sys.modules, "torch._dynamo.compiled_autograd", fake)
    monkeypatch.setattr(_cpp, "_ext", types.SimpleNamespace(norm_fast=lambda *a: pytest.fail("called")))
    assert not _cpp.eager_ok() and _cpp.fast_call("norm_fast", None) is None
    fake.compiled_autograd_enabled, fake.in_compiled_autograd_region = False, True
    assert not _cpp.eager_ok()
    fake.in_compiled_autograd_region = False
    assert _cpp.eager_ok()


def test_extension_builds_in_the_background(monkeypatch):
    """The first use starts the build on a thread and returns None (the Python path runs; registration is
    retried, not marked unsupported); the extension is there once the build is done; a failed build warns
    once and leaves everything on the Python path for good."""
    import threading

    release = threading.Event()
    fake = types.SimpleNamespace(name="ext")

    def slow_build():
        release.wait(5)
        return fake

    for name, value in (("ENABLED", True), ("_ext", None), ("_failed", False), ("_thread", None)):
        monkeypatch.setattr(_cpp, name, value)
    monkeypatch.setattr(_cpp, "build", slow_build)
    assert _cpp.extension() is None and _cpp.building()
    assert _cpp.register(None, None, 0, (), "") is None  # still building: try again on a later call
    release.set()
    assert _cpp.extension(wait=True) is fake and not _cpp.building()
    assert _cpp.extension() is fake

    def failing_build():
        raise RuntimeError("Ninja is required to load C++ extensions")

    for name, value in (("_ext", None), ("_failed", False), ("_thread", None)):
        monkeypatch.setattr(_cpp, name, value)
    monkeypatch.setattr(_cpp, "build", failing_build)
    with pytest.warns(UserWarning, match=r"pip install 'fused-layers\[cpp\]' for ninja"):
        assert _cpp.extension(wait=True) is None
    assert _cpp._failed and _cpp.register(None, None, 0, (), "") == _cpp.UNSUPPORTED


def test_extension_is_built_optimized(monkeypatch):
    """torch.utils.cpp_extension.load adds no optimization flag: the build must ask for -O3 (the first GPU
    runs were -O0, and every tensor / intrusive_ptr / pybind helper was a call: 3x the host instructions of a
    C++ forward)."""
    import torch.utils.cpp_extension as ce

    seen = {}
    monkeypatch.setattr(ce, "load", lambda *a, **kw: seen.update(kw) or "ext")
    assert _cpp.build() == "ext" and "-O3" in seen["extra_cflags"]


def test_stale_build_lock_is_cleared(monkeypatch, tmp_path):
    """A torch build lock left by a process that exited mid-build (its background build unfinished) must not
    make every later build wait forever: inside our flock, a lock file is a dead process's and is removed."""
    import torch.utils.cpp_extension as ce

    monkeypatch.setattr(ce, "_get_build_directory", lambda name, verbose: str(tmp_path))
    (tmp_path / "lock").write_text("")

    def fake_load(*a, **kw):  # torch's FileBaton would spin here while the stale file exists
        assert not (tmp_path / "lock").exists()
        return "ext"

    monkeypatch.setattr(ce, "load", fake_load)
    with pytest.warns(UserWarning, match="exited mid-build"):
        assert _cpp.build() == "ext"
    assert (tmp_path / "fused_layers.flock").exists()


def test_extension_builds():
    """fastpath.cpp compiles against this torch and Triton's cuda.h (a CPU build of torch compiles the launch
    path without CUDA streams: it never launches)."""
    ext = _cpp.build()
    for name in ("param_count", "register_launch", "register_norm", "norm_apply", "norm_infer", "softmax_apply",
                 "softmax_infer", "register_attention", "attention_apply", "attention_infer", "norm_fast",
                 "rms_variant_fast", "softmax_fast", "attention_fast", "clear_fast", "set_dry_run"):
        assert callable(getattr(ext, name))
    # The parameter slots a launch passes: pointers, an int Triton made a constant (skipped), i32 and i64
    # ints, an fp32 float, then Triton's two scratch pointers (null); i32 / fp32 in the low 4 bytes.
    import struct

    slots = ext.pack_for_test("pp-ilf", [1, -3, 2**40], 2, [0x7F0000001000, 0x7F0000002000], [1e-5])  # no scratch
    assert slots[:2] == [0x7F0000001000, 0x7F0000002000]
    assert slots[2] == struct.unpack("<I", struct.pack("<i", -3))[0]
    assert slots[3] == 2**40
    assert slots[4] == struct.unpack("<I", struct.pack("<f", 1e-5))[0]
    assert slots[5:] == [0, 0] and len(slots) == 7
    with pytest.raises(RuntimeError, match="too few pointers"):
        ext.pack_for_test("pp", [], 0, [16], [])
    with pytest.raises(RuntimeError, match="left over"):
        ext.pack_for_test("p", [], 0, [16, 32], [])
    # A host TMA descriptor ('T', the Gluon norm backward's x / dy / w): passed by its own 128-byte storage, then
    # the shape (i32) and strides (i64) Triton's launcher passes after it.
    slots = ext.pack_for_test("pTiilTil", [7, 3, 5, 9, 8], 0, [0x7F0000001000], [])
    assert slots == [0x7F0000001000, -1000, 7, 3, 5, -1001, 9, 8]


def test_tma_specs_and_kinds():
    """The C++ registration of a kernel with host TMA descriptors (Triton's TensorDescriptor arguments): the
    kinds Triton's launcher expands them to, and the driver-order spec the extension encodes each launch from."""
    from types import SimpleNamespace

    sig = {"X": "*bf16", "M": "i32", "N": "constexpr", "x_desc": "tensordesc<bf16[1, 64, 256],NVMMASharedLayout(...)>",
           "w_desc": "tensordesc<fp32[64, 256],NVMMASharedLayout(...)>"}
    compiled = SimpleNamespace(src=SimpleNamespace(signature=sig))
    fn = SimpleNamespace(arg_names=list(sig))
    assert _cpp._kinds(compiled, fn, "pii" + "dd") == "pi-" + "Tiiilll" + "Tiill"
    assert _cpp._kinds(compiled, fn, "pidd") is None  # a descriptor where an int is expected
    md = SimpleNamespace(tensordesc_meta=[
        dict(swizzle=0, elem_size=2, elem_type=10, block_size=[1, 64, 256], fp4_padded=False),
        dict(swizzle=3, elem_size=4, elem_type=7, block_size=[64, 256], fp4_padded=False)])
    specs = _cpp._tma_specs(md, ((0, [300, 64, 256], [16384, 256, 1]), (3, [64, 256], [256, 1])))
    # [ptr, CUtensorMapDataType (bf16: 9), rank, swizzle, dims innermost first, byte strides, box innermost first]
    assert specs == [[0, 9, 3, 0, 256, 64, 300, 512, 32768, 256, 64, 1], [3, 7, 2, 3, 256, 64, 1024, 256, 64]]
    assert _cpp._tma_specs(md, ((0, [300, 64, 256], [16384, 256, 1]),)) is None  # one spec a descriptor
    assert _cpp._tma_specs(md, ((0, [300, 64, 256], [16384, 256, 2]), (3, [64, 256], [256, 1]))) is None
    # register_all takes specs with and without descriptors; a kernel not compiled yet: None (the Python path runs)
    k = SimpleNamespace(aligned_key=lambda dev, dtypes: (dev, *dtypes), compiled=lambda key: None)
    specs = (k, (torch.float32,), (4,), "pi"), (k, (torch.float32,), (), "pd", ((0, [4], [1]),))
    assert _cpp.register_all(0, *specs) is None


# --------------------------------------------------------------------------------------------------
# GPU: the node itself
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def cpp_on(monkeypatch):
    monkeypatch.setattr(_cpp, "ENABLED", True)
    ext = _cpp.extension(wait=True)
    if ext is None:
        pytest.skip("the C++ fast path did not build here")
    return ext


def _used_cpp(x, weight, bias, k, is_rms, grad=True):
    plan = ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, k, weight is not None, bias is not None, is_rms, grad, False)
    key = (x.get_device(), None if weight is None else weight.dtype, None if bias is None else bias.dtype, None)
    nid = plan.cpp.get(key)  # (device, weight dtype, bias dtype, output dtype: None = x's)
    return type(nid) is int


def _ref(fn, x, w, b, dy):
    leaves = [t for t in (x, w, b) if t is not None]
    y = fn(x, w, b)
    return (y, *torch.autograd.grad(y, leaves, dy))


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype,pdtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                          (torch.bfloat16, torch.float32)], ids=["bf16", "fp32", "bf16_fp32params"])
@pytest.mark.parametrize("n", [768, 1031, 4096])
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_gpu_cpp_node_matches_float64(rms, dtype, pdtype, n, affine, cpp_on):
    if rms and affine == "wb":
        pytest.skip("RMSNorm has no bias")
    dev = "cuda"
    x = (torch.randn(37, n, device=dev) * 2 + 0.5).to(dtype).requires_grad_()
    w = torch.randn(n, device=dev, dtype=pdtype).requires_grad_() if affine != "none" else None
    b = torch.randn(n, device=dev, dtype=pdtype).requires_grad_() if affine == "wb" else None
    if rms:
        ours = lambda x, w, b: fused_rms_norm(x, (n,), w, 1e-6)  # noqa: E731
    else:
        ours = lambda x, w, b: fused_layer_norm(x, (n,), w, b, 1e-5)  # noqa: E731
    ref = (lambda x, w, b: F.rms_norm(x, (n,), w, 1e-6)) if rms else (lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5))
    for it in range(3):  # the first call runs the Python path (Triton compiles), later ones the C++ node
        dy = torch.randn(37, n, device=dev, dtype=dtype)
        got = _ref(ours, x, w, b, dy)
        d64 = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
        want = _ref(ref, *d64, dy.double())
        for g, r in zip(got, want):
            low = torch.bfloat16 in (dtype, pdtype)
            tol = dict(atol=3e-2, rtol=3e-2) if low else dict(atol=1e-4, rtol=1e-4)
            if g is not got[0]:  # parameter gradients sum 37 rows
                tol = {k: v * 4 for k, v in tol.items()}
            torch.testing.assert_close(g.double(), r, **tol)
        params = [t for t in (x, w, b) if t is not None]
        assert got[0].dtype == dtype and all(g.dtype == t.dtype for g, t in zip(got[1:], params))
    assert _used_cpp(x, w, b, 1, rms), "the C++ node never ran"
    assert got[0].grad_fn.name() == "FusedNormBackward", got[0].grad_fn  # the C++ node (norm_fast's, by now)


@pytest.mark.gpu
@pytest.mark.parametrize("grads", ["x", "xw", "xb", "w", "b"])
def test_gpu_cpp_node_frozen_parameters(grads, cpp_on):
    """Some of x / weight / bias frozen: the node skips the dweight / dbias reduce when neither is wanted and
    still returns exactly the gradients asked for, right (torch.autograd.grad of the ones that require grad)."""
    n, dev, dt = 1031, "cuda", torch.bfloat16
    x = (torch.randn(29, n, device=dev) + 0.25).to(dt).requires_grad_("x" in grads)
    w = torch.randn(n, device=dev, dtype=dt).requires_grad_("w" in grads)
    b = torch.randn(n, device=dev, dtype=dt).requires_grad_("b" in grads)
    leaves = [t for t in (x, w, b) if t.requires_grad]
    for _ in range(3):  # the first call runs the Python path (Triton compiles), later ones the C++ node
        dy = torch.randn(29, n, device=dev, dtype=dt)
        y = fused_layer_norm(x, (n,), w, b, 1e-5)
        got = torch.autograd.grad(y, leaves, dy)
        d64 = [t.detach().double().requires_grad_(t.requires_grad) for t in (x, w, b)]
        y64 = F.layer_norm(d64[0], (n,), d64[1], d64[2], 1e-5)
        want = torch.autograd.grad(y64, [t for t in d64 if t.requires_grad], dy.double())
        for g, r in zip(got, want):
            torch.testing.assert_close(g.double(), r, atol=0.12, rtol=3e-2)
    assert _used_cpp(x, w, b, 1, False, grad=True) and y.grad_fn.name() == "FusedNormBackward"


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_gpu_cpp_inference_forward(rms, cpp_on):
    """Without autograd: the C++ forward of the no-statistics plan."""
    n = 1000
    x = torch.randn(33, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = None if rms else torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        y = fused_rms_norm(x, (n,), w, 1e-6) if rms else fused_layer_norm(x, (n,), w, b)
    if rms:
        ref = F.rms_norm(x.double(), (n,), w.double(), 1e-6)
    else:
        ref = F.layer_norm(x.double(), (n,), w.double(), b.double())
    torch.testing.assert_close(y.double(), ref, atol=3e-2, rtol=3e-2)
    assert y.grad_fn is None and _used_cpp(x, w, b, 1, rms, grad=False)


@pytest.mark.gpu
def test_gpu_cpp_node_strided_and_misaligned_grads(cpp_on):
    """A non-contiguous dy, and a dy whose data is not 16-byte aligned, are copied before the backward kernel."""
    n = 1024
    x = torch.randn(16, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):  # a contiguous dy, as the C++ node's backward is registered for (not sum()'s expanded one)
        fused_layer_norm(x, (n,), w, None).backward(torch.randn_like(x))
    x.grad = w.grad = None
    y = fused_layer_norm(x, (n,), w, None)
    assert _used_cpp(x, w, None, 1, False)
    base = torch.randn(n, 16, device="cuda", dtype=torch.bfloat16)
    for dy in (base.t(), torch.randn(16 * n + 1, device="cuda", dtype=torch.bfloat16)[1:].view(16, n)):
        gx, gw = torch.autograd.grad(y, (x, w), dy, retain_graph=True)
        y64 = F.layer_norm(x.double(), (n,), w.double())
        rx, rw = torch.autograd.grad(y64, (x, w), dy.double())
        torch.testing.assert_close(gx.double(), rx.double(), atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(gw.double(), rw.double(), atol=0.1, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape,dim", [((37, 1031), -1), ((4, 8, 128, 128), -1), ((6, 50, 7), 1)])
def test_gpu_cpp_softmax_matches_float64(dtype, shape, dim, cpp_on):
    """Softmax through the C++ node (rows along the last dim, and along dim 1 with an inner stride), its
    gradient against float64, and the no-grad forward."""
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    for _ in range(3):
        dy = torch.randn(shape, device="cuda", dtype=dtype)
        y = fused_softmax(x, dim)
        (gx,) = torch.autograd.grad(y, x, dy)
        x64 = x.detach().double().requires_grad_()
        y64 = torch.softmax(x64, dim)
        (g64,) = torch.autograd.grad(y64, x64, dy.double())
        torch.testing.assert_close(y.double(), y64, **tol)
        torch.testing.assert_close(gx.double(), g64, **tol)
        with torch.no_grad():
            torch.testing.assert_close(fused_softmax(x, dim).double(), y64, **tol)
    plan = sm_ops._plan(x.shape, (x.stride(),), x.dtype, dim % x.dim())
    assert type(plan.cpp.get((0, True))) is list and type(plan.cpp.get((0, False))) is list
    assert y.grad_fn.name() == "FusedSoftmaxBackward", y.grad_fn


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_gpu_fast_call_takes_registered_shapes_only(rms, cpp_on):
    """norm_fast / softmax_fast (one C++ call from the functional API) answer for a shape the Python path
    registered, and return None, so that the Python path runs, for anything else: another width, a
    non-contiguous or misaligned x, a normalized_shape or weight that does not match, autocast."""
    n, dt = 1024, torch.bfloat16
    x = torch.randn(24, n, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dt, requires_grad=True)
    b = None if rms else torch.randn(n, device="cuda", dtype=dt, requires_grad=True)
    eps = None if rms else 1e-5  # RMSNorm's eps=None: torch's default for the dtype
    if rms:
        fused = lambda x, w: fused_rms_norm(x, (n,), w, eps)  # noqa: E731
    else:
        fused = lambda x, w: fused_layer_norm(x, (n,), w, b, eps)  # noqa: E731
    ref = (lambda x, w: F.rms_norm(x, (n,), w, eps)) if rms else (lambda x, w: F.layer_norm(x, (n,), w, b, eps))
    for _ in range(2):
        fused(x, w).backward(torch.randn_like(x))
        with torch.no_grad():
            fused(x, w)
    fast = cpp_on.norm_fast
    y = fast(x, [n], w, b, eps, rms)
    assert y is not None and y.grad_fn.name() == "FusedNormBackward"
    with torch.no_grad():
        yi = fast(x, [n], w, b, eps, rms)
    assert yi is not None and yi.grad_fn is None
    dy = torch.randn_like(x)
    leaves = [t for t in (x, w, b) if t is not None]
    got = torch.autograd.grad(y, leaves, dy, retain_graph=True)
    again = torch.autograd.grad(y, leaves, dy)  # retain_graph: the node's saved tensors are still there
    d64 = [t.detach().double().requires_grad_() for t in leaves]
    y64 = ref(d64[0], d64[1]) if rms else F.layer_norm(d64[0], (n,), d64[1], d64[2], eps)
    want = torch.autograd.grad(y64, d64, dy.double())
    torch.testing.assert_close(y.double(), y64, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(yi, y)
    for g, g2, r in zip(got, again, want):
        torch.testing.assert_close(g.double(), r, atol=0.15, rtol=3e-2)
        torch.testing.assert_close(g, g2)
    with pytest.raises(RuntimeError):  # the graph was freed by the second backward
        torch.autograd.grad(y, leaves, dy)
    # anything not registered, or not plain: None (the Python path)
    assert fast(torch.randn(24, n + 1, device="cuda", dtype=dt), [n + 1], None, None, eps, rms) is None
    assert fast(torch.randn(n, 24, device="cuda", dtype=dt).t(), [n], w, b, eps, rms) is None
    assert fast(torch.randn(24 * n + 1, device="cuda", dtype=dt)[1:].view(24, n), [n], w, b, eps, rms) is None
    assert fast(x, [24, n], w, b, eps, rms) is None
    assert fast(x, [n], w[:-1], b, eps, rms) is None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert fast(x, [n], w, b, eps, rms) is None
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():  # a forward-mode tangent: the Python path (its custom op) carries it
        assert fast(fwAD.make_dual(x.detach(), torch.randn_like(x)), [n], w, b, eps, rms) is None
    # through the functional API with torch's own tensors: fast, and equal to the Python path's answer
    y2 = fused(x, w)
    assert y2.grad_fn.name() == "FusedNormBackward"
    _cpp_off = _cpp.ENABLED
    try:
        _cpp.ENABLED = False
        y3 = fused(x, w)
    finally:
        _cpp.ENABLED = _cpp_off
    torch.testing.assert_close(y2, y3)


@pytest.mark.gpu
def test_gpu_softmax_fast_call(cpp_on):
    x = torch.randn(40, 333, device="cuda", dtype=torch.float32, requires_grad=True)
    for _ in range(2):
        fused_softmax(x, -1).backward(torch.randn_like(x))
    y = cpp_on.softmax_fast(x, 1)
    assert y is not None and y.grad_fn.name() == "FusedSoftmaxBackward"
    dy = torch.randn_like(x)
    (g,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    (g64,) = torch.autograd.grad(torch.softmax(x64, -1), x64, dy.double())
    torch.testing.assert_close(g.double(), g64, atol=1e-5, rtol=1e-5)
    assert cpp_on.softmax_fast(x, 0) is None  # not the last dim
    assert cpp_on.softmax_fast(torch.randn(40, 334, device="cuda"), -1) is None  # not registered
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert cpp_on.softmax_fast(x, -1) is None
    with pytest.raises(TypeError):  # the functional API turns this into its own error message
        cpp_on.softmax_fast([1.0], -1)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [12288, 16384], ids=["12K", "16K"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("pdtype,affine", [(torch.bfloat16, "wb"), (torch.float32, "wb"), (torch.bfloat16, "none")],
                         ids=["bf16", "fp32params", "none"])
def test_gpu_cpp_node_gluon_row_backward(rms, pdtype, affine, n, cpp_on):
    """bf16 rows of 16K and 12K (3 TMA boxes a row) through the Gluon row backward: the C++ node launches it and its
    reduce, right against float64, also for a non-contiguous dy (made contiguous in C++); the C++ launch encodes the
    host descriptors at each call, their box from the compiled kernel."""
    from fused_layers.ops import layer_norm_gluon as lg

    if not (lg.HAS_GLUON and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("needs an sm_90 GPU and Gluon")
    dev, dtype = "cuda", torch.bfloat16
    x = (torch.randn(300, n, device=dev) * 2 + 0.5).to(dtype).requires_grad_()
    w = torch.randn(n, device=dev, dtype=pdtype).requires_grad_() if affine != "none" else None
    b = torch.randn(n, device=dev, dtype=pdtype).requires_grad_() if affine == "wb" and not rms else None
    if rms:
        ours = lambda x, w, b: fused_rms_norm(x, (n,), w, 1e-6)  # noqa: E731
    else:
        ours = lambda x, w, b: fused_layer_norm(x, (n,), w, b, 1e-5)  # noqa: E731
    ref = (lambda x, w, b: F.rms_norm(x, (n,), w, 1e-6)) if rms else (lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5))
    with ln_ops.config_override("layer_norm", gluon=True):
        for it in range(4):  # the first call runs the Python path (compiles), later ones the C++ node
            dy = torch.randn(300, n, device=dev, dtype=dtype)
            if it == 3:
                dy = torch.randn(n, 300, device=dev, dtype=dtype).t()  # non-contiguous
            got = _ref(ours, x, w, b, dy)
            d64 = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
            want = _ref(ref, *d64, dy.double())
            for g, r in zip(got, want):
                tol = dict(atol=3e-2, rtol=3e-2) if g is got[0] else dict(atol=0.5, rtol=5e-2)
                torch.testing.assert_close(g.double(), r, **tol)
        assert _used_cpp(x, w, b, 1, rms), "the C++ node never ran"
        assert got[0].grad_fn.name() == "FusedNormBackward", got[0].grad_fn
        plan = ln_ops._bwd_plan(x.shape, x.stride(), x.stride(), x.dtype, 1, w is not None, b is not None, rms,
                                x.get_device(), False, True)  # the eager plan (persist_ok)
        assert plan.gluon, "the Gluon row backward did not take the plan"


@pytest.mark.gpu
def test_gpu_wide_rows_stay_on_the_python_path(cpp_on):
    n = 65536  # chunked (wide-row) kernels: not on the C++ path
    x = torch.randn(4, n, device="cuda", requires_grad=True)
    for _ in range(2):
        fused_layer_norm(x, (n,)).sum().backward()
    plan = ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, 1, False, False, False, True, False)
    assert plan.cpp.get((0, None, None, None)) is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_tensors_on_a_device_that_is_not_current():
    """A model on cuda:1 without torch.cuda.set_device(1): the kernels launch on the tensors' device."""
    assert torch.cuda.current_device() == 0
    x = torch.randn(8, 1000, device="cuda:1", requires_grad=True)
    w = torch.randn(1000, device="cuda:1", requires_grad=True)
    for _ in range(2):
        y = fused_layer_norm(x, (1000,), w)
        gx, gw = torch.autograd.grad(y, (x, w), torch.ones_like(y))
    y64 = F.layer_norm(x.double(), (1000,), w.double())
    rx, rw = torch.autograd.grad(y64, (x, w), torch.ones_like(y64))
    torch.testing.assert_close(y.double(), y64, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gx.double(), rx, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw.double(), rw, atol=1e-3, rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# CPU: what the Python side registers matches the kernels' real parameter lists
# --------------------------------------------------------------------------------------------------
# The pointer order the C++ node passes to each kernel (fastpath.cpp), by the kernels' parameter names.
_CPP_POINTERS = {
    "_norm_fwd_kernel": ["X", "Y", "W", "B", "STATS"],
    "_norm_bwd_kernel": ["X", "DY", "DX", "W", "STATS", "PARTS"],
    "_norm_reduce_partials_kernel": ["PARTS", "DW", "DB"],
    "_softmax_fwd_kernel": ["X", "Y"],
    "_softmax_bwd_kernel": ["Y", "DY", "DX"],
    "_attn_fwd_kernel": ["Q", "K", "V", "O", "LSE", "KB", "CU_Q", "CU_K", "SEED"],
    "_attn_bwd_preprocess": ["O", "DO", "DELTA", "CU_Q"],
    "_attn_bwd_dkdv_kernel": ["Q", "K", "V", "DO", "DK", "DV", "LSE", "DELTA", "KB", "CU_Q", "CU_K", "SEED"],
    "_attn_bwd_dq_kernel": ["Q", "K", "V", "DO", "DQ", "LSE", "DELTA", "KB", "CU_Q", "CU_K", "SEED"],
}


@pytest.fixture
def dry_run(cpp_on):
    """The extension with its launches switched off (``set_dry_run``): the autograd nodes run on CPU tensors,
    so their wiring is tested without a GPU (the outputs' values are whatever the allocator held)."""
    cpp_on.set_dry_run(True)
    yield cpp_on
    cpp_on.set_dry_run(False)
    cpp_on.clear_fast()  # (keys bound for CPU tensors)


def _fake_launch(ext, kinds):
    return ext.register_launch(0, -1, [1, 1, 1], 32, 0, kinds, [], 0, 0)


@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_cpu_norm_node_wiring(affine, dry_run):
    """The hand-written norm node: one output edge per input (x, weight, bias), gradients of the inputs'
    shapes and dtypes land in .grad, only for inputs that require grad, retain_graph keeps the saved tensors
    and a second backward without it raises as for any torch op."""
    ext, n = dry_run, 37
    nid = ext.register_norm(_fake_launch(ext, "pppppf"), _fake_launch(ext, "pppppp"), _fake_launch(ext, "ppp"),
                            16, 2 * 2 * n, -1)
    x = torch.randn(8, n, requires_grad=True)
    w = torch.randn(n, requires_grad=True) if affine != "none" else None
    b = torch.randn(n) if affine == "wb" else None  # (a bias that does not require grad)
    y = ext.norm_apply(x, w, b, 1e-5, nid)
    assert y.shape == x.shape and y.dtype == x.dtype and y.requires_grad
    assert y.grad_fn.name() == "FusedNormBackward" and len(y.grad_fn.next_functions) == 3
    y.backward(torch.randn_like(y), retain_graph=True)
    assert x.grad.shape == x.shape and (w is None or w.grad.shape == w.shape)
    assert b is None or b.grad is None  # bias did not require grad
    y.backward(torch.randn_like(y))
    with pytest.raises(RuntimeError, match="second time"):
        y.backward(torch.randn_like(y))


def test_cpu_fast_call_lookup(dry_run):
    """norm_fast / rms_variant_fast / softmax_fast / attention_fast on CPU tensors in a dry run: a bound key
    answers (through the functional API too), anything that differs from it returns None."""
    ext, n, f32 = dry_run, 40, 6
    nid = ext.register_norm(_fake_launch(ext, "pppppf"), _fake_launch(ext, "pppppp"), _fake_launch(ext, "ppp"),
                            12, 2 * 2 * n, -1)
    ext.bind_norm([6, n, f32, f32, f32, -1, 2], nid)
    ext.bind_norm([6, n, f32, f32, -1, -1, 1 | 2], nid)  # RMSNorm, weight only
    x = torch.randn(2, 3, n, requires_grad=True)
    w, b = torch.randn(n, requires_grad=True), torch.randn(n, requires_grad=True)
    assert fused_layer_norm(x, (n,), w, b).grad_fn.name() == "FusedNormBackward"
    assert fused_layer_norm(x, n, w, b).grad_fn.name() == "FusedNormBackward"  # an int normalized_shape
    assert fused_rms_norm(x, (n,), w).grad_fn.name() == "FusedNormBackward"  # eps=None: torch's default
    fast = ext.norm_fast
    assert fast(x, [n], w, b, 1e-5, False) is not None
    assert fast(x, [3, n], w, b, 1e-5, False) is None  # another normalized_shape
    assert fast(x, [n], w[:-1], b, 1e-5, False) is None  # weight of another shape
    assert fast(x, [n], w.double(), b, 1e-5, False) is None  # a dtype never bound
    assert fast(x.transpose(0, 1), [n], w, b, 1e-5, False) is None  # not contiguous
    assert fast(torch.randn(6, n + 1), [n + 1], None, None, 1e-5, False) is None  # not bound
    with torch.no_grad():
        assert fast(x, [n], w, b, 1e-5, False) is None  # no-autograd key not bound
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        assert fast(fwAD.make_dual(x.detach(), torch.randn_like(x)), [n], w, b, 1e-5, False) is None
    ext.clear_fast()
    assert fast(x, [n], w, b, 1e-5, False) is None
    # softmax
    ext.bind_softmax([6, n, f32, -1, -1, -1, 2], _fake_launch(ext, "pp"), _fake_launch(ext, "ppp"))
    assert fused_softmax(x, -1).grad_fn.name() == "FusedSoftmaxBackward"
    assert ext.softmax_fast(x, 1) is None and ext.softmax_fast(x, 2) is not None
    # attention: the key is the layouts, causal, p, with-autograd
    q = torch.randn(1, 4, 16, 8, requires_grad=True)
    k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(2))
    st = list(q.stride())
    plan = ext.register_attention(_fake_launch(ext, "p" * 9 + "fff"), _fake_launch(ext, "pppp"),
                                  _fake_launch(ext, "p" * 12 + "ffff"), _fake_launch(ext, "p" * 11 + "ffff"),
                                  st, [1, 4, 16], st, list(k.stride()), list(v.stride()))
    ext.bind_attention(q, k, v, True, 0.0, True, plan, 1.0)
    assert fused_attention(q, k, v, is_causal=True, enable_gqa=True).grad_fn.name() == "FusedAttentionBackward"
    assert ext.attention_fast(q, k, v, 0.0, True, None, False) is None  # GQA without enable_gqa
    assert ext.attention_fast(q, k, v, 0.1, True, None, True) is None  # another p
    assert ext.attention_fast(q, k, v, 0.0, False, None, True) is None  # not causal
    assert ext.attention_fast(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, 0.0, True, None, True) is None


def test_cpu_softmax_and_attention_node_wiring(dry_run):
    ext = dry_run
    x = torch.randn(4, 9, requires_grad=True)
    y = ext.softmax_apply(x, _fake_launch(ext, "pp"), _fake_launch(ext, "ppp"))
    assert y.grad_fn.name() == "FusedSoftmaxBackward" and len(y.grad_fn.next_functions) == 1
    (gx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert gx.shape == x.shape
    q = torch.randn(1, 4, 16, 8, requires_grad=True)
    k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(2))
    strides = list(q.stride())
    plan = ext.register_attention(_fake_launch(ext, "p" * 9 + "fff"), _fake_launch(ext, "pppp"),
                                  _fake_launch(ext, "p" * 12 + "ffff"), _fake_launch(ext, "p" * 11 + "ffff"),
                                  strides, [1, 4, 16], strides, list(k.stride()), list(v.stride()))
    out = ext.attention_apply(q, k, v, 0.5, 0.35, None, 0.0, 1.0, plan)
    assert out.grad_fn.name() == "FusedAttentionBackward" and len(out.grad_fn.next_functions) == 3
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    with torch.no_grad():
        assert ext.attention_infer(q, k, v, 0.5, None, 0.0, 1.0, plan).grad_fn is None


def test_fast_calls_leave_bad_arguments_to_the_python_path(cpp_on):
    """With the extension loaded, arguments the one-call fast paths cannot even convert (pybind's TypeError)
    still get the functional API's own error, naming the argument."""
    from fused_layers.ops.norm_variants import fused_rms_norm_variant

    cases = [
        (lambda: fused_layer_norm("x", (3,)), "fused_layer_norm: argument 'input'"),
        (lambda: fused_rms_norm("x", (3,)), "fused_rms_norm: argument 'input'"),
        (lambda: fused_softmax("x", -1), "fused_softmax: argument 'input'"),
        (lambda: fused_attention("q", "k", "v"), "fused_attention: argument 'query'"),
        (lambda: fused_rms_norm_variant("x", torch.ones(3), 1e-6), "argument 'input'"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError, match=message):
            call()
    assert _cpp.fast_call("norm_fast", "x", (3,), None, None, 1e-5, False) is None


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    def fake_register(kernel, key, device, ints, role):
        calls.append((kernel, key, ints, role))
        return len(calls) - 1

    monkeypatch.setattr(_cpp, "register", fake_register)
    monkeypatch.setattr(_cpp, "_is_compiled", lambda kernel, key: True)  # the interpreter binds nothing
    monkeypatch.setattr(_cpp, "register_plan", lambda name, *h: ("plan", name, h))
    return calls


def _name(kernel):
    fn = kernel.fn
    return getattr(fn, "fn", fn).__name__  # InterpretedFunction / JITFunction -> the Python function


def _check_against_kernel(kernel, key, ints, role):
    """The role string covers the kernel's runtime parameters exactly; its pointers are the ones the C++ node
    passes, in order; the ints are the plan's."""
    import inspect

    params = inspect.signature(getattr(kernel.fn, "fn", kernel.fn)).parameters
    runtime = [n for n, p in params.items() if "constexpr" not in str(p.annotation)]
    assert len(runtime) == len(role), (_name(kernel), runtime, role)
    assert [n for n, r in zip(runtime, role) if r == "p"] == _CPP_POINTERS[_name(kernel)]
    assert role.count("i") == len(ints)
    assert key[0] == -1 and len(key) == 1 + len(kernel.check)  # device, then one entry per checked tensor


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
@pytest.mark.parametrize("grad", [True, False])
def test_norm_registration_matches_the_kernels(rms, affine, grad, recorded):
    if rms and affine == "wb":
        pytest.skip("RMSNorm has no bias")
    x = torch.randn(6, 100, dtype=torch.bfloat16)
    w = torch.randn(100, dtype=torch.float32) if affine != "none" else None
    b = torch.randn(100, dtype=torch.float32) if affine == "wb" else None
    plan = ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, 1, w is not None, b is not None, rms, grad, False)
    out = ln_ops._cpp_register(plan, x, w, b, 1, rms, grad)
    names = [_name(c[0]) for c in recorded]
    bwd = ["_norm_bwd_kernel"] + (["_norm_reduce_partials_kernel"] if affine != "none" else [])
    expect = ["_norm_fwd_kernel"] + (bwd if grad else [])
    assert names == expect
    for c in recorded:
        _check_against_kernel(*c)
    # the parameters' dtypes are in the keys: fp32 weight / bias next to bf16 x
    if affine != "none":
        assert (torch.float32, 0) in recorded[0][1]
    assert out[0] == "plan" and out[2][:2] == ((0, -1, -1, 0, 0) if not grad else (0, 1))[:2]


@pytest.mark.parametrize("shape,dim", [((5, 37), 1), ((3, 9, 4), 1)])
@pytest.mark.parametrize("grad", [True, False])
def test_softmax_registration_matches_the_kernels(shape, dim, grad, recorded):
    x = torch.randn(shape)
    plan = sm_ops._plan(x.shape, (x.stride(),), x.dtype, dim)
    handles = sm_ops._cpp_softmax_register(plan, x, dim, grad)
    assert [_name(c[0]) for c in recorded] == ["_softmax_fwd_kernel"] + (["_softmax_bwd_kernel"] if grad else [])
    assert handles == list(range(len(recorded)))
    for c in recorded:
        _check_against_kernel(*c)


@interpreter_only
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grad", [True, False])
def test_attention_registration_matches_the_kernels(causal, grad, recorded):
    """Dense attention (GQA, q in (B, S, H, D) memory order): the forward, and with grad the backward's three
    kernels, registered with the pointer order, floats-before-ints roles and ints the C++ node uses."""
    q = torch.randn(1, 7, 4, 16).transpose(1, 2)  # (B, H, S, D) view of (B, S, H, D) memory
    k, v = (torch.randn(1, 2, 9, 16) for _ in range(2))
    plan = at_ops._fwd_plan(at_ops._fwd_key(q, k, v, 7, 9, causal))
    out = at_ops._cpp_attention_register(plan, q, k, v, 7, 9, causal, 0.25, grad)
    names = [_name(c[0]) for c in recorded]
    assert names == ["_attn_fwd_kernel"] + (["_attn_bwd_preprocess", "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel"]
                                           if grad else [])
    for c in recorded:
        _check_against_kernel(*c)
    assert out[0] == "plan" and out[1] == "register_attention"
    ost = list(at_ops._permuted_stride(q.shape, plan.order))
    assert out[2][4] == ost and out[2][4] == list(q.stride())  # out laid out like q
    if grad:
        assert out[2][:4] == (0, 1, 2, 3)
        assert out[2][6] == list(q.stride())  # dq laid out like q


# --------------------------------------------------------------------------------------------------
# GPU: attention through the C++ node
# --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("S,D,hkv", [(197, 64, 12), (128, 128, 4)])
def test_gpu_cpp_attention_matches_float64(causal, layout, S, D, hkv, cpp_on):
    """Dense attention (ViT-like S 197, GQA 12/4) through the C++ node against float64: output and every
    gradient; also the no-grad forward and a dO in another layout than the output."""
    H = 12
    def make(h):
        t = torch.randn(2, S, h, D, device="cuda", dtype=torch.bfloat16)
        return (t.transpose(1, 2) if layout == "bshd" else t.transpose(1, 2).contiguous()).requires_grad_()
    q, k, v = make(H), make(hkv), make(hkv)
    for it in range(3):
        y = fused_attention(q, k, v, is_causal=causal, enable_gqa=hkv != H)
        do = torch.randn_like(y).transpose(-1, -2).contiguous().transpose(-1, -2)  # dO strided unlike y
        got = (y, *torch.autograd.grad(y, (q, k, v), do))
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        y64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, enable_gqa=hkv != H)
        want = (y64, *torch.autograd.grad(y64, (q64, k64, v64), do.double()))
        for g, r in zip(got, want):
            rel = ((g.double() - r).norm() / r.norm()).item()
            assert rel < 2e-2, rel
        with torch.no_grad():
            yi = fused_attention(q, k, v, is_causal=causal, enable_gqa=hkv != H)
        assert (yi.double() - y64).abs().max().item() < 5e-2
    plan = at_ops._FWD_PLANS.get(at_ops._fwd_key(q, k, v, S, S, causal))
    assert type(plan.cpp.get((0, False))) is int and type(plan.cpp.get((0, True))) is int
    assert got[0].grad_fn.name() == "FusedAttentionBackward", got[0].grad_fn


@interpreter_only
def test_attention_registration_with_dropout(recorded):
    """With dropout the plan (HAS_DROPOUT kernels) registers the same kernels and roles; its backward is
    compiled by a warm-up launch with the call's seed."""
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    plan = at_ops._fwd_plan(at_ops._fwd_key(q, k, v, 9, 9, True, True))
    seed = at_ops.draw_dropout_seed("cpu")
    out = at_ops._cpp_attention_register(plan, q, k, v, 9, 9, True, 0.25, True, 0.1, seed)
    assert [_name(c[0]) for c in recorded] == ["_attn_fwd_kernel", "_attn_bwd_preprocess", "_attn_bwd_dkdv_kernel",
                                               "_attn_bwd_dq_kernel"]
    for c in recorded:
        _check_against_kernel(*c)
    assert out[1] == "register_attention"


@pytest.mark.gpu
def test_gpu_cpp_attention_dropout_same_mask_as_python_path(cpp_on):
    """Dropout through the C++ node: the same seed gives the Python path's output and gradients (the node
    passes the seed tensor, p and the kept values' scale; the backward regenerates the same mask)."""
    q, k, v = (torch.randn(2, 12, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(2, 12, 256, 64, device="cuda", dtype=torch.bfloat16)

    def run(cpp):
        _cpp.ENABLED = cpp
        try:
            torch.manual_seed(1234)
            y = fused_attention(q, k, v, dropout_p=0.1, is_causal=True)
            return (y, *torch.autograd.grad(y, (q, k, v), do))
        finally:
            _cpp.ENABLED = True

    ref = run(False)
    for _ in range(2):  # the first C++-enabled call registers (Python path), the second runs the node
        got = run(True)
    assert got[0].grad_fn.name() == "FusedAttentionBackward", got[0].grad_fn
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=0, rtol=0)


@pytest.mark.gpu
def test_gpu_attention_fast_call(cpp_on):
    """attention_fast (SDPA's dense call in one C++ call) answers for a layout the Python path bound, with
    and without autograd, GQA with enable_gqa only; anything else returns None (the Python path runs)."""
    B, H, HKV, S, D = 2, 8, 2, 200, 64
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    for _ in range(2):
        fused_attention(q, k, v, is_causal=True, enable_gqa=True).backward(torch.randn_like(q))
        with torch.no_grad():
            fused_attention(q, k, v, is_causal=True, enable_gqa=True)
    fast = cpp_on.attention_fast
    y = fast(q, k, v, 0.0, True, None, True)
    assert y is not None and y.grad_fn.name() == "FusedAttentionBackward"
    with torch.no_grad():
        yi = fast(q, k, v, 0.0, True, None, True)
    assert yi is not None and yi.grad_fn is None
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
    torch.testing.assert_close(y.double(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(yi, y)
    do = torch.randn_like(q)
    got = torch.autograd.grad(y, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, enable_gqa=True)
    want = torch.autograd.grad(out64, (q64, k64, v64), do.double())
    for g, r in zip(got, want):
        torch.testing.assert_close(g.double(), r, atol=5e-2, rtol=5e-2)
    assert fast(q, k, v, 0.0, True, None, False) is None  # GQA without enable_gqa: the Python path raises
    assert fast(q, k, v, 0.0, False, None, True) is None  # not causal: not bound
    assert fast(q, k, v, 0.0, True, 0.5, True) is not None  # scale is a runtime argument
    with pytest.raises(ValueError):
        fused_attention(q, k, v, is_causal=True)  # (through the functional API: its own error)
    # a config override rebuilds the plans: the bindings are dropped, then the Python path binds again
    from fused_layers.ops._common import config_override

    with config_override("attention", nonexistent_knob=1):
        assert fast(q, k, v, 0.0, True, None, True) is None
    assert fast(q, k, v, 0.0, True, None, True) is None
    fused_attention(q, k, v, is_causal=True, enable_gqa=True)  # re-registers (plans are cached per epoch)
    fused_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert fast(q, k, v, 0.0, True, None, True) is not None


@pytest.mark.parametrize("cast_before_w", [True, False])
def test_rms_variant_registration(cast_before_w, recorded):
    """The HF Llama-family RMSNorm (bf16 x, fp32 weight, y in float32 = promote_types): the forward key holds y's
    dtype, the backward plan the cast order, and the plan the output's ScalarType code."""
    x = torch.randn(6, 100, dtype=torch.bfloat16)
    w = torch.randn(100, dtype=torch.float32)
    plan = ln_ops._fwd_plan(x.shape, x.stride(), x.dtype, 1, True, False, True, True, cast_before_w)
    out = ln_ops._cpp_register(plan, x, w, None, 1, True, True, cast_before_w, torch.float32)
    assert [_name(c[0]) for c in recorded] == ["_norm_fwd_kernel", "_norm_bwd_kernel", "_norm_reduce_partials_kernel"]
    for c in recorded:
        _check_against_kernel(*c)
    assert recorded[0][1][1:3] == ((torch.bfloat16, 0), (torch.float32, 0))  # x, then y in float32
    assert out[2][-1] == 6  # c10::ScalarType::Float


@pytest.mark.gpu
@pytest.mark.parametrize("cast_before_w,keep", [(True, False), (False, True), (False, False)])
def test_gpu_cpp_rms_variant_matches_reference(cast_before_w, keep, cpp_on):
    """The RMSNorm variants (HF Llama order, Gemma's keep-input-dtype) through the C++ node."""
    from fused_layers.ops.norm_variants import fused_rms_norm_variant

    x = torch.randn(40, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2048, device="cuda", dtype=torch.float32, requires_grad=True)
    for _ in range(3):
        # dy on the bf16 grid: the backward reads dy in x's dtype (test_layer_norm's strict xfail on float32 dy)
        dy = torch.randn(40, 2048, device="cuda").to(torch.bfloat16).float()
        y = fused_rms_norm_variant(x, w, 1e-6, cast_before_weight=cast_before_w, keep_input_dtype=keep)
        gx, gw = torch.autograd.grad(y, (x, w), dy.to(y.dtype))
        assert y.dtype == (torch.bfloat16 if keep else torch.float32)
        # each cast order against its own float64 reference and PyTorch's own (tests/_tol.py): one reference for
        # both orders at atol 0.05 passed a kernel that ignored the flag
        refs, tor = rms_variant_refs(x, w, dy.to(y.dtype), cast_before_w, keep, y=y)
        for name, a, r, t in zip(("y", "dx", "dW"), (y, gx, gw), refs, tor):
            assert_within_torch(a, r, t, what=name)
    assert y.grad_fn.name() == "FusedNormBackward", y.grad_fn
    # by now the registered shape runs in one C++ call (rms_variant_fast), with this variant's output dtype
    y2 = cpp_on.rms_variant_fast(x, w, 1e-6, cast_before_w, keep)
    assert y2 is not None and y2.dtype == y.dtype
    torch.testing.assert_close(y2, y, atol=0, rtol=0)  # the same kernels on the same inputs
    assert cpp_on.rms_variant_fast(x, w.half(), 1e-6, cast_before_w, keep) is None  # a weight dtype never registered
