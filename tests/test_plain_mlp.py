"""Plain MLPs (integrations/_mlp.py, the ``mlp`` and ``mlp_recompute`` kinds): transformers' GPT-2 MLP and timm's Mlp
swapped in tiny models
(fp32) against the unswapped model: logits and every parameter gradient; what autograd keeps (one intermediate-width
tensor less a layer); the paths that run the class's own forward (hooks, adapters, dropout, a norm, no gradient);
restore."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_same_step
from torch import nn

from fused_layers import restore_modules, swap_modules


def _gpt2(**over):
    transformers = pytest.importorskip("transformers")  # (the timm lane of .ci/run has no transformers)
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
    assert_same_step(_step(ref, ids), _step(fused, ids))
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
    assert_same_step(_step(ref, ids), _step(fused, ids))
    assert len(calls) == 1  # layer 1 only
    handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(fused(input_ids=ids).logits, ref(input_ids=ids).logits, atol=2e-5, rtol=2e-5)
    assert len(calls) == 1
    lora = dict(r=4, lora_alpha=8, target_modules=["c_proj"], lora_dropout=0.0, fan_in_fan_out=True)
    ref_l = peft.get_peft_model(copy.deepcopy(ref), peft.LoraConfig(**lora))
    fused_l = peft.get_peft_model(copy.deepcopy(fused), peft.LoraConfig(**lora))
    fused_l.load_state_dict(ref_l.state_dict())
    assert_same_step(_step(ref_l, ids), _step(fused_l, ids))
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
    rep = swap_modules(fused, kinds=["mlp_recompute"])
    assert rep.counts() == {"mlp_recompute": 2} and "timm_mlp" in str(rep)
    calls = _calls(monkeypatch)
    x, t = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    assert_same_step(_vit_step(ref, x, t), _vit_step(fused, x, t))
    assert len(calls) == 2
    restore_modules(fused)
    assert type(fused.blocks[0].mlp) is type(ref.blocks[0].mlp)


def test_timm_mlp_dropout_and_norm(monkeypatch):
    """A dropout between the activation and fc2 runs timm's forward while training (its mask draw is timm's); an MLP
    with a norm after the activation is left alone with the reason."""
    ref = _vit(proj_drop_rate=0.1)
    fused = copy.deepcopy(ref)
    swap_modules(fused, kinds=["mlp_recompute"])
    calls = _calls(monkeypatch)
    x, t = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    torch.manual_seed(1)
    a = _vit_step(ref, x, t)
    torch.manual_seed(1)
    b = _vit_step(fused, x, t)
    assert_same_step(a, b)
    assert calls == []
    from timm.layers import Mlp

    m = nn.Sequential(Mlp(16, 32, norm_layer=nn.LayerNorm))
    rep = swap_modules(m, kinds=["mlp_recompute"])
    assert rep.counts() == {} and "a norm between the activation and fc2" in str(rep)


def test_timm_mlp_is_off_by_default():
    """timm's Mlp saves memory only (its activation is one PyTorch kernel already): a default swap leaves it alone and
    says why; naming the kind swaps it, and the other kinds still go in by default."""
    rep = swap_modules(_vit())
    counts = rep.counts()
    assert counts.get("mlp_recompute", 0) == 0 and counts.get("mlp", 0) == 0 and counts["layer_norm"] == 5
    skipped = [s for s in rep.skipped if s.kind == "mlp_recompute"]
    assert len(skipped) == 2 and all("off by default" in s.reason and "'kinds'" in s.reason for s in skipped)
    rep = swap_modules(_vit(), kinds={"mlp_recompute": True})
    assert rep.counts() == {"mlp_recompute": 2}
    rep = swap_modules(_vit(), kinds=["layer_norm"])
    assert all("disabled" in s.reason for s in rep.skipped if s.kind == "mlp_recompute")


# --------------------------------------------------------------------------------------------------
# register_mlp: a class of your own (the job's demo GPT registers its MLP)
# --------------------------------------------------------------------------------------------------
class _MyMLP(nn.Module):
    def __init__(self, d=16, hidden=40, act=None):
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.nonlin = act if act is not None else nn.GELU(approximate="tanh")
        self.down = nn.Linear(hidden, d)

    def forward(self, inp):
        return self.down(self.nonlin(self.up(inp)))


class _NotPlain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act, self.proj = nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(self.act(self.fc(x))) + x


def test_register_mlp_fuses_your_own_class(monkeypatch):
    """A registered class is swapped (kind mlp), trains as unswapped (loss and every gradient), its activation kept
    out of what autograd holds; an unverified activation is refused with the reason; a forward of another form is a
    TypeError naming what is expected; registering twice returns the first entry."""
    from fused_layers.integrations import register_mlp

    entry = register_mlp(_MyMLP, fc="up", act="nonlin", proj="down")
    assert register_mlp(_MyMLP, fc="up", act="nonlin", proj="down") is entry
    torch.manual_seed(0)
    ref = nn.Sequential(_MyMLP(), nn.LayerNorm(16), _MyMLP(act=nn.SiLU()))
    fused = copy.deepcopy(ref)
    rep = swap_modules(fused, kinds=["mlp"])
    assert rep.counts() == {"mlp": 2}, str(rep)
    calls = _calls(monkeypatch)
    x = torch.randn(3, 7, 16)
    for m in (ref, fused):
        m(x).square().mean().backward()
    assert len(calls) == 2
    for (n, a), (_, b) in zip(ref.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5, msg=lambda s: f"{n}: {s}")
    rep = swap_modules(nn.Sequential(_MyMLP(act=nn.ReLU())), kinds=["mlp"])
    assert rep.counts() == {} and "not a verified GELU / SiLU" in str(rep)
    with pytest.raises(TypeError, match=r"must be exactly `return self.proj\(self.act\(self.fc\(x\)\)\)`"):
        register_mlp(_NotPlain)
    restore_modules(fused)
    assert type(fused[0]) is _MyMLP


def test_demo_gpt_mlp_is_registered():
    """The job's GPT (lm_demo) registers its MLP: a swap counts it as kind mlp and it trains as unswapped."""
    from lm_demo.model import GPT

    torch.manual_seed(0)
    ref = GPT(vocab_size=32, seq_len=16, d_model=16, n_layer=2, n_head=2)
    fused = copy.deepcopy(ref)
    rep = swap_modules(fused, kinds=["mlp"])
    assert rep.counts() == {"mlp": 2}, str(rep)
    idx = torch.randint(0, 32, (2, 16))
    for m in (ref, fused):
        m(idx, idx).backward()
    for (n, a), (_, b) in zip(ref.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5, msg=lambda s: f"{n}: {s}")
