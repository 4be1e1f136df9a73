"""torch.compile of swapped models on the CPU, with the GPU's routing forced: no graph break and no more
recompiles than the unswapped model.

What runs only on CUDA and is traced by Dynamo: the C++ fast path's checks (``_cpp.ENABLED``, the
extension that a background build sets), the cuDNN routing (``prefer_sdpa``), and what transformers builds
for the attention function under compile.  ``gpu_route`` forces those branches here (the kernels still
run in Triton's interpreter, the routing takes the GPU's decisions) and ``backend="eager"`` keeps the
check to Dynamo: graphs, breaks and recompiles are counted from ``torch._dynamo.utils.counters``.
``compile_counts`` is shared with tests/test_compile_gpu.py, which runs the same sequence through Inductor.
"""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
from torch import nn

import fused_layers.functional as FF
from fused_layers import restore_modules, swap_modules
from fused_layers.ops.norm_variants import fused_rms_norm_variant

try:
    import transformers
except Exception:  # pragma: no cover - the [hf] extra
    transformers = None

needs_hf = pytest.mark.skipif(transformers is None, reason="transformers not installed")


def compile_counts(model: nn.Module, batches, step, backend="eager", mode=None, after=None) -> dict:
    """Compile ``model`` and run, as the failing runs did: an eval forward under no_grad, then training steps
    (``step(compiled, batch)`` runs forward + backward), then eval again; ``after(i)`` runs before step i.
    Returns graph breaks, unique graphs and recompiles (Dynamo's counters)."""
    from torch._dynamo.utils import counters

    recompiles: list[str] = []  # Dynamo's "Recompiling function ..." messages (its recompiles log)

    class _Recompiles(logging.Handler):
        def emit(self, record):
            recompiles.append(record.getMessage().split("\n", 1)[0])

    log = logging.getLogger("torch._dynamo.guards.__recompiles")
    handler = _Recompiles()
    torch._logging.set_logs(recompiles=True)
    log.addHandler(handler)
    try:
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model, backend=backend, mode=mode)
        model.eval()
        with torch.no_grad():
            compiled(**batches[0])
        model.train()
        for i, b in enumerate(batches):
            if after is not None:
                after(i)
            for p in model.parameters():
                p.grad = None
            step(compiled, b)
        model.eval()
        with torch.no_grad():
            compiled(**batches[0])
        model.train()
    finally:
        log.removeHandler(handler)
        torch._logging.set_logs()
    return {"breaks": sum(counters["graph_break"].values()), "break_reasons": dict(counters["graph_break"]),
            "graphs": counters["stats"]["unique_graphs"], "recompiles": len(recompiles),
            "recompiled": sorted(set(recompiles))}


def assert_no_worse(fused: dict, plain: dict) -> None:
    """No graph break, unique graph or recompile the unswapped model does not have (transformers' own code
    breaks the graph in some models, e.g. a logger call of GPT-2's: those count for both)."""
    assert fused["breaks"] <= plain["breaks"], fused["break_reasons"]
    assert set(fused["break_reasons"]) <= set(plain["break_reasons"]), fused["break_reasons"]
    assert fused["graphs"] <= plain["graphs"], (fused, plain)
    assert fused["recompiles"] <= plain["recompiles"], (fused["recompiled"], plain["recompiled"])


@pytest.fixture
def gpu_route(monkeypatch):
    """The routing the GPU takes, with the kernels in the interpreter: the C++ fast path on (not built yet),
    cuDNN measured faster for this device (prefer_sdpa's dense bf16 / fp16 head dim 64 / 128 cases)."""
    from fused_layers.ops import _cpp
    from fused_layers.ops import attention as attn_ops

    monkeypatch.setattr(_cpp, "ENABLED", True)
    monkeypatch.setattr(_cpp, "_ext", None)
    monkeypatch.setattr(attn_ops, "ROUTE_DEVICE_TYPE", "cpu")
    monkeypatch.setitem(attn_ops._CUDNN_FASTER, -1, True)
    return _cpp


