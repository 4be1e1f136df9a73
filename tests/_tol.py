"""One tolerance rule for 16-bit results: within K times PyTorch's own error, against the same float64 reference.

For an output or a gradient ``ours`` of a fused op, ``ref`` the same quantity computed in float64 from the same
(16-bit valued) inputs, and ``torch_ref`` PyTorch's own implementation run in the same dtypes::

    max |ours - ref|  <=  K * max |torch_ref - ref|  +  FLOOR[dtype] * scale  +  SUBNORMAL[dtype]

``scale`` is the quantity's own size (``max |ref|`` unless given: a CE gradient's is ~1/rows under mean reduction,
a LayerNorm dx's is that of one row, never sqrt(rows) of it), so a wrong result is never hidden by an absolute
tolerance sized for another quantity. Why K = 2 and a floor of one unit of the dtype's precision (eps) at that
scale: in two runs over seeds 1-8 (tests/test_tolerance.py: 2 draws x bf16/fp16 x 2 sizes, the interpreter running
the persistent and piece-wise kernels and 16-row attention tiles; 128 draws per check, 32 for attention), the
correct fused LayerNorm y/dx/dW/dB, softmax y/dx, CE loss/dlogits and attention out/dq/dk/dv used at most 0.83 of
the allowed error (the scalar CE loss; every tensor <= 0.64), while the smallest planted fault used 1.41 of it
(LayerNorm dx without its projection terms; every gradient x 0.95 >= 2.2, attention x 0.95 >= 2.5; a dropped column
or key, pieces without their exchange, a zero CE gradient, 0.2 x dx: >= 4.3), so either bound could move by 20 % and
still separate them. The floor, relative to the scale and never an absolute atol, covers results where PyTorch's own
rounding happens to be exact (a scalar loss, tiny tensors). ``SUBNORMAL`` is the spacing of the dtype's subnormals
(tiny x eps: 6e-8 in float16), the finest a result that small can be: an RMSNorm dx over rows of one column (about
1e-8) came out 1.5 of those steps off in float16 where PyTorch's happened to be half of one (absolute errors only).
The softmax backward is measured from OUR saved output (``softmax_backward_refs``: float64 and PyTorch's backward
from the same y): fed each backward its own forward's y, one probability near 1 rounded a unit apart by two correct
forwards moved dx by eps * |dy| through the cancellation in y * (dy - y . dy), which rejected the correct bf16
backward at 1.04 of the allowed error (FUSED_TEST_SEED=1, 45 columns, persistent pieces), and measured from float64
softmax(x) that inherited error also let dx x 0.95 pass at 0.97. With ``relative=True`` the rule also holds entry by
entry, each error relative to its own entry (probabilities: a dropped small column is 100 % off). Compositions of
several ops (a compiled block) use ``assert_norm_within_torch``, the same rule on relative norms.
float32 results keep their float64 tolerances (conftest.TOL).
"""

import contextlib

import torch

K = 2.0
FLOOR = {torch.float16: torch.finfo(torch.float16).eps, torch.bfloat16: torch.finfo(torch.bfloat16).eps,
         torch.float32: 1e-5, torch.float64: 1e-10}
SUBNORMAL = {d: torch.finfo(d).tiny * torch.finfo(d).eps for d in (torch.float16, torch.bfloat16)}


def tol_error(ours, ref, torch_ref, scale=None, k=K, relative=False):
    """(max error of ours, allowed error) under the rule, over the entries where the float64 reference is finite;
    ``relative``: errors relative to each entry (entries of normal size only), for positive outputs such as
    probabilities, whose every entry is its own scale (a dropped small column is 100 % off)."""
    floor = FLOOR.get(ours.dtype, FLOOR[torch.float32])
    ours_dtype = ours.dtype
    tiny = torch.finfo(ours.dtype).tiny if ours.dtype.is_floating_point else 0.0
    ours, ref, torch_ref = ours.detach().double(), ref.detach().double(), torch_ref.detach().double()
    keep = torch.isfinite(ref) & torch.isfinite(torch_ref)
    if relative:
        keep &= ref.abs() >= tiny
    if not keep.any():
        return 0.0, 0.0
    r, t, o = ref[keep], torch_ref[keep], ours[keep]
    div = r.abs() if relative else torch.ones_like(r)
    err = ((o - r).abs() / div).max().item()
    t_err = ((t - r).abs() / div).max().item()
    if relative:
        scale = 1.0
    elif scale is None:
        scale = r.abs().max().item()
    return err, k * t_err + floor * scale + (0.0 if relative else SUBNORMAL.get(ours_dtype, 0.0))


