"""Hugging Face transformers: the rest of the decoder layer -- gated MLPs, RoPE, residual add + norm.

Three look-alikes, each verified by the syntax tree of the code it replaces (``integrations.fingerprint``); a class
whose code differs is not matched, and a module whose instance does not fit is left alone with its reason in the
``SwapReport``.

* ``gated_mlp``: ``*MLP`` classes whose forward is Llama's ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (Llama,
  Mistral, Qwen2/3, Gemma 1-3, Granite, OLMo 2, Cohere, ...) or Phi-3's ``gate_up_proj`` + ``chunk(2, -1)`` (Phi-3,
  GLM) run ``down_proj(fused_gated_activation(gate, up, act))``: the projections are called as the class calls them
  (adapters, hooks and quantized linears keep working), only the activation-times-up is fused, and its backward
  recomputes the activation (ops/gated_activation.py).  Where ``down_proj`` is a plain ``nn.Linear`` nothing hooks,
  ``fused_gated_activation_linear`` runs it too, and the product is written again in the backward instead of kept
  (one (tokens, intermediate) tensor less per layer: 64 MiB at Gemma's 4,096 x 8,192 in bf16); where nothing hooks
  the gate and up projections, the backward writes their gradients over their outputs (``reuse_inputs``: two such
  tensors less at its peak).  The activation must
  be one whose math we verified (``act_fn`` / ``activation_fn``): torch's ``nn.SiLU`` / ``nn.GELU``, transformers'
  ``SiLUActivation``, ``GELUActivation`` on ``F.gelu``, ``GELUTanh`` on ``F.gelu(approximate="tanh")``,
  ``NewGELUActivation``; any other (ReLU^2, a clipped or quick GELU) leaves the module alone.
* ``rope``: the model's ``*RotaryEmbedding`` module.  Its forward is the class's own; the (cos, sin) it returns are
  remembered (weakly, by identity), and the modeling module's ``apply_rotary_pos_emb`` -- the name every attention
  forward of that model calls -- is replaced by a dispatcher that runs ``fused_rope`` on exactly those cos / sin and
  calls the original function for anything else.  Why this way: the attention module is already the ``attention``
  kind's (its look-alike in ``_hf.py`` calls the class's own forward, which looks ``apply_rotary_pos_emb`` up at call
  time), and one module takes one kind; the dispatcher composes with that look-alike, with the class's own forward
  and with any attention implementation, keeps each kind switchable on its own (restoring the rotary module stops
  the fusion, the last one puts the original function back), and changes nothing for other models: the only
  process-wide change, and one that is exact by construction (the fused path is taken only for the function whose
  source we verified: Llama's half-split, Phi-3's partial rotary, GLM's interleaved partial rotary; 123 of the 184
  modeling modules of transformers 5.25 with a rotary embedding, Cohere, GPT-NeoX or Gemma 3n not among them).  Under
  ``torch.compile`` the original function runs (no identity bookkeeping inside a graph).
* ``residual_norm``: decoder layers (``*DecoderLayer`` of transformers) whose forward holds, once, the three
  statements ``X = R + Y; R = X; X = self.<norm>(X)`` (Llama's ``hidden_states = residual + hidden_states; residual =
  hidden_states; hidden_states = self.post_attention_layernorm(hidden_states)``; Phi-3's with ``Y =
  self.resid_attn_dropout(hidden_states)``; Gemma 2/3's ``pre_feedforward_layernorm``: 142 classes of transformers
  5.25 have the site) and whose ``<norm>`` is a verified RMSNorm (Llama's order or Gemma's ``1 + w``: ``_hf.py``'s
  entries).  The fused forward is the class's own, rewritten on its syntax tree: those three statements become ``R,
  X = self._fused_add_norm(self.<norm>, Y, R)`` (one ``fused_add_rms_norm``, ops/residual_norm.py), everything else
  as written, compiled against the model module's own globals and put back inside the class's own wrappers
  (transformers' kwarg deprecation; gradient checkpointing is added by ``GradientCheckpointingLayer`` to every
  subclass, ours too).  So the check is on what changes, and a new release's layer qualifies by having the same
  three statements.  A norm with hooks, or inputs the kernel does not take, runs the three statements as written.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types
import weakref
from typing import Any, Optional

import torch
from torch import nn
from torch.nn.modules import module as _module

from ..ops import compile_config
from ..ops import gated_activation_config as gated_cfg
from ..ops._common import SUPPORTED_DTYPES, get_override, is_compiling, triton_runnable
from . import REGISTRY, LookAlike, _compile_forward, fingerprint

# --------------------------------------------------------------------------------------------------
# Gated MLPs.  Sources copied from transformers 5.25 (models/llama, models/phi3).
# --------------------------------------------------------------------------------------------------
LLAMA_MLP_FORWARD = '''
def forward(self, x):
    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    return down_proj
'''

PHI3_MLP_FORWARD = '''
def forward(self, hidden_states):
    up_states = self.gate_up_proj(hidden_states)
    gate, up_states = up_states.chunk(2, dim=-1)
    up_states = up_states * self.activation_fn(gate)
    return self.down_proj(up_states)
'''

# transformers.activations forwards (5.25) whose math the kernels compute
_HF_ACT_SOURCES = {
    "SiLUActivation": ("silu", "def forward(self, input):\n    return nn.functional.silu(input)\n"),
    "NewGELUActivation": ("gelu_tanh", "def forward(self, input):\n    return 0.5 * input * (1.0 + torch.tanh("
                          "math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))\n"),
    "GELUActivation": ("gelu", "def forward(self, input):\n    return self.act(input)\n"),  # with act = F.gelu
    "GELUTanh": ("gelu_tanh", "def forward(self, input):\n    return self.act(input)\n"),  # act = partial(gelu, tanh)
}


def activation_name(act: Any) -> Optional[str]:
    """The ``fused_gated_activation`` name of the activation module ``act``, or None when its math is not one
    the kernels compute exactly as written."""
    t = type(act)
    if t is nn.SiLU:
        return "silu"
    if t is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act.approximate)
    if not t.__module__.startswith("transformers.") or t.__name__ not in _HF_ACT_SOURCES:
        return None
    name, src = _HF_ACT_SOURCES[t.__name__]
    ok = _ACT_VERIFIED.get(t)
    if ok is None:  # (a syntax-tree comparison: once per class, at the swap's check, never while Dynamo traces)
        ok = _ACT_VERIFIED[t] = fingerprint(t.__dict__.get("forward")) == _compile_forward(src)
    if not ok:
        return None
    inner = act.__dict__.get("act")
    if t.__name__ == "GELUActivation" and inner is not nn.functional.gelu:
        return None
    if t.__name__ == "GELUTanh" and not (getattr(inner, "func", None) is nn.functional.gelu and not inner.args
                                        and inner.keywords == {"approximate": "tanh"}):
        return None
    return name


_ACT_VERIFIED: dict[type, bool] = {}


def _mlp_check(attr: str, projections: tuple[str, ...]):
    def check(m: nn.Module) -> Optional[str]:
        missing = [n for n in (attr, *projections) if not hasattr(m, n)]
        if missing:
            return f"missing attribute(s) {missing}"
        act = getattr(m, attr)
        if activation_name(act) is None:
            return f"its {attr} is {type(act).__module__}.{type(act).__qualname__}, not a verified SiLU / GELU"
        return None
    return check


def _fusable(*ts: torch.Tensor) -> bool:
    """The gated kernels take these (one float dtype the kernels run, a device Triton runs on)."""
    t0 = ts[0]
    return t0.dtype in SUPPORTED_DTYPES and triton_runnable(t0) and all(t.dtype == t0.dtype for t in ts)


def unhooked(m: nn.Module) -> bool:
    """Nothing hooks ``m``, nor every module (ZeRO-3 gathers parameters in a global hook), so its weight can be read
    and multiplied outside its forward."""
    return not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                or _module._global_forward_hooks or _module._global_forward_pre_hooks
                or _module._global_backward_hooks or _module._global_backward_pre_hooks)


def _plain_linear(m: nn.Module) -> bool:
    """``m`` is exactly an ``nn.Linear`` (no adapter, quantized or parametrized subclass) that nothing hooks."""
    return type(m) is nn.Linear and unhooked(m)


def _down(self, h_in: torch.Tensor, up: Optional[torch.Tensor], act: str, fresh: bool) -> torch.Tensor:
    """``down_proj(act(gate) * up)``: with a plain ``nn.Linear`` down projection the product is not kept for the
    backward (``fused_gated_activation_linear``), else the module is called on the fused product.  ``fresh``: gate
    and up come from projections that nothing hooks, so nothing else holds them and the backward writes their
    gradients over them (``reuse_inputs``)."""
    from ..ops.gated_activation import fused_gated_activation, fused_gated_activation_linear

    d = self.down_proj
    if _plain_linear(d):
        return fused_gated_activation_linear(h_in, up, d.weight, d.bias, act, reuse_inputs=fresh)
    return d(fused_gated_activation(h_in, up, act))


def _frozen(x: torch.Tensor, act: str, gate: nn.Module, up: Optional[nn.Module],
            down: nn.Module) -> Optional[torch.Tensor]:
    """The MLP on ``frozen_gated_mlp`` (x kept, gate and up computed again in the backward) where its projections
    (``up`` None: ``gate`` is Phi-3's ``gate_up_proj``, gate rows first) are plain bias-free ``nn.Linear`` that
    nothing hooks and whose weights do not train; else None."""
    from ..ops.gated_activation import frozen_gated_mlp

    w = getattr(down, "weight", None)
    if not isinstance(w, torch.Tensor) or w.requires_grad:  # a training MLP: none of the checks below (host time)
        return None
    ps = (gate, down) if up is None else (gate, up, down)
    if not all(_plain_linear(p) and p.bias is None for p in ps):
        return None
    if up is None:
        w = gate.weight
        if w.shape[0] % 2:
            return None
        n = w.shape[0] // 2
        return frozen_gated_mlp(x, w[:n], w[n:], down.weight, act)  # chunk(2, -1)'s halves: the weight's rows
    return frozen_gated_mlp(x, gate.weight, up.weight, down.weight, act)


def _build_llama_mlp(cls: type) -> dict:
    source_forward = cls.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if is_compiling() and compile_config.route("gated_activation") == "inductor":
            return source_forward(self, x)
        act = activation_name(self.act_fn)
        if act is None or not triton_runnable(x):
            return source_forward(self, x)
        if get_override("gated_activation", "recompute_frozen", gated_cfg.RECOMPUTE_FROZEN):
            y = _frozen(x, act, self.gate_proj, self.up_proj, self.down_proj)
            if y is not None:
                return y
        gate, up = self.gate_proj(x), self.up_proj(x)  # the class's order
        if not _fusable(gate, up):
            return self.down_proj(self.act_fn(gate) * up)
        return _down(self, gate, up, act, unhooked(self.gate_proj) and unhooked(self.up_proj))

    return {"forward": forward}


def _build_phi3_mlp(cls: type) -> dict:
    source_forward = cls.forward

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if is_compiling() and compile_config.route("gated_activation") == "inductor":
            return source_forward(self, hidden_states)
        act = activation_name(self.activation_fn)
        if act is None or not triton_runnable(hidden_states):
            return source_forward(self, hidden_states)
        if get_override("gated_activation", "recompute_frozen", gated_cfg.RECOMPUTE_FROZEN):
            y = _frozen(hidden_states, act, self.gate_up_proj, None, self.down_proj)
            if y is not None:
                return y
        gate_up = self.gate_up_proj(hidden_states)
        if not _fusable(gate_up) or gate_up.shape[-1] % 2:
            gate, up_states = gate_up.chunk(2, dim=-1)
            return self.down_proj(up_states * self.activation_fn(gate))
        return _down(self, gate_up, None, act, unhooked(self.gate_up_proj))  # gate first: chunk(2)'s order

    return {"forward": forward}


# --------------------------------------------------------------------------------------------------
# RoPE.  Sources copied from transformers 5.25 (models/llama, models/phi3, models/glm).
# --------------------------------------------------------------------------------------------------
LLAMA_ROTATE_HALF = '''
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
'''

GLM_ROTATE_HALF = '''
def rotate_half(x):
    x1 = x[..., 0::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)
'''

LLAMA_ROPE = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
'''

PHI3_ROPE = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed
'''

GLM_ROPE = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
    q_embed = torch.cat([q_embed, q_pass], dim=-1)
    k_embed = torch.cat([k_embed, k_pass], dim=-1)
    return q_embed, k_embed
'''

#: verified (apply_rotary_pos_emb, rotate_half) -> (interleaved, partial rotary allowed)
_ROPE_VARIANTS = (
    (LLAMA_ROPE, LLAMA_ROTATE_HALF, False, False),
    (PHI3_ROPE, LLAMA_ROTATE_HALF, False, True),
    (GLM_ROPE, GLM_ROTATE_HALF, True, True),
)

_TAGGED: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()  # cos / sin of fused modules
_INSTALLED: dict[str, tuple[Any, Any]] = {}  # modeling module name -> (original apply_rotary_pos_emb, dispatcher)
_HOLDERS: dict[str, "weakref.WeakSet[nn.Module]"] = {}  # modeling module name -> its fused rotary modules


def _plain_function(obj: Any) -> Any:
    """``obj`` as a plain function: transformers may wrap ``apply_rotary_pos_emb`` in the ``kernels`` package's
    ``Func`` module (``use_kernel_forward_from_hub``), which calls the function it closes over."""
    if isinstance(obj, types.FunctionType):
        return obj
    fwd = getattr(type(obj), "forward", None)
    if isinstance(obj, nn.Module) and type(obj).__name__ == "Func" and isinstance(fwd, types.FunctionType):
        try:
            return inspect.getclosurevars(fwd).nonlocals.get("func")
        except (TypeError, ValueError):
            return None
    return None


def _rope_variant(mod: types.ModuleType) -> Optional[tuple[bool, bool]]:
    """(interleaved, partial) of the modeling module's verified ``apply_rotary_pos_emb``, or None."""
    orig = _INSTALLED.get(mod.__name__, (getattr(mod, "apply_rotary_pos_emb", None),))[0]
    fn, rot = _plain_function(orig), getattr(mod, "rotate_half", None)
    if fn is None or rot is None:
        return None
    fp, fp_rot = fingerprint(fn), fingerprint(rot)
    for src, rot_src, interleaved, partial in _ROPE_VARIANTS:
        if fp == _compile_forward(src) and fp_rot == _compile_forward(rot_src):
            return interleaved, partial
    return None


def _is_hf_rotary(cls: type) -> bool:
    if not (cls.__module__.startswith("transformers.models.") and cls.__name__.endswith("RotaryEmbedding")):
        return False
    mod = sys.modules.get(cls.__module__)
    return mod is not None and hasattr(mod, "apply_rotary_pos_emb")


def _model_class(m: nn.Module) -> type:
    """The class whose forward ``m`` runs: its own, or the model's class under a wrapper subclass with no forward of
    its own (FSDP2's ``FSDP<Name>`` when the model was sharded before the swap)."""
    return next((c for c in type(m).__mro__ if "forward" in c.__dict__), type(m))


def _rotary_check(m: nn.Module) -> Optional[str]:
    name = _model_class(m).__module__
    mod = sys.modules.get(name)
    if _rope_variant(mod) is None:
        return (f"{name}.apply_rotary_pos_emb differs from the verified ones (Llama, Phi-3, GLM): its "
                "attention keeps the model's own RoPE")
    return None


def _dispatcher(original: Any, interleaved: bool, partial: bool):
    """The modeling module's ``apply_rotary_pos_emb`` while a rotary module of it is fused: ``fused_rope`` for the
    cos / sin that module returned (and inputs the kernel takes), ``original`` for any other call."""
    from ..ops import rope

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if (not is_compiling() and _TAGGED.get(id(cos)) is cos and _TAGGED.get(id(sin)) is sin
                and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4 and k.dim() == 4
                and unsqueeze_dim in (1, 2) and cos.dim() == 3 and cos.shape == sin.shape
                and q.dtype == k.dtype and q.dtype in SUPPORTED_DTYPES and cos.dtype == sin.dtype
                and cos.dtype in SUPPORTED_DTYPES  # (the result takes promote_types(q, cos), as HF's does)
                and (partial or cos.shape[-1] == q.shape[-1]) and cos.shape[-1] % 2 == 0
                and 0 < cos.shape[-1] <= q.shape[-1] and triton_runnable(q)):
            s = q.shape[2 if unsqueeze_dim == 1 else 1]
            if cos.shape[-2] == s and cos.shape[0] in (1, q.shape[0]) and k.shape[0] == q.shape[0]:
                return rope.fused_rope(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=unsqueeze_dim)
        return original(q, k, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb.__wrapped__ = _plain_function(original)
    return apply_rotary_pos_emb


def _build_rotary(cls: type) -> dict:
    source_forward = cls.forward
    modname = cls.__module__

    def forward(self, *args: Any, **kwargs: Any):
        out = source_forward(self, *args, **kwargs)
        if not is_compiling() and isinstance(out, tuple) and len(out) == 2:
            for t in out:  # remembered by identity, weakly: the attention's apply_rotary_pos_emb fuses these
                if isinstance(t, torch.Tensor):
                    _TAGGED[id(t)] = t
        return out

    def _fused_after_swap(self):
        mod = sys.modules[modname]
        _HOLDERS.setdefault(modname, weakref.WeakSet()).add(self)
        weakref.finalize(self, _uninstall_if_unheld, modname)  # a fused model dropped without a restore
        if modname not in _INSTALLED:
            interleaved, partial = _rope_variant(mod)
            original = mod.apply_rotary_pos_emb
            disp = _dispatcher(original, interleaved, partial)
            _INSTALLED[modname] = (original, disp)
            mod.apply_rotary_pos_emb = disp

    def _fused_before_restore(self):
        holders = _HOLDERS.get(modname)
        if holders is not None:
            holders.discard(self)
        _uninstall_if_unheld(modname)

    # the ledger replays module calls: the rotary module's own forward is unchanged, nothing to time
    return {"forward": forward, "_fused_after_swap": _fused_after_swap, "_fused_before_restore": _fused_before_restore,
            "_fused_ledger_skip": True}


def _uninstall_if_unheld(modname: str) -> None:
    """Put the model module's own ``apply_rotary_pos_emb`` back once no fused rotary module of it is left."""
    holders = _HOLDERS.get(modname)
    if not any(True for _ in (holders or ())) and modname in _INSTALLED:  # (iterating skips the dying)
        original, disp = _INSTALLED.pop(modname)
        mod = sys.modules.get(modname)
        if mod is not None and mod.apply_rotary_pos_emb is disp:
            mod.apply_rotary_pos_emb = original


def rope_installed(module_name: str) -> bool:
    """True while ``module_name``'s ``apply_rotary_pos_emb`` is the fused dispatcher (for tests and reports)."""
    return module_name in _INSTALLED


# --------------------------------------------------------------------------------------------------
# Residual add + norm in decoder layers.  The class's own forward, with its three statements
#     X = R + Y;   R = X;   X = self.<norm>(X)
# (Llama's ``hidden_states = residual + hidden_states; residual = hidden_states; hidden_states =
# self.post_attention_layernorm(hidden_states)``, Phi-3's with ``Y = self.resid_attn_dropout(hidden_states)``)
# rewritten on its syntax tree into
#     R, X = self._fused_add_norm(self.<norm>, Y, R)
# and everything else kept as written.
# --------------------------------------------------------------------------------------------------
def _fused_add_norm(norm: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, norm(h)) with h = residual + x: one kernel where it computes exactly that, the three lines otherwise."""
    if is_compiling() and compile_config.route("residual_norm") == "inductor":
        h = residual + x
        return h, norm(h)
    entry = _norm_entry(norm)
    w = getattr(norm, "weight", None)
    if (entry in _NORMS and isinstance(w, torch.Tensor) and w.dim() == 1
            and not (norm._forward_hooks or norm._forward_pre_hooks or nn.modules.module._global_forward_hooks
                     or nn.modules.module._global_forward_pre_hooks)
            and isinstance(x, torch.Tensor) and isinstance(residual, torch.Tensor) and x.shape == residual.shape
            and x.dtype in SUPPORTED_DTYPES and residual.dtype in SUPPORTED_DTYPES and w.dtype in SUPPORTED_DTYPES
            and x.dim() >= 1 and w.shape[0] == x.shape[-1] and w.device == x.device and residual.device == x.device
            and triton_runnable(x)):
        from ..ops.residual_norm import fused_add_rms_norm

        if entry == "hf_llama_rms_norm":  # (h in promote_types(x, residual), y in promote_types(h, weight))
            return fused_add_rms_norm(x, residual, w, norm.variance_epsilon, cast_before_weight=True)
        if entry == "hf_gemma_rms_norm":
            return fused_add_rms_norm(x, residual, w, norm.eps, keep_input_dtype=True, weight_offset=1.0)
    h = residual + x
    return h, norm(h)


#: the norms a fused decoder layer computes itself (registry entries of _hf.py, verified there)
_NORMS = ("hf_llama_rms_norm", "hf_gemma_rms_norm")


_NORM_ENTRIES: dict[type, Optional[str]] = {}


def _norm_entry(norm: nn.Module) -> Optional[str]:
    """The registry entry of the norm module's class (or of the class it was swapped from) when the instance passes
    that entry's check, else None."""
    from . import is_fused_class, match

    cls = type(norm)
    if cls in _NORM_ENTRIES:  # (syntax-tree checks: once per class, at the swap's check, never while Dynamo traces)
        return _NORM_ENTRIES[cls]
    if is_fused_class(cls):
        cls = cls.__dict__.get("_fused_layers_source") or cls.__mro__[1]
    entry = match(cls)
    name = None
    if entry is not None and (entry.check is None or entry.check(norm) is None):  # (Gemma's: its _norm too)
        name = entry.name
    _NORM_ENTRIES[type(norm)] = name
    return name


def _name(node: ast.AST) -> Optional[str]:
    return node.id if isinstance(node, ast.Name) else None


def _add_norm_site(body: list) -> Optional[tuple[int, str, str, str, ast.expr]]:
    """(index, X, R, norm attribute, Y) of the one ``X = R + Y; R = X; X = self.<norm>(X)`` in ``body``, else
    None (none, or more than one)."""
    found = []
    for i in range(len(body) - 2):
        a, b, c = body[i:i + 3]
        if not all(isinstance(t, ast.Assign) and len(t.targets) == 1 for t in (a, b, c)):
            continue
        x = _name(a.targets[0])
        if not (x and isinstance(a.value, ast.BinOp) and isinstance(a.value.op, ast.Add)):
            continue
        r = _name(a.value.left)
        if not (r and r != x and _name(b.targets[0]) == r and _name(b.value) == x and _name(c.targets[0]) == x):
            continue
        call = c.value
        if (isinstance(call, ast.Call) and not call.keywords and len(call.args) == 1 and _name(call.args[0]) == x
                and isinstance(call.func, ast.Attribute) and _name(call.func.value) == "self"):
            found.append((i, x, r, call.func.attr, a.value.right))
    return found[0] if len(found) == 1 else None


def _inner_forward(cls: type) -> Optional[types.FunctionType]:
    fwd = cls.__dict__.get("forward")
    try:
        inner = inspect.unwrap(fwd) if fwd is not None else None
    except ValueError:
        return None
    return inner if isinstance(inner, types.FunctionType) else None


_SITES: dict[type, Optional[tuple[types.FunctionType, str]]] = {}


def _fused_inner(cls: type) -> Optional[tuple[types.FunctionType, str]]:
    """(the class's innermost forward with its residual add + norm fused, the norm's attribute name), or None where
    the forward has no such site, or its source cannot be read, or it closes over variables (cached per class).

    The new function is the rewritten source compiled as the original's code was: same file name, the defining
    module's globals (no copy: names looked up at call time resolve as the original's do), the original's defaults."""
    if cls in _SITES:
        return _SITES[cls]
    out = None
    inner = _inner_forward(cls)
    if inner is not None and not inner.__code__.co_freevars:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(inner)))
            ast.increment_lineno(tree, inner.__code__.co_firstlineno - 1)  # tracebacks point into the model's file
        except (OSError, TypeError, SyntaxError):
            tree = None
        fn = tree.body[0] if tree is not None and tree.body else None
        site = _add_norm_site(fn.body) if isinstance(fn, ast.FunctionDef) else None
        if site is not None:
            i, x, r, attr, y = site
            self_attr = ast.Attribute(ast.Name("self", ast.Load()), attr, ast.Load())
            helper = ast.Attribute(ast.Name("self", ast.Load()), "_fused_add_norm", ast.Load())
            fn.body[i:i + 3] = [ast.Assign(
                targets=[ast.Tuple([ast.Name(r, ast.Store()), ast.Name(x, ast.Store())], ast.Store())],
                value=ast.Call(helper, [self_attr, y, ast.Name(r, ast.Load())], []))]
            fn.decorator_list, fn.returns = [], None  # (annotations are not evaluated: the code object alone is kept)
            for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg]:
                if a is not None:
                    a.annotation = None
            module = ast.fix_missing_locations(ast.Module([fn], []))
            code = compile(module, inner.__code__.co_filename, "exec")
            fn_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
            new = types.FunctionType(fn_code, inner.__globals__, inner.__name__, inner.__defaults__)
            new.__kwdefaults__ = inner.__kwdefaults__
            new.__qualname__, new.__doc__, new.__module__ = inner.__qualname__, inner.__doc__, inner.__module__
            out = (new, attr)
    _SITES[cls] = out
    return out