def _ext_built_at(cpp, i):
    """The C++ extension's background build finishes between the first and second training step."""
    def after(step):
        if step == 1:
            cpp._ext = object()  # never called while compiling (fast_call checks is_compiling first)
    return after


# --------------------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------------------
def _hf_model(family: str, dtype: torch.dtype, vocab=64, hidden=128, ffn=64, layers=1, heads=2, kv_heads=1,
              positions=32):
    """A small transformers causal LM of ``family`` (gpt2, llama, qwen2, gemma) with SDPA attention, no KV cache
    (tests/test_compile_gpu.py builds larger ones)."""
    T = transformers or pytest.importorskip("transformers")
    if family == "gpt2":
        m = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                                           n_positions=positions, attn_implementation="sdpa"))
    else:
        cfg, cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                    "gemma": ("GemmaConfig", "GemmaForCausalLM")}[family]
        kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions,
                  attn_implementation="sdpa", **({"head_dim": 64} if family == "gemma" else {}))
        m = getattr(T, cls)(getattr(T, cfg)(**kw))
    m.config.use_cache = False
    return m.to(dtype)


def _lm_step(compiled, b):
    compiled(**b).loss.backward()


def _assert_trains_as(model, ref, out, batch):
    """``out`` (the compiled swapped ``model``'s output on ``batch``, its loss backpropagated) has the loss of the
    unswapped ``ref`` on the same batch, and ``model`` every gradient of it."""
    want = ref(**batch)
    want.loss.backward()
    torch.testing.assert_close(out.loss, want.loss)
    grads = {n: p.grad for n, p in ref.named_parameters()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-5, rtol=1e-4, msg=n)


def _mlp_routes_on_kernels(monkeypatch):
    """The MLP kinds' compile routes (ops/compile_config.py) on "kernels" for one test: their torch.library ops."""
    import dataclasses

    from fused_layers.ops import compile_config

    monkeypatch.setattr(compile_config, "COMPILED", dataclasses.replace(compile_config.COMPILED, mlp="kernels",
                                                                        gated_activation="kernels"))


def _lm_batches(n=2, mask=None):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 64, (1, 8), generator=g)
        b = {"input_ids": ids, "labels": ids}
        if mask is not None:
            b["attention_mask"] = mask
        out.append(b)
    return out


@needs_hf
@pytest.mark.slow
@pytest.mark.parametrize("family,dtype", [("llama", torch.bfloat16), ("gpt2", torch.bfloat16)])
@pytest.mark.parametrize("mlp_route", ["default", "kernels"])
# (Qwen2, Gemma: tests/test_compile_gpu.py; the float32 kernel route: the demo GPT and the tests below)
def test_hf_compiled_gpu_route_no_break_no_extra_recompile(gpu_route, family, dtype, mlp_route, monkeypatch):
    """bf16 head dim 64: the attention routes to SDPA as on Hopper (the HF function's checks, then SDPA).  The C++ build
    finishing mid-run (``_cpp._ext`` set) was a recompile of every frame: Dynamo guarded on it.  With the MLP routes
    on "kernels" (their ops under compile) too."""
    if mlp_route == "kernels":
        _mlp_routes_on_kernels(monkeypatch)
    torch.manual_seed(0)
    model = _hf_model(family, dtype)
    batches = _lm_batches()
    plain = compile_counts(model, batches, _lm_step)
    report = swap_modules(model)
    assert report.counts().get("attention") == 1
    fused = compile_counts(model, batches, _lm_step, after=_ext_built_at(gpu_route, 1))
    restore_modules(model)
    assert_no_worse(fused, plain)


