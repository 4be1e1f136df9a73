"""SDPA callers: modules whose forward calls ``F.scaled_dot_product_attention`` run ``fused_attention``.

Scoped to the swapped modules, no process-wide patch: the fused subclass of such a class gets a *copy*
of the class's ``forward`` function (same code, defaults, closure) whose globals are a copy of the
defining module's globals in which the names the code reaches SDPA through are rebound:

* ``F`` / ``functional`` (``torch.nn.functional``) -> a proxy module whose ``scaled_dot_product_attention``
  is ``sdpa_fused`` and whose every other attribute is torch's;
* ``torch`` -> a proxy ``torch`` whose ``nn.functional`` is that proxy
  (``torch.nn.functional.scaled_dot_product_attention(...)``, nanoGPT's spelling);
* a bare ``scaled_dot_product_attention`` imported from torch -> ``sdpa_fused``.

The copied globals are the ``__dict__`` of a module registered in ``sys.modules`` under its own name
(``fused_layers_rebound.<module>``): Dynamo guards an inlined function's globals through the module that
``__name__`` names, so a copy still named after the original module made it guard on torch's SDPA while it
traced ``sdpa_fused`` (torch 2.11: an error building the guards of a compiled timm ViT).

Other modules, and the same class's instances that were not swapped, still call torch's SDPA.
``sdpa_fused`` takes SDPA's full signature and gives SDPA's result (``fused_attention`` falls back to
SDPA for what the kernels do not cover, and where cuDNN is measured faster -- ``prefer_sdpa`` -- it calls
SDPA itself, as the project's attention modules do), so rebinding cannot change what a forward computes.  A call
the forward makes through a helper function defined elsewhere is not rebound (it keeps torch's SDPA).
"""

from __future__ import annotations

import sys
import types
from typing import Any, Optional

import torch
import torch.nn.functional as F

_REAL_SDPA = F.scaled_dot_product_attention


def sdpa_fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention``'s signature and result, on the fused kernels."""
    from ..ops.attention import fused_attention

    # backend "auto": SDPA itself where cuDNN is measured faster (as FusedAttention)
    return fused_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa,
                           backend="auto")


class _Proxy(types.ModuleType):
    """A module that answers ``overrides`` first and everything else from ``real``."""

    def __init__(self, real: types.ModuleType, overrides: dict[str, Any]) -> None:
        super().__init__(real.__name__)
        self.__dict__["_real"] = real
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:  # only called for names not overridden
        return getattr(self.__dict__["_real"], name)


_F_PROXY = _Proxy(F, {"scaled_dot_product_attention": sdpa_fused})
_NN_PROXY = _Proxy(torch.nn, {"functional": _F_PROXY})
_TORCH_PROXY = _Proxy(torch, {"nn": _NN_PROXY})


def calls_sdpa(fn) -> bool:
    """True when ``fn``'s own code names ``scaled_dot_product_attention`` (directly or as an attribute)."""
    code = getattr(fn, "__code__", None)
    return code is not None and "scaled_dot_product_attention" in code.co_names


def _rebound_globals(globals_: dict) -> Optional[dict]:
    """The rebound copy of a module's globals, as a registered module's ``__dict__``; None if nothing in them
    reaches SDPA.  One module per original module, shared by its rebound forwards and refreshed from the original
    at each rebinding (a class defined later in the module, e.g. in a notebook, sees the names defined since)."""
    swaps = {F: _F_PROXY, torch: _TORCH_PROXY, torch.nn: _NN_PROXY, _REAL_SDPA: sdpa_fused}
    changed = {k: swaps[v] for k, v in globals_.items() if any(v is s for s in swaps)}
    if not changed:
        return None
    own = f"fused_layers_rebound.{globals_.get('__name__', '')}"
    mod = sys.modules.get(own)
    if mod is None:
        mod = sys.modules[own] = types.ModuleType(own)  # Dynamo's guards import the module that __name__ names
    mod.__dict__.update(globals_)
    mod.__dict__.update(changed, __name__=own)
    return mod.__dict__


def rebound_forward(fn) -> Optional[types.FunctionType]:
    """A copy of ``fn`` that reaches ``sdpa_fused`` wherever it reached torch's SDPA; None if it does not call it."""
    if not isinstance(fn, types.FunctionType) or not calls_sdpa(fn):
        return None
    g = _rebound_globals(fn.__globals__)
    if g is None:
        return None
    new = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    return new


def build_sdpa_caller(cls: type) -> dict:
    """Namespace of the fused subclass of an SDPA-calling class (its forward, rebound)."""
    fwd = rebound_forward(cls.forward)
    if fwd is None:
        raise TypeError(f"{cls.__module__}.{cls.__qualname__}.forward does not call F.scaled_dot_product_attention")
    return {"forward": fwd}
