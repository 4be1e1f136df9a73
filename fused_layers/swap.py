"""Model surgery: swap PyTorch modules for their fused drop-in subclasses, in place, and back.

``KINDS`` is the one registry of swappable kinds; ``swap_modules``, the Lightning callback
(``fused_layers.lightning.FusedLayersCallback``) and the training job's config all read it.

How a swap works.  Every fused module is a drop-in subclass of its source class (same constructor, same
attributes and parameter names), so a swap only changes the instance's class::

    module.__class__ = FusedLayerNorm

Everything else is the very same object: the same ``Parameter`` and buffer objects (an optimizer built
before or after holds the right tensors, in the same order; DDP/FSDP see nothing new), the same forward /
backward / state-dict hooks, the train/eval mode, device and dtype.  ``state_dict`` keys are unchanged, so
checkpoints load strictly in either direction.  ``restore_modules`` sets the original class back.

A target class may define ``_fused_after_swap(self)`` (called right after the class change, e.g. to
derive an attribute its ``__init__`` would have set) and ``_fused_before_restore(self)``.

Known look-alikes (``fused_layers.integrations``).  Classes of other libraries whose forward computes
what one of our kinds does (Hugging Face's Llama-family / T5 / Gemma RMSNorms, timm's LayerNorm and
LayerNorm2d, timm's SDPA-calling attention, every transformers attention module that goes through its
``AttentionInterface``) are swapped by default whenever their library is imported, each into a fused
subclass of its own class (only ``forward`` differs).  They count as their kind (``kinds`` switches
them) and the report names the registry entry.  Hugging Face attention modules also switch their model
to the attention implementation "fused_layers" (and back on restore).  Six kinds exist only as such
look-alikes (``Kind.known_only``: no torch class, nothing a ``mapping`` can name): ``gated_mlp``
(transformers' gated MLPs), ``rope`` (the RoPE of their attention, through the model's rotary-embedding
module), ``residual_norm`` (their decoder layers' residual add + post-attention norm; ``integrations/_hf_decoder.py``
says what each verifies), ``mlp`` (GPT-2's plain MLP, ``integrations/_mlp.py``), ``mlp_recompute`` (timm's Mlp,
off by default: ``Kind.default``) and ``lora`` (PEFT's LoRA linear, ``integrations/_peft.py``).

Rules.  By default only modules whose type *is* a source class are swapped (a subclass may override
``forward``, so it is reported and left alone unless ``mapping`` names it).  A module that is already
fused is left alone (swapping is idempotent).  When a whole attention module is swapped for
``FusedAttention``, the ``nn.Softmax`` inside it is no longer used and is not swapped.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from torch import nn

__all__ = ["KINDS", "Kind", "SwapReport", "SwapEntry", "SkipEntry", "swap_modules", "restore_modules",
           "available_kinds", "resolve_kinds"]

#: Attribute set on a swapped instance: the class it had before (restored by ``restore_modules``).
SOURCE_ATTR = "_fused_layers_source"


# --------------------------------------------------------------------------------------------------
# Classes that a wrapper made by subclassing (FSDP2's ``fully_shard``: ``FSDP<Cls>(FSDPModule, Cls)``)
# --------------------------------------------------------------------------------------------------
_MIXINS = ("FSDPModule", "ReplicateModule")  # torch.distributed's fully_shard / replicate


def _unwrap_class(cls: type) -> tuple[type | None, type]:
    """``(mixin, base)`` for a class a wrapper made as ``type(prefix + base.__name__, (mixin, base), ...)`` with no
    forward of its own; ``(None, cls)`` for any other class.  Swaps and restores act on ``base``, then wrap again, so a
    model sharded before it is swapped (or between an A/B's arms) keeps its wrapper."""
    bases = cls.__bases__
    if (len(bases) == 2 and bases[0].__name__ in _MIXINS and bases[0].__module__.startswith("torch.distributed")
            and "forward" not in cls.__dict__):
        return bases[0], bases[1]
    return None, cls


def _wrap_class(mixin: type | None, base: type, like: type) -> type:
    """``base`` under ``mixin`` as the wrapper makes it (its own class cache where it keeps one), modelled on ``like``
    (a class the wrapper made: its name prefix and attributes)."""
    if mixin is None:
        return base
    cache: dict = {}
    if mixin.__name__ == "FSDPModule":
        try:
            from torch.distributed.fsdp._fully_shard._fully_shard import get_cls_to_fsdp_cls

            cache = get_cls_to_fsdp_cls()
        except ImportError:  # pragma: no cover - another torch layout
            cache = _WRAPPED
    else:
        cache = _WRAPPED
    _, old = _unwrap_class(like)
    if like.__bases__ == (mixin, old):
        cache.setdefault(old, like)  # the wrapper's class for the class it wrapped: restored as it was
    new = cache.get(base)
    if new is None or new.__bases__ != (mixin, base):
        prefix = like.__name__[: -len(old.__name__)] if like.__name__.endswith(old.__name__) else mixin.__name__
        extra = {k: v for k, v in like.__dict__.items()
                 if k not in ("__module__", "__dict__", "__weakref__", "__doc__", "__qualname__")}
        new = type(f"{prefix}{base.__name__}", (mixin, base), extra)
        cache[base] = new
    return new


_WRAPPED: dict[type, type] = {}


@dataclass(frozen=True)
class Kind:
    """One swappable kind: a reference class and its fused drop-in subclass."""

    name: str
    source: str  #: dotted path of the reference class
    target: str  #: name of the fused class, looked up in ``fused_layers.modules`` then ``fused_layers``
    metric: str  #: "GB/s" (memory-bound: bytes of input + output) or "TFLOP/s" (attention)
    #: attributes a mapped (non-subclass) user class must have for the fused forward to work
    needs: tuple[str, ...] = ()
    #: a kind of third-party look-alikes only (``fused_layers.integrations``): no torch source class, no fused class
    #: of ours, nothing a ``mapping`` can name
    known_only: bool = False
    #: swapped when ``kinds`` is None; a kind that is off by default is swapped only where ``kinds`` names it
    default: bool = True
    #: why a kind is off by default (the report's reason for the modules it leaves alone)
    why_off: str = ""


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("layer_norm", "torch.nn.LayerNorm", "FusedLayerNorm", "GB/s", ("weight", "eps")),
        Kind("rms_norm", "torch.nn.RMSNorm", "FusedRMSNorm", "GB/s", ("weight", "eps")),
        Kind("softmax", "torch.nn.Softmax", "FusedSoftmax", "GB/s", ("dim",)),
        Kind("multihead_attention", "torch.nn.MultiheadAttention", "FusedMultiheadAttention", "TFLOP/s"),
        Kind("attention", "fused_layers.modules.attention.Attention", "FusedAttention", "TFLOP/s"),
        # also turns a LinearCrossEntropyLoss (LM head + loss) holding it into the chunked fused head + loss
        Kind("cross_entropy", "torch.nn.CrossEntropyLoss", "FusedCrossEntropyLoss", "GB/s",
             ("weight", "ignore_index", "reduction", "label_smoothing")),
        # transformers' decoder layers (integrations/_hf_decoder.py): the gated MLP's activation-times-up, RoPE of
        # the attention, the residual add + post-attention norm
        Kind("gated_mlp", "", "", "GB/s", known_only=True),
        Kind("rope", "", "", "GB/s", known_only=True),
        Kind("residual_norm", "", "", "GB/s", known_only=True),
        # transformers' GPT-2 plain MLP and the ones registered with ``register_mlp`` (integrations/_mlp.py): the
        # activation with the second linear, recomputed in the backward
        Kind("mlp", "", "", "GB/s", known_only=True),
        # the same for plain MLPs whose activation is already one PyTorch kernel (timm's Mlp): memory only
        Kind("mlp_recompute", "", "", "GB/s", known_only=True, default=False,
             why_off="it saves one (tokens, hidden) activation a layer but no GPU time, and its host time made "
                     "timm's ViT-B/16 step 0.78x on an H100 host; name it in 'kinds' to trade speed for memory"),
        # PEFT's LoRA linear layer (integrations/_peft.py): its input kept in its own dtype, not as a float32 copy
        Kind("lora", "", "", "GB/s", known_only=True),
    )
}


