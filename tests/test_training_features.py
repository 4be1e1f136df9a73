"""Swapped HF models under the training features fine-tuners use: PEFT LoRA adapters, gradient checkpointing and
gradient accumulation with transformers' ``num_items_in_batch`` scaling.  Each against the same model unswapped
(float32, the kernels in Triton's interpreter): the loss and every trainable parameter's gradient."""

import copy
import warnings

import pytest
import torch

from fused_layers import swap_modules

transformers = pytest.importorskip("transformers")


def _tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).train()


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def _compare(ref, fused, batches, tol=2e-5):
    """Accumulate over ``batches`` (dicts of model kwargs) on both models; returns the fused run's outputs."""
    outs = []
    for model in (ref, fused):
        model.zero_grad(set_to_none=True)
        run = []
        for b in batches:
            out = model(**b)
            out.loss.backward()
            run.append(out)
        outs.append((run, _grads(model)))
    (ra, ga), (rb, gb) = outs
    for a, b in zip(ra, rb):
        torch.testing.assert_close(b.loss, a.loss, atol=tol, rtol=tol)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=tol, rtol=tol, msg=n)
    return rb


def _lora_pair(targets):
    """A tiny Llama under a PEFT LoRA adapter on ``targets`` (random adapter weights, so they matter), and a copy of
    it to swap: (reference, copy)."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, init_lora_weights=False)
    ref = peft.get_peft_model(_tiny_llama(), lora)
    return ref, copy.deepcopy(ref)


def test_lora_on_attention_and_mlp():
    """LoRA on the attention and MLP projections (PEFT), the model swapped after: every kind still swaps inside the
    PeftModel, the fused head + loss runs, and the adapters' gradients are the unswapped model's."""
    ref, fused = _lora_pair(["q_proj", "v_proj", "up_proj", "down_proj"])
    counts = swap_modules(fused).counts()
    assert counts["attention"] == 1 and counts["rms_norm"] == 3 and counts["cross_entropy"] == 1, counts
    ids = torch.randint(0, 48, (2, 10))
    out = _compare(ref, fused, [dict(input_ids=ids, labels=ids)])
    assert out[0].logits is None  # the fused LM head ran
    assert all("lora_" in n for n in _grads(fused))  # only the adapters train


def _attention_lora_frozen_mlp_spied(monkeypatch):
    """A LoRA pair on the attention projections, the copy swapped, and the list that each frozen-MLP call appends to:
    (reference, swapped, calls)."""
    from fused_layers.ops import gated_activation as ga

    ref, fused = _lora_pair(["q_proj", "k_proj", "v_proj", "o_proj"])
    swap_modules(fused)
    ran = []
    apply = ga._FrozenGatedMLPFunction.apply
    monkeypatch.setattr(ga._FrozenGatedMLPFunction, "apply", lambda *a: ran.append(1) or apply(*a))
    return ref, fused, ran


def test_lora_on_the_attention_frozen_mlp_recomputes_gate_and_up(monkeypatch):
    """LoRA on the attention only: the frozen MLP keeps its input and computes gate and up again in the backward
    (``frozen_gated_mlp``, ``RECOMPUTE_FROZEN``'s default), the adapters' gradients as unswapped; with the override
    off, and with gradient checkpointing of either kind, which recomputes the layer already, the MLP keeps gate and
    up."""
    from fused_layers.ops import _common, gated_activation_config

    ref, fused, ran = _attention_lora_frozen_mlp_spied(monkeypatch)
    ids = torch.randint(0, 48, (2, 10))
    _compare(ref, fused, [dict(input_ids=ids, labels=ids)])
    assert ran == [1]  # the one layer's MLP
    ran.clear()
    with _common.config_override("gated_activation", recompute_frozen=0):
        _compare(ref, fused, [dict(input_ids=ids, labels=ids)])
    assert not ran
    monkeypatch.setattr(gated_activation_config, "RECOMPUTE_FROZEN", False)  # the user's switch (docs/performance.md)
    _compare(ref, fused, [dict(input_ids=ids, labels=ids)])
    assert not ran
    monkeypatch.setattr(gated_activation_config, "RECOMPUTE_FROZEN", True)
    for reentrant in (False, True):  # hooks on the saved tensors / the layer run again inside the backward
        for m in (ref, fused):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        _compare(ref, fused, [dict(input_ids=ids, labels=ids)])
        assert not ran
    assert all("lora_" in n for n in _grads(fused))


def test_lora_under_bf16_autocast_frozen_mlp_recomputes(monkeypatch):
    """The same float32 model under bf16 autocast (the HF Trainer's ``bf16=True``): the frozen MLP still keeps only
    its (bf16) input, and the loss and every adapter gradient are within 2x the unswapped model's own autocast error
    of its float32 run."""
    ref, fused, ran = _attention_lora_frozen_mlp_spied(monkeypatch)
    ids = torch.randint(0, 48, (2, 10))
    runs = []
    for model, bf16 in ((ref, False), (ref, True), (fused, True)):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        runs.append((out.loss.detach(), _grads(model)))
    assert ran == [1]
    (l32, g32), (lref, gref), (lfused, gfused) = runs
    assert (lfused - l32).abs() <= 2 * (lref - l32).abs() + 1e-3 * l32.abs()
    assert g32.keys() == gfused.keys() and g32
    for n, g in g32.items():
        bound = 2 * (gref[n] - g).abs().max() + 1e-3 * g.abs().max()
        assert (gfused[n] - g).abs().max() <= bound, n


def test_lora_on_the_lm_head_keeps_training():
    """A LoRA adapter on lm_head: the fused head steps aside for the adapter (one warning naming why), the loss alone
    is fused, and the adapter's gradient is the unswapped model's."""
    ref, fused = _lora_pair(["q_proj", "lm_head"])
    swap_modules(fused)
    ids = torch.randint(0, 48, (2, 10))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = _compare(ref, fused, [dict(input_ids=ids, labels=ids)])
    assert out[0].logits is not None
    assert any("LM head + loss are not fused" in str(w.message) for w in seen)
    assert any("lm_head.lora_B" in n for n in _grads(fused))


def test_gradient_checkpointing():
    """``gradient_checkpointing_enable()`` on the swapped model: the fused layers run again in the recomputation, the
    loss and every gradient as unswapped with checkpointing."""
    torch.manual_seed(0)
    ref = _tiny_llama()
    fused = copy.deepcopy(ref)
    swap_modules(fused)
    for m in (ref, fused):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 48, (2, 10))
    out = _compare(ref, fused, [dict(input_ids=ids, labels=ids)])
    assert out[0].logits is None


def test_gradient_accumulation_with_num_items_in_batch():
    """Two micro-batches with ignored labels, each loss a sum over the step's ``num_items_in_batch`` tokens (the HF
    Trainer's scaling): the accumulated gradients equal the unswapped model's."""
    torch.manual_seed(0)
    ref = _tiny_llama()
    fused = copy.deepcopy(ref)
    swap_modules(fused)
    batches = []
    for _ in range(2):
        ids = torch.randint(0, 48, (2, 10))
        labels = ids.clone()
        labels[:, :3] = -100
        batches.append(dict(input_ids=ids, labels=labels))
    n = torch.tensor(sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches))
    for b in batches:
        b["num_items_in_batch"] = n
    _compare(ref, fused, batches)
