"""Hugging Face transformers: RMSNorm look-alikes and the attention implementation "fused_layers".

Norms (matched by forward fingerprint, see the package docstring; the verified forwards are below):

* ``LlamaRMSNorm`` and its copies: ``weight * (x.float() * rsqrt(mean(x^2) + variance_epsilon)).to(x.dtype)``
  -> ``fused_rms_norm_variant(cast_before_weight=True)``: h is rounded to x's dtype *before* the weight
  multiply, y in the promoted dtype, exactly that order.
* ``T5LayerNorm`` (RMS, no mean; rounds h to the weight's dtype only when that is half precision) ->
  ``cast_before_weight = weight is half``.
* ``GemmaRMSNorm``: ``(h * (1 + weight.float())).type_as(x)`` -> the same kernels with the weight
  ``1 + weight.float()`` (an N-element op; its gradient is the weight's), multiply in float32, one
  rounding to x's dtype: the same order as Gemma's.

A call the kernels cannot take (a weight in a third dtype, a device Triton cannot run on) runs the
class's own forward.

Attention.  ``register()`` adds "fused_layers" to transformers' ``AttentionInterface`` (the function
``fused_attention_forward``) and to ``AttentionMaskInterface`` (the mask function is SDPA's own, so the
masks a model builds are exactly those ``sdpa`` gets: ``None`` for causal without padding, else a 4-D
boolean mask).  ``swap_modules`` gives each attention module that calls ``ALL_ATTENTION_FUNCTIONS`` a
fused subclass and switches the model to "fused_layers" with the model's own
``set_attn_implementation``; ``restore_modules`` switches back to what it was when the last one is
restored.  The registered function runs our kernels for modules of a fused subclass (a check on the
module's type, nothing for Dynamo to guard beyond it) and SDPA for any other module, so a model whose
layers are partly restored (``policy=faster``) is right everywhere.

What runs fused: no mask with causal / non-causal; a 4-D boolean or additive mask that is a key-padding mask,
or causal (Sq == Sk) AND a key-padding mask (decomposed once per mask tensor, the model passes the same tensor
to every layer; under torch.compile a mask tensor runs SDPA, since telling which mask it is means reading its
values, a graph break in every layer); GQA through ``num_key_value_groups`` (the kernels' native GQA, K/V not
repeated); ``scaling``; attention dropout in training. Anything else -- sliding windows, soft-capping,
attention sinks, position biases, other masks, ``output_attentions`` -- runs SDPA after one warning.
Where the project's attention modules call SDPA because cuDNN is measured faster (``prefer_sdpa``: dense,
no mask, MHA, head dim 64/128 on Hopper), so does this function.
A query row whose keys are all masked (a padded query under causal + left padding) gives 0, as SDPA
does with the boolean masks transformers builds; with a finite additive mask SDPA would average over
all keys there instead (a row no loss reads).
"""

from __future__ import annotations

import inspect
import os
import sys
import weakref
from typing import Any, Optional

import torch
from torch import nn

from ..ops import compile_config
from ..ops._common import is_compiling, use_fallback, warn_once
from ..ops.norm_variants import fused_rms_norm_variant, variant_supported
from . import REGISTRY, LookAlike

IMPL = "fused_layers"  #: the name registered in transformers' AttentionInterface

# --------------------------------------------------------------------------------------------------
# Norms.  The forwards below are copied from transformers 5.24 (models/llama, models/t5, models/gemma);
# a class matches only when its forward compiles to the same code.
# --------------------------------------------------------------------------------------------------
LLAMA_RMS_FORWARD = '''
def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
'''

T5_NORM_FORWARD = '''
def forward(self, hidden_states):
    # T5 uses a layer_norm which only scales and doesn't shift, which is also known as Root Mean
    # Square Layer Normalization https://huggingface.co/papers/1910.07467 thus variance is calculated
    # w/o mean and there is no bias. Additionally we want to make sure that the accumulation for
    # half-precision inputs is done in fp32

    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)

    # convert into half-precision if necessary
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)

    return self.weight * hidden_states
'''