@needs_hf
@pytest.mark.slow
def test_hf_materialized_mask_under_compile_runs_sdpa_without_a_break(gpu_route):
    """transformers builds a 4-D mask under compile where torch reports tracing as exporting (torch < 2.14);
    telling a causal + padding mask apart means reading it (decompose_mask: torch.equal, .any()), a
    data-dependent graph break in every layer.  Compiled, a mask tensor runs the model's own implementation (SDPA
    here; one warning, emitted while tracing, no break); eager calls still fuse it.  Same loss and gradients as the
    unswapped model."""
    torch.manual_seed(0)
    model = _hf_model("llama", torch.float32)
    ref = _hf_model("llama", torch.float32)
    ref.load_state_dict(model.state_dict())
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()  # what sdpa_mask materializes: causal, no padding
    batches = _lm_batches(1, mask)
    swap_modules(model)
    from fused_layers.ops import _common

    for key in [k for k in _common._warned if k.startswith("hf_attention:a mask tensor under torch.compile")]:
        _common._warned.discard(key)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fused = compile_counts(model, batches, _lm_step)
    assert fused["breaks"] == 0, fused["break_reasons"]
    assert any("a mask tensor under torch.compile" in str(x.message) for x in w)
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    out = torch.compile(model, backend="eager")(**batches[0])
    out.loss.backward()
    _assert_trains_as(model, ref, out, batches[0])


_CALL_MASK_FAMILIES = {  # (config, model, extra config): every model type of CALL_MASK_MODELS
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=32)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=8)),
    # local layers with a window shorter than the batch, soft-capped attention and final logits
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=8, sliding_window=4, attn_implementation="eager")),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=4, pad_token_id=0)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(sliding_window=4, num_local_experts=2,
                                                             num_experts_per_tok=1)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(head_dim=8, num_experts=2, num_experts_per_tok=1,
                                                                 moe_intermediate_size=32)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(sliding_window=4)),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),
}


def _call_mask_model(family):
    cfg, cls, extra = _CALL_MASK_FAMILIES[family]
    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, attn_implementation="sdpa")
    if family == "gpt2":
        kw = dict(vocab_size=64, attn_implementation="sdpa")
    kw.update(extra)
    torch.manual_seed(0)
    m = getattr(transformers, cls)(getattr(transformers, cfg)(**kw))
    m.config.use_cache = False
    return m.train()


def _spy_fused_attention(monkeypatch) -> list:
    """(has a key mask, window) of every call that reaches ``fused_attention``, in a list the test reads."""
    from fused_layers.ops import attention as attn_ops

    calls, orig = [], attn_ops.fused_attention

    def spy(*a, **k):
        calls.append((k.get("attn_mask") is not None, k.get("window")))
        return orig(*a, **k)

    monkeypatch.setattr(attn_ops, "fused_attention", spy)
    return calls


def _forbid_host_reads(mp, found: list) -> None:
    """What a swapped eager causal LM whose call fixes its masks must not call (transformers' mask builders and host
    reads, our own mask readers), patched on ``mp`` to record the call in ``found`` and raise."""
    import transformers.masking_utils as masking_utils

    from fused_layers.integrations import _hf

    def no_host_read(*a, **k):
        found.append(a or k)
        raise AssertionError("a mask built or positions read on the host")

    for name in ("sdpa_mask", "_ignore_causal_mask_sdpa"):
        mp.setattr(masking_utils, name, no_host_read)
    mp.setattr(masking_utils, "find_packed_sequence_indices", _hf._no_host_packed_check(no_host_read))
    mp.setattr(_hf, "_packed_from_position_ids", no_host_read)
    mp.setattr(_hf, "decompose_mask", no_host_read)


