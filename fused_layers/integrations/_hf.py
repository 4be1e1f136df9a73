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
restored.  SDPA's masks leave "causal" to the module's ``is_causal``; a model that does not support SDPA
may build a causal mask for a module that says ``is_causal = False`` (BigBird-Pegasus's decoder), so
such a model is switched to "fused_layers_eager_masks" instead: the same function, given the additive
masks ``eager_mask`` builds (never skipped), which it decomposes as any other mask.  The registered function
runs our kernels for modules of a fused subclass (a check on the module's type, nothing for Dynamo to guard
beyond it) and the model's own implementation for any other module, so a model whose layers are partly
restored (``policy=faster``) is right everywhere.

What runs fused: no mask with causal / non-causal; a 4-D boolean or additive mask that is a key-padding mask, or
causal (Sq == Sk) AND a key-padding mask, or causal AND the layer's ``sliding_window`` AND a key-padding mask
(decomposed once per mask tensor and window, the model passes the same tensor to every layer of a kind): the window
goes to the kernels, which skip the key tiles outside it.  Where the swapped causal LM's call fixes its masks
(``CALL_MASK_MODELS``, no cache, no position ids but beside a 2-D padding mask: causal AND the layer's window AND
that padding mask), the kernels take those and no mask is read: eager, none is built (``CallMasks``), so the
forward never waits on a host read of the positions or the padding, as transformers' mask code does every forward;
compiled, transformers materializes every mask, and telling which one a tensor is would break the graph in every
layer, so the unread mask drops out of the graph.  Other calls under torch.compile run the model's own
implementation on the mask;
``softcap`` (Gemma 2's logit soft-capping) in the kernels; GQA through ``num_key_value_groups`` (the kernels'
native GQA, K/V not repeated); ``scaling``; attention dropout in training. Packed, padding-free batches (several
sequences in one row, as ``DataCollatorWithFlattening`` builds them) run the varlen kernel, so no attention crosses
a sequence boundary: marked by the ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (+ ``max_length_q`` / ``max_length_k``)
kwargs, read as flash-attention reads them, or by ``position_ids`` that restart, with no mask or the block-diagonal
one transformers builds from them (transformers' sdpa and eager paths see the packing only in the latter case).
Anything else -- attention sinks, position biases, other masks, ``output_attentions`` -- runs, after one warning,
the attention implementation the model was configured with before the switch (``own_attention``: "eager" gets the
additive mask transformers' ``eager_mask`` would have built), so it computes exactly what the unswapped model
computes; SDPA, for one, has no soft-capping.
Where the project's attention modules call SDPA because cuDNN is measured faster (``prefer_sdpa``: dense,
no mask, MHA, head dim 64/128 on Hopper), so does this function.
A query row whose keys are all masked (a padded query under causal + left padding) gives 0, as SDPA
does with the boolean masks transformers builds; with a finite additive mask SDPA would average over
all keys there instead (a row no loss reads).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import weakref
from typing import Any, Optional

import torch
from torch import nn

from ..ops import compile_config
from ..ops._common import is_compiling, use_fallback, warn_once
from ..ops.norm_variants import fused_rms_norm_variant, variant_supported
from . import REGISTRY, LookAlike

IMPL = "fused_layers"  #: the name registered in transformers' AttentionInterface
IMPL_EAGER_MASKS = "fused_layers_eager_masks"  #: the same function with the masks "eager" gets (see above)

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
        return cross_entropy_op(x, t, None, ignore_index, reduction, 0.0, need_grad, torch.float32, 0.0,
                                needs_grad=need_grad)

    return _causal_lm_loss(logits, vocab_size, labels, num_items_in_batch, ignore_index, shift_labels, rows_loss)


def _softcap_block(node, parents) -> Optional[str]:
    """The config attribute ``X`` if ``node`` is exactly Gemma 2's final soft-capping of the logits::

        if self.config.X is not None:
            logits = logits / self.config.X
            logits = torch.tanh(logits)
            logits = logits * self.config.X
    """
    import ast

    def cfg_attr(e) -> Optional[str]:  # self.config.X -> "X"
        if (isinstance(e, ast.Attribute) and isinstance(e.value, ast.Attribute) and e.value.attr == "config"
                and isinstance(e.value.value, ast.Name) and e.value.value.id == "self"):
            return e.attr
        return None

    def is_logits(e) -> bool:
        return isinstance(e, ast.Name) and e.id == "logits"

    test = getattr(node, "test", None)
    if not (isinstance(node, ast.If) and not node.orelse and isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.IsNot) and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None and len(node.body) == 3):
        return None
    attr = cfg_attr(test.left)
    if attr is None:
        return None
    div, tanh, mul = node.body
    ok = all(isinstance(a, ast.Assign) and len(a.targets) == 1 and is_logits(a.targets[0]) for a in node.body)
    ok = ok and isinstance(div.value, ast.BinOp) and isinstance(div.value.op, ast.Div) and is_logits(div.value.left) \
        and cfg_attr(div.value.right) == attr
    ok = ok and isinstance(tanh.value, ast.Call) and len(tanh.value.args) == 1 and is_logits(tanh.value.args[0]) \
        and isinstance(tanh.value.func, ast.Attribute) and tanh.value.func.attr == "tanh" and not tanh.value.keywords
    ok = ok and isinstance(mul.value, ast.BinOp) and isinstance(mul.value.op, ast.Mult) and is_logits(mul.value.left) \
        and cfg_attr(mul.value.right) == attr
    return attr if ok else None


def _lm_head_plan(cls: type) -> tuple[Optional[str], Optional[str]]:
    """Whether ``cls.forward`` may run the LM head + loss as one fused linear cross-entropy: ``(why not, softcap)``
    (``why not`` None: it may; ``softcap`` the config attribute of its final logit soft-capping, or None).

    Checked on the forward's syntax tree, so any transformers version or model copy qualifies by what it
    does: ``logits`` is assigned once, from ``self.lm_head(...)`` (optionally ``.contiguous()``), optionally
    soft-capped by exactly Gemma 2's block (``_softcap_block``: the fused loss caps inside its kernel, and the
    attribute is read nowhere else in the model's module), and is otherwise only passed on: as
    ``logits=logits`` (to ``self.loss_function`` and the output), as the first arguments of
    ``self.loss_function``, or returned in a tuple.  A forward that rescales the logits otherwise (Cohere's
    ``logit_scale``) assigns ``logits`` again or uses it in arithmetic and is refused."""
    import ast
    import textwrap

    fwd = cls.__dict__.get("forward") or getattr(cls, "forward", None)
    try:
        fwd = inspect.unwrap(fwd)
        fwd_src = textwrap.dedent(inspect.getsource(fwd))
        tree = ast.parse(fwd_src)
    except (OSError, TypeError, ValueError, SyntaxError) as e:
        return f"its forward's source is not readable ({type(e).__name__})", None
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    softcap, capped = None, set()
    for node in ast.walk(tree):
        attr = _softcap_block(node, parents)
        if attr is not None:
            if softcap is not None:
                return "its forward soft-caps the logits twice", None
            softcap = attr
            capped = {id(n) for n in ast.walk(node)}
    if softcap is not None:
        try:
            module_src = inspect.getsource(sys.modules[fwd.__module__])
        except (OSError, TypeError, KeyError):
            return "its module's source is not readable (soft-capped logits)", None
        if module_src.count(softcap) != fwd_src.count(softcap):
            return f"config.{softcap} is read outside its forward", None
    stores, bad = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "logits" and id(node) not in capped:
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
        return f"its forward assigns logits {len(stores)} times (post-processed logits)", None
    assign = parents.get(stores[0])
    call = getattr(assign, "value", None)
    while (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "contiguous"
           and not call.args):  # self.lm_head(h).contiguous() (OPT)
        call = call.func.value
    if not (isinstance(assign, ast.Assign) and isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "lm_head" and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
        return "its logits do not come straight from self.lm_head(...)", None
    if bad:
        return "its forward uses the logits for more than the loss and the output", None
    heads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "lm_head"]
    if len(heads) != 1:  # the head computes the loss during its call: nothing else may touch it
        return f"its forward refers to self.lm_head {len(heads)} times", None
    if any(isinstance(n, ast.Name) and n.id == "labels" and isinstance(n.ctx, ast.Store) for n in ast.walk(tree)):
        return "its forward changes the labels before its loss", None
    return None, softcap


#: The HF fused linear cross-entropy: in training with labels, the LM head + loss run chunked over tokens
#: and ``outputs.logits`` is None (as Liger-Kernel's HF patches do).  Set to False (or
#: FUSED_LAYERS_HF_SKIP_LOGITS=0) to keep the logits: the loss alone is fused then.
HF_SKIP_LOGITS = os.environ.get("FUSED_LAYERS_HF_SKIP_LOGITS", "1") not in ("0", "false", "False")


def _head_linear(head: nn.Module) -> tuple[Optional[nn.Linear], Optional[str]]:
    """The ``nn.Linear`` whose forward computes ``head``'s output, or ``(None, why not)``.

    A plain ``nn.Linear``; the same sharded by FSDP2 (``fully_shard`` makes its class an ``FSDPLinear`` subclass,
    forward unchanged) or partitioned by DeepSpeed ZeRO-3 (hooks only); or the ``nn.Linear`` an FSDP1 wrapper
    holds.  Anything with a forward of its own (a PEFT adapter, a quantized layer) computes something else."""
    inner = head
    if type(head).__name__ == "FullyShardedDataParallel":  # FSDP1: the wrapper's forward unshards, then calls it
        inner = getattr(head, "_fsdp_wrapped_module", None)
    if isinstance(inner, nn.Linear) and type(inner).forward is nn.Linear.forward:
        return inner, None
    return None, (f"its lm_head is a {type(head).__name__} with a forward of its own (an adapter or a wrapper), "
                  "not a linear layer")


def _is_dtensor(t: torch.Tensor) -> bool:
    dt = sys.modules.get("torch.distributed.tensor")
    return dt is not None and isinstance(t, getattr(dt, "DTensor", ()))


def _head_dispatch(lin: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head's forward once its causal LM has run swapped: the fused head + loss of the call in progress
    (``_fused_head_call``, which that call sets and clears), else the head's own forward.  It stays installed
    between calls (cleared by the model's restore) because Dynamo 2.11 cannot trace taking an entry out of a
    module's ``__dict__``: that graph break ran every compiled step's head and loss eager."""
    call = lin.__dict__.get("_fused_head_call")
    if call is not None:
        return call(hidden)
    return type(lin).forward(lin, hidden)


def _install_head_dispatch(model: nn.Module) -> None:
    """Route the head's forward through ``_head_dispatch`` (``_fused_after_swap``; again by the first call of a
    head replaced since): installed before any compile, so Dynamo's guards see one layout of the head."""
    lin, _ = _head_linear(model.__dict__["_modules"].get("lm_head"))
    if lin is not None and "_fused_head_call" not in lin.__dict__:
        lin.__dict__["forward"] = functools.partial(_head_dispatch, lin)
        lin.__dict__["_fused_head_call"] = None


def _drop_head_dispatch(model: nn.Module) -> None:
    """Undo what the swapped causal LM's calls left on the model and its head (``_fused_before_restore``)."""
    model.__dict__.pop("_fused_lce_loss", None)
    lin, _ = _head_linear(model.__dict__["_modules"].get("lm_head"))
    if lin is not None and "_fused_head_call" in lin.__dict__:
        lin.__dict__.pop("_fused_head_call")
        lin.__dict__.pop("forward", None)


# The masks of the causal-LM call in progress, where its arguments fix them (``_call_masks``), for the attention
# function; set by the swapped causal LM's forward (the previous value back after it).  Eager, the model's mask
# function then returns a ``CallMasks`` instead of building a mask: transformers would read the positions the model
# made itself (``find_packed_sequence_indices``) and the padding mask (``_ignore_causal_mask_sdpa``) on the host, a
# sync that drains the GPU's queue at the start of every forward (a step the GPU runs faster than the host launches
# it then waits on the host).  Compiled, transformers materializes every mask (torch < 2.14 reports tracing as
# exporting, and the positions a model makes itself always look possibly packed), and which mask a tensor is shows
# only in its values: the attention function takes the call's masks and the unread mask drops out of the graph.
# Eager calls keep theirs per thread (``nn.DataParallel`` runs its replicas' forwards in threads at once); the
# compiled one in a plain list, which Dynamo traces (it does not trace a ``threading.local``).
_CALL_MASKS: list = [None]
_EAGER_CALL = threading.local()


def _eager_call_masks() -> Optional[tuple]:
    """The masks of this thread's eager causal-LM call in progress (``_call_masks``), or None."""
    return getattr(_EAGER_CALL, "masks", None)


def _set_call_masks(masks: Optional[tuple]) -> Optional[tuple]:
    """Make ``masks`` those of the call in progress (compiled or this thread's eager one); returns the previous."""
    if is_compiling():
        prev, _CALL_MASKS[0] = _CALL_MASKS[0], masks
    else:
        prev, _EAGER_CALL.masks = _eager_call_masks(), masks
    return prev


class CallMasks:
    """The mask of a layer of a causal-LM call whose arguments fix it (``_call_masks``): causal AND ``window`` (the
    ``local_size`` transformers gives the mask function of a sliding-window mask, None for a causal one) AND
    ``padding``, the call's 2-D key-padding mask (bool, or None).  What the "fused_layers" mask function returns in
    eager for such a call, passed by the model to its layers (a checkpointed layer gets it again when it
    recomputes); ``build()`` makes the 4-D mask transformers' ``sdpa_mask`` would have made, for the model's own
    attention implementation."""

    __slots__ = ("padding", "window", "_kwargs", "_built")

    def __init__(self, kwargs: dict):
        self.padding = kwargs.get("attention_mask")
        self.window = kwargs.get("local_size")
        self._kwargs = kwargs
        self._built: Optional[tuple] = None

    def build(self) -> Optional[torch.Tensor]:
        if self._built is None:
            from transformers.masking_utils import sdpa_mask

            self._built = (sdpa_mask(**self._kwargs),)
        return self._built[0]


def _fused_mask(*args: Any, **kwargs: Any):
    """The "fused_layers" mask function: transformers' ``sdpa_mask``, or in eager, where the causal LM's call fixes
    the masks (``_eager_call_masks``) and the mask is square with no offsets, a ``CallMasks`` (nothing built, no host
    read)."""
    from transformers.masking_utils import sdpa_mask

    if (not is_compiling() and _eager_call_masks() is not None and not args and kwargs.get("q_length") is not None
            and kwargs.get("q_length") == kwargs.get("kv_length") and not kwargs.get("q_offset")
            and not kwargs.get("kv_offset")):
        return CallMasks(kwargs)
    return sdpa_mask(*args, **kwargs)


def _no_host_packed_check(find: Any) -> Any:
    """transformers' ``find_packed_sequence_indices``, which reads the positions on the host, answering None (one
    sequence a row) without reading them during a causal-LM call that passed no positions (``_eager_call_masks``): the
    positions are then the model's own, 0 .. S - 1 in every row."""
    if getattr(find, "_fused_layers", False):
        return find

    @functools.wraps(find)
    def find_packed_sequence_indices(position_ids, *args, **kwargs):
        if not is_compiling() and _eager_call_masks() is not None:
            return None
        return find(position_ids, *args, **kwargs)

    find_packed_sequence_indices._fused_layers = True
    return find_packed_sequence_indices


# Model types whose causal LMs build, from a call without position ids or a cache, only causal masks -- with the
# window the layer passes its attention as ``sliding_window`` where it has one -- AND the call's 2-D padding mask
# (read in their modeling files, transformers 5.17 and 5.25; against the unswapped model, padded and not, windows
# shorter than the batch: the first two lines eager with checkpointing and compiled, the rest eager)
CALL_MASK_MODELS = frozenset({"gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2",
                              "phi", "phi3", "olmo2", "granite", "starcoder2",
                              "olmo", "olmo3", "cohere", "cohere2", "glm", "glm4", "glm4_moe", "helium", "smollm3",
                              "stablelm", "granitemoe", "granitemoeshared", "ernie4_5", "ernie4_5_moe", "exaone4",
                              "ministral", "apertus", "arcee", "nemotron", "hunyuan_v1_dense", "persimmon", "jetmoe",
                              "bitnet", "dots1"})
# (PEFT's causal LM passes the output_* flags, None by default: neither changes a mask)
_CALL_MASK_KWARGS = frozenset({"num_items_in_batch", "ignore_index", "shift_labels", "return_dict", "output_attentions",
                               "output_hidden_states"})


def _call_masks(model: nn.Module, bound: dict) -> Optional[tuple]:
    """``(padding,)`` -- the call's 2-D ``attention_mask`` or None -- where the call's arguments fix every mask the
    model builds (``CALL_MASK_MODELS``; no cache; no 4-D mask of the caller's; no keyword argument beyond the
    loss's; position ids only beside a 2-D mask: without one, transformers reads them for several sequences packed
    in a row), else None."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in CALL_MASK_MODELS or getattr(cfg, "attention_chunk_size", None):
        return None
    if not set(getattr(cfg, "layer_types", None) or ()) <= {"full_attention", "sliding_attention"}:
        return None
    if (bound.get("past_key_values") is not None or bound.get("use_cache")
            or not set(bound.get("kwargs", {})) <= _CALL_MASK_KWARGS):
        return None
    mask = bound.get("attention_mask")
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 2):
        return None
    if bound.get("position_ids") is not None and mask is None:
        return None
    return (mask,)


def _build_causal_lm(cls: type) -> dict:
    source_forward = cls.forward
    try:
        sig = inspect.signature(source_forward)
    except (TypeError, ValueError):  # pragma: no cover
        sig = None
    linear_why, softcap_attr = _lm_head_plan(cls)

    def _get(self):
        # (an "is None" test, not "or": Dynamo 2.11 cannot take the truth of a nested function and gave up on
        # the whole compiled forward, which then ran eager)
        fn = self.__dict__.get("_fused_lce_loss")
        return fn if fn is not None else self.__dict__.get("_loss_function", fused_causal_lm_loss)

    def _set(self, value):
        self.__dict__["_loss_function"] = value

    def _bind(self, args: tuple, kwargs: dict) -> Optional[dict]:
        try:
            return None if sig is None else sig.bind(self, *args, **kwargs).arguments
        except TypeError:
            return None

    def _linear_call(self, args: tuple, kwargs: dict, bound: Optional[dict]) -> Optional[dict]:
        """The call's bound arguments (``bound``, where the caller has them) where the fused LM head + loss may run
        it, else None."""
        if linear_why is not None or not HF_SKIP_LOGITS or not self.training or not torch.is_grad_enabled():
            return None
        if "_loss_function" in self.__dict__ or (is_compiling() and compile_config.COMPILED.linear_cross_entropy
                                                  != "kernels"):  # compiled too: Inductor would hold the logits
            return None
        cfg = getattr(self, "config", None)
        if not getattr(cfg, "return_dict", True):  # tuple outputs: keep transformers' path
            return None
        bound = bound if bound is not None else _bind(self, args, kwargs)
        if bound is None:
            return None
        keep = bound.get("logits_to_keep", 0)
        extra = bound.get("kwargs", {})
        if (bound.get("labels") is None or not isinstance(keep, int) or keep != 0
                or extra.get("return_dict") is False):
            return None
        return bound

    @functools.wraps(source_forward)  # its signature: the Trainer keeps the batch columns the forward takes
    def forward(self, *args: Any, **kwargs: Any):
        cfg = getattr(self, "config", None)
        call_masks = getattr(cfg, "model_type", None) in CALL_MASK_MODELS
        bound = _bind(self, args, kwargs) if call_masks or is_compiling() else None
        masks = _call_masks(self, bound) if call_masks and bound is not None else None
        if masks is None:
            return _forward(self, args, kwargs, bound)
        prev = _set_call_masks(masks)
        try:
            return _forward(self, args, kwargs, bound)
        finally:
            _set_call_masks(prev)

    def _forward(self, args: tuple, kwargs: dict, bound: Optional[dict]):
        bound = _linear_call(self, args, kwargs, bound)
        if bound is None:
            return source_forward(self, *args, **kwargs)
        head = self.__dict__["_modules"].get("lm_head")
        lin, why = _head_linear(head)
        if lin is None:
            warn_once(f"hf_lm_head:{type(self).__name__}:{why}",
                      f"fused_layers: {type(self).__name__}'s LM head + loss are not fused ({why}); the loss alone "
                      "is fused and the (tokens, vocabulary) logits are made.")
            return source_forward(self, *args, **kwargs)
        fwd_labels = bound["labels"]
        extra = bound.get("kwargs", {})
        ignore_index = extra.get("ignore_index", -100)
        cfg = self.config
        cap = getattr(cfg, softcap_attr, None) if softcap_attr is not None else None
        done: dict = {}

        def head_forward(hidden: torch.Tensor) -> torch.Tensor:
            # Runs inside the head's own call, after its pre-forward hooks (FSDP's unshard, ZeRO-3's gather) and
            # before its post-forward ones: the weight is whole here.  Returns the loss as the "logits", so the
            # hooks that FSDP registers on the head's output see the loss's backward.
            w, b = lin.weight, lin.bias
            if _is_dtensor(w):  # a tensor-parallel head: its own forward (and the model's soft-capping)
                warn_once("hf_lm_head:dtensor", "fused_layers: the LM head's weight is a DTensor (tensor "
                          "parallel) during its forward; its logits are made and the loss alone is fused.")
                logits = nn.functional.linear(hidden, w, b)
                return logits if cap is None else torch.tanh(logits / cap) * cap
            from ..ops.linear_cross_entropy import fused_linear_cross_entropy

            def rows_loss(h: torch.Tensor, t: torch.Tensor, reduction: str) -> torch.Tensor:
                return fused_linear_cross_entropy(h, w, t, b, ignore_index=ignore_index, reduction=reduction,
                                                  softcap=cap).float()

            loss = _causal_lm_loss(hidden, hidden.shape[-1], fwd_labels, extra.get("num_items_in_batch"), ignore_index,
                                   extra.get("shift_labels"), rows_loss)
            done["loss"] = loss
            return loss

        def loss_function(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, **kw: Any) -> torch.Tensor:
            if "loss" not in done:  # the head made real logits (see head_forward)
                return fused_causal_lm_loss(logits, labels, vocab_size, **kw)
            # (the head's output may come back re-wrapped by its hooks, as ZeRO-3's do to hook the backward: the same
            # 0-d loss, another tensor object)
            if labels is not fwd_labels or not isinstance(logits, torch.Tensor) or logits.dim() != 0:
                raise RuntimeError(f"{type(self).__name__}: the fused LM head + loss computed the loss of the "
                                   "forward's labels, but the model passed other labels or logits to its loss; "
                                   "set FUSED_LAYERS_HF_SKIP_LOGITS=0 to keep transformers' path")
            return logits

        if "_fused_head_call" not in lin.__dict__:  # a head replaced since the swap
            _install_head_dispatch(self)
        lin.__dict__["_fused_head_call"] = head_forward
        self.__dict__["_fused_lce_loss"] = loss_function
        if cap is not None:  # the head's loss caps the logits; the model's own block (_lm_head_plan) is switched off
            setattr(cfg, softcap_attr, None)
        try:
            out = source_forward(self, *args, **kwargs)
        finally:  # (cleared by assignment: see _head_dispatch)
            lin.__dict__["_fused_head_call"] = None
            self.__dict__["_fused_lce_loss"] = None
            if cap is not None:
                setattr(cfg, softcap_attr, cap)
        if "loss" not in done:
            return out
        # the "logits" are the loss: drop them (the point is never to hold (tokens, vocab) logits)
        if not hasattr(out, "items"):
            raise RuntimeError(f"{type(self).__name__}: the fused LM head + loss expected a ModelOutput, got "
                               f"{type(out).__name__}; set FUSED_LAYERS_HF_SKIP_LOGITS=0 to keep transformers' path")
        return type(out)(**{k: v for k, v in out.items() if k != "logits"})

    return {"loss_function": property(_get, _set, doc="transformers' causal-LM loss on the fused cross-entropy kernel"),
            "forward": forward,
            "_fused_after_swap": _install_head_dispatch, "_fused_before_restore": _drop_head_dispatch,
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
    """Register "fused_layers" (SDPA's masks) and "fused_layers_eager_masks" (eager's) in transformers' attention
    and attention-mask interfaces (idempotent)."""
    if _registered[0]:
        return
    import transformers.masking_utils as masking_utils
    from transformers import AttentionInterface

    AttentionInterface.register(IMPL, fused_attention_forward)
    masking_utils.AttentionMaskInterface.register(IMPL, _fused_mask)
    AttentionInterface.register(IMPL_EAGER_MASKS, fused_attention_forward)
    masking_utils.AttentionMaskInterface.register(IMPL_EAGER_MASKS, masking_utils.eager_mask)
    if hasattr(masking_utils, "find_packed_sequence_indices"):
        masking_utils.find_packed_sequence_indices = _no_host_packed_check(masking_utils.find_packed_sequence_indices)
    _registered[0] = True


def _impl_for(root: nn.Module, attention: list[nn.Module], prev: str) -> str:
    """The implementation ``root`` is switched to from ``prev``: IMPL, or IMPL_EAGER_MASKS where the model does
    not support SDPA, was not set to it anyway, and one of its fused attention modules says it is not causal (its
    causal mask is then in the mask alone)."""
    if (prev == "sdpa" or getattr(type(root), "_supports_sdpa", False)
            or all(getattr(m, "is_causal", True) for m in attention)):
        return IMPL
    return IMPL_EAGER_MASKS


def _sdpa(*args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


# The attention implementation each module's model had before ``switch_models`` set "fused_layers", kept in the
# module's own ``__dict__`` (a copy of the model keeps it; a module without it runs "eager").  Not a weak-keyed
# table: Dynamo guards on such a table's length, which changes whenever any other model is collected, failing the
# guard of the frame that is running (torch 2.13: "Guard failed on the same frame it was created").
OWN_ATTR = "_fused_layers_own_attn"


def _own_impl(module: nn.Module) -> str:
    return getattr(module, OWN_ATTR, "eager")


def _eager_function(module: nn.Module):
    """The ``eager_attention_forward`` of the module's modeling file (the function transformers itself runs for
    "eager"), looked up along the class's MRO (the fused subclass first, then the model's own class)."""
    for cls in type(module).__mro__:
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if fn is not None:
            return fn
    return None


def _eager_mask(mask: Optional[torch.Tensor], query: torch.Tensor, sk: int, causal: bool) -> Optional[torch.Tensor]:
    """The additive mask transformers' ``eager_mask`` builds, from the mask ``sdpa_mask`` built for "fused_layers":
    a boolean mask becomes 0 / finfo.min in the query's dtype; no mask (SDPA's causal skip: plain causal, or no
    mask at all) becomes the top-left causal mask SDPA's ``is_causal`` applies (none for one query row)."""
    sq = query.shape[2]
    if mask is None:
        if not (causal and sq > 1):
            return None
        mask = torch.ones(sq, sk, dtype=torch.bool, device=query.device).tril()[None, None]
    if mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=query.dtype, device=mask.device)
    return torch.where(mask, zero, torch.finfo(query.dtype).min)