GEMMA_RMS_FORWARD = '''
def forward(self, x):
    output = self._norm(x.float())
    # Llama does x.to(float16) * w whilst Gemma is (x * w).to(float16)
    # See https://github.com/huggingface/transformers/pull/29402
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
'''

GEMMA_NORM_HELPER = '''
def forward(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
'''

_HALF = (torch.float16, torch.bfloat16)


def _needs(*names: str):
    def check(m: nn.Module) -> Optional[str]:
        missing = [n for n in names if not hasattr(m, n)]
        if missing:
            return f"missing attribute(s) {missing}"
        w = getattr(m, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 1:
            return "weight is not a 1-D tensor"
        return None
    return check


def _build_llama(cls: type) -> dict:
    source_forward = cls.forward

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not variant_supported(hidden_states, self.weight):
            return source_forward(self, hidden_states)
        return fused_rms_norm_variant(hidden_states, self.weight, self.variance_epsilon, cast_before_weight=True)

    return {"forward": forward}


def _build_t5(cls: type) -> dict:
    source_forward = cls.forward

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not variant_supported(hidden_states, w):
            return source_forward(self, hidden_states)
        return fused_rms_norm_variant(hidden_states, w, self.variance_epsilon, cast_before_weight=w.dtype in _HALF)

    return {"forward": forward}


def _gemma_check(m: nn.Module) -> Optional[str]:
    why = _needs("weight", "eps")(m)
    if why:
        return why
    from . import _compile_forward, fingerprint
    norm = type(m).__dict__.get("_norm") or getattr(type(m), "_norm", None)
    if norm is None or fingerprint(norm) != _compile_forward(GEMMA_NORM_HELPER):
        return "its _norm differs from GemmaRMSNorm's (not verified)"
    return None


def _build_gemma(cls: type) -> dict:
    source_forward = cls.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not variant_supported(x, self.weight):
            return source_forward(self, x)
        w1 = 1.0 + self.weight.float()  # float32 [N]; the gradient flows back to the weight
        return fused_rms_norm_variant(x, w1, self.eps, cast_before_weight=False, keep_input_dtype=True)

    return {"forward": forward}


REGISTRY.extend([
    LookAlike("hf_llama_rms_norm", "transformers", "rms_norm", "transformers.models.llama.modeling_llama.LlamaRMSNorm",
              _build_llama, forward_src=LLAMA_RMS_FORWARD, check=_needs("weight", "variance_epsilon"),
              note="Llama-family RMSNorm (cast to the input dtype, then weight)"),
    LookAlike("hf_t5_layer_norm", "transformers", "rms_norm", "transformers.models.t5.modeling_t5.T5LayerNorm",
              _build_t5, forward_src=T5_NORM_FORWARD, check=_needs("weight", "variance_epsilon"),
              note="T5 LayerNorm (RMS, no mean; cast to a half weight's dtype, then weight)"),
    LookAlike("hf_gemma_rms_norm", "transformers", "rms_norm", "transformers.models.gemma.modeling_gemma.GemmaRMSNorm",
              _build_gemma, forward_src=GEMMA_RMS_FORWARD, check=_gemma_check,
              note="Gemma RMSNorm (x * (1 + weight), float32, then cast)"),
])


# --------------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------------
def _is_hf_attention(cls: type) -> bool:
    if not cls.__module__.startswith("transformers.models."):
        return False
    fwd = cls.__dict__.get("forward")
    try:
        fwd = inspect.unwrap(fwd) if fwd is not None else None  # transformers decorates some forwards
    except ValueError:
        return False
    code = getattr(fwd, "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


def _attention_check(m: nn.Module) -> Optional[str]:
    cfg = getattr(m, "config", None)
    if cfg is None or not hasattr(cfg, "_attn_implementation"):
        return "no config with an attention implementation"
    return None


def _build_attention(cls: type) -> dict:
    """The fused subclass keeps its source's forward: the registered attention function fuses the calls whose
    module is of a fused class (``_fused_module``), a check on the module's type alone, so nothing mutable
    (a stack of running modules) is read or written while Dynamo traces."""

    def _fused_ledger_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """For the speedup ledger, which replays recorded calls: no KV cache (a stateful object that each
        call would grow, holding tensors of the recorded step's graph)."""
        cache_mod = sys.modules.get("transformers.cache_utils")
        base = getattr(cache_mod, "Cache", ()) if cache_mod is not None else ()
        kwargs = {k: (None if base and isinstance(v, base) else v) for k, v in kwargs.items()}
        if "use_cache" in kwargs:
            kwargs["use_cache"] = False
        return tuple(None if base and isinstance(a, base) else a for a in args), kwargs

    return {"_fused_ledger_inputs": staticmethod(_fused_ledger_inputs)}


REGISTRY.append(
    LookAlike("hf_attention", "transformers", "attention", "transformers.models.llama.modeling_llama.LlamaAttention",
              _build_attention, predicate=_is_hf_attention, check=_attention_check,
              note="attention through transformers' AttentionInterface ('fused_layers')"),
)

# --------------------------------------------------------------------------------------------------
# The causal-LM loss
# --------------------------------------------------------------------------------------------------
def _is_hf_causal_lm(cls: type) -> bool:
    """A transformers causal LM (``*ForCausalLM``, ``GPT2LMHeadModel``, ...) whose forward takes its loss from
    ``PreTrainedModel.loss_function`` (which model instances resolve to ForCausalLMLoss: ``check``)."""
    in_transformers = cls.__module__.startswith("transformers.models.")
    if not (in_transformers and cls.__name__.endswith(("ForCausalLM", "LMHeadModel"))):
        return False
    if not any(b.__name__ == "PreTrainedModel" and b.__module__ == "transformers.modeling_utils" for b in cls.__mro__):
        return False
    fwd = getattr(cls, "forward", None)
    try:
        fwd = inspect.unwrap(fwd) if fwd is not None else None  # transformers decorates forwards
    except ValueError:
        return False
    code = getattr(fwd, "__code__", None)
    return code is not None and "loss_function" in code.co_names


def _causal_lm_loss_check(m: nn.Module) -> Optional[str]:
    if "_loss_function" in m.__dict__:
        return "a loss_function of its own is set (left alone)"
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING

        hf = LOSS_MAPPING["ForCausalLM"]
        current = m.loss_function
    except Exception as e:  # noqa: BLE001  (another transformers layout)
        return f"transformers' causal-LM loss not found ({type(e).__name__}: {e})"
    if current is not hf:
        return f"its loss_function is {getattr(current, '__name__', current)!r}, not transformers' ForCausalLMLoss"
    return None


def _causal_lm_loss(x: torch.Tensor, width: int, labels: torch.Tensor, num_items_in_batch, ignore_index: int,
                    shift_labels: Optional[torch.Tensor], rows_loss) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss`` around ``rows_loss(x2d, target, reduction)``: shift the labels, flatten
    to rows of ``width``, ``sum / num_items_in_batch`` when given, else the mean over non-ignored tokens."""
    if shift_labels is None:
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    x2 = x.reshape(-1, width)
    t = shift_labels.reshape(-1).to(x2.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = rows_loss(x2, t, reduction)
    if reduction == "sum":
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def fused_causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                         num_items_in_batch: Optional[torch.Tensor] = None, ignore_index: int = -100,
                         shift_labels: Optional[torch.Tensor] = None, **kwargs: Any) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss`` on the fused cross-entropy kernel.  transformers computes
    ``logits.float()`` first (an fp32 copy of the logits and of their gradient, 8 bytes per logit); here
    the logits are read in their own dtype with float32 math, the gradient is written in the forward, and
    the loss is float32 as transformers' is."""
    from ..ops.cross_entropy import cross_entropy_op, validate

    def rows_loss(x: torch.Tensor, t: torch.Tensor, reduction: str) -> torch.Tensor:
        validate(x, t, None, ignore_index, reduction, 0.0)
        if (x.dtype == torch.float64 or use_fallback("cross_entropy", x)
                or (is_compiling() and compile_config.COMPILED.cross_entropy == "inductor")):
            return nn.functional.cross_entropy(x.float(), t, ignore_index=ignore_index, reduction=reduction)
        need_grad = x.requires_grad and torch.is_grad_enabled()
        return cross_entropy_op(x, t, None, ignore_index, reduction, 0.0, need_grad, torch.float32,
                                needs_grad=need_grad)

    return _causal_lm_loss(logits, vocab_size, labels, num_items_in_batch, ignore_index, shift_labels, rows_loss)


def _lm_head_feeds_only_the_loss(cls: type) -> Optional[str]:
    """Why ``cls.forward`` may not run the LM head + loss as one fused linear cross-entropy (None: it may).

    Checked on the forward's syntax tree, so any transformers version or model copy qualifies by what it
    does: ``logits`` is assigned once, from ``self.lm_head(...)`` (optionally ``.contiguous()``), and is
    otherwise only passed on: as ``logits=logits`` (to ``self.loss_function`` and the output), as the first
    arguments of ``self.loss_function``, or returned in a tuple.  A forward that
    rescales or soft-caps the logits (Gemma 2's ``final_logit_softcapping``, Cohere's ``logit_scale``)
    assigns ``logits`` again or uses it in arithmetic and is refused."""
    import ast
    import textwrap

    fwd = cls.__dict__.get("forward") or getattr(cls, "forward", None)
    try:
        fwd = inspect.unwrap(fwd)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fwd)))
    except (OSError, TypeError, ValueError, SyntaxError) as e:
        return f"its forward's source is not readable ({type(e).__name__})"
    stores, bad = [], []
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "logits":
            if isinstance(node.ctx, ast.Store):
                stores.append(node)
                continue
            parent = parents.get(node)
            if isinstance(parent, ast.keyword) and parent.arg == "logits":
                continue
            if isinstance(parent, ast.Tuple):
                continue
            if (isinstance(parent, ast.Call) and node in parent.args and isinstance(parent.func, ast.Attribute)
                    and parent.func.attr == "loss_function"):  # self.loss_function(logits, labels, ...)
                continue
            bad.append(getattr(node, "lineno", "?"))
    if len(stores) != 1:
        return f"its forward assigns logits {len(stores)} times (post-processed logits)"
    assign = parents.get(stores[0])
    call = getattr(assign, "value", None)
    while (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "contiguous"
           and not call.args):  # self.lm_head(h).contiguous() (OPT)
        call = call.func.value
    if not (isinstance(assign, ast.Assign) and isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "lm_head" and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
        return "its logits do not come straight from self.lm_head(...)"
    if bad:
        return "its forward uses the logits for more than the loss and the output"
    heads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "lm_head"]
    if len(heads) != 1:  # the head is stood in for during the call: nothing else may touch it
        return f"its forward refers to self.lm_head {len(heads)} times"
    return None