@needs_hf
@pytest.mark.slow
@pytest.mark.parametrize("family", list(_CALL_MASK_FAMILIES))
@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_causal_lm_call_masks_run_the_kernels(mode, family, monkeypatch):
    """Where the causal LM's call fixes its masks (no position ids, no cache: causal AND the layer's window AND the
    call's 2-D padding mask), every attention call runs the kernels on those: compiled, never reading the mask
    transformers materializes (no graph break); eager, with no mask built at all (no host read of the positions or
    the padding), gradient checkpointing on, so that the recomputed layers get the call's masks again.  No warning,
    and the loss and every gradient of the unswapped eager model, unpadded and left-padded with position ids (float32;
    compiled Llama also right- and left-padded without)."""

    from fused_layers.integrations import _hf
    from fused_layers.ops import _common

    assert _hf.CALL_MASK_MODELS == set(_CALL_MASK_FAMILIES) | set(_CALL_MASK_MORE_FAMILIES)
    ref = _call_mask_model(family)
    model = _call_mask_model(family)
    model.load_state_dict(ref.state_dict())
    for m in (ref, model):  # dropout off: the two models must draw nothing
        for mod in m.modules():
            if isinstance(mod, nn.Dropout):
                mod.p = 0.0
        if mode == "eager":
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    report = swap_modules(model)
    assert report.counts().get("attention") == 2, str(report)
    calls, built = _spy_fused_attention(monkeypatch), []
    for key in [k for k in _common._warned if k.startswith("hf_attention:")]:
        _common._warned.discard(key)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, 8), generator=g)
    right = torch.ones(2, 8, dtype=torch.long)
    right[1, 6:] = 0
    left = torch.ones(2, 8, dtype=torch.long)
    left[0, :3] = 0
    torch._dynamo.reset()
    run = torch.compile(model, backend="eager") if mode == "compile" else model
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        # (left padding with the position ids a generation-style caller passes: beside a 2-D mask they change no mask)
        cases = [(None, False), (right, False), (left, False), (left, True)]
        # (CI time: all four compiled on Llama; elsewhere the first and last, eager also checkpointed, twice the work)
        for mask, positions in cases if mode == "compile" and family == "llama" else cases[::3]:
            labels = ids
            if mask is not None:  # no loss on a padded position's logits (a row with every key masked: each
                # implementation fills it its own way; the shifted loss reads the last one before the text)
                read = torch.zeros_like(mask, dtype=torch.bool)
                read[:, 1:] = mask[:, :-1] == 0
                labels = ids.masked_fill((mask == 0) | read, -100)
            batch = {"input_ids": ids, "labels": labels}
            if mask is not None:
                batch["attention_mask"] = mask
            if positions:
                batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
            calls.clear()
            model.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            with monkeypatch.context() as mp:
                if mode == "eager":
                    _forbid_host_reads(mp, built)
                out = run(**batch)
                out.loss.backward()
            # both layers on the kernels (compiled: traced once per mask case; eager: again in the recompute)
            assert len(calls) == (2 if mode == "compile" else 4), (mask, calls)
            assert all(padded == (mask is not None) for padded, _ in calls), calls
            _assert_trains_as(model, ref, out, batch)
    assert not built
    assert not [x for x in w if "not fused" in str(x.message)], [str(x.message) for x in w]
    if _CALL_MASK_FAMILIES[family][2].get("sliding_window"):  # the local layers' window reached the kernels
        assert any(win == 4 for _, win in calls), calls
    restore_modules(model)
    torch._dynamo.reset()


# The other model types of CALL_MASK_MODELS: same mask code (create_causal_mask / create_sliding_window_causal_mask
# into the attention alone), checked eager; those with local layers get one with a window shorter than the batch.
_CALL_MASK_MORE_FAMILIES = ["olmo", "olmo3", "cohere", "cohere2", "glm", "glm4", "glm4_moe", "helium", "smollm3",
                            "stablelm", "granitemoe", "granitemoeshared", "ernie4_5", "ernie4_5_moe", "exaone4",
                            "ministral", "apertus", "arcee", "nemotron", "hunyuan_v1_dense", "persimmon", "jetmoe",
                            "bitnet", "dots1"]