def own_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, dropout: float = 0.0, scaling: Optional[float] = None,
                  is_causal: Optional[bool] = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Run the attention the module's model was configured with before the switch, on the mask built for
    "fused_layers" (``sdpa_mask``'s): "sdpa" takes it as it is; "eager" gets it as ``eager_mask`` makes it; a
    flash-attention implementation runs itself where there is no mask (its own masks are 2-D padding masks);
    anything else runs the module's ``eager_attention_forward``, which computes every feature a model has."""
    prev = _own_impl(module)
    kw = dict(dropout=dropout, scaling=scaling, **kwargs)
    if is_causal is not None:
        kw["is_causal"] = is_causal
    if prev == "sdpa":
        return _sdpa(module, query, key, value, attention_mask, **kw)
    if "flash" in prev and attention_mask is None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        if prev in ALL_ATTENTION_FUNCTIONS:
            return ALL_ATTENTION_FUNCTIONS[prev](module, query, key, value, None, **kw)
    eager = _eager_function(module)
    if eager is None:  # a module of a file without one (not a transformers model file): SDPA, as before the switch
        return _sdpa(module, query, key, value, attention_mask, **kw)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        return _sdpa(module, query, key, value, attention_mask, **kw)
    mask = _eager_mask(attention_mask, query, key.shape[2], bool(causal))
    kw.pop("is_causal", None)
    return eager(module, query, key, value, mask, **kw)


# The decompositions of the last few mask tensors seen (a model passes the same tensor to every layer of a kind;
# models with sliding-window layers have two).  Entries: (weakref to the mask, its _version, window, result).
_MASK_CACHE: list = []
_MASK_CACHE_SIZE = 4


def _cached(mask: torch.Tensor, window: Optional[int], compute):
    for ref, ver, win, res in _MASK_CACHE:
        if ref() is mask and ver == mask._version and win == window:
            return res
    res = compute()
    try:
        _MASK_CACHE.insert(0, (weakref.ref(mask), mask._version, window, res))
    except TypeError:
        return res
    del _MASK_CACHE[_MASK_CACHE_SIZE:]
    return res


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
    return _cached(mask, None, lambda: _decompose(mask, sq, sk))


def decompose_window_mask(mask: torch.Tensor, sq: int, sk: int, window: int) -> Optional[tuple]:
    """``(key mask,)`` such that ``mask`` is causal AND the sliding window ``window`` (query i sees key j only if
    i - window < j <= i, transformers' ``sliding_window_causal_mask_function``) AND that key mask (B|1, H|1, 1, Sk),
    ``(None,)`` where no key is padded, or None.  With Sq == Sk every query sees its own key through causal and
    window, so the diagonal is the key mask.  Boolean or additive as ``decompose_mask``; cached per (tensor,
    window)."""
    if (mask.dim() != 4 or sq != sk or mask.shape[-1] != sk or mask.shape[-2] != sq or mask.requires_grad
            or isinstance(window, bool) or not isinstance(window, int) or window < 1):
        return None
    return _cached(mask, window, lambda: _decompose_window(mask, sq, window))


def _decompose_window(mask: torch.Tensor, s: int, window: int) -> Optional[torch.Tensor]:
    i = torch.arange(s, device=mask.device)[:, None]
    j = torch.arange(s, device=mask.device)[None, :]
    band = (j <= i) & (j > i - window)
    diag = mask.diagonal(dim1=-2, dim2=-1)[:, :, None, :]  # (B, H, 1, S): the key mask
    if mask.dtype == torch.bool:
        if not torch.equal(mask, diag & band):
            return None
        return (None,) if bool(diag.all()) else (diag,)
    dropped = torch.finfo(mask.dtype).min / 2
    # inside the band the mask must equal the key bias; outside it must drop the key
    if not torch.equal(torch.where(band, mask, diag.expand_as(mask)), diag.expand_as(mask)):
        return None
    if bool((torch.where(band, torch.full_like(mask, float("-inf")), mask) > dropped).any()):
        return None
    diag = diag.masked_fill(diag <= dropped, float("-inf"))
    return (None,) if bool((diag == 0).all()) else (diag,)


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


# --------------------------------------------------------------------------------------------------
# Packed (padding-free) batches: several sequences in one row, as DataCollatorWithFlattening builds them
# --------------------------------------------------------------------------------------------------
_PACK_CACHE: list = []  # (weakref to position_ids, its _version, (cu, max_len) or None); one slot


def _packed_from_position_ids(position_ids: torch.Tensor) -> Optional[tuple[torch.Tensor, int]]:
    """(cu_seqlens int32, max length) of a (1, S) ``position_ids`` that restarts (a new sequence wherever the
    position does not follow the previous one, as transformers' ``find_packed_sequence_indices``), or None for
    one sequence.  One host sync per position_ids tensor (cached: every layer gets the same one)."""
    if _PACK_CACHE:
        ref, ver, res = _PACK_CACHE[0]
        if ref() is position_ids and ver == position_ids._version:
            return res
    pos = position_ids.reshape(-1)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[1:] = pos[1:] != pos[:-1] + 1
    idx = starts.nonzero().reshape(-1)
    res = None
    if idx.numel() > 1:
        cu = torch.cat([idx, idx.new_tensor([pos.numel()])]).to(torch.int32)
        res = (cu, int(cu.diff().max()))
    try:
        _PACK_CACHE[:] = [(weakref.ref(position_ids), position_ids._version, res)]
    except TypeError:
        pass
    return res


def _is_packed_mask(mask: torch.Tensor, cu: torch.Tensor, s: int, window: Optional[int]) -> bool:
    """``mask`` is the block-diagonal causal (+ sliding window) boolean mask transformers builds for the packed
    sequences ``cu`` (``packed_sequence_mask_function``) of ``s`` tokens in all; cached per (tensor, window)."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[-2:] != (s, s) or mask.shape[0] != 1:
        return False

    def compute():
        seq = torch.zeros(s, dtype=torch.int64, device=mask.device)
        seq[cu[1:-1].long().to(mask.device)] = 1
        seq = seq.cumsum(0)
        i = torch.arange(s, device=mask.device)[:, None]
        j = torch.arange(s, device=mask.device)[None, :]
        expect = (seq[:, None] == seq[None, :]) & (j <= i)
        if window is not None:
            expect &= j > i - window
        return torch.equal(mask, expect[None, None].expand_as(mask))

    return _cached(mask, ("packed", window), compute)


def _packed(query: torch.Tensor, key: torch.Tensor, attention_mask: Any, window: Optional[int],
            kwargs: dict) -> Optional[tuple[torch.Tensor, torch.Tensor, int, int]]:
    """(cu_q, cu_k, max_q, max_k) where one row holds several sequences: the ``cu_seq_lens_q`` / ``cu_seq_lens_k``
    (+ ``max_length_q`` / ``max_length_k``) kwargs of ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``
    (read as flash-attention reads them: the mask is not consulted), or else ``position_ids`` that restart, with
    no mask (transformers' masks then cross the sequence boundaries) or the block-diagonal mask transformers
    builds from them.  None for an ordinary batch."""
    if query.shape[0] != 1:
        return None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if isinstance(cu_q, torch.Tensor) and isinstance(cu_k, torch.Tensor):
        if cu_q.dim() != 1 or cu_k.shape != cu_q.shape:
            return None
        mq, mk = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        if is_compiling() and (mq is None or mk is None):  # reading the lengths would break the graph
            return None
        mq = int(cu_q.diff().max()) if mq is None else int(mq)
        mk = int(cu_k.diff().max()) if mk is None else int(mk)
        return cu_q.to(query.device), cu_k.to(query.device), mq, mk
    pos = kwargs.get("position_ids")
    sq, sk = query.shape[2], key.shape[2]
    if is_compiling():  # where the positions restart shows only in their values: the model's own path, as unswapped
        return None
    if not isinstance(pos, torch.Tensor) or sq != sk or sq < 2 or pos.shape[-1] != sq or pos.numel() != sq:
        return None
    found = _packed_from_position_ids(pos)
    if found is None:
        return None
    cu, mx = found
    if attention_mask is not None and not (isinstance(attention_mask, torch.Tensor)
                                           and _is_packed_mask(attention_mask, cu, sq, window)):
        return None
    cu = cu.to(query.device)
    return cu, cu, mx, mx


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
    ((B, Sq, Hq, D), None).  Fused for modules of a fused subclass, the model's own implementation otherwise
    (see module docstring)."""
    call = attention_mask if isinstance(attention_mask, CallMasks) else None
    if getattr(type(module), "_fused_layers_lookalike", None) != "hf_attention":  # not a swapped module
        return own_attention(module, query, key, value, call.build() if call is not None else attention_mask,
                             dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
    why = None
    softcap, window = kwargs.get("softcap"), kwargs.get("sliding_window")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap <= 0):
        why = f"soft-capping {softcap!r}"
    elif window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        why = f"a sliding window {window!r}"
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
    # The mask the causal-LM call fixes (_call_masks: causal AND a window AND the call's 2-D padding), never read.
    # Eager, the CallMasks the model passes, with the mask's own window (the one transformers' SDPA / eager paths
    # apply, whatever the layer passes); compiled, in place of the mask transformers materializes (which mask a
    # tensor is shows only in its values: reading them would break the graph at every layer, and the unread mask
    # drops out of it), with the window the layer passes.
    fixed = None
    if call is not None:
        fixed = (call.padding, call.window if isinstance(call.window, int) and call.window > 0 else None)
    elif (is_compiling() and _CALL_MASKS[0] is not None and isinstance(attention_mask, torch.Tensor)
          and attention_mask.dim() == 4 and attention_mask.shape[-1] == sk):
        fixed = (_CALL_MASKS[0][0], window)
    if fixed is not None:
        padding, win = fixed
        if why is None and causal and sq == sk and (padding is None or padding.shape[-1] == sk):
            kmask = None if padding is None else padding.to(torch.bool)[:, None, None, :]
            return _run_kernels(module, query, key, value, None, kmask, sq > 1, win, softcap, dropout, scaling,
                                is_causal, kwargs)
        if call is not None:
            attention_mask = call.build()  # anything else: as if transformers had built it
    packed = _packed(query, key, attention_mask, window, kwargs) if why is None and call is None else None
    if packed is not None:
        from ..ops.attention import fused_attention_varlen

        cu_q, cu_k, max_q, max_k = packed
        out = fused_attention_varlen(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                                     cu_q, cu_k, max_q, max_k, bool(causal), scaling, window=window,
                                     softcap=None if softcap is None else float(softcap), dropout_p=float(dropout))
        return out.unsqueeze(0), None
    kmask = None
    win = None  # the window the kernels apply: only where the mask has it (the mask is what transformers applies)
    if why is None and attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            why = f"a {type(attention_mask).__name__} mask"
        elif is_compiling():  # (reading which mask it is, decompose_mask, would break the graph at every layer)
            why = "a mask tensor under torch.compile"
        else:
            dec = decompose_mask(attention_mask, sq, sk)
            if dec is not None:
                kmask, causal = dec
            elif window is not None and (kw := decompose_window_mask(attention_mask, sq, sk, window)) is not None:
                (kmask,), causal, win = kw, True, window
            else:
                why = "a mask that is neither key padding nor causal (+ sliding window) + key padding"
    if why is not None:
        prev = _own_impl(module)
        warn_once(f"hf_attention:{why}:{prev}", f"fused_layers attention: {why} is not fused; these calls run the "
                  f"model's own attention implementation ({prev!r}).")
        return own_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                             is_causal=is_causal, **kwargs)
    if attention_mask is None:
        # SDPA's rule (transformers' sdpa_attention_forward): causal only with several queries and no mask;
        # with more keys than queries (prefill of an empty static cache) the extra keys are cropped.
        causal = bool(sq > 1 and causal)
        if causal and sk > sq:
            key, value = key[:, :, :sq], value[:, :, :sq]
    return _run_kernels(module, query, key, value, attention_mask, kmask, causal, win, softcap, dropout, scaling,
                        is_causal, kwargs)


def _run_kernels(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: Optional[torch.Tensor], kmask: Optional[torch.Tensor], causal: bool,
                 win: Optional[int], softcap: Any, dropout: float, scaling: Optional[float], is_causal: Optional[bool],
                 kwargs: dict) -> tuple[torch.Tensor, None]:
    """The kernels on (B, H, S, D) q / k / v with a (B, 1, 1, Sk) boolean key mask ``kmask`` or None, ``causal``,
    the window ``win``; SDPA (cuDNN) instead where it is measured faster and nothing but causal is asked."""
    from ..ops.attention import fused_attention, prefer_sdpa

    # where cuDNN is measured faster, as FusedAttention does (SDPA has no window or soft-capping)
    if kmask is None and win is None and softcap is None and prefer_sdpa(query, key, None):
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
                     **kwargs)
    gqa = query.shape[1] != key.shape[1]
    out = fused_attention(query, key, value, attn_mask=kmask, dropout_p=float(dropout), is_causal=causal, scale=scaling,
                          enable_gqa=gqa, window=win, softcap=None if softcap is None else float(softcap),
                          backend="triton")
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
        if PREV_ATTR not in root.__dict__:  # (once per model)
            prev = root.config._attn_implementation
            impl = _impl_for(root, [modules[n] for n in attention_names if _under(n, rname)], prev)
            try:
                root.set_attn_implementation(impl)
            except Exception as e:  # noqa: BLE001 - any refusal: leave this model alone
                failed[name] = f"set_attn_implementation refused: {type(e).__name__}: {e}"
                continue
            root.__dict__[PREV_ATTR] = prev
        for m in root.modules():  # what each module's calls run where ours cannot
            m.__dict__[OWN_ATTR] = root.__dict__[PREV_ATTR]
        cfg = getattr(modules[name], "config", None)
        if getattr(cfg, "_attn_implementation", None) not in (IMPL, IMPL_EAGER_MASKS):
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
        for m in root.modules():
            m.__dict__.pop(OWN_ATTR, None)