def within_torch(ours, ref, torch_ref, scale=None, k=K, relative=False):
    """True when ours meets the rule (and, with ``relative``, its per-entry form too); non-finite reference entries
    must match exactly (NaN for NaN)."""
    if ours.shape != ref.shape:
        return False
    ours_d, ref_d = ours.detach().double(), ref.detach().double()
    bad = ~torch.isfinite(ref_d)
    if bad.any() and not torch.equal(ours_d[bad].nan_to_num(), ref_d[bad].nan_to_num()):
        return False
    if not torch.isfinite(ours_d[~bad]).all():
        return False
    for rel in (False, True) if relative else (False,):
        err, allowed = tol_error(ours, ref, torch_ref, scale, k, rel)
        if not err <= allowed:
            return False
    return True


def softmax_backward_refs(y, dy, dim=-1):
    """(float64 reference, PyTorch's own) for the softmax backward from OUR saved output ``y`` and ``dy``: the
    backward's inputs are (y, dy), and the forward that made y has its own check.  dx = y * (dy - sum(y * dy))
    cancels where one probability is near 1, so a one-unit difference between two correct forwards' roundings of
    that probability moves dx by eps * |dy| there: measured from the float64 dx of x itself, that inherited error
    both hid a dx x 0.95 and, fed each backward its own forward's y, rejected a correct one (module docstring)."""
    d = dim % max(y.dim(), 1)
    yd, dyd = y.detach().double(), dy.detach().double()
    ref = yd * (dyd - (yd * dyd).sum(d, keepdim=True))
    return ref, torch.ops.aten._softmax_backward_data(dy.detach(), y.detach(), d, y.dtype)


def rms_variant_refs(x, w, dy, cast_before_w, keep_input_dtype=False, y=None):
    """(float64 reference of THIS cast order, PyTorch's own in the same dtypes) for the RMSNorm variant's (y, dx,
    dW) (ops/norm_variants.py): cast_first rounds the normalized row to x's dtype before the weight multiply (the
    rounding a step of the float64 math, straight through in the backward, as autograd sees the cast), weight_first
    multiplies in float32.  Each order gets its own reference, so a kernel that ignores the flag fails.  Pass the
    kernel's ``y`` so that an entry a float32 computation may round either way takes the way the kernel took."""
    from fused_layers.ops.norm_variants import rms_norm_variant_reference

    x64, w64 = (t.detach().double().requires_grad_(True) for t in (x, w))
    h = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    if cast_before_w:
        h = h + (_rounded_as_float32_may(h.detach(), x.dtype, y, w) - h.detach())
    y64 = w64 * h
    xt, wt = (t.detach().requires_grad_(True) for t in (x, w))
    yt = rms_norm_variant_reference(xt, wt, 1e-6, cast_before_w, keep_input_dtype)
    return ((y64, *torch.autograd.grad(y64, (x64, w64), dy.double())),
            (yt, *torch.autograd.grad(yt, (xt, wt), dy.to(yt.dtype))))


def _rounded_as_float32_may(h64, dtype, y=None, w=None):
    """h64 rounded to ``dtype``, as a float32 computation of h may round it.  An entry within 2^-20 (relative) of a
    rounding midpoint rounds either way from float32 (a float32 row sum in another order moves the row's rstd by about
    1e-7; 2 of 5 seeds of a 40 x 2048 bf16 row hit one, 1 bf16 unit x |w| off); such an entry takes the rounding
    nearest ``y / w``, every other entry the one rounding there is (so a kernel that skips the cast still fails)."""
    r = h64.to(dtype).double()
    if y is None:
        return r
    lo, hi = ((h64 * (1 + s * 2.0 ** -20)).to(dtype).double() for s in (-1, 1))
    seen = y.detach().double() / w.detach().double()
    pick = torch.where((seen - lo).abs() <= (seen - hi).abs(), lo, hi)
    return torch.where(lo != hi, pick, r)