@needs_hf
@pytest.mark.parametrize("family", _CALL_MASK_MORE_FAMILIES)
def test_causal_lm_call_masks_more_families(family, monkeypatch):
    """Eager, left-padded with position ids, then unpadded: no mask built, every attention call on the kernels with
    the call's padding (and the local layers' window), the loss and every gradient of the unswapped model."""


    try:
        cfg = transformers.AutoConfig.for_model(family)
    except (KeyError, ValueError):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=32, head_dim=8, pad_token_id=0)
    optional = dict(num_experts=2, num_local_experts=2, n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1,
                    moe_intermediate_size=32, shared_expert_intermediate_size=32, first_k_dense_replace=1)
    for k, v in list(small.items()) + [(k, v) for k, v in optional.items() if hasattr(cfg, k)]:
        setattr(cfg, k, v)
    if getattr(cfg, "layer_types", None) and "sliding_attention" in cfg.layer_types:
        cfg.sliding_window, cfg.layer_types = 4, ["sliding_attention", "full_attention"]
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float().train()
    model = copy.deepcopy(ref)
    for m in (ref, model):
        m.config.use_cache = False
        for mod in m.modules():
            if isinstance(mod, nn.Dropout):
                mod.p = 0.0
    assert swap_modules(model).counts().get("attention") == 2
    calls, built = _spy_fused_attention(monkeypatch), []
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    left = torch.ones(2, 8, dtype=torch.long)
    left[0, :3] = 0
    labels = ids.masked_fill(left == 0, -100)
    labels[0, 3] = -100  # (its shifted target is read from the last padded position)
    for batch in ({"input_ids": ids, "attention_mask": left, "position_ids": (left.cumsum(-1) - 1).clamp(min=0),
                   "labels": labels}, {"input_ids": ids, "labels": ids}):
        calls.clear()
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        with monkeypatch.context() as mp:
            _forbid_host_reads(mp, built)
            out = model(**batch)
            out.loss.backward()
        assert len(calls) == 2 and all(padded == ("attention_mask" in batch) for padded, _ in calls), calls
        _assert_trains_as(model, ref, out, batch)
    assert not built
    if getattr(cfg, "layer_types", None) and "sliding_attention" in cfg.layer_types:
        assert (False, 4) in calls, calls


@needs_hf
@pytest.mark.slow
def test_compiled_lora_causal_lm_masks_run_the_kernels(monkeypatch):
    """A PEFT LoRA model compiled, padded, called with the output_* flags (which PEFT versions pass on to the causal
    LM, None by default): the attention calls run the kernels with the call's padding mask, and train as the
    unswapped adapter model does."""
    peft = pytest.importorskip("peft")
    from fused_layers.ops import attention as attn_ops

    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    ref = peft.get_peft_model(_call_mask_model("llama"), peft.LoraConfig(**lora))
    model = peft.get_peft_model(_call_mask_model("llama"), peft.LoraConfig(**lora))
    model.load_state_dict(ref.state_dict())
    swap_modules(model)
    calls = []
    orig = attn_ops.fused_attention

    def spy(*a, **k):
        calls.append(k.get("attn_mask") is not None)
        return orig(*a, **k)

    monkeypatch.setattr(attn_ops, "fused_attention", spy)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100),
             "output_attentions": False, "output_hidden_states": False}
    torch._dynamo.reset()
    out = torch.compile(model, backend="eager")(**batch)
    out.loss.backward()
    assert calls == [True, True], calls
    _assert_trains_as(model, ref, out, batch)
    torch._dynamo.reset()


# --------------------------------------------------------------------------------------------------
# torch modules and the demo GPT
# --------------------------------------------------------------------------------------------------
class _Encoder(nn.Module):
    def __init__(self, d=128, h=2):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, h, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, x, mask=None):
        return self.enc(x, mask=mask, is_causal=mask is not None)


def _sum_step(compiled, b):
    compiled(**b).float().square().sum().backward()


