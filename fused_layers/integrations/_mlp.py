"""Plain (non-gated) MLPs: ``fc2(act(fc1(x)))`` of transformers' GPT-2 (the ``mlp`` kind) and timm's ViT blocks
(``mlp_recompute``, off by default).

An eager MLP keeps two (tokens, intermediate) tensors a layer for the backward: ``fc1(x)`` for the activation's
gradient and ``act(fc1(x))`` for ``fc2``'s weight gradient.  The fused forward calls ``fc1`` as the class does
(adapters, hooks and quantized linears keep working) and runs ``fc2(act(h))`` as one
``fused_activation_linear`` (ops/gated_activation.py), whose backward writes ``act(h)`` again instead of keeping
it: one such tensor less a layer (GPT-2 small at 8 x 1,024 tokens: 0.56 GiB over 12 layers; ViT-B/16 at 64 images:
0.87 GiB).  Where nothing hooks ``fc1``, its output is the MLP's own, and the backward writes its gradient over it
(``reuse_inputs``).  Verified by the syntax tree of each forward (``integrations.fingerprint``), with the instance
checked at the swap and at each call:

* ``transformers.models.gpt2.modeling_gpt2.GPT2MLP`` and the classes that copy its forward (GPT-BigCode, ...):
  ``dropout(c_proj(act(c_fc(x))))``; ``c_proj`` is GPT-2's ``Conv1D`` (weight (in, out): ``addmm(bias, h,
  weight)``, run as ``F.linear(h, weight.t(), bias)``) or an ``nn.Linear``.
* ``timm.layers.mlp.Mlp``: ``drop2(fc2(norm(drop1(act(fc1(x))))))`` with ``norm`` the identity and ``drop1`` inactive
  (p = 0, timm's default, or eval), ``fc2`` an ``nn.Linear``.  Kind ``mlp_recompute``, swapped only where ``kinds``
  names it: timm's activation is one PyTorch kernel already, so the fusion saves memory but no GPU time (the reason
  is ``swap.KINDS``'s), where GPT-2's ``gelu_new``, eight kernels, becomes one (GPU busy 20.1 against 28.0 ms a step).

* a class of your own whose forward is ``return self.<proj>(self.<act>(self.<fc>(x)))``, registered with
  ``fused_layers.integrations.register_mlp(cls, fc=..., act=..., proj=...)`` (the job's demo GPT registers its MLP).

The activation must be one whose math is verified (``_hf_decoder.activation_name``: torch's ``nn.GELU`` exact or
tanh, ``nn.SiLU``; transformers' ``NewGELUActivation``, GPT-2's, ...).  ``fc2`` must be exactly the library's
class with nothing hooking it (no adapter, no ZeRO-3 gather); else, and without a gradient, the class's own
forward runs.  Under ``torch.compile`` the ``mlp`` route decides (ops/compile_config.py): "inductor" runs the
class's code (Inductor then keeps ``act(h)`` for ``fc2``'s weight gradient), "kernels" the fused op, a
``torch.library`` op that keeps ``h`` alone.
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Optional

import torch
from torch import nn

from ..ops import compile_config
from ..ops._common import SUPPORTED_DTYPES, is_compiling, triton_runnable
from ..ops.gated_activation import fused_activation_linear
from . import _MATCH_CACHE, REGISTRY, LookAlike, _compile_forward, _qualname, fingerprint
from ._hf_decoder import _plain_linear, activation_name, unhooked

GPT2_MLP_FORWARD = '''
def forward(self, hidden_states):
    hidden_states = self.c_fc(hidden_states)
    hidden_states = self.act(hidden_states)
    hidden_states = self.c_proj(hidden_states)
    hidden_states = self.dropout(hidden_states)
    return hidden_states
'''

TIMM_MLP_FORWARD = '''
def forward(self, x):
    x = self.fc1(x)
    x = self.act(x)
    x = self.drop1(x)
    x = self.norm(x)
    x = self.fc2(x)
    x = self.drop2(x)
    return x
'''


def _is_conv1d(m: nn.Module) -> bool:
    t = type(m)
    return t.__name__ == "Conv1D" and t.__module__ == "transformers.pytorch_utils"


def _proj_weight(m: nn.Module) -> Optional[torch.Tensor]:
    """The (out, in) weight of GPT-2's projection: a Conv1D's transposed, an nn.Linear's own; None for anything else."""
    if _is_conv1d(m):
        return m.weight.t()
    return m.weight if type(m) is nn.Linear else None