def attention_refs(q, k, v, do, **kw):
    """(float64 reference, PyTorch's own SDPA in q's dtype): each a tuple (out, dq, dk, dv) for the upstream
    gradient ``do``; ``kw`` as SDPA's (is_causal, attn_mask, scale, enable_gqa)."""
    import torch.nn.functional as F

    outs = []
    for dtype in (torch.float64, q.dtype):
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
        mask = kw.get("attn_mask")
        kw2 = dict(kw, attn_mask=mask.to(dtype) if mask is not None and mask.is_floating_point() else mask)
        out = F.scaled_dot_product_attention(*leaves, **kw2)
        outs.append((out, *torch.autograd.grad(out, leaves, do.to(dtype))))
    return outs[0], outs[1]


def assert_within_torch(ours, ref, torch_ref, what="", scale=None, k=K, relative=False):
    """Assert the rule; the message carries both errors."""
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    if within_torch(ours, ref, torch_ref, scale, k, relative):
        return
    msg = []
    for rel in (False, True) if relative else (False,):
        err, allowed = tol_error(ours, ref, torch_ref, scale, k, rel)
        t_err, _ = tol_error(torch_ref, ref, torch_ref, scale, k, rel)
        msg.append(f"{'relative' if rel else 'max'} error {err:.3g} (allowed {allowed:.3g}, PyTorch's own {t_err:.3g})")
    raise AssertionError(f"{what}: " + "; ".join(msg) + f"; K={k}, non-finite entries must match the reference")


def rel_norm_error(ours, ref):
    """||ours - ref|| / ||ref|| in float64."""
    ours, ref = ours.detach().double(), ref.detach().double()
    return ((ours - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def assert_norm_within_torch(ours, ref, torch_ref, what="", k=K):
    """The rule by relative norms, for compositions of several ops (a compiled block: bf16 roundings at other
    places than PyTorch's eager chain, whose largest entries errors are a poor statistic, while the norm over
    thousands of entries is stable): ||ours - ref|| / ||ref|| <= K * PyTorch's own + FLOOR."""
    err, t_err = rel_norm_error(ours, ref), rel_norm_error(torch_ref, ref)
    allowed = k * t_err + FLOOR.get(ours.dtype, FLOOR[torch.float32])
    assert err <= allowed, f"{what}: relative-norm error {err:.3g} (allowed {allowed:.3g}, PyTorch's own {t_err:.3g})"


@contextlib.contextmanager
def launched(op="softmax"):
    """Record the kernels launched in the block: a list of (kernel name, meta) in launch order, one entry per
    distinct (name, meta).  Every Triton and Gluon launch of the library goes through ``ops._library.Kernel`` (tests
    /test_library.py), so this says which plan ran: the persistent kernels, VEC8 (``VEC_WIN`` > 0), packed, Gluon,
    TMA.  Entering bumps the launch-plan epoch of ``op`` (an empty ``config_override``): new plans, and the C++ fast
    path's tables emptied, so the block's first call of a shape takes the Python path, where the spy sees it."""
    from fused_layers.ops import _library
    from fused_layers.ops._common import config_override

    seen: list[tuple[str, dict]] = []
    orig = _library.Kernel.__call__

    def spy(self, *args):
        entry = (self.fn.__name__, dict(self.meta))
        if entry not in seen:
            seen.append(entry)
        return orig(self, *args)

    _library.Kernel.__call__ = spy
    try:
        with config_override(op):
            yield seen
    finally:
        _library.Kernel.__call__ = orig


def kernel_names(seen):
    """The names in a ``launched`` record."""
    return [name for name, _ in seen]


def ran(seen, name, **meta):
    """True when ``seen`` (a ``launched`` record) holds a launch of kernel ``name`` whose meta has each of ``meta``
    (a value, or a predicate on the value: ``VEC_WIN=lambda w: w > 0``)."""
    def match(m):
        return all(k in m and (v(m[k]) if callable(v) else m[k] == v) for k, v in meta.items())

    return any(n == name and match(m) for n, m in seen)