def _import(path: str) -> Any:
    mod, _, name = path.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def source_class(kind: str) -> type[nn.Module] | None:
    if KINDS[kind].known_only:
        return None
    try:
        return _import(KINDS[kind].source)
    except (ImportError, AttributeError):  # e.g. nn.RMSNorm on torch < 2.4
        return None


def target_class(kind: str) -> type[nn.Module] | None:
    """The fused class of ``kind``, imported lazily; ``None`` while it does not exist."""
    name = KINDS[kind].target
    if KINDS[kind].known_only:
        return None
    for mod in ("fused_layers.modules", "fused_layers"):
        try:
            return getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            continue
    return None


def available_kinds() -> dict[str, str | None]:
    """``{kind: None}`` for kinds that can be swapped now, ``{kind: reason}`` for those that cannot."""
    out: dict[str, str | None] = {}
    for k in KINDS:
        if KINDS[k].known_only:
            out[k] = None  # (its look-alikes are matched when their library is imported)
        elif source_class(k) is None:
            out[k] = f"source class {KINDS[k].source} not available in this torch"
        elif target_class(k) is None:
            out[k] = f"target not available (fused_layers has no {KINDS[k].target} yet)"
        else:
            out[k] = None
    return out


def resolve_kinds(kinds: None | Iterable[str] | Mapping[str, bool]) -> list[str]:
    """Normalise ``kinds`` (None = every kind on by default, a list of names, or ``{name: on/off}``) and check the
    names."""
    if kinds is None:
        names = [k for k in KINDS if KINDS[k].default]
    elif isinstance(kinds, Mapping):
        _check_names(kinds.keys(), "kinds")
        names = [k for k, on in kinds.items() if on]
    elif isinstance(kinds, str):
        raise TypeError("swap_modules: argument 'kinds' must be a list or a dict of kind names, "
                        f"got the string {kinds!r}")
    else:
        names = list(kinds)
        _check_names(names, "kinds")
    return [k for k in KINDS if k in names]