#: The HF fused linear cross-entropy: in training with labels, the LM head + loss run chunked over tokens
#: and ``outputs.logits`` is None (as Liger-Kernel's HF patches do).  Set to False (or
#: FUSED_LAYERS_HF_SKIP_LOGITS=0) to keep the logits: the loss alone is fused then.
HF_SKIP_LOGITS = os.environ.get("FUSED_LAYERS_HF_SKIP_LOGITS", "1") not in ("0", "false", "False")


class _CaptureHidden(nn.Module):
    """Stands in for ``lm_head`` during a fused forward: the "logits" the model passes on are its hidden states."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states


def _linear_loss(head: nn.Linear):
    """The loss_function of a fused forward: its "logits" are the hidden states (_CaptureHidden), and the
    head + loss run as the fused linear cross-entropy."""
    def loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int,
             num_items_in_batch: Optional[torch.Tensor] = None, ignore_index: int = -100,
             shift_labels: Optional[torch.Tensor] = None, **kwargs: Any) -> torch.Tensor:
        from ..ops.linear_cross_entropy import fused_linear_cross_entropy

        def rows_loss(h: torch.Tensor, t: torch.Tensor, reduction: str) -> torch.Tensor:
            return fused_linear_cross_entropy(h, head.weight, t, head.bias, ignore_index=ignore_index,
                                              reduction=reduction).float()

        return _causal_lm_loss(logits, logits.shape[-1], labels, num_items_in_batch, ignore_index, shift_labels,
                               rows_loss)

    return loss


def _build_causal_lm(cls: type) -> dict:
    source_forward = cls.forward
    try:
        sig = inspect.signature(source_forward)
    except (TypeError, ValueError):  # pragma: no cover
        sig = None
    linear_why = _lm_head_feeds_only_the_loss(cls)

    def _get(self):
        return self.__dict__.get("_fused_lce_loss") or self.__dict__.get("_loss_function", fused_causal_lm_loss)

    def _set(self, value):
        self.__dict__["_loss_function"] = value

    def _linear_ok(self, args: tuple, kwargs: dict) -> bool:
        if linear_why is not None or not HF_SKIP_LOGITS or not self.training or not torch.is_grad_enabled():
            return False
        if "_loss_function" in self.__dict__ or (is_compiling() and compile_config.COMPILED.linear_cross_entropy
                                                  != "kernels"):  # compiled too: Inductor would hold the logits
            return False
        cfg = getattr(self, "config", None)
        if not getattr(cfg, "return_dict", True):  # tuple outputs: keep transformers' path
            return False
        head = self.__dict__["_modules"].get("lm_head")
        if type(head) is not nn.Linear or sig is None:
            return False
        if head._forward_pre_hooks or head._forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
            return False  # hooks on the head (FSDP unsharding, adapters, probes) must see it called
        try:
            bound = sig.bind(self, *args, **kwargs).arguments
        except TypeError:
            return False
        keep = bound.get("logits_to_keep", 0)
        extra = bound.get("kwargs", {})
        return (bound.get("labels") is not None and isinstance(keep, int) and keep == 0
                and extra.get("return_dict") is not False)

    def forward(self, *args: Any, **kwargs: Any):
        if not _linear_ok(self, args, kwargs):
            return source_forward(self, *args, **kwargs)
        mods = self.__dict__["_modules"]
        head = mods["lm_head"]
        mods["lm_head"] = _CaptureHidden()
        self.__dict__["_fused_lce_loss"] = _linear_loss(head)
        try:
            out = source_forward(self, *args, **kwargs)
        finally:
            mods["lm_head"] = head
            self.__dict__.pop("_fused_lce_loss", None)
        # the "logits" are hidden states: drop them (the point is never to hold (tokens, vocab) logits)
        if not hasattr(out, "items"):
            raise RuntimeError(f"{type(self).__name__}: the fused LM head + loss expected a ModelOutput, got "
                               f"{type(out).__name__}; set FUSED_LAYERS_HF_SKIP_LOGITS=0 to keep transformers' path")
        return type(out)(**{k: v for k, v in out.items() if k != "logits"})

    return {"loss_function": property(_get, _set, doc="transformers' causal-LM loss on the fused cross-entropy kernel"),
            "forward": forward,
            # the speedup ledger replays module calls with random inputs: not a whole model (token ids,
            # caches); the step-time A/B measures this swap on real steps
            "_fused_ledger_skip": True,
            "_fused_linear_refused": linear_why}


REGISTRY.append(
    LookAlike("hf_causal_lm_loss", "transformers", "cross_entropy",
              "transformers.models.llama.modeling_llama.LlamaForCausalLM",
              _build_causal_lm, predicate=_is_hf_causal_lm, check=_causal_lm_loss_check,
              note="the LM head + loss of causal LMs (fused linear cross-entropy in training, else the fused loss)"),
)

_registered = [False]


def register() -> None:
    """Register "fused_layers" in transformers' attention and attention-mask interfaces (idempotent)."""
    if _registered[0]:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPL, fused_attention_forward)
    AttentionMaskInterface.register(IMPL, sdpa_mask)
    _registered[0] = True