def _gpt2_check(m: nn.Module) -> Optional[str]:
    missing = [n for n in ("c_fc", "act", "c_proj", "dropout") if not hasattr(m, n)]
    if missing:
        return f"missing attribute(s) {missing}"
    if activation_name(m.act) is None:
        return f"its act is {type(m.act).__module__}.{type(m.act).__qualname__}, not a verified GELU / SiLU"
    if not (_is_conv1d(m.c_proj) or type(m.c_proj) is nn.Linear):
        return (f"its c_proj is {type(m.c_proj).__qualname__}, not transformers' Conv1D or an nn.Linear (an adapter or "
                "a quantized layer)")
    return None


def _timm_check(m: nn.Module) -> Optional[str]:
    missing = [n for n in ("fc1", "act", "drop1", "norm", "fc2", "drop2") if not hasattr(m, n)]
    if missing:
        return f"missing attribute(s) {missing}"
    if activation_name(m.act) is None:
        return f"its act is {type(m.act).__module__}.{type(m.act).__qualname__}, not a verified GELU / SiLU"
    if type(m.fc2) is not nn.Linear:
        return f"its fc2 is {type(m.fc2).__qualname__}, not an nn.Linear (use_conv, an adapter or a quantized layer)"
    if type(m.norm) is not nn.Identity:
        return f"its norm is {type(m.norm).__qualname__}: a norm between the activation and fc2 is not fused"
    if type(m.drop1) is not nn.Dropout:
        return f"its drop1 is {type(m.drop1).__qualname__}, not an nn.Dropout"
    return None


def _inductor_route() -> bool:
    """Under ``torch.compile`` with the ``mlp`` route "inductor" (ops/compile_config.py): the class's own forward."""
    return is_compiling() and compile_config.route("mlp") == "inductor"


def _fusable(h: torch.Tensor, weight: torch.Tensor) -> bool:
    """The kernels take these: a float dtype they run, a device Triton runs on, a gradient to save memory for."""
    return (h.dtype in SUPPORTED_DTYPES and triton_runnable(h) and torch.is_grad_enabled()
            and (h.requires_grad or weight.requires_grad))


def _build_gpt2_mlp(cls: type) -> dict:
    source_forward = cls.forward

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        act = activation_name(self.act)
        if _inductor_route() or act is None or not triton_runnable(hidden_states):
            return source_forward(self, hidden_states)
        h = self.c_fc(hidden_states)  # the class's call: hooks and adapters on c_fc keep working
        proj = self.c_proj
        w = _proj_weight(proj)
        if w is None or not (unhooked(proj) and _fusable(h, w)):
            return self.dropout(proj(self.act(h)))
        return self.dropout(fused_activation_linear(h, w, proj.bias, act, reuse_inputs=unhooked(self.c_fc)))

    return {"forward": forward}


def _build_timm_mlp(cls: type) -> dict:
    source_forward = cls.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = activation_name(self.act)
        fc2 = self.fc2
        if (_inductor_route() or act is None or not triton_runnable(x) or type(self.norm) is not nn.Identity
                or not _plain_linear(fc2) or (self.drop1.p > 0 and self.drop1.training)):
            return source_forward(self, x)
        h = self.fc1(x)
        if not _fusable(h, fc2.weight):
            return self.drop2(fc2(self.norm(self.drop1(self.act(h)))))
        return self.drop2(fused_activation_linear(h, fc2.weight, fc2.bias, act, reuse_inputs=unhooked(self.fc1)))

    return {"forward": forward}