def _check_names(names: Iterable[str], arg: str) -> None:
    bad = [n for n in names if n not in KINDS]
    if bad:
        raise ValueError(f"swap_modules: argument '{arg}' has unknown kind(s) {bad}; allowed: {sorted(KINDS)}")


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------
@dataclass
class SwapEntry:
    name: str
    kind: str
    from_cls: str
    to_cls: str
    #: how the class was recognised: "" (a torch source class), "mapping", or "known: <registry entry>"
    via: str = ""
    #: what of the kind this module does not fuse, and why ("" when it fuses all of it)
    note: str = ""


@dataclass
class SkipEntry:
    name: str
    kind: str
    reason: str


@dataclass
class SwapReport:
    """What ``swap_modules`` (or ``restore_modules``) did: swapped and skipped modules, by qualified name."""

    swapped: list[SwapEntry] = field(default_factory=list)
    skipped: list[SkipEntry] = field(default_factory=list)
    #: kinds that were asked for but cannot be swapped in this install (target class not available yet)
    unavailable: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Number of swapped modules per kind (every requested kind present, 0 when none)."""
        out: dict[str, int] = {}
        for e in self.swapped:
            out[e.kind] = out.get(e.kind, 0) + 1
        return out

    def names(self, kind: str | None = None) -> list[str]:
        return [e.name for e in self.swapped if kind is None or e.kind == kind]

    def merge(self, other: "SwapReport") -> "SwapReport":
        """Combine two passes (e.g. ``setup`` then ``configure_model``); a later skip of a module that an
        earlier pass swapped ("already fused") is dropped."""
        done = {e.name for e in self.swapped}
        return SwapReport(
            swapped=self.swapped + other.swapped,
            skipped=[s for s in self.skipped if s.name not in {e.name for e in other.swapped}]
            + [s for s in other.skipped if s.name not in done],
            unavailable={**self.unavailable, **other.unavailable},
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "swapped": [asdict(e) for e in self.swapped],
            "skipped": [asdict(e) for e in self.skipped],
            "unavailable": dict(self.unavailable),
        }

    def rows(self) -> list[list[str]]:
        """Rows ``[name, kind, status, detail]`` for a text table / W&B table."""
        rows = [[e.name, e.kind, "swapped", f"{e.from_cls} -> {e.to_cls}" + (f" ({e.via})" if e.via else "")
                 + (f"; {e.note}" if e.note else "")] for e in self.swapped]
        rows += [[e.name, e.kind, "skipped", e.reason] for e in self.skipped]
        return rows

    def __str__(self) -> str:
        """What was swapped, per kind and class change, and what was skipped and why (module names grouped
        per reason, at most ``_NAMES_SHOWN`` each); ``rows()`` lists every module."""
        lines = [f"fused_layers swap report: {len(self.swapped)} swapped, {len(self.skipped)} skipped"]
        swapped: dict[tuple[str, str], list[str]] = {}
        for e in self.swapped:
            change = (f"{_short(e.from_cls)} -> {_short(e.to_cls)}" + (f" ({e.via})" if e.via else "")
                      + (f"; {e.note}" if e.note else ""))
            swapped.setdefault((e.kind, change), []).append(e.name or "<root>")
        skipped: dict[tuple[str, str], list[str]] = {}
        for e in self.skipped:
            skipped.setdefault((e.kind, e.reason), []).append(e.name or "<root>")
        w = max([len(k) for k, _ in (*swapped, *skipped)] + [len(k) for k in self.unavailable] + [1])
        for (kind, change), names in swapped.items():
            lines.append(f"  {kind:<{w}}  swapped {len(names):>3}  {change}: {_names(names)}")
        for (kind, reason), names in skipped.items():
            lines.append(f"  {kind:<{w}}  skipped {len(names):>3}  {_names(names)}: {reason}")
        for kind, why in self.unavailable.items():
            lines.append(f"  {kind:<{w}}  not available: {why}")
        return "\n".join(lines)


_NAMES_SHOWN = 3


def _short(qualname: str) -> str:
    """``torch.nn.modules.normalization.LayerNorm`` -> ``LayerNorm``."""
    return qualname.rsplit(".", 1)[-1]


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_NAMES_SHOWN])
    return shown + (f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else "")


# --------------------------------------------------------------------------------------------------
# Matching
# --------------------------------------------------------------------------------------------------
def _matches(name: str, patterns: Iterable[str]) -> bool:
    """``name`` matches a pattern as a glob (fnmatch) or, failing that, as a full regex."""
    for p in patterns:
        if fnmatch.fnmatchcase(name, p):
            return True
        try:
            if re.fullmatch(p, name):
                return True
        except re.error:
            pass
    return False


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _mapping_value(key: Any, value: Any) -> tuple[str, dict[str, str]]:
    """A mapping value: ``"kind"``, ``("kind", {"eps": "variance_epsilon"})`` or
    ``{"kind": "kind", "aliases": {"eps": "variance_epsilon"}}`` -> (kind, aliases)."""
    aliases: Any = {}
    if isinstance(value, str):
        kind = value
    elif isinstance(value, Mapping):
        extra = set(value) - {"kind", "aliases"}
        if "kind" not in value or extra:
            raise ValueError(
                f"swap_modules: argument 'mapping' entry {key!r}: a dict value needs 'kind' and optionally "
                f"'aliases' (got keys {sorted(map(str, value))})"
            )
        kind, aliases = value["kind"], value.get("aliases") or {}
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:  # also OmegaConf lists
        kind, aliases = value
    else:
        raise TypeError(
            f"swap_modules: argument 'mapping' entry {key!r}: value must be a kind name, (kind, aliases) or "
            f"{{'kind': ..., 'aliases': ...}}, got {value!r}"
        )
    if not isinstance(aliases, Mapping) or not all(isinstance(a, str) and isinstance(b, str)
                                                   for a, b in aliases.items()):
        raise TypeError(
            f"swap_modules: argument 'mapping' entry {key!r}: aliases must map attribute names to attribute names "
            f"(e.g. {{'eps': 'variance_epsilon'}}), got {aliases!r}"
        )
    return kind, dict(aliases)


def _normalize_mapping(mapping: Mapping[Any, Any] | None) -> dict[type, tuple[str, dict[str, str]]]:
    out: dict[type, tuple[str, dict[str, str]]] = {}
    for key, value in (mapping or {}).items():
        kind, aliases = _mapping_value(key, value)
        if kind not in KINDS:
            raise ValueError(f"swap_modules: argument 'mapping' maps {key!r} to unknown kind {kind!r}; "
                             f"allowed: {sorted(KINDS)}")
        if KINDS[kind].known_only:
            raise ValueError(f"swap_modules: argument 'mapping' maps {key!r} to kind {kind!r}, which swaps only the "
                             "known transformers classes it verifies (no mapping); allowed: "
                             f"{sorted(k for k in KINDS if not KINDS[k].known_only)}")
        if isinstance(key, str):
            try:
                cls = _import(key)
            except (ImportError, AttributeError, ValueError) as e:
                raise ValueError(f"swap_modules: argument 'mapping' names class {key!r}, "
                                 f"which cannot be imported ({e})") from e
        else:
            cls = key
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError("swap_modules: argument 'mapping' keys must be nn.Module classes or dotted paths to them, "
                            f"got {key!r}")
        out[cls] = (kind, aliases)
    return out


_ALIASED: dict[tuple, type] = {}


def _alias_property(real: str) -> property:
    return property(lambda self: getattr(self, real), lambda self, v: setattr(self, real, v))


def _aliased_target(target: type, aliases: Mapping[str, str]) -> type:
    """A subclass of ``target`` where attribute ``a`` reads / writes ``aliases[a]`` (made once)."""
    key = (target, tuple(sorted(aliases.items())))
    cls = _ALIASED.get(key)
    if cls is None:
        ns = {a: _alias_property(real) for a, real in aliases.items()}
        ns.update(_fused_layers_kind=next(k for k in KINDS if target_class(k) is target),
                  _fused_layers_lookalike="mapping", _fused_layers_source=None, __module__=__name__)
        cls = _ALIASED[key] = type(target.__name__, (target,), ns)
    return cls


def _adapt(module: nn.Module, kind: str, source: type, aliases: Mapping[str, str] | None = None) -> str | None:
    """Make a mapped module that is not a subclass of ``source`` usable by the fused forward.

    Fills the attributes the fused forward reads that a look-alike class may lack (``normalized_shape``
    and ``elementwise_affine`` from ``weight``).  Returns a reason string when it cannot.
    """
    if isinstance(module, source):
        return None
    aliases = aliases or {}
    bad = [real for real in aliases.values() if not hasattr(module, real)]
    if bad:
        return f"'mapping' aliases name attribute(s) {bad} that the module does not have"
    missing = [a for a in KINDS[kind].needs if not hasattr(module, a) and a not in aliases]
    if kind in ("multihead_attention",):
        return f"a mapped class for '{kind}' must subclass {KINDS[kind].source}"
    if missing:
        return f"incompatible with {KINDS[kind].target}: missing attribute(s) {missing}"
    if kind in ("layer_norm", "rms_norm"):
        w = getattr(module, aliases.get("weight", "weight"))
        if not hasattr(module, "normalized_shape"):
            if w is None:
                return "incompatible: no weight to derive normalized_shape from"
            module.__dict__["normalized_shape"] = tuple(w.shape)
        if not hasattr(module, "elementwise_affine"):
            module.__dict__["elementwise_affine"] = w is not None
        if kind == "layer_norm" and not hasattr(module, "bias"):
            module.__dict__["bias"] = None
    return None


# --------------------------------------------------------------------------------------------------
# Swap / restore
# --------------------------------------------------------------------------------------------------
def swap_modules(
    model: nn.Module,
    kinds: None | Iterable[str] | Mapping[str, bool] = None,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    mapping: Mapping[Any, str] | None = None,
) -> SwapReport:
    """Replace, in place, the modules of ``model`` that have a fused drop-in; return a ``SwapReport``.

    Args:
        model: any ``nn.Module`` (the root itself can be swapped too; its name is ``""``).
        kinds: which kinds to swap: ``None`` (every kind of ``KINDS`` but those off by default: ``mlp_recompute``),
            a list of names, or ``{name: bool}``.
        include: glob or regex patterns on qualified module names (``"blocks.*.ln_1"``); when given,
            only matching modules are swapped.
        exclude: patterns of modules to leave alone (applied after ``include``).
        mapping: other classes to swap, ``{cls or "dotted.path.Cls": kind}`` -- a model's own
            LayerNorm look-alike with ``weight``/``bias``/``eps``, or a subclass of a source class.
            A value may also name attribute aliases the fused forward should read instead:
            ``{MyNorm: ("rms_norm", {"eps": "variance_epsilon"})}`` (or ``{"kind": ..., "aliases": ...}``).
            A class mapped to ``"attention"`` that is not our ``Attention`` but whose forward calls
            ``F.scaled_dot_product_attention`` (nanoGPT's ``CausalSelfAttention``) runs ``fused_attention``
            there instead.  A mapping entry takes precedence over the known look-alikes.

    Exact source types and the known look-alikes of ``fused_layers.integrations`` (when their library is
    imported) are swapped by default; already-fused modules are skipped (idempotent).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"swap_modules: argument 'model' must be an nn.Module, got {type(model).__name__}")
    include, exclude = list(include or ()), list(exclude or ())
    wanted = resolve_kinds(kinds)
    user_map = _normalize_mapping(mapping)
    report = SwapReport()

    sources: dict[type, str] = {}  # exact source class -> kind (all kinds, to report disabled ones)
    targets: dict[type, str] = {}
    for k in KINDS:
        src = source_class(k)
        if src is not None:
            sources[src] = k
        tgt = target_class(k)
        if tgt is not None:
            targets[tgt] = k
        if k in wanted and not KINDS[k].known_only and (src is None or tgt is None):
            report.unavailable[k] = available_kinds()[k] or "not available"

    from . import integrations

    fused_attention_prefixes: list[str] = []
    hf_attention: list[str] = []
    for name, module in model.named_modules():
        mixin, cls = _unwrap_class(type(module))
        if any(name.startswith(p + ".") for p in fused_attention_prefixes):
            kind = sources.get(cls) or user_map.get(cls, (None,))[0]
            if kind is not None or cls in targets:
                report.skipped.append(SkipEntry(name, kind or targets[cls], "inside a fused attention module (unused)"))
            continue
        if cls in targets or integrations.is_fused_class(cls):  # already fused
            kind = targets.get(cls) or cls._fused_layers_kind
            if cls in targets and kind == "attention":
                fused_attention_prefixes.append(name)
            report.skipped.append(SkipEntry(name, kind, "already fused"))
            continue
        aliases: dict[str, str] = {}
        known = None
        via = ""
        if cls in user_map:
            kind, aliases = user_map[cls]
            via = "mapping"
            if kind == "attention" and not issubclass(cls, source_class("attention") or ()):
                known = _sdpa_caller_entry(cls)
                if known is None:
                    report.skipped.append(SkipEntry(name, kind, f"{_qualname(cls)} is not an Attention and its forward "
                                                    "does not call F.scaled_dot_product_attention"))
                    continue
        elif cls in sources:
            kind = sources[cls]
        elif (known := integrations.match(cls)) is not None:
            kind = known.kind
            via = f"known: {known.name}"
        else:
            base = next((s for s in sources if isinstance(module, s)), None)
            if base is not None and sources[base] in wanted:
                report.skipped.append(
                    SkipEntry(name, sources[base],
                              f"{_qualname(cls)} subclasses {_qualname(base)}; add it to 'mapping' to swap it")
                )
            continue
        if kind not in wanted:
            off = KINDS[kind].why_off if kinds is None and not KINDS[kind].default else ""
            report.skipped.append(SkipEntry(name, kind, f"kind '{kind}' off by default: {off}" if off
                                            else f"kind '{kind}' disabled"))
            continue
        if kind in report.unavailable:
            report.skipped.append(SkipEntry(name, kind, report.unavailable[kind]))
            continue
        if include and not _matches(name, include):
            report.skipped.append(SkipEntry(name, kind, "not matched by 'include'"))
            continue
        if exclude and _matches(name, exclude):
            report.skipped.append(SkipEntry(name, kind, "matched by 'exclude'"))
            continue
        if known is not None:
            why = known.check(module) if known.check is not None else None
            if why is not None:
                report.skipped.append(SkipEntry(name, kind, f"{via or 'mapping'}: {why}"))
                continue
            target = integrations.fused_class(cls, known)
        else:
            target = target_class(kind)
            src = source_class(kind)
            why = _adapt(module, kind, src, aliases)
            if why is not None:
                report.skipped.append(SkipEntry(name, kind, why))
                continue
            if aliases:
                target = _aliased_target(target, aliases)
        module.__class__ = _wrap_class(mixin, target, type(module))
        module.__dict__[SOURCE_ATTR] = cls
        after = getattr(target, "_fused_after_swap", None)
        if after is not None:
            after(module)
        note = ""
        if getattr(target, "_fused_linear_refused", None):  # an HF causal LM whose forward keeps its LM head
            note = f"LM head not fused, loss only: {target._fused_linear_refused}"
        elif kind in ("attention", "multihead_attention"):
            note = CUDNN_ROUTE  # which kernel runs depends on each call's shape and device: say the rule
        report.swapped.append(SwapEntry(name, kind, _qualname(cls), _qualname(target), via, note))
        if kind == "attention" and known is None:
            fused_attention_prefixes.append(name)
        if known is not None and known.name == "hf_attention":
            hf_attention.append(name)
    if hf_attention:  # switch the models that hold them to the "fused_layers" attention implementation
        from .integrations import _hf

        failed = _hf.switch_models(model, hf_attention)
        if failed:
            modules = dict(model.named_modules())
            for n, why in failed.items():
                mod = modules[n]
                mod.__class__ = _wrap_class(_unwrap_class(type(mod))[0], mod.__dict__.pop(SOURCE_ATTR), type(mod))
                report.skipped.append(SkipEntry(n, "attention", why))
            report.swapped = [e for e in report.swapped if e.name not in failed]
    return report