def _sdpa(*args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


# One slot: the decomposition of the last mask tensor seen (a model passes the same tensor to every layer).
_MASK_CACHE: list = [None, None, None]  # [weakref to mask, its _version, result]


def _tril(sq: int, sk: int, device) -> torch.Tensor:
    return torch.ones(sq, sk, dtype=torch.bool, device=device).tril()


def decompose_mask(mask: torch.Tensor, sq: int, sk: int) -> Optional[tuple[torch.Tensor, bool]]:
    """(key mask shaped (B|1, H|1, 1, Sk), causal) equivalent to a 4-D SDPA-style ``mask``, or None.

    ``mask`` is boolean (True keeps) or additive (float: 0 keeps, a large negative value or -inf drops).
    It decomposes when every query row equals the last one (a key-padding mask), or when Sq == Sk and it
    is the causal mask AND the last row (causal's last row keeps every key, so the last row is the key
    mask).  One comparison over the mask; the result is cached for the same tensor.
    """
    if mask.dim() != 4 or mask.shape[-1] != sk or mask.shape[-2] not in (1, sq) or mask.requires_grad:
        return None
    ref, ver, res = _MASK_CACHE
    if ref is not None and ref() is mask and ver == mask._version:
        return res
    res = _decompose(mask, sq, sk)
    try:
        _MASK_CACHE[:] = [weakref.ref(mask), mask._version, res]
    except TypeError:
        pass
    return res


def _decompose(mask: torch.Tensor, sq: int, sk: int) -> Optional[tuple[torch.Tensor, bool]]:
    last = mask[:, :, -1:, :]
    if mask.dtype != torch.bool:  # a dropped key (finfo.min, as transformers' eager masks) becomes -inf
        last = last.masked_fill(last <= torch.finfo(mask.dtype).min / 2, float("-inf"))
    if mask.shape[-2] == 1 or torch.equal(mask, mask[:, :, -1:, :].expand_as(mask)):
        return last, False
    if sq != sk:
        return None
    tril = _tril(sq, sk, mask.device)
    if mask.dtype == torch.bool:
        expect = last & tril
        return (last, True) if torch.equal(mask, expect.expand_as(mask)) else None
    # additive: the lower triangle must equal the key bias, the upper triangle must drop the key
    key = mask[:, :, -1:, :].expand_as(mask)
    if not torch.equal(torch.where(tril, mask, key), key):
        return None
    dropped = torch.finfo(mask.dtype).min / 2
    up = torch.where(tril, torch.full_like(mask, float("-inf")), mask)
    if bool((up > dropped).any()):
        return None
    return last, True


def fused_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function convention: q (B, Hq, Sq, D), k / v (B, Hkv, Sk, D), returns
    ((B, Sq, Hq, D), None).  Fused for modules of a fused subclass, SDPA otherwise (see module docstring)."""
    if getattr(type(module), "_fused_layers_lookalike", None) != "hf_attention":  # not a swapped module
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
                     **kwargs)
    why = None
    if kwargs.get("softcap") is not None:
        why = "soft-capping"
    elif kwargs.get("sliding_window") is not None:
        why = "a sliding window"
    elif kwargs.get("position_bias") is not None:
        why = "a position bias"
    elif kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        why = "attention sinks"
    elif kwargs.get("output_attentions"):
        why = "output_attentions=True"
    elif query.shape[-1] != value.shape[-1] or query.shape[-1] > 256:
        why = f"head dims q {query.shape[-1]} / v {value.shape[-1]}"
    sq, sk = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    kmask = None
    if why is None and attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            why = f"a {type(attention_mask).__name__} mask"
        elif is_compiling():
            # Which mask this is shows only in its values, and reading them (decompose_mask) would break the
            # graph at every layer.  transformers materializes the causal mask under torch.compile even
            # without padding where torch reports tracing as exporting (torch < 2.14, its masking_utils
            # says), so this is the common compiled case there; the unswapped model runs SDPA on that mask.
            why = "a mask tensor under torch.compile"
        else:
            dec = decompose_mask(attention_mask, sq, sk)
            if dec is None:
                why = "a mask that is neither key padding nor causal + key padding"
            else:
                kmask, causal = dec
    if why is not None:
        warn_once(f"hf_attention:{why}", f"fused_layers attention: {why} is not fused; using SDPA for these calls.")
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
                     **kwargs)
    if attention_mask is None:
        # SDPA's rule (transformers' sdpa_attention_forward): causal only with several queries and no mask;
        # with more keys than queries (prefill of an empty static cache) the extra keys are cropped.
        causal = bool(sq > 1 and causal)
        if causal and sk > sq:
            key, value = key[:, :, :sq], value[:, :, :sq]
    from ..ops.attention import fused_attention, prefer_sdpa

    if kmask is None and prefer_sdpa(query, key, None):  # where cuDNN is measured faster, as FusedAttention does
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
                     **kwargs)
    gqa = query.shape[1] != key.shape[1]
    out = fused_attention(query, key, value, attn_mask=kmask, dropout_p=float(dropout), is_causal=causal, scale=scaling,
                          enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


# --------------------------------------------------------------------------------------------------
# Model-level switch (called by swap_modules / restore_modules)
# --------------------------------------------------------------------------------------------------
PREV_ATTR = "_fused_layers_prev_attn"


def _pretrained_roots(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost transformers PreTrainedModel instances in ``model`` (name, module)."""
    mu = sys.modules.get("transformers.modeling_utils")
    if mu is None:
        return []
    base = mu.PreTrainedModel
    roots: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, base) and not any(name == r or name.startswith(r + ".") or r == "" for r, _ in roots):
            roots.append((name, m))
    return roots


