"""What every op shares: where Triton can run, input checks, config overrides, warnings.

Dispatch rule (one place, used by every op):

* a CUDA tensor runs the Triton kernel;
* a CPU tensor runs the Triton kernel under ``TRITON_INTERPRET=1`` (the interpreter: slow, for tests);
* anything else (a CPU tensor without the interpreter, MPS, ...) runs the op's PyTorch reference,
  with one warning per op.

Eager calls take a *direct path* (``torch.autograd.Function`` straight into the launchers); under
``torch.compile`` the same launchers are reached through ``torch.library`` custom ops (fake + autograd
registered) so the graph has no break. The direct path exists because the custom-op dispatcher costs
tens of microseconds per call in eager mode, comparable to a small kernel (``python -m benchmarks host``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Iterator

import torch

try:  # Triton is a Linux-only dependency.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except Exception:  # pragma: no cover - exercised only where triton is missing
    HAS_TRITON = False

if HAS_TRITON:

    @triton.jit
    def bits_to_f32(x):
        """A 16-bit float tensor in float32, through its bits for bf16 (the bits moved up 16 places): equal to
        x.to(tl.float32), in a form the compiler does not merge with it, so a kernel that converts a held 16-bit row
        once per pass (the PACKED forwards of softmax and the norms) keeps no float32 copy of it alive between
        passes.  fp16 converts."""
        if x.dtype == tl.bfloat16:
            return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        else:
            return x.to(tl.float32)


#: Read once at import: Triton itself reads the variable when kernels are first decorated.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = "float16, bfloat16 or float32"

_warned: set[str] = set()
#: Every fallback ``warn_once`` was asked to report, in the order first seen: key -> [message, times]
_fallbacks: dict[str, list] = {}


def fallbacks(since: dict[str, int] | None = None) -> dict[str, int]:
    """What ran something else than the kernels in this process (the model's own code, the PyTorch reference,
    another kernel variant), each message once, with how often: eager calls, or traces under torch.compile (a
    compiled graph keeps what it traced).  The warnings say the same, once each.  ``since``: an earlier result;
    only what came after it (a run's own)."""
    since = since or {}
    return {m: n - since.get(m, 0) for m, n in _fallbacks.values() if n > since.get(m, 0)}


def _record(key: str, message: str) -> None:
    entry = _fallbacks.get(key)
    if entry is None:
        _fallbacks[key] = [message, 1]
    else:
        entry[1] += 1


# --------------------------------------------------------------------------------------------------
# Error types: the fused modules are drop-ins, so a bad input raises what PyTorch's module raises for it
# (``except RuntimeError`` around ``nn.LayerNorm`` keeps working) and what our messages always raised.
# --------------------------------------------------------------------------------------------------
class FusedShapeError(ValueError, RuntimeError):
    """A shape that does not fit (PyTorch raises ``RuntimeError`` there; we raised ``ValueError``)."""


class FusedDtypeError(TypeError, NotImplementedError):
    """A dtype the op does not implement (PyTorch raises ``NotImplementedError``, a ``RuntimeError``, for
    e.g. an integer tensor into softmax; we raised ``TypeError``)."""


def warn_once(key: str, message: str, category: type[Warning] = UserWarning) -> None:
    """Emit ``message`` once per process for ``key``.

    While Dynamo traces, ``warnings.warn`` would break the graph (Dynamo cannot trace it): the warning is
    then given by ``_warn_while_tracing``, which Dynamo runs as plain Python once, when it traces the call."""
    if is_compiling():
        _warn_while_tracing(key, message)
        return
    _record(key, message)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, category, stacklevel=3)


@torch.compiler.assume_constant_result
def _warn_while_tracing(key: str, message: str) -> bool:
    """``warn_once`` from compiled code: run once while tracing (``assume_constant_result``), never in the graph."""
    _record(key, message)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=2)
    return True


def triton_runnable(t: torch.Tensor) -> bool:
    """True when the Triton kernels can run on ``t``'s device (CUDA, or CPU under the interpreter)."""
    if not HAS_TRITON:
        return False
    if t.is_cuda:  # (on every eager call: 0.08 us, where t.device.type == "cuda" takes 0.5)
        return True
    return INTERPRET and t.is_cpu


def is_dtensor(t: object) -> bool:
    """``t`` is a ``torch.distributed`` DTensor (a tensor-parallel plan's input or parameter)."""
    dt = sys.modules.get("torch.distributed.tensor")
    return dt is not None and isinstance(t, getattr(dt, "DTensor", ()))