def _is_decoder_layer(cls: type) -> bool:
    return (cls.__module__.startswith("transformers.models.") and cls.__name__.endswith("DecoderLayer")
            and _fused_inner(cls) is not None)


def _layer_check(m: nn.Module) -> Optional[str]:
    cls = _model_class(m)
    site = _fused_inner(cls)
    if site is None:
        return "its forward has no residual add + norm site this rewrite takes"
    attr = site[1]
    norm = getattr(m, attr, None)
    if not isinstance(norm, nn.Module):
        return f"its {attr} is not a module"
    if _norm_entry(norm) not in _NORMS:
        return (f"its {attr} is {type(norm).__qualname__}, not a verified Llama / Gemma RMSNorm (the residual add "
                "and the norm stay apart)")
    if _rewrapped(cls) is None:
        return "its forward's wrappers could not be rebuilt around the fused forward"
    return None


def _rewrap(fn: Any, inner: types.FunctionType) -> Optional[types.FunctionType]:
    """``fn`` with its innermost wrapped function replaced by ``inner``: each ``functools.wraps`` wrapper is copied
    with the closure cell that held the function it wraps pointing to the new one.  None where a wrapper does not
    hold what it wraps in a cell."""
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is None:
        return inner
    new_inner = _rewrap(wrapped, inner)
    if new_inner is None or not isinstance(fn, types.FunctionType) or not fn.__closure__:
        return None
    cells, found = [], False
    for cell in fn.__closure__:
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            held = None
        if held is wrapped:
            cells.append(types.CellType(new_inner))
            found = True
        else:
            cells.append(cell)
    if not found:
        return None
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__wrapped__ = new_inner
    new.__qualname__, new.__doc__ = fn.__qualname__, fn.__doc__
    return new