@pytest.mark.slow
def test_functional_attention_routes_inside_one_graph(gpu_route):
    """``fused_attention(backend="auto")`` compiles into one graph (``fullgraph=True``) on the GPU's routing path:
    SDPA where cuDNN is measured faster (a dense bf16 head-dim-64 call), the kernels with a key-padding mask; forward
    and backward match eager."""
    from _tol import kernel_names, launched

    from fused_layers import fused_attention

    q, k, v = (torch.randn(1, 2, 16, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    keep = torch.ones(1, 1, 1, 16, dtype=torch.bool)
    keep[..., -3:] = False
    for mask in (None, keep):
        torch._dynamo.reset()
        fn = torch.compile(lambda q, k, v, m: fused_attention(q, k, v, m, is_causal=True, backend="auto"),
                           backend="eager", fullgraph=True)
        out = fn(q, k, v, mask)
        with launched("attention") as seen:
            ref = fused_attention(q, k, v, mask, is_causal=True, backend="auto")
        assert bool(kernel_names(seen)) == (mask is not None), kernel_names(seen)  # SDPA without the mask
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
        g, r = torch.autograd.grad(out.float().sum(), (q, k, v)), torch.autograd.grad(ref.float().sum(), (q, k, v))
        for a, b in zip(g, r):
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@pytest.mark.slow
def test_transformer_encoder_compiled_no_break(gpu_route):
    torch.manual_seed(0)
    model = _Encoder().to(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    mask = nn.Transformer.generate_square_subsequent_mask(8, dtype=torch.bfloat16)
    batches = [{"x": torch.randn(1, 8, 128, generator=g).to(torch.bfloat16), "mask": mask} for _ in range(2)]
    plain = compile_counts(model, batches, _sum_step)
    swap_modules(model)
    fused = compile_counts(model, batches, _sum_step, after=_ext_built_at(gpu_route, 1))
    assert_no_worse(fused, plain)


@pytest.mark.slow
def test_timm_vit_compiled_no_break(gpu_route):
    """timm's attention reaches fused_attention through a rebound F.scaled_dot_product_attention
    (integrations/_sdpa.py), inlined into the compiled model: torch 2.11 failed building its guards before the
    rebound globals were a registered module's."""
    timm = pytest.importorskip("timm", reason="timm lane (needs torchvision)")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=4, img_size=32, depth=1)
    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(1, 3, 32, 32, generator=g)} for _ in range(2)]
    plain = compile_counts(model, batches, _sum_step)
    assert swap_modules(model).counts().get("attention") == 1
    fused = compile_counts(model, batches, _sum_step, after=_ext_built_at(gpu_route, 1))
    assert_no_worse(fused, plain)


@pytest.mark.slow
def test_demo_gpt_compiled_no_break(gpu_route):
    from lm_demo.model import GPT

    torch.manual_seed(0)
    # float32: the attention kernels' route (bf16 at head dim 64 routes to SDPA, as the encoder test does)
    model = GPT(vocab_size=64, seq_len=8, d_model=128, n_layer=1, n_head=2, attn_impl="reference")
    g = torch.Generator().manual_seed(0)
    batches = [{"idx": torch.randint(0, 64, (1, 8), generator=g), "targets": torch.randint(0, 64, (1, 8), generator=g)}
               for _ in range(2)]

    def step(compiled, b):
        compiled(**b).backward()

    plain = compile_counts(model, batches, step)
    swap_modules(model)
    fused = compile_counts(model, batches, step, after=_ext_built_at(gpu_route, 1))
    assert_no_worse(fused, plain)


def test_warn_once_under_compile_warns_once_without_a_break():
    """warnings.warn is not traceable: from compiled code the warning is given while tracing."""
    from torch._dynamo.utils import counters

    from fused_layers.ops import _common

    key = "test_compile:warn"
    _common._warned.discard(key)

    def f(x):
        _common.warn_once(key, "compiled warning")
        return x + 1

    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = torch.compile(f, backend="eager")
        c(torch.ones(2))
        c(torch.ones(2))
        _common.warn_once(key, "compiled warning")  # eager: already given
    assert [str(x.message) for x in w] == ["compiled warning"]
    assert not counters["graph_break"]


# --------------------------------------------------------------------------------------------------
# The compile-time routes (ops/compile_config.py)
# --------------------------------------------------------------------------------------------------
def _ops_in_graph(fn, *args) -> set[str]:
    """The fused_layers ops Dynamo records for ``fn(*args)`` (forward graph)."""
    seen: set[str] = set()

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            name = str(node.target)
            if "fused_layers" in name:
                seen.add(name.split("fused_layers.")[-1].split(".")[0])
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return seen