REGISTRY.extend([
    LookAlike("hf_gpt2_mlp", "transformers", "mlp", "transformers.models.gpt2.modeling_gpt2.GPT2MLP", _build_gpt2_mlp,
              forward_src=GPT2_MLP_FORWARD, check=_gpt2_check,
              note="GPT-2 MLP c_proj(act(c_fc(x))): the activation recomputed in the backward, not kept"),
    LookAlike("timm_mlp", "timm", "mlp_recompute", "timm.layers.mlp.Mlp", _build_timm_mlp, forward_src=TIMM_MLP_FORWARD,
              check=_timm_check, note="timm Mlp fc2(act(fc1(x))): the activation recomputed in the backward, not kept"),
])


def _build_plain(fc: str, act: str, proj: str):
    """The fused forward of ``return self.<proj>(self.<act>(self.<fc>(x)))`` (``register_mlp``)."""
    def build(cls: type) -> dict:
        source_forward = cls.forward

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            name = activation_name(getattr(self, act))
            p = getattr(self, proj)
            if _inductor_route() or name is None or not triton_runnable(x) or not _plain_linear(p):
                return source_forward(self, x)
            first = getattr(self, fc)
            h = first(x)
            if not _fusable(h, p.weight):
                return p(getattr(self, act)(h))
            return fused_activation_linear(h, p.weight, p.bias, name, reuse_inputs=unhooked(first))

        return {"forward": forward}

    return build


def register_mlp(cls: type, fc: str = "fc", act: str = "act", proj: str = "proj") -> LookAlike:
    """Make ``swap_modules`` (kind ``mlp``) fuse your own plain MLP class: ``cls.forward`` must be exactly
    ``return self.<proj>(self.<act>(self.<fc>(x)))`` (checked on its syntax tree; any argument name), with ``proj``
    an ``nn.Linear`` and ``act`` a verified GELU / SiLU at swap time (else the module is left alone with the reason).
    Registering a class twice returns its first entry.  Raises ``TypeError`` for a forward of another form."""
    path = _qualname(cls)
    for e in REGISTRY:
        if e.kind == "mlp" and path in e.classes:
            return e
    fwd = cls.__dict__.get("forward")
    try:
        arg = inspect.signature(fwd).parameters
        arg = list(arg)[1]
    except (TypeError, ValueError, IndexError):
        raise TypeError(f"register_mlp: {path} has no forward(self, x) of its own") from None
    want = f"def forward(self, {arg}):\n    return self.{proj}(self.{act}(self.{fc}({arg})))\n"
    if fingerprint(fwd) != _compile_forward(textwrap.dedent(want)):
        raise TypeError(f"register_mlp: {path}.forward must be exactly `return self.{proj}(self.{act}(self.{fc}("
                        f"{arg})))` (arguments 'fc', 'act', 'proj' name the attributes)")

    def check(m: nn.Module) -> Optional[str]:
        missing = [n for n in (fc, act, proj) if not hasattr(m, n)]
        if missing:
            return f"missing attribute(s) {missing}"
        if activation_name(getattr(m, act)) is None:
            a = getattr(m, act)
            return f"its {act} is {type(a).__module__}.{type(a).__qualname__}, not a verified GELU / SiLU"
        if type(getattr(m, proj)) is not nn.Linear:
            return f"its {proj} is {type(getattr(m, proj)).__qualname__}, not an nn.Linear"
        return None

    entry = LookAlike(f"mlp:{path}", cls.__module__.split(".", 1)[0], "mlp", path, _build_plain(fc, act, proj),
                      classes=(path,), check=check, note=f"{cls.__qualname__} {proj}(act({fc}(x))), registered")
    REGISTRY.append(entry)
    _MATCH_CACHE.pop(cls, None)
    return entry