_REWRAPPED: dict[type, Optional[types.FunctionType]] = {}


def _rewrapped(cls: type) -> Optional[types.FunctionType]:
    """The fused forward of a decoder-layer class inside the class's own wrappers (transformers' kwarg deprecation),
    cached per class.  The gradient-checkpointing wrapper (``forward_with_checkpointing``) is left out:
    ``GradientCheckpointingLayer`` adds it to every subclass, the fused one too."""
    if cls not in _REWRAPPED:
        fused = _fused_inner(cls)
        fwd = cls.__dict__.get("forward")
        if fused is not None and getattr(fwd, "__code__", None) is not None \
                and fwd.__code__.co_name == "forward_with_checkpointing":
            fwd = fwd.__wrapped__
        _REWRAPPED[cls] = None if fused is None else _rewrap(fwd, fused[0])
    return _REWRAPPED[cls]


def _build_layer(cls: type) -> dict:
    fwd = _rewrapped(cls)
    if fwd is None:  # (the check refused such classes; a direct build gets the class's own forward)
        fwd = cls.forward
    # the ledger replays module calls: a whole decoder layer (attention, caches) is measured by the step A/B instead
    return {"forward": fwd, "_fused_add_norm": staticmethod(_fused_add_norm), "_fused_ledger_skip": True}