def use_fallback(op: str, t: torch.Tensor, *others: object) -> bool:
    """True (and warn once) when ``op`` must run its PyTorch reference on ``t``'s device, or because ``t`` or one of
    ``others`` is a DTensor: the kernels take local tensors, and PyTorch's own ops have DTensor's sharding rules."""
    if is_dtensor(t) or any(is_dtensor(o) for o in others):
        warn_once(f"fallback:{op}:dtensor", f"fused_layers.{op}: DTensor inputs (a tensor-parallel plan) run the "
                  "PyTorch reference, whose sharding rules DTensor knows.")
        return True
    if triton_runnable(t):
        return False
    if t.device.type == "meta":  # shape propagation / FLOP counting: the reference is the right answer
        return True
    why = "triton is not installed" if not HAS_TRITON else f"Triton cannot run on device '{t.device}'"
    hint = "" if t.device.type != "cpu" else (
        " (TRITON_INTERPRET=1, set before import, runs the kernels on the CPU in Triton's interpreter: for tests "
        "and debugging only, far too slow to train with -- about 90 s per step of the demo's tiny GPT)"
    )
    warn_once(f"fallback:{op}:{t.device.type}", f"fused_layers.{op}: {why}{hint}; using the PyTorch reference.")
    return True


def check_tensor(op: str, name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_float_dtype(op: str, name: str, t: torch.Tensor, allow_float64: bool = False) -> None:
    """Raise a clear ``FusedDtypeError`` (a ``TypeError`` and, like PyTorch's, a ``NotImplementedError``)
    when ``t`` is not a supported floating dtype."""
    ok = SUPPORTED_DTYPES + ((torch.float64,) if allow_float64 else ())
    if t.dtype not in ok:
        extra = " (float64 runs the PyTorch reference)" if allow_float64 else ""
        raise FusedDtypeError(f"{op}: argument '{name}' has dtype {t.dtype}; supported: {_DTYPE_NAMES}{extra}")


def check_same_device(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(
                f"{op}: argument '{name}' is on {t.device} but '{ref_name}' is on {ref.device}; "
                "all tensors must be on the same device"
            )


def normalize_dim(op: str, dim: int, ndim: int) -> int:
    """Wrap a possibly negative ``dim`` like PyTorch does, raising ``IndexError`` when out of range."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: argument 'dim' must be an int, got {type(dim).__name__}")
    n = max(ndim, 1)  # a 0-d tensor accepts dim in [-1, 0], like torch
    if not -n <= dim < n:
        raise IndexError(f"{op}: argument 'dim' out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return dim % n


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def concrete(seq) -> tuple[int, ...]:
    """``seq`` (a shape or strides) as plain ints: symbolic sizes met while tracing with dynamic shapes are
    specialized (a guard), since launch plans and constexpr block sizes need concrete values."""
    return tuple(int(v) for v in seq)


def autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype ``torch.autocast`` runs its lower-precision ops in on ``t``'s device, or None outside autocast."""
    try:
        if torch.is_autocast_enabled(t.device.type):
            return torch.get_autocast_dtype(t.device.type)
    except (TypeError, RuntimeError, AttributeError):  # torch < 2.4, or a device type without autocast
        pass
    return None


def autocast_off(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """``torch.autocast(<t's device>, enabled=False)`` where autocast is on there, else a no-op context: entering
    and leaving autocast's context costs about 10 us of host time a call."""
    return torch.autocast(t.device.type, enabled=False) if autocast_dtype(t) is not None else contextlib.nullcontext()


def autocast_cast(dtype: torch.dtype, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """``tensors`` as autocast casts the arguments of one of its lower-precision ops (SDPA): floating tensors to
    ``dtype``, float64 and everything else as they are."""
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                 else t for t in tensors)


def is_compiling() -> bool:
    """True while Dynamo traces: then ops go through the registered custom ops."""
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover - torch < 2.3
        return False


# --------------------------------------------------------------------------------------------------
# Config overrides. Tests use them to push block sizes down so that the interpreter (which runs one
# program at a time in numpy) reaches the multi-block / streaming paths on small tensors.
# --------------------------------------------------------------------------------------------------
_OVERRIDES: dict[str, dict[str, int]] = {}
_EPOCH = [0]  # bumped on every override change, so launch-plan caches keyed on it stay right


def override_epoch() -> int:
    return _EPOCH[0]


def get_override(op: str, key: str, default: int) -> int:
    return _OVERRIDES.get(op, {}).get(key, default)


@contextlib.contextmanager
def config_override(op: str, **values: int) -> Iterator[None]:
    """Temporarily override config values of ``op`` (e.g. ``config_override("softmax", max_single_block=64)``)."""
    old = dict(_OVERRIDES.get(op, {}))
    _OVERRIDES.setdefault(op, {}).update(values)
    _bump_epoch()
    try:
        yield
    finally:
        _OVERRIDES[op] = old
        _bump_epoch()


def _bump_epoch() -> None:
    """New launch plans from now on: the Python caches key on the epoch; the C++ fast paths' tables, which
    map a call's shape straight to a plan, are emptied (ops/_cpp.py)."""
    _EPOCH[0] += 1
    from . import _cpp

    if _cpp._ext is not None:
        _cpp._ext.clear_fast()