_ROUTED = {  # op -> (a call of its functional, the registered op it records on the "kernels" route)
    "layer_norm": (lambda x: FF.fused_layer_norm(x, (16,)), "norm_fwd"),
    "rms_norm": (lambda x: FF.fused_rms_norm(x, (16,)), "norm_fwd"),
    "rms_norm_variant": (lambda x: fused_rms_norm_variant(x, torch.ones(16), 1e-6), "rms_norm_variant_fwd"),
    "softmax": (lambda x: FF.fused_softmax(x, -1), "softmax_fwd"),
    "cross_entropy": (lambda x: FF.fused_cross_entropy(x, torch.zeros(4, dtype=torch.long)), "cross_entropy_fwd"),
    "linear_cross_entropy": (lambda x: FF.fused_linear_cross_entropy(x, torch.ones(5, 16),
                                                                     torch.zeros(4, dtype=torch.long)),
                             "linear_cross_entropy_fwd"),
}


def _hf_mlp_call():
    """A swapped transformers LlamaMLP (the gated_activation look-alike), called on (4, 16) inputs."""
    import transformers as T

    mlp = T.models.llama.modeling_llama.LlamaMLP(T.LlamaConfig(hidden_size=16, intermediate_size=32,
                                                               num_attention_heads=2, num_key_value_heads=2))
    swap_modules(mlp)
    return mlp


def _mlp_call():
    """A swapped plain MLP (the demo GPT's, registered for the ``mlp`` kind), called on (4, 16) inputs."""
    from lm_demo.model import MLP

    mlp = MLP(16, 32)
    swap_modules(mlp)
    return mlp


def _hf_add_norm_call():
    """The residual add + norm of a swapped decoder layer (its ``_fused_add_norm``) on a LlamaRMSNorm."""
    import transformers as T

    from fused_layers.integrations._hf_decoder import _fused_add_norm

    norm = T.models.llama.modeling_llama.LlamaRMSNorm(16)
    _fused_add_norm(norm, torch.ones(2, 16), torch.ones(2, 16))  # eager first, as the swap's check runs it
    return lambda x: _fused_add_norm(norm, x, x * 2)




def test_compiled_routes_are_data_and_decide_what_dynamo_records(monkeypatch):
    """Every op of the table records its registered op on the "kernels" route and none on "inductor" (its
    PyTorch computation, for Inductor to generate and fuse); the defaults: norms to Inductor (the measured
    case), the rest on the kernels, the linear cross-entropy always (Inductor would hold the logits)."""
    import dataclasses

    from fused_layers.ops import compile_config

    default = compile_config.COMPILED
    routed = dict(_ROUTED, mlp=(_mlp_call(), "activation_linear_fwd"))
    try:  # the transformers look-alikes' routes
        import transformers  # noqa: F401

        routed["gated_activation"] = (_hf_mlp_call(), "gated_activation_linear_fwd")
        routed["residual_norm"] = (_hf_add_norm_call(), "residual_norm_fwd")
    except ImportError:
        pass
    fields = {f.name for f in dataclasses.fields(default)}
    assert dataclasses.is_dataclass(default) and set(routed) <= fields
    assert fields - set(routed) <= {"gated_activation", "residual_norm"}  # (those two need transformers)
    assert (default.layer_norm, default.rms_norm) == ("inductor", "inductor")
    assert default.linear_cross_entropy == "kernels"
    x = torch.randn(4, 16)
    for op, (call, recorded) in routed.items():
        for r in ("kernels", "inductor"):
            monkeypatch.setattr(compile_config, "COMPILED", dataclasses.replace(default, **{op: r}))
            assert (recorded in _ops_in_graph(call, x)) == (r == "kernels"), (op, r)


