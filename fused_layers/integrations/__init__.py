"""Known third-party look-alikes: classes of other libraries that ``swap_modules`` swaps by default.

A *look-alike* is a class whose forward is numerically what one of our kinds computes (Hugging Face's
Llama-family RMSNorm, Gemma's RMSNorm, T5's LayerNorm, timm's LayerNorm / LayerNorm2d) or that calls
``F.scaled_dot_product_attention`` (timm's ViT attention) or goes through transformers' attention
registry (every ``*Attention`` of a model that calls ``ALL_ATTENTION_FUNCTIONS``).  A swap gives the
instance a *fused subclass of its own class* (made once per class, see ``fused_class``): same
parameters, buffers, hooks and state_dict keys; ``isinstance(m, SourceClass)`` still holds; the
subclass overrides ``forward`` only.  ``restore_modules`` sets the original class back.

How a class is recognised (``match``), without importing anything: only classes whose defining module
is already imported can be in a model, so a library that is not imported costs nothing.

* Norms are matched by *forward fingerprint*: the class's ``forward`` must parse to the same syntax
  tree (names, constants, operations; not comments, formatting, annotations or the docstring) as the
  forward we verified, whose source is kept here (``_hf.py``, ``_timm.py``).  So every copy transformers makes
  of ``LlamaRMSNorm`` (Mistral, Qwen2/3, Phi-3, ...: 140 classes in transformers 5.24, each checked) is covered,
  and a class whose forward changes in a later release stops matching instead of being swapped wrongly.
* timm's SDPA callers and HF attention classes are matched by class path / by what their forward calls.
* transformers' gated MLPs, rotary embeddings and decoder layers (``_hf_decoder.py``) by their forward's
  fingerprint, and the model's ``apply_rotary_pos_emb`` / the layer's norm by theirs; the plain MLPs of GPT-2 and
  timm (``_mlp.py``) likewise.

Each entry is verified by ``tests/test_integrations.py`` against the library's own forward and backward.
Entries of a library that is not installed are simply never matched.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Optional

from torch import nn

__all__ = ["LookAlike", "REGISTRY", "match", "fused_class", "is_fused_class", "fingerprint", "entries_for",
           "register_mlp"]


def _ast_fingerprint(src: str) -> Optional[str]:
    """The AST of the first function in ``src``, without its name, decorators, annotations, docstring
    (and, being an AST, without comments or formatting)."""
    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:
        return None
    fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if fn is None:
        return None
    fn.name, fn.decorator_list, fn.returns = "f", [], None
    for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg]:
        if a is not None:
            a.annotation = None
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        fn.body = body[1:] or [ast.Pass()]
    return ast.dump(fn, include_attributes=False)


_SRC_FP: dict[Any, Optional[str]] = {}


def fingerprint(fn) -> Optional[str]:
    """What a function computes as written: its source's AST, less name, decorators, annotations,
    docstring, comments and formatting (``None`` when the source cannot be read)."""
    try:
        hit = _SRC_FP.get(fn)
    except TypeError:
        hit = None
    if hit is not None:
        return hit
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    fp = _ast_fingerprint(src)
    try:
        _SRC_FP[fn] = fp
    except TypeError:
        pass
    return fp


def _compile_forward(src: str) -> Optional[str]:
    """Fingerprint of a forward given as source (``def forward(self, ...)``)."""
    return _ast_fingerprint(src)


@dataclass(frozen=True)
class LookAlike:
    """One registry entry."""

    name: str  #: e.g. "hf_llama_rms_norm"
    library: str  #: top-level package: "transformers", "timm"
    kind: str  #: the KINDS name it counts as (on/off switch, report)
    canonical: str  #: dotted path of the class the tests verify
    build: Callable[[type], dict]  #: source class -> the fused subclass's namespace (forward, hooks)
    forward_src: Optional[str] = None  #: a class matches when its forward compiles to this source
    classes: tuple[str, ...] = ()  #: or: dotted paths matched by name
    predicate: Optional[Callable[[type], bool]] = None  #: or: a test on the class
    #: instance check at swap time: a reason not to swap this module, or None
    check: Optional[Callable[[nn.Module], Optional[str]]] = None
    note: str = ""  #: one line for the report / README

    def fp(self) -> Optional[str]:
        if self.forward_src is None:
            return None
        fp = _FP_CACHE.get(self.name)
        if fp is None:
            fp = _FP_CACHE[self.name] = _compile_forward(self.forward_src)
        return fp


_FP_CACHE: dict[str, Optional[str]] = {}
REGISTRY: list[LookAlike] = []
_MATCH_CACHE: dict[type, Optional[LookAlike]] = {}
_FUSED_CACHE: dict[type, type] = {}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def entries_for(library: str) -> list[LookAlike]:
    return [e for e in REGISTRY if e.library == library]


def match(cls: type) -> Optional[LookAlike]:
    """The registry entry whose look-alike ``cls`` is, else None (cached per class)."""
    try:
        return _MATCH_CACHE[cls]
    except KeyError:
        pass
    except TypeError:  # unhashable metaclass oddities
        return None
    out = None
    top = cls.__module__.split(".", 1)[0]
    if top in sys.modules and not is_fused_class(cls):
        path = _qualname(cls)
        for e in REGISTRY:
            if e.library != top:
                continue
            if path in e.classes or (e.predicate is not None and e.predicate(cls)):
                out = e
                break
            fp = e.fp()
            if fp is not None and "forward" in cls.__dict__ and fingerprint(cls.__dict__["forward"]) == fp:
                out = e
                break
    _MATCH_CACHE[cls] = out
    return out


def is_fused_class(cls: type) -> bool:
    return "_fused_layers_lookalike" in getattr(cls, "__dict__", {})


def fused_class(cls: type, entry: LookAlike) -> type:
    """The fused subclass of ``cls`` (made once): ``entry.build(cls)`` supplies forward (and hooks)."""
    fused = _FUSED_CACHE.get(cls)
    if fused is None:
        ns = dict(entry.build(cls))
        # Named after the module that defines the entry (fused_layers.integrations._hf / _timm), so the
        # report reads "timm.layers.norm.LayerNorm -> fused_layers.integrations._timm.FusedLayerNorm".
        ns.update(_fused_layers_kind=entry.kind, _fused_layers_lookalike=entry.name, _fused_layers_source=cls,
                  __module__=getattr(entry.build, "__module__", __name__))
        fused = type(f"Fused{cls.__name__}", (cls,), ns)
        fused.__qualname__ = f"Fused{cls.__name__}"
        _FUSED_CACHE[cls] = fused
    return fused


def load_entries() -> None:
    """Fill ``REGISTRY`` (our own modules only; importing them imports no third-party library)."""
    if REGISTRY:
        return
    from . import _hf, _hf_decoder, _mlp, _peft, _timm  # noqa: F401  (each appends its entries)


load_entries()

from ._mlp import register_mlp  # noqa: E402  (your own plain MLP class into the ``mlp`` kind)