#: the swap report's note on attention modules (``prefer_sdpa`` in ops/attention.py)
CUDNN_ROUTE = "SDPA's cuDNN kernel where measured faster (Hopper, bf16/fp16, head dim 64/128, no mask)"


def _sdpa_caller_entry(cls: type):
    """A registry entry for a user class mapped to "attention" whose forward calls SDPA (else None)."""
    from .integrations import LookAlike
    from .integrations._sdpa import build_sdpa_caller, rebound_forward

    if rebound_forward(cls.forward) is None:
        return None
    return LookAlike("sdpa_caller", cls.__module__.split(".")[0], "attention", _qualname(cls), build_sdpa_caller,
                     note="F.scaled_dot_product_attention runs fused_attention")


def restore_modules(model: nn.Module, names: Iterable[str] | SwapReport | None = None) -> SwapReport:
    """Undo ``swap_modules``: give fused modules back their original class (the same objects again).

    ``names`` limits it to those qualified names (or to the modules a ``SwapReport`` swapped); by default
    every fused module in ``model`` is restored.  Fused modules that were built as fused (never swapped)
    go back to their kind's source class.  Returns a report of what was restored.
    """
    if isinstance(names, SwapReport):
        names = names.names()
    only = None if names is None else set(names)
    targets = {t: k for k in KINDS if (t := target_class(k)) is not None}
    report = SwapReport()
    for name, module in model.named_modules():
        if only is not None and name not in only:
            continue
        mixin, fused_cls = _unwrap_class(type(module))
        kind = _kind_of(fused_cls, targets)
        if kind is None:
            continue
        src = (module.__dict__.get(SOURCE_ATTR) or fused_cls.__dict__.get(SOURCE_ATTR)
               or source_class(kind))
        before = getattr(fused_cls, "_fused_before_restore", None)
        if before is not None:
            before(module)
        module.__class__ = _wrap_class(mixin, src, type(module))
        module.__dict__.pop(SOURCE_ATTR, None)
        report.swapped.append(SwapEntry(name, kind, _qualname(fused_cls), _qualname(src)))
    if "transformers.modeling_utils" in sys.modules:  # models with no fused attention left switch back
        from .integrations import _hf

        _hf.unswitch_models(model)
    return report


def _kind_of(cls: type, targets: dict[type, str]) -> str | None:
    """The kind of a fused class (ours, a look-alike's fused subclass or an aliased one), else None."""
    kind = targets.get(cls)
    if kind is None and "_fused_layers_lookalike" in cls.__dict__:
        kind = cls.__dict__["_fused_layers_kind"]
    return kind


def fused_source(module: nn.Module) -> type[nn.Module] | None:
    """The reference class of a fused module (what ``restore_modules`` would give it), else ``None``."""
    targets = {t: k for k in KINDS if (t := target_class(k)) is not None}
    cls = _unwrap_class(type(module))[1]
    kind = _kind_of(cls, targets)
    if kind is None:
        return None
    return module.__dict__.get(SOURCE_ATTR) or cls.__dict__.get(SOURCE_ATTR) or source_class(kind)


def fused_kind(module: nn.Module) -> str | None:
    """The kind of a fused module, else ``None``."""
    return _kind_of(_unwrap_class(type(module))[1], {t: k for k in KINDS if (t := target_class(k)) is not None})