REGISTRY.extend([
    LookAlike("hf_gated_mlp", "transformers", "gated_mlp", "transformers.models.llama.modeling_llama.LlamaMLP",
              _build_llama_mlp, forward_src=LLAMA_MLP_FORWARD,
              check=_mlp_check("act_fn", ("gate_proj", "up_proj", "down_proj")),
              note="gated MLP down(act(gate(x)) * up(x)): the activation-times-up fused, recomputed in the backward"),
    LookAlike("hf_gate_up_mlp", "transformers", "gated_mlp", "transformers.models.phi3.modeling_phi3.Phi3MLP",
              _build_phi3_mlp, forward_src=PHI3_MLP_FORWARD,
              check=_mlp_check("activation_fn", ("gate_up_proj", "down_proj")),
              note="gated MLP on one gate_up projection (Phi-3): chunk + activation-times-up fused"),
    LookAlike("hf_rope", "transformers", "rope", "transformers.models.llama.modeling_llama.LlamaRotaryEmbedding",
              _build_rotary, predicate=_is_hf_rotary, check=_rotary_check,
              note="RoPE of the model's attention (apply_rotary_pos_emb) fused, for this module's cos / sin"),
    LookAlike("hf_residual_norm", "transformers", "residual_norm",
              "transformers.models.llama.modeling_llama.LlamaDecoderLayer", _build_layer, predicate=_is_decoder_layer,
              check=_layer_check, note="decoder layer: residual add + post-attention RMSNorm in one kernel"),
])
