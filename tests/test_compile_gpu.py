"""torch.compile on the GPU: Inductor sees the Triton kernels (triton_op), and CUDA graphs
(mode="reduce-overhead") run every fused module with no graph break, no host sync and no recompile."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from _tol import assert_norm_within_torch
from torch import nn

from fused_layers import FusedAttention, FusedLayerNorm, FusedRMSNorm, FusedSoftmax
from fused_layers.ops import compile_config

pytestmark = pytest.mark.gpu


class _Block(nn.Module):
    """Every fused module once: LayerNorm -> attention -> RMSNorm -> softmax over features."""

    def __init__(self, d=128, h=4):
        super().__init__()
        self.h = h
        self.ln = FusedLayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn = FusedAttention()
        self.rms = FusedRMSNorm(d)
        self.proj = nn.Linear(d, d)
        self.sm = FusedSoftmax(dim=-1)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(self.ln(x)).view(B, S, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        a = self.attn(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        return self.sm(self.proj(self.rms(x + a)))


class _PlainBlock(nn.Module):
    """_Block from torch's own modules alone (nn.LayerNorm, nn.RMSNorm, SDPA, nn.Softmax), the same parameter
    names: the compiled fused block's independent reference, run in float64 (the reference) and in bf16 (PyTorch's
    own error)."""

    def __init__(self, d=128, h=4):
        super().__init__()
        self.h = h
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.rms = nn.RMSNorm(d)
        self.proj = nn.Linear(d, d)
        self.sm = nn.Softmax(dim=-1)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(self.ln(x)).view(B, S, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        return self.sm(self.proj(self.rms(x + a)))


def _plain_refs(model, x):
    """(float64 reference, PyTorch's own bf16) outputs and parameter gradients of _PlainBlock with model's weights,
    for the same loss as _step."""
    outs = []
    for dtype in (torch.float64, x.dtype):
        plain = _PlainBlock(model.qkv.in_features, model.h).to(x.device, dtype)
        plain.rms.eps = model.rms.eps
        plain.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()})
        out = plain(x.to(dtype))
        w = _W[out.shape]
        (out.double() * w.double()).sum().backward()
        outs.append((out, {n: p.grad for n, p in plain.named_parameters()}))
    return outs


_W = {}


def _step(model, x):
    out = model(x)
    gen = torch.Generator(out.device).manual_seed(1)
    w = _W.setdefault(out.shape, torch.randn(out.shape, device=out.device, generator=gen))
    (out.float() * w).sum().backward()
    return out


def test_inductor_emits_our_kernels(monkeypatch):
    from torch._inductor.utils import run_and_get_code

    # the default lets Inductor write the norms
    monkeypatch.setattr(compile_config, "COMPILED", dataclasses.replace(compile_config.COMPILED, layer_norm="kernels",
                                                                         rms_norm="kernels"))
    torch._dynamo.reset()
    model = _Block().cuda().to(torch.bfloat16)
    x = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True)
    _, codes = run_and_get_code(lambda: _step(compiled, x))
    code = "\n".join(codes)
    for name in ("_norm_fwd_kernel", "_attn_fwd_kernel", "_softmax_fwd_kernel"):
        assert name in code, f"{name} not in Inductor's generated code"
    assert "torch.ops.fused_layers" not in code, "an opaque fused_layers op is left in the compiled graph"


@pytest.mark.parametrize("norms,d", [("inductor", 128), ("kernels", 128), ("inductor", 256)],
                         ids=["inductor-D32", "kernels-D32", "inductor-D64"])
def test_reduce_overhead_no_break_no_sync_no_recompile(monkeypatch, norms, d):
    """D32: our attention kernels; D64: the dense case the modules hand to SDPA (cuDNN) on Hopper, compiled with
    the device probe's cache empty, as in a model compiled before any eager call (the probe once broke the graph
    there).  "kernels": Inductor emits the norm kernels too (as it always does for fused_rms_norm_variant)."""
    from fused_layers.ops import attention as attn_ops

    route = "inductor" if norms == "inductor" else "kernels"
    monkeypatch.setattr(compile_config, "COMPILED", dataclasses.replace(compile_config.COMPILED, layer_norm=route,
                                                                         rms_norm=route))
    monkeypatch.setattr(attn_ops, "_CUDNN_FASTER", {})
    import torch._dynamo.utils as dyn_utils

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Block(d).cuda().to(torch.bfloat16)
    ref = _Block(d).cuda().to(torch.bfloat16)
    ref.load_state_dict(model.state_dict())
    dyn_utils.counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(2, 64, d, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):  # warm-up + CUDA graph recording
        for p in model.parameters():
            p.grad = None
        _step(compiled, x)
    torch.cuda.synchronize()
    frames = dict(dyn_utils.counters["stats"])
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            for p in model.parameters():
                p.grad = None
            out = _step(compiled, x)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert not dyn_utils.counters["graph_break"], dict(dyn_utils.counters["graph_break"])
    assert dict(dyn_utils.counters["stats"]) == frames, "recompiled across steps"
    # Against torch's own modules, not the fused eager block: float64 the reference, bf16 eager PyTorch's error;
    # the chain of bf16 roundings compared by relative norms (tests/_tol.py).
    (out64, g64), (out_t, g_t) = _plain_refs(ref, x)
    assert_norm_within_torch(out, out64, out_t, what="output")
    for n, p in model.named_parameters():
        assert_norm_within_torch(p.grad, g64[n], g_t[n], what=f"d{n}")


# --------------------------------------------------------------------------------------------------
# Whole swapped models through Inductor: no graph break, no more graphs or recompiles than unswapped, through
# an eval forward under no_grad first, then training, then eval again (the order of the run whose attention
# frame hit Dynamo's recompile limit on grad_mode).  The sequence is tests/test_compile.py's compile_counts.
# --------------------------------------------------------------------------------------------------
def _gpu_hf(family):
    from test_compile import _hf_model

    m = _hf_model(family, torch.bfloat16, vocab=512, hidden=256, ffn=512, layers=3, heads=4, kv_heads=2,
                  positions=256)
    ids = [torch.randint(0, 512, (2, 256), device="cuda") for _ in range(3)]
    return m.cuda(), [{"input_ids": i, "labels": i} for i in ids], (lambda c, b: c(**b).loss.backward())


def _gpu_encoder():
    from test_compile import _Encoder

    x = [{"x": torch.randn(2, 256, 128, device="cuda", dtype=torch.bfloat16),
          "mask": nn.Transformer.generate_square_subsequent_mask(256, device="cuda", dtype=torch.bfloat16)}
         for _ in range(3)]
    return _Encoder().cuda().to(torch.bfloat16), x, (lambda c, b: c(**b).float().square().sum().backward())


def _gpu_demo_gpt():
    from lm_demo.model import GPT

    m = GPT(vocab_size=512, seq_len=256, d_model=256, n_layer=3, n_head=4).cuda().to(torch.bfloat16)
    b = [{"idx": torch.randint(0, 512, (2, 256), device="cuda"), "targets": torch.randint(0, 512, (2, 256),
                                                                                           device="cuda")}
         for _ in range(3)]
    return m, b, (lambda c, bb: c(**bb).backward())


def _gpu_vit():
    timm = pytest.importorskip("timm")
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10).cuda().to(torch.bfloat16)
    b = [{"x": torch.randn(2, 3, 224, 224, device="cuda", dtype=torch.bfloat16)} for _ in range(3)]
    return m, b, (lambda c, bb: c(**bb).float().square().sum().backward())


_MODELS = {"llama": lambda: _gpu_hf("llama"), "qwen2": lambda: _gpu_hf("qwen2"), "gpt2": lambda: _gpu_hf("gpt2"),
           "gemma": lambda: _gpu_hf("gemma"), "encoder": _gpu_encoder, "demo_gpt": _gpu_demo_gpt, "vit": _gpu_vit}


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["default", "reduce-overhead"])
@pytest.mark.parametrize("name", list(_MODELS))
def test_swapped_models_compile_like_unswapped(name, mode):
    from test_compile import assert_no_worse, compile_counts

    from fused_layers import restore_modules, swap_modules
    from fused_layers.ops import _cpp

    if name in ("llama", "qwen2", "gpt2", "gemma"):
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, batches, step = _MODELS[name]()
    plain = compile_counts(model, batches, step, backend="inductor", mode=mode)
    report = swap_modules(model)
    assert sum(report.counts().values()) > 0

    def ext_built(i):  # eager calls elsewhere in the process (an A/B, an eval) start the C++ build
        if i == 1:
            _cpp.extension(wait=True)

    fused = compile_counts(model, batches, step, backend="inductor", mode=mode, after=ext_built)
    restore_modules(model)
    assert_no_worse(fused, plain)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_compiled_causal_lm_masks_run_the_kernels_gpu(family):
    """Through Inductor, a swapped causal LM whose call fixes its masks (no position ids, no cache) runs every
    attention call on the kernels (no "not fused" warning), padded or not, with the loss and gradients of the
    unswapped model compiled the same way (float32; Gemma 2: local layers with a window shorter than the batch)."""
    import copy
    import warnings

    pytest.importorskip("transformers")
    from test_compile import _call_mask_model

    from fused_layers import swap_modules
    from fused_layers.ops import _common

    ref = _call_mask_model(family).cuda()
    for mod in ref.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0
    model = copy.deepcopy(ref)
    swap_modules(model)
    for key in [k for k in _common._warned if k.startswith("hf_attention:")]:
        _common._warned.discard(key)
    torch._dynamo.reset()
    fused, plain = torch.compile(model), torch.compile(ref)
    ids = torch.randint(0, 64, (2, 32), device="cuda")
    pad = torch.ones(2, 32, dtype=torch.long, device="cuda")
    pad[1, 24:] = 0
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for mask in (None, pad):
            batch = {"input_ids": ids, "labels": ids if mask is None else ids.masked_fill(mask == 0, -100)}
            if mask is not None:
                batch["attention_mask"] = mask
            grads = []
            for m, c in ((model, fused), (ref, plain)):
                m.zero_grad(set_to_none=True)
                loss = c(**batch).loss
                loss.backward()
                grads.append((loss.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}))
            (loss_f, g_f), (loss_p, g_p) = grads
            torch.testing.assert_close(loss_f, loss_p, rtol=1e-3, atol=1e-4)
            assert g_f.keys() == g_p.keys()
            for n in g_p:
                assert _rel_err(g_f[n], g_p[n]) < 2e-3, (n, _rel_err(g_f[n], g_p[n]))
    assert not [x for x in w if "not fused" in str(x.message)], [str(x.message) for x in w]
    torch._dynamo.reset()


class _DecoderOps(nn.Module):
    """RoPE -> residual add + RMSNorm -> SwiGLU, the decoder-layer ops of the functional API."""

    def __init__(self, d=128, h=4, hk=2, inter=256):
        super().__init__()
        self.h, self.hk = h, hk
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d * hk // h)
        self.gate, self.up, self.down = nn.Linear(d, inter), nn.Linear(d, inter), nn.Linear(inter, d)
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x, cos, sin):
        from fused_layers import fused_add_rms_norm, fused_rope, fused_swiglu

        B, S, D = x.shape
        q = self.q(x).view(B, S, self.h, D // self.h).transpose(1, 2)
        k = self.k(x).view(B, S, self.hk, D // self.h).transpose(1, 2)
        q, k = fused_rope(q, k, cos, sin)
        a = (q + k.repeat_interleave(self.h // self.hk, 1)).transpose(1, 2).reshape(B, S, D)
        h, y = fused_add_rms_norm(a, x, self.w, 1e-6, cast_before_weight=True)
        return h + self.down(fused_swiglu(self.gate(y), self.up(y)))


def _rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def test_decoder_ops_compile_to_our_kernels():
    """fullgraph: Inductor emits the RoPE, residual-norm and gated-activation kernels (forward and backward), no
    opaque op is left, and the numbers are the eager model's."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _DecoderOps().cuda().to(torch.bfloat16)
    ref = _DecoderOps().cuda().to(torch.bfloat16)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16)
    fr = torch.arange(64, device="cuda").float()[:, None] / (10000 ** (torch.arange(0, 32, 2, device="cuda") / 32))
    emb = torch.cat((fr, fr), -1)[None].expand(2, -1, -1)
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
    compiled = torch.compile(model, fullgraph=True)
    out, codes = run_and_get_code(lambda: _step(lambda t: compiled(t, cos, sin), x))
    code = "\n".join(codes)
    for name in ("_rope_kernel", "_res_norm_fwd_kernel", "_res_norm_bwd_kernel", "_gated_fwd_kernel",
                 "_gated_bwd_kernel"):
        assert name in code, f"{name} not in Inductor's generated code"
    assert "torch.ops.fused_layers" not in code, "an opaque fused_layers op is left in the compiled graph"
    out_ref = _step(lambda t: ref(t, cos, sin), x)
    assert _rel_err(out, out_ref) < 1e-2
    for (n, p), pr in zip(model.named_parameters(), ref.parameters()):
        assert _rel_err(p.grad, pr.grad) < 3e-2, (n, _rel_err(p.grad, pr.grad))
