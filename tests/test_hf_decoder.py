"""transformers' decoder layers (integrations/_hf_decoder.py): gated MLPs, RoPE and residual + norm swapped into tiny
Llama, Qwen2, Gemma and Phi-3 models from their configs (fp32), against the unswapped model: logits and every
parameter gradient; gradient checkpointing; what is left alone and why; restore."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_same_step
from torch import nn

from fused_layers import restore_modules, swap_modules

transformers = pytest.importorskip("transformers")

from fused_layers.integrations import _hf_decoder  # noqa: E402

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=8, hidden_activation="gelu_pytorch_tanh")),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.5, pad_token_id=0)),
    # the norm after the residual add is pre_feedforward_layernorm (post_attention_layernorm precedes the add)
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=8, hidden_activation="gelu_pytorch_tanh",
                                                       attn_implementation="eager")),
}
NEW = ("gated_mlp", "rope", "residual_norm")


def _tiny(family, **over):
    cfg_name, model_name, extra = FAMILIES[family]
    kw = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, attn_implementation="sdpa")
    kw.update(extra)
    kw.update(over)
    torch.manual_seed(0)
    m = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**kw))
    with torch.no_grad():  # weights away from their init (Gemma's norm weights start at 0, RMSNorm's at 1)
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def _step(m, ids):
    m.zero_grad(set_to_none=True)
    out = m(input_ids=ids)
    loss = out.logits.float().square().mean()  # a loss that reaches every logit
    loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _spies(monkeypatch):
    """Count the fused kernels' calls (each op's entry point as the integration calls it)."""
    from fused_layers.ops import gated_activation, residual_norm, rope

    calls = {"gated": 0, "rope": 0, "res": 0}
    for mod, name, key in ((gated_activation, "fused_gated_activation", "gated"),
                           (gated_activation, "fused_gated_activation_linear", "gated"), (rope, "fused_rope", "rope"),
                           (residual_norm, "fused_add_rms_norm", "res")):
        orig = getattr(mod, name)

        def spy(*a, _orig=orig, _key=key, **k):
            calls[_key] += 1
            return _orig(*a, **k)

        monkeypatch.setattr(mod, name, spy)
    return calls


@pytest.mark.parametrize("family", list(FAMILIES))
def test_swapped_model_matches(family, monkeypatch, device):
    """Only the three new kinds swapped: logits and every gradient against the unswapped model; the fused kernels
    ran (2 MLPs, 2 layers' RoPE, 2 residual norms); restore puts the model's apply_rotary_pos_emb back."""
    ref = _tiny(family).to(device)
    m = copy.deepcopy(ref)
    rep = swap_modules(m, kinds=list(NEW))
    assert rep.counts() == {"gated_mlp": 2, "rope": 1, "residual_norm": 2}, str(rep)
    modname = type(m.model.rotary_emb).__mro__[1].__module__  # (the fused subclass's base: the model's class)
    assert _hf_decoder.rope_installed(modname)
    calls = _spies(monkeypatch)
    ids = torch.randint(0, 48, (2, 5), device=device)
    assert_same_step(_step(ref, ids), _step(m, ids))
    assert calls == {"gated": 2, "rope": 2, "res": 2}, calls
    assert_same_step(_step(ref, ids), _step(ref, ids))  # the unswapped model is untouched by the dispatcher
    assert calls["rope"] == 2
    back = restore_modules(m)
    # the dispatcher stays while another fused rotary module of this family lives (other tests' models, held by
    # compiled code until Dynamo is reset)
    torch._dynamo.reset()
    import gc

    gc.collect()
    assert len(back.swapped) == 5
    assert _hf_decoder.rope_installed(modname) == bool(_hf_decoder._HOLDERS.get(modname))
    assert not _hf_decoder._HOLDERS.get(modname) or m not in _hf_decoder._HOLDERS[modname]
    assert all(type(x).__name__.startswith("Fused") is False for x in m.modules())


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_frozen_mlp_keeps_its_input(family, monkeypatch, device):
    """MLPs whose projections do not train (Llama's three, Phi-3's gate_up + down; the rest of the model trains):
    each runs ``frozen_gated_mlp``, which saves the MLP's input and no intermediate-width tensor, and the logits
    and every gradient are the unswapped model's."""
    from fused_layers.ops import gated_activation as ga

    ref = _tiny(family).to(device)
    for name, p in ref.named_parameters():
        if ".mlp." in name:
            p.requires_grad_(False)
    m = copy.deepcopy(ref)
    swap_modules(m, kinds=list(NEW))
    saved = []
    apply = ga._FrozenGatedMLPFunction.apply

    def spy(*a):
        y = apply(*a)
        saved.append([tuple(t.shape) for t in y.grad_fn.saved_tensors])
        return y

    monkeypatch.setattr(ga._FrozenGatedMLPFunction, "apply", spy)
    ids = torch.randint(0, 48, (2, 5), device=device)
    assert_same_step(_step(ref, ids), _step(m, ids))
    assert saved == [[(2, 5, 32), (64, 32), (64, 32), (32, 64)]] * 2  # x and the three weights (gate_up's halves)


def test_autocast_mixed_dtypes(monkeypatch, device):
    """float32 weights under bf16 autocast (the usual fine-tuning set-up): bf16 projections, a float32 residual
    stream, float32 cos / sin. Every fused path is still taken (the residual add of a bf16 attention output to the
    float32 stream, RoPE of bf16 q / k by float32 cos / sin), and the model's logits and gradients are the
    unswapped model's within bf16 rounding."""
    ref = _tiny("llama").to(device)
    m = copy.deepcopy(ref)
    swap_modules(m, kinds=list(NEW))
    calls = _spies(monkeypatch)
    ids = torch.randint(0, 48, (2, 5), device=device)
    dev_type = torch.device(device).type
    with torch.autocast(dev_type, dtype=torch.bfloat16):
        a, b = _step(ref, ids), _step(m, ids)
    assert calls == {"gated": 2, "rope": 2, "res": 2}, calls
    (la, ga), (lb, gb) = a, b
    rel = lambda x, y: ((x.float() - y.float()).norm() / y.float().norm()).item()  # noqa: E731
    assert rel(lb, la) < 2e-2
    for n in ga:
        assert rel(gb[n], ga[n]) < 5e-2, (n, rel(gb[n], ga[n]))
    restore_modules(m)


def _saved_activation_bytes(m, ids):
    """Bytes of the tensors autograd keeps for the backward (parameters left out, each storage once)."""
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(input_ids=ids)
    return sum(seen.values())


def test_what_autograd_keeps(device):
    """The memory the kinds exist for, counted exactly (bf16 Llama, 2 layers, 10 tokens): the fused MLP keeps two
    bf16 intermediate-size tensors less a layer (act(gate) is recomputed, the product written again in the
    backward; one less where the down projection is hooked and called as a module), the fused residual + norm one
    float32 hidden-size tensor less (HF's RMSNorm keeps h.float())."""
    ref = _tiny("llama", intermediate_size=48).to(device, torch.bfloat16)
    ids = torch.randint(0, 48, (2, 5), device=device)
    base = _saved_activation_bytes(ref, ids)
    layers, tokens = 2, 10
    for kind, saved in (("gated_mlp", 2 * layers * tokens * 48 * 2), ("residual_norm", layers * tokens * 32 * 4)):
        m = copy.deepcopy(ref)
        swap_modules(m, kinds=[kind])
        assert base - _saved_activation_bytes(m, ids) == saved, kind
    m = copy.deepcopy(ref)
    swap_modules(m, kinds=["gated_mlp"])
    seen = []
    for layer in m.model.layers:
        layer.mlp.down_proj.register_forward_hook(lambda mod, i, o: seen.append(mod))
    assert base - _saved_activation_bytes(m, ids) == layers * tokens * 48 * 2
    assert len(seen) == layers  # the hooks ran: the module was called


def test_all_kinds_together_and_gradient_checkpointing(device):
    """Every kind (attention, norms and loss too) on Llama with gradient checkpointing on (the layers recompute
    their forward in the backward): logits and gradients match, and again after one optimizer step of both."""
    ref = _tiny("llama").to(device)
    m = copy.deepcopy(ref)
    rep = swap_modules(m)
    assert {"attention", "rms_norm", *NEW} <= set(rep.counts()), str(rep)
    ids = torch.randint(0, 48, (2, 5), device=device)
    for model in (ref, m):
        model.train()
        # (transformers 5.25 renames it activation_checkpointing_enable; older releases have only this name)
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    assert m.model.layers[0].gradient_checkpointing
    assert_same_step(_step(ref, ids), _step(m, ids), tol=5e-5)
    opt_a, opt_b = (torch.optim.SGD(x.parameters(), lr=0.1) for x in (ref, m))
    opt_a.step()
    opt_b.step()
    assert_same_step(_step(ref, ids), _step(m, ids), tol=5e-5)
    restore_modules(m)


def test_left_alone_with_reasons():
    """An MLP whose activation is not a verified one, a decoder layer whose post-attention norm is not an RMSNorm
    we verified, a model whose apply_rotary_pos_emb is not verified: skipped, the reasons in the report."""
    m = _tiny("llama", hidden_act="relu")
    m.model.layers[1].post_attention_layernorm = nn.LayerNorm(32)
    rep = swap_modules(m, kinds=list(NEW))
    skipped = {s.name: s.reason for s in rep.skipped}
    assert "not a verified SiLU / GELU" in skipped["model.layers.0.mlp"]
    assert "not a verified Llama / Gemma RMSNorm" in skipped["model.layers.1"]
    assert rep.counts() == {"rope": 1, "residual_norm": 1}
    restore_modules(m)
    # a model family whose RoPE function is not one of the verified ones (Cohere: its own interleaving code)
    cfg = transformers.CohereConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    rep = swap_modules(transformers.CohereForCausalLM(cfg), kinds=["rope"])
    reasons = [s.reason for s in rep.skipped if s.kind == "rope"]
    assert "rope" not in rep.counts() and len(reasons) == 1 and "differs from the verified ones" in reasons[0]


def test_decoder_layer_sites():
    """The three statements found by their shape in each family's own forward: the norm's attribute; a layer whose
    statement after the add is not a verified norm (OLMo 2: the MLP) is refused with its reason."""
    import transformers.models.olmo2.modeling_olmo2 as mo
    import transformers.models.phi3.modeling_phi3 as mp

    assert _hf_decoder._fused_inner(mp.Phi3DecoderLayer)[1] == "post_attention_layernorm"
    cfg = transformers.Olmo2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, max_position_embeddings=32)
    layer = mo.Olmo2DecoderLayer(cfg, 0)
    assert "its mlp is Olmo2MLP, not a verified" in _hf_decoder._layer_check(layer)


