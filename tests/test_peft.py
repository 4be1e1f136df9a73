"""PEFT's LoRA linear layer swapped (integrations/_peft.py, the ``lora`` kind): PEFT's result and gradients from its
own operations, the input kept in its own dtype, and PEFT's own forward wherever the call does not apply."""

import copy

import pytest
import torch
from torch import nn

from fused_layers import restore_modules, swap_modules
from fused_layers.integrations import _peft

peft = pytest.importorskip("peft")


class _Block(nn.Module):
    def __init__(self, dtype, n_in=24, n_out=20):
        super().__init__()
        self.proj = nn.Linear(n_in, n_out, bias=True, dtype=dtype)
        self.other = nn.Linear(n_out, 5, dtype=dtype)

    def forward(self, x):
        return self.other(self.proj(x))


def _pair(dtype=torch.bfloat16, size=(24, 20), r=4, **lora):
    """A LoRA adapter on ``proj`` (PEFT's defaults: float32 adapter weights beside a 16-bit base), random adapter
    weights; the model and a swapped copy."""
    torch.manual_seed(0)
    cfg = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=["proj"], init_lora_weights=False, **lora)
    ref = peft.get_peft_model(_Block(dtype, *size), cfg)
    fused = copy.deepcopy(ref)
    rep = swap_modules(fused)
    return ref, fused, rep


def _run(model, x, **kw):
    x = x.detach().clone().requires_grad_()
    y = model(x * 1, **kw)  # an activation, as in a model (autocast caches its casts of leaves, not of these)
    y.float().square().sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return y, x.grad, grads


def _spy(monkeypatch):
    """A list that each call of the fused LoRA forward appends to."""
    ran = []
    forward = _peft._lora_forward
    monkeypatch.setattr(_peft, "_lora_forward", lambda *a: ran.append(1) or forward(*a))
    return ran


def _packed(monkeypatch, layer, x):
    """What the fused call's own saved-tensor hooks (``_keep_input``) keep of each tensor autograd saves, for one call
    of ``layer`` on ``x`` with no other saved-tensor hooks active."""
    kept = []
    keep_input = _peft._keep_input

    def spied(*args):
        pack, unpack = keep_input(*args)
        return (lambda t: kept.append(pack(t)) or kept[-1]), unpack

    monkeypatch.setattr(_peft, "_keep_input", spied)
    layer(x.requires_grad_())
    return kept


def _saved(layer, x):
    """Every tensor autograd keeps for the backward of one call of ``layer`` on ``x``."""
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        layer(x.requires_grad_())
    return kept


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lora_linear_is_peft_s(dtype, monkeypatch):
    """The swapped layer's output, input gradient and adapter gradients are PEFT's bit for bit (the same operations
    in the same dtypes), with a float32 adapter on a bf16 base and on a float32 one; the bf16 call keeps its input
    in bf16 where PEFT keeps a float32 copy."""
    ref, fused, rep = _pair(dtype)
    assert rep.counts() == {"lora": 1}, str(rep)
    ran = _spy(monkeypatch)
    x = torch.randn(3, 7, 24, dtype=dtype)
    (y0, dx0, g0), (y1, dx1, g1) = _run(ref, x), _run(fused, x)
    assert ran == [1]
    assert y1.dtype == y0.dtype == dtype
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)
    torch.testing.assert_close(dx1, dx0, atol=0, rtol=0)
    assert g0.keys() == g1.keys() and all("lora_" in n for n in g0) and len(g0) == 2
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=0, rtol=0, msg=n)
    layer = fused.base_model.model.proj
    saved = [t for t in _saved(layer, x) if t.numel() == x.numel()]  # other hooks active: _LoraAFunction (bf16)
    assert saved and all(t.dtype == dtype for t in saved)  # x itself (or a view), never a float32 copy
    packed = _packed(monkeypatch, layer, x)  # no other hooks: PEFT's ops under _keep_input's hooks
    if dtype == torch.bfloat16:
        assert [p[0] is x for p in packed if type(p) is tuple] == [True]  # x kept for the float32 copy's view
    big = [p for p in packed if type(p) is torch.Tensor and p.numel() == x.numel()]
    assert not [t for t in big if t.dtype == torch.float32 and dtype != torch.float32], big


