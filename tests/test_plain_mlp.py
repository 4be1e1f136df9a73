"""Plain MLPs (integrations/_mlp.py, the ``mlp`` kind): transformers' GPT-2 MLP and timm's Mlp swapped in tiny models
(fp32) against the unswapped model: logits and every parameter gradient; what autograd keeps (one intermediate-width
tensor less a layer); the paths that run the class's own forward (hooks, adapters, dropout, a norm, no gradient);
restore."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fused_layers import restore_modules, swap_modules

transformers = pytest.importorskip("transformers")


def _gpt2(**over):
    kw = dict(n_embd=32, n_layer=2, n_head=4, n_inner=80, vocab_size=48, n_positions=32, resid_pdrop=0.0,
              embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
    kw.update(over)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw)).train()


def _step(m, ids, seed=0):
    m.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks for both models
    out = m(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _compare(a, b, tol=2e-5):
    (la, ga), (lb, gb) = a, b
    torch.testing.assert_close(lb, la, atol=tol, rtol=tol)
    assert ga.keys() == gb.keys() and len(ga) > 0
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=tol, rtol=tol, msg=lambda m: f"{n}: {m}")


def _calls(monkeypatch):
    from fused_layers.integrations import _mlp

    calls = []
    real = _mlp.fused_activation_linear
    monkeypatch.setattr(_mlp, "fused_activation_linear", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    return calls


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gpt2_mlp_trains_as_unswapped(monkeypatch, dropout):
    """GPT-2's MLP (Conv1D projections, NewGELUActivation) swapped: the loss and every gradient as the unswapped
    model's, dropout after c_proj included (same seed, same masks); restore gives the class back."""
    ref = _gpt2(resid_pdrop=dropout)
    fused = copy.deepcopy(ref)
    rep = swap_modules(fused, kinds=["mlp"])
    assert rep.counts() == {"mlp": 2}, str(rep)
    assert "hf_gpt2_mlp" in str(rep)
    calls = _calls(monkeypatch)
    ids = torch.randint(0, 48, (2, 12))
    _compare(_step(ref, ids), _step(fused, ids))
    assert calls == [(2, 12, 80)] * 2
    restore_modules(fused)
    assert type(fused.transformer.h[0].mlp) is type(ref.transformer.h[0].mlp)


def test_gpt2_mlp_keeps_one_tensor_less():
    """What autograd holds from the forward: per MLP, the swapped one keeps c_fc's output but not act(c_fc(x))."""
    ids = torch.randint(0, 48, (2, 12))

    def intermediate_saved(m):
        """Distinct activations of the intermediate width (80) that autograd keeps; the weights are not counted."""
        params = {p.untyped_storage().data_ptr() for p in m.parameters()}
        seen = set()

        def pack(t):
            if t.shape[-1:] == (80,) and t.untyped_storage().data_ptr() not in params:
                seen.add(t.untyped_storage().data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(input_ids=ids, labels=ids).loss.backward()
        return len(seen)

    ref = _gpt2()
    fused = copy.deepcopy(ref)
    swap_modules(fused, kinds=["mlp"])
    assert intermediate_saved(fused) == 2 * 1 and intermediate_saved(ref) >= 2 * 2  # (NewGELU's own ops keep more)


def test_gpt2_mlp_falls_back_to_the_class(monkeypatch):
    """A hook on c_proj (ZeRO-3 gathers in one), a LoRA adapter on it, no gradient, or torch.compile: the class's own
    forward, with the same results."""
    peft = pytest.importorskip("peft")
    ids = torch.randint(0, 48, (2, 12))
    ref = _gpt2()
    fused = copy.deepcopy(ref)
    swap_modules(fused, kinds=["mlp"])
    calls = _calls(monkeypatch)
    handle = fused.transformer.h[0].mlp.c_proj.register_forward_pre_hook(lambda m, a: None)
    _compare(_step(ref, ids), _step(fused, ids))
    assert len(calls) == 1  # layer 1 only
    handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(fused(input_ids=ids).logits, ref(input_ids=ids).logits, atol=2e-5, rtol=2e-5)
    assert len(calls) == 1
    lora = dict(r=4, lora_alpha=8, target_modules=["c_proj"], lora_dropout=0.0, fan_in_fan_out=True)
    ref_l = peft.get_peft_model(copy.deepcopy(ref), peft.LoraConfig(**lora))
    fused_l = peft.get_peft_model(copy.deepcopy(fused), peft.LoraConfig(**lora))
    fused_l.load_state_dict(ref_l.state_dict())
    _compare(_step(ref_l, ids), _step(fused_l, ids))
    assert len(calls) == 1  # every c_proj is an adapter now


def test_gpt2_mlp_checks_refuse_what_it_does_not_compute():
    """An activation whose math is not verified (ReLU) or a c_proj that is neither Conv1D nor nn.Linear: left
    alone, with the reason in the report."""
    m = _gpt2(activation_function="relu")
    rep = swap_modules(m, kinds=["mlp"])
    assert rep.counts() == {} and "not a verified GELU / SiLU" in str(rep)
    m = _gpt2()
    m.transformer.h[0].mlp.c_proj = nn.Sequential(nn.Linear(80, 32))
    rep = swap_modules(m, kinds=["mlp"])
    assert rep.counts() == {"mlp": 1} and "not transformers' Conv1D or an nn.Linear" in str(rep)


# --------------------------------------------------------------------------------------------------
# timm's Mlp (ViT blocks)
# --------------------------------------------------------------------------------------------------
def _vit(**kw):
    timm = pytest.importorskip("timm", reason="timm not importable")
    torch.manual_seed(0)
    return timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=10, img_size=32, patch_size=16,
                             depth=2, embed_dim=32, num_heads=2, **kw).train()


def _vit_step(m, x, t):
    m.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(m(x), t)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def test_timm_mlp_trains_as_unswapped(monkeypatch):
    """ViT's Mlp (nn.GELU, p = 0 dropouts, no norm) swapped: loss and every gradient as timm's; restore."""
    ref = _vit()
    fused = copy.deepcopy(ref)
    rep = swap_modules(fused, kinds=["mlp"])
    assert rep.counts() == {"mlp": 2} and "timm_mlp" in str(rep)
    calls = _calls(monkeypatch)
    x, t = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    _compare(_vit_step(ref, x, t), _vit_step(fused, x, t))
    assert len(calls) == 2
    restore_modules(fused)
    assert type(fused.blocks[0].mlp) is type(ref.blocks[0].mlp)


def test_timm_mlp_dropout_and_norm(monkeypatch):
    """A dropout between the activation and fc2 runs timm's forward while training (its mask draw is timm's); an MLP
    with a norm after the activation is left alone with the reason."""
    ref = _vit(proj_drop_rate=0.1)
    fused = copy.deepcopy(ref)
    swap_modules(fused, kinds=["mlp"])
    calls = _calls(monkeypatch)
    x, t = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    torch.manual_seed(1)
    a = _vit_step(ref, x, t)
    torch.manual_seed(1)
    b = _vit_step(fused, x, t)
    _compare(a, b)
    assert calls == []
    from timm.layers import Mlp

    m = nn.Sequential(Mlp(16, 32, norm_layer=nn.LayerNorm))
    rep = swap_modules(m, kinds=["mlp"])
    assert rep.counts() == {} and "a norm between the activation and fc2" in str(rep)