def test_activation_recognition():
    from transformers.activations import ACT2FN

    expect = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
              "gelu_new": "gelu_tanh", "relu": None, "gelu_python_tanh": None, "quick_gelu": None, "gelu_10": None}
    for name, want in expect.items():
        assert _hf_decoder.activation_name(ACT2FN[name]) == want, name
    assert _hf_decoder.activation_name(nn.GELU(approximate="tanh")) == "gelu_tanh"


def test_mapping_cannot_name_a_known_only_kind():
    with pytest.raises(ValueError, match="known transformers classes"):
        swap_modules(nn.Sequential(nn.Linear(2, 2)), mapping={nn.Linear: "rope"})


def test_rope_dispatcher_leaves_other_calls_alone():
    """With a fused rotary module installed, a call with cos / sin it did not produce runs the original function."""
    m = _tiny("llama")
    swap_modules(m, kinds=["rope"])
    import transformers.models.llama.modeling_llama as ml

    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8)
    cos, sin = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    orig = ml.apply_rotary_pos_emb.__wrapped__
    for a, b in zip(ml.apply_rotary_pos_emb(q, k, cos, sin), orig(q, k, cos, sin)):
        assert torch.equal(a, b)
    restore_modules(m)
    assert not _hf_decoder.rope_installed(ml.__name__)