def test_lora_linear_input_modified_in_place_raises():
    """x, kept in place of its float32 copy, modified in place before the backward: autograd's own error, never a
    gradient from the modified values."""
    _, fused, _ = _pair(torch.bfloat16)
    x = torch.randn(3, 7, 24, dtype=torch.bfloat16, requires_grad=True)
    h = x * 1
    y = fused(h)
    h.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.float().sum().backward()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lora_linear_under_autocast_is_peft_s(dtype, monkeypatch):
    """Under bf16 autocast (the HF Trainer's ``bf16=True``), a bf16 and a float32 base with float32 adapters: the
    output, the input and adapter gradients are PEFT's bit for bit."""
    ref, fused, _ = _pair(dtype)
    ran = _spy(monkeypatch)
    x = torch.randn(3, 7, 24, dtype=dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (y0, dx0, g0), (y1, dx1, g1) = _run(ref, x), _run(fused, x)
    assert ran == [1] and y1.dtype == y0.dtype == torch.bfloat16
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)
    torch.testing.assert_close(dx1, dx0, atol=0, rtol=0)
    assert g0.keys() == g1.keys() and len(g0) == 2
    for n in g0:
        assert g1[n].dtype == g0[n].dtype == torch.float32
        torch.testing.assert_close(g1[n], g0[n], atol=0, rtol=0, msg=n)


@pytest.mark.parametrize("autocast", [False, True])
def test_lora_linear_with_dropout_is_peft_s(autocast, monkeypatch):
    """An active LoRA dropout (p 0.1, training), bf16 base, float32 adapter, with and without bf16 autocast: the same
    draw as PEFT's (one seed), the output and every gradient PEFT's bit for bit; only a bool mask of the input's
    shape is kept for it; in eval the dropout is off, as PEFT's."""
    ref, fused, _ = _pair(torch.bfloat16, lora_dropout=0.1)
    ran = _spy(monkeypatch)
    x = torch.randn(3, 7, 24, dtype=torch.bfloat16)
    outs = []
    for model in (ref, fused):
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outs.append(_run(model, x))
    (y0, dx0, g0), (y1, dx1, g1) = outs
    assert ran == [1]
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)
    torch.testing.assert_close(dx1, dx0, atol=0, rtol=0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=0, rtol=0, msg=n)
    layer = fused.base_model.model.proj
    saved = _saved(layer, x)
    assert torch.bool in [t.dtype for t in saved]
    assert not [t for t in saved if t.dtype == torch.float32 and t.shape == x.shape]
    for m in (ref, fused):
        m.eval()
    torch.testing.assert_close(fused(x), ref(x), atol=0, rtol=0)


def test_lora_linear_trains_base_weight_and_bias(monkeypatch):
    """A base layer that trains too (its weight and bias not frozen): its output and every gradient are PEFT's bit for
    bit."""
    ref, fused, _ = _pair(torch.float32)
    for m in (ref, fused):
        m.base_model.model.proj.base_layer.weight.requires_grad_(True)
        m.base_model.model.proj.base_layer.bias.requires_grad_(True)
    ran = _spy(monkeypatch)
    x = torch.randn(2, 5, 24)
    (y0, dx0, g0), (y1, dx1, g1) = _run(ref, x), _run(fused, x)
    assert ran == [1] and "base_model.model.proj.base_layer.weight" in g0
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)
    torch.testing.assert_close(dx1, dx0, atol=0, rtol=0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=0, rtol=0, msg=n)