def _under(name: str, root: str) -> bool:
    return root == "" or name == root or name.startswith(root + ".")


def switch_models(model: nn.Module, attention_names: list[str]) -> dict[str, str]:
    """Switch the PreTrainedModels that hold the fused attention modules ``attention_names`` to
    "fused_layers"; returns {attention module name: reason} for those that could not be switched."""
    failed: dict[str, str] = {}
    if not attention_names:
        return failed
    register()
    roots = _pretrained_roots(model)
    modules = dict(model.named_modules())
    for name in attention_names:
        owner = next((r for r in roots if _under(name, r[0])), None)
        if owner is None:
            failed[name] = "not inside a transformers PreTrainedModel (its attention implementation cannot be set)"
            continue
        rname, root = owner
        if PREV_ATTR not in root.__dict__:
            prev = root.config._attn_implementation
            try:
                root.set_attn_implementation(IMPL)
            except Exception as e:  # noqa: BLE001 - any refusal: leave this model alone
                failed[name] = f"set_attn_implementation refused: {type(e).__name__}: {e}"
                continue
            root.__dict__[PREV_ATTR] = prev
        cfg = getattr(modules[name], "config", None)
        if getattr(cfg, "_attn_implementation", None) != IMPL:
            impl = getattr(cfg, "_attn_implementation", None)
            failed[name] = f"its config's attention implementation stayed {impl!r}"
    return failed


def unswitch_models(model: nn.Module) -> None:
    """Switch back every PreTrainedModel in ``model`` that no longer holds a fused attention module."""
    roots = _pretrained_roots(model)
    if not roots:
        return
    fused = [n for n, m in model.named_modules() if getattr(type(m), "_fused_layers_lookalike", None) == "hf_attention"]
    for rname, root in roots:
        prev = root.__dict__.get(PREV_ATTR)
        if prev is None or any(_under(n, rname) for n in fused):
            continue
        root.set_attn_implementation(prev)
        root.__dict__.pop(PREV_ATTR, None)
