"""One tolerance rule for 16-bit results: within K times PyTorch's own error, against the same float64 reference.

For an output or a gradient ``ours`` of a fused op, ``ref`` the same quantity computed in float64 from the same
(16-bit valued) inputs, and ``torch_ref`` PyTorch's own implementation run in the same dtypes::

    max |ours - ref|  <=  K * max |torch_ref - ref|  +  FLOOR[dtype] * scale

``scale`` is the quantity's own size (``max |ref|`` unless given: a CE gradient's is ~1/rows under mean reduction,
a LayerNorm dx's is that of one row, never sqrt(rows) of it), so a wrong result is never hidden by an absolute
tolerance sized for another quantity. K = 2 because two correct float32-accumulating implementations differ
only in summation order and in which way a near-tie rounds (each within about one rounding of the output), while a
gradient off by 5 % is 6 units of bf16 precision (2^-7) off and a dropped column 100 % of its entries
(tests/test_tolerance.py checks that the rule accepts the one and rejects the other). The floor, one unit of the
dtype's precision at the quantity's scale, covers tiny tensors where PyTorch's rounding happens to be exact. With
``relative=True`` the rule also holds entry by entry, each error relative to its own entry (probabilities).
float32 results keep their float64 tolerances (conftest.TOL).
"""

import torch

K = 2.0
FLOOR = {torch.float16: torch.finfo(torch.float16).eps, torch.bfloat16: torch.finfo(torch.bfloat16).eps,
         torch.float32: 1e-5, torch.float64: 1e-10}


def tol_error(ours, ref, torch_ref, scale=None, k=K, relative=False):
    """(max error of ours, allowed error) under the rule, over the entries where the float64 reference is finite;
    ``relative``: errors relative to each entry (entries of normal size only), for positive outputs such as
    probabilities, whose every entry is its own scale (a dropped small column is 100 % off)."""
    floor = FLOOR.get(ours.dtype, FLOOR[torch.float32])
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
    return err, k * t_err + floor * scale


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