@pytest.mark.parametrize("case", ["merged", "disabled", "two_adapters", "dora", "no_grad", "adapter_names"])
def test_lora_linear_runs_peft_s_forward_where_the_call_does_not_apply(case, monkeypatch):
    """Merged or disabled adapters, two active adapters, DoRA, no gradient and ``adapter_names``: PEFT's own forward
    runs, with its result."""
    kw = {}
    if case == "dora":
        kw = dict(use_dora=True)
    ref, fused, _ = _pair(torch.float32, **kw)
    x = torch.randn(2, 5, 24)
    call = {}
    if case == "merged":
        for m in (ref, fused):
            m.base_model.model.proj.merge()
    if case == "two_adapters":
        ref.add_adapter("second", peft.LoraConfig(r=2, target_modules=["proj"], init_lora_weights=False))
        ref.base_model.set_adapter(["default", "second"])
        fused = copy.deepcopy(ref)
        swap_modules(fused)
    if case == "adapter_names":
        call = dict(adapter_names=["default", "default"])
    ran = _spy(monkeypatch)
    if case == "disabled":
        with ref.disable_adapter():
            y0 = ref(x)
        with fused.disable_adapter():
            y1 = fused(x)
    elif case == "no_grad":
        with torch.no_grad():
            y0, y1 = ref(x), fused(x)
    elif case == "adapter_names":
        y0, y1 = ref.base_model.model.proj(x, **call), fused.base_model.model.proj(x, **call)
    else:
        y0, y1 = ref(x), fused(x)
    assert not ran
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)


def test_quantized_or_hooked_base_is_left_alone():
    """A base layer that is not exactly an nn.Linear is left to PEFT at the swap, with the reason in the report;
    restore puts PEFT's class back."""
    ref, fused, rep = _pair(torch.float32)
    layer = fused.base_model.model.proj
    assert type(layer).__module__ == "fused_layers.integrations._peft"
    restore_modules(fused)
    assert type(layer) is peft.tuners.lora.layer.Linear

    class Quantized(nn.Linear):
        pass

    layer.base_layer.__class__ = Quantized
    rep = swap_modules(fused)
    assert rep.counts().get("lora", 0) == 0
    assert any("not an nn.Linear" in s.reason for s in rep.skipped), str(rep)


def test_lora_bf16_llama_keeps_no_float32_input(monkeypatch):
    """A bf16 tiny Llama with float32 LoRA adapters on the attention (PEFT's defaults), swapped whole: every
    projection's adapter runs the fused call, the loss and adapter gradients are the unswapped model's within bf16
    rounding, and no float32 tensor of the hidden width is kept for the backward."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                           init_lora_weights=False)
    ref = peft.get_peft_model(base, lora)
    fused = copy.deepcopy(ref)
    assert swap_modules(fused).counts()["lora"] == 4
    ran = _spy(monkeypatch)
    ids = torch.randint(0, 48, (2, 10))
    kept = []

    def pack(t):
        kept.append((t.dtype, tuple(t.shape)))
        return t

    losses, grads = [], []
    for model in (ref, fused):
        kept.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        if model is ref:
            assert (torch.float32, (2, 10, 32)) in kept  # PEFT's float32 copies of the projections' inputs
    assert ran == [1, 1, 1, 1]
    assert (torch.float32, (2, 10, 32)) not in kept
    torch.testing.assert_close(losses[1], losses[0], atol=0, rtol=1e-2)
    assert grads[0].keys() == grads[1].keys()
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=5e-2 * g.abs().max().item(), rtol=0, msg=n)


@pytest.mark.gpu
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gpu_lora_linear_llama_size(dropout, autocast):
    """On the GPU at a Llama projection's size (4,096 tokens, 1,024 -> 1,024, r 16, bf16 base, float32 adapter),
    without and with a LoRA dropout (the fused dropout kernel, one seed), without and with bf16 autocast: PEFT's
    output bit for bit (the same cuBLAS calls, the same draw), the input and adapter gradients within float32
    rounding."""
    ref, fused, _ = _pair(torch.bfloat16, size=(1024, 1024), r=16, lora_dropout=dropout)
    ref, fused = ref.cuda(), fused.cuda()
    x = torch.randn(4, 1024, 1024, device="cuda", dtype=torch.bfloat16)
    outs = []
    for model in (ref, fused):
        torch.manual_seed(1)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            outs.append(_run(model, x))
    (y0, dx0, g0), (y1, dx1, g1) = outs
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)
    torch.testing.assert_close(dx1, dx0, atol=1e-2, rtol=1e-2)  # bf16 (one rounding apart at most)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-4 * g0[n].abs().max().item(), rtol=1e-3, msg=n)