def test_set_compiled_routes_checks_its_arguments_and_recompiles_a_compiled_frame():
    """``fused_layers.set_compiled_routes``: a wrong op is a TypeError and a wrong route a ValueError, each naming
    what is allowed, and the table is left as it was; a frame compiled under the defaults compiles again under the
    new table (Dynamo guards on it) and records the routed op; the returned table puts the defaults back."""
    import dataclasses

    import fused_layers
    from fused_layers.ops import compile_config

    default = compile_config.COMPILED
    with pytest.raises(TypeError, match="no op 'mlps'; ops: layer_norm, "):
        fused_layers.set_compiled_routes(mlps="kernels")
    with pytest.raises(ValueError, match="mlp='fast'; a route is one of kernels, inductor"):
        fused_layers.set_compiled_routes(mlp="fast")
    assert compile_config.COMPILED is default
    mlp, x, recorded = _mlp_call(), torch.randn(4, 16), []

    def backend(gm, example_inputs):
        recorded.append({str(n.target) for n in gm.graph.nodes})
        return gm.forward

    torch._dynamo.reset()
    step = torch.compile(mlp, backend=backend, fullgraph=True)
    step(x)
    before = fused_layers.set_compiled_routes(mlp="kernels" if default.mlp == "inductor" else "inductor")
    try:
        step(x)
        step(x)  # the second call under the new table reuses its graph
    finally:
        fused_layers.set_compiled_routes(**dataclasses.asdict(before))
    assert before is default and compile_config.COMPILED == default
    assert len(recorded) == 2, recorded  # one graph per table
    has_op = [any("activation_linear_fwd" in t for t in g) for g in recorded]
    assert has_op == ([False, True] if default.mlp == "inductor" else [True, False])


@needs_hf
def test_compiled_hf_attention_does_not_guard_on_other_models():
    """What a swapped model's attention runs where ours cannot is read from the module itself: another swapped
    model collected while this one runs compiled is no recompile (a weak-keyed table of every switched module made
    Dynamo guard on its length: a recompile per collected model, and on torch 2.13 "Guard failed on the same
    frame it was created" when one was collected during the frame)."""
    import gc

    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = _hf_model("gpt2", torch.float32)
    model.eval()
    swap_modules(model)
    other = _hf_model("gpt2", torch.float32)
    swap_modules(other)
    (b,) = _lm_batches(1)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager")
    compiled(**b)
    graphs = counters["stats"]["unique_graphs"]
    del other
    gc.collect()
    compiled(**b)
    assert counters["stats"]["unique_graphs"] == graphs and not counters["graph_break"]


@needs_hf
@pytest.mark.slow
@pytest.mark.parametrize("family,op", [("llama", "gated_activation_linear_fwd"), ("gpt2", "activation_linear_fwd")])
def test_hf_mlps_on_the_kernels_route_compile_and_train_as_unswapped(monkeypatch, family, op):
    """With the MLP routes on "kernels", a compiled swapped transformers causal LM records the MLP op (activation +
    projection, backward by the kernels) with no graph break, through Inductor's partitioner, and trains as the
    unswapped model: loss and every gradient."""
    from torch._dynamo.utils import counters

    _mlp_routes_on_kernels(monkeypatch)
    torch.manual_seed(0)
    model = _hf_model(family, torch.float32, layers=2)
    ref = _hf_model(family, torch.float32, layers=2)
    ref.load_state_dict(model.state_dict())
    model.eval(), ref.eval()  # GPT-2's dropout off: the same function, gradients still on
    assert swap_modules(model).counts()["gated_mlp" if family == "llama" else "mlp"] == 2
    (b,) = _lm_batches(1)
    assert op in _ops_in_graph(lambda ids: model(input_ids=ids, labels=ids).loss, b["input_ids"])
    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(model, backend="aot_eager_decomp_partition")(**b)
    out.loss.backward()
    assert not counters["graph_break"]
    _assert_trains_as(model, ref, out, b)


@needs_hf
@pytest.mark.slow
def test_hf_causal_lm_compiled_keeps_the_chunked_linear_cross_entropy():
    """Compiled training of a transformers causal LM runs the LM head + loss chunked (no logits in the graph's
    outputs, the fused op recorded): the fusion Inductor cannot do.  Loss and every gradient as unswapped."""
    torch.manual_seed(0)
    model = _hf_model("llama", torch.float32)
    ref = _hf_model("llama", torch.float32)
    ref.load_state_dict(model.state_dict())
    swap_modules(model)
    (b,) = _lm_batches(1)
    seen: set[str] = set()

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(model, backend=backend)(**b)
    assert out.logits is None and any("linear_cross_entropy" in t for t in seen)
    out.loss.backward()
    _assert_trains_as(model, ref, out, b)
