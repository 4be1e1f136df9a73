"""ops: each fused op against its peers, forward and forward + backward, in one process.

    python -m benchmarks ops                                  # every op at its default shapes, bf16
    python -m benchmarks ops --ops softmax,cross_entropy --dtypes bf16,fp32

Peers, each where it runs: ``torch`` (PyTorch eager: ``torch.softmax``, ``F.layer_norm``, ``F.rms_norm``,
``F.cross_entropy``, ``F.linear`` + ``F.cross_entropy``), ``compile`` (``torch.compile`` of that same reference),
``liger`` (Liger-Kernel, when installed), and for attention SDPA with its default dispatch (``sdpa``) and each
backend forced (``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``); ``--flex`` adds FlexAttention. The
cross-entropy also runs ``torch_fp32`` (``F.cross_entropy(x.float(), t)``, what Hugging Face's loss does). The
decoder-layer ops (``--ops gated_activation,residual_rms_norm,rope``; rows ``gated_silu``, ``gated_gelu_tanh``,
``residual_rms_norm``, ``rope``) run against the eager formulas of Hugging Face's Llama (``act(gate) * up``;
``h = residual + x`` then ``LlamaRMSNorm``; ``apply_rotary_pos_emb``, Phi-3's partial form), their compiled form and
Liger-Kernel's SwiGLU / GeGLU, fused add + RMSNorm and RoPE.

Method: every implementation is warmed up first (one forward + backward: Triton JIT, torch.compile, the
library's eager C++ fast path, which is built on a background thread and waited for). Then each pass is
timed with ``triton.testing.do_bench`` (timer ``do_bench``: eager calls, host included, L2 flushed) and by
CUDA-graph replay (timer ``graph``: the kernels alone; an implementation that cannot be captured has no
``graph`` row). Inputs requiring grad, as in training: ``fwd`` builds the autograd graph, ``bwd`` is
``torch.autograd.grad`` of a saved forward, ``fwd+bwd`` both. Bandwidth counts the fewest bytes a pass must
move (softmax and norms: forward reads x and writes y, backward reads two tensors and writes dx; cross-entropy:
one read of the logits and one write of their gradient); ``copy_frac`` divides it by a device-to-device
copy's GB/s measured in the same run. Attention reports TFLOP/s (4 B H S^2 D a forward, halved when causal;
backward 2.5x), the linear cross-entropy TFLOP/s of its three matmuls. ``peak_mib``: the allocator's peak
during one fwd+bwd above what was allocated before it.
"""

from __future__ import annotations

import gc
import time
from typing import Callable

from . import utils

OPS = ["softmax", "layer_norm", "rms_norm", "cross_entropy", "linear_cross_entropy", "attention", "gated_activation",
       "residual_rms_norm", "rope"]
ELEMENTS = 2**26  # softmax and norms: rows x width, 128 MiB in bf16: far past L2
WIDTHS = {"softmax": [1024, 4096, 16384, 32768, 65536, 262144],
          "layer_norm": [768, 1024, 2048, 4096, 8192, 16384],
          "rms_norm": [768, 1024, 2048, 4096, 8192, 16384]}
CE_ROWS, CE_VOCABS = 8192, [32000, 50304, 128256, 262144]
# (tokens, hidden, vocab): GPT-2 small (the demo's padded vocabulary, and HF's 50,257: unaligned rows), a Llama-3-sized
# head, and the heads of the models suite's Gemma and Qwen2
LINEAR_CE = [(16384, 768, 50304), (8192, 768, 50257), (8192, 2048, 128256), (4096, 1024, 256000), (8192, 896, 151936)]
# (B, Hq, Hkv, S, D, causal)
ATTENTION = [(16, 16, 16, 1024, 64, False), (16, 16, 16, 1024, 64, True), (16, 16, 16, 1024, 128, False),
             (16, 16, 16, 1024, 128, True), (4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True),
             (4, 32, 8, 4096, 128, True), (1, 16, 16, 16384, 128, True)]
# sliding-window causal attention (B, Hq, Hkv, S, D, window): Mistral's layers at the models suite's size and at 4K,
# Gemma 2's local layers (head dim 128, a 512 window here as in that suite; 4,096 in the real model)
ATTENTION_WINDOW = [(4, 16, 4, 2048, 64, 1024), (2, 16, 4, 4096, 64, 1024), (4, 8, 4, 1024, 128, 512)]
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# decoder layers: (tokens, intermediate size) of Llama 2 7B, Llama 3 8B; the residual + RMSNorm at hidden sizes of
# Llama 3.2 1B ... 70B; RoPE (B, Hq, Hkv, S, D, rotated dims): Llama 3 8B, Phi-2 (partial rotary, 32 of 80)
GATED = [(8192, 11008), (8192, 14336)]
RESIDUAL_WIDTHS = [2048, 4096, 5120, 8192]
ROPE = [(4, 32, 8, 2048, 128, 128), (4, 32, 32, 2048, 80, 32)]


def add_arguments(p) -> None:
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--dtypes", default="bf16", help="softmax and norms: comma-separated of bf16, fp16, fp32")
    p.add_argument("--widths", default="", help="softmax and norms: widths instead of the defaults, e.g. 4096,32768")
    p.add_argument("--timers", default="do_bench,graph", help="do_bench and/or graph")
    p.add_argument("--no-peers", action="store_true", help="time the fused implementation only")
    p.add_argument("--flex", action="store_true", help="attention: also FlexAttention (torch.compile, slow to build)")


def shape_name(*dims: int) -> str:
    return "x".join(str(d) for d in dims)


def attention_name(B, Hq, Hkv, S, D, causal) -> str:
    heads = f"H{Hq}" if Hq == Hkv else f"Hq{Hq} Hkv{Hkv}"
    return f"B{B} {heads} S{S} D{D}" + (" causal" if causal else "")


class Runner:
    """Times callables with the chosen timers and turns them into table rows."""

    def __init__(self, args, env: dict):
        import torch

        self.args, self.env = args, env
        self.smoke = args.smoke
        self.dev = "cpu" if self.smoke else "cuda"
        self.timers = ["wall"] if self.smoke else [t for t in args.timers.split(",") if t]
        self.copy = float("nan") if self.smoke else utils.copy_gbps()
        if not self.smoke:
            print(f"[ops] device copy {self.copy:.0f} GB/s on {torch.cuda.get_device_name()}", flush=True)
        self.rows: list[dict] = []

    def time(self, timer: str, fn: Callable, setup: Callable | None = None) -> float:
        if timer == "wall":  # --smoke: one call, wall clock (checks the code path only)
            state = setup() if setup else None
            t0 = time.perf_counter()
            fn(state) if setup else fn()
            return (time.perf_counter() - t0) * 1e3
        if timer == "graph":
            return utils.graph_ms(fn, setup=setup)
        if setup is not None:
            state = setup()
            return utils.do_bench_ms(lambda: fn(state))
        return utils.do_bench_ms(fn)

    def peak(self, fn: Callable) -> float:
        return float("nan") if self.smoke else utils.peak_extra_mib(fn)

    def record(self, op, pass_, dtype, shape, impl, timer, ms, nbytes=None, flops=None, peak=None, note=""):
        row = dict(self.env, op=op, **{"pass": pass_}, dtype=dtype, shape=shape, impl=impl, timer=timer, ms=ms,
                   peak_mib=peak, note=note)
        if nbytes:
            row["gbps"] = nbytes / ms / 1e6
            row["copy_frac"] = row["gbps"] / self.copy
        if flops:
            row["tflops"] = flops / ms / 1e9
        self.rows.append(row)
        extra = f"{row['copy_frac']:.3f} of copy" if nbytes else (f"{row['tflops']:.0f} TFLOP/s" if flops else "")
        print(f"  {op:>20} {pass_:>7} {dtype:>5} {shape:>26} {impl:>15} {timer:>8}: {ms:9.4f} ms  {extra}", flush=True)

    def run_impl(self, op, dtype, shape, impl, fwd: Callable, leaves, grad_out, passes, nbytes=None, flops=None,
                 graph_ok=True):
        """Warm up ``fwd`` (a callable returning the output), then time each pass with each timer (``graph_ok``:
        False for an implementation known not to be capture-safe)."""
        import torch

        def grad_of(y):
            return torch.autograd.grad(y, leaves, grad_out, retain_graph=True)

        def fwd_bwd():
            return torch.autograd.grad(fwd(), leaves, grad_out)

        try:
            for _ in range(2):
                fwd_bwd()
            utils.wait_for_fast_path()
            fwd_bwd()
            peak = self.peak(fwd_bwd)
        except Exception as e:  # noqa: BLE001 - a peer that cannot run this case: say so, go on
            print(f"  {op} {shape} {impl}: cannot run ({type(e).__name__}: {str(e)[:160]})", flush=True)
            return
        calls = {"fwd": (fwd, None), "bwd": (grad_of, fwd), "fwd+bwd": (fwd_bwd, None)}
        for p in passes:
            for timer in self.timers:
                if timer == "graph" and not graph_ok:
                    continue
                try:
                    ms = self.time(timer, *calls[p])
                except Exception as e:  # noqa: BLE001 - e.g. a peer that cannot be captured in a CUDA graph
                    print(f"  {op} {shape} {impl} {p}: no {timer} timing ({type(e).__name__}: {str(e)[:120]})")
                    if not self.smoke:
                        torch.cuda.synchronize()
                    continue
                self.record(op, p, dtype, shape, impl, timer, ms, nbytes=(nbytes or {}).get(p),
                            flops=(flops or {}).get(p), peak=peak if p == "fwd+bwd" else None)

    def free(self):
        import torch

        gc.collect()
        if not self.smoke:
            torch.cuda.empty_cache()


def _compile(fn):
    import torch

    return torch.compile(fn, dynamic=False)


def _liger(name: str):
    """A Liger-Kernel implementation, or None when Liger is not installed (or lacks it)."""
    try:
        if name == "softmax":
            from liger_kernel.ops.softmax import LigerSoftmaxFunction

            return lambda x: LigerSoftmaxFunction.apply(x)
        if name == "layer_norm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return lambda x, w, b, eps: LigerLayerNormFunction.apply(x, w, b, eps)
        if name == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            return lambda x, w, eps: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)
        if name == "cross_entropy":
            from liger_kernel.transformers import LigerCrossEntropyLoss

            return LigerCrossEntropyLoss()
        if name == "linear_cross_entropy":
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            loss = LigerFusedLinearCrossEntropyLoss()
            return lambda h, w, t: loss(w, h, t)
    except Exception:  # noqa: BLE001 - Liger is optional
        return None
    return None


def bench_softmax(r: Runner, dtype: str, widths, peers: bool):
    import torch

    from fused_layers import fused_softmax

    impls = {"fused": lambda x: fused_softmax(x, -1)}
    if peers:
        impls["torch"] = lambda x: torch.softmax(x, -1)
        if not r.smoke:
            impls["compile"] = _compile(lambda x: torch.softmax(x, -1))
            if _liger("softmax"):
                impls["liger"] = _liger("softmax")
    dt = getattr(torch, DTYPES[dtype])
    for n in widths:
        rows = max(1, (64 if r.smoke else ELEMENTS) // n)
        x = torch.randn(rows, n, device=r.dev, dtype=dt, requires_grad=True)
        dy = torch.randn_like(x)
        e = x.numel() * x.element_size()
        for name, f in impls.items():
            r.run_impl("softmax", dtype, shape_name(rows, n), name, lambda f=f: f(x), [x], dy,
                       ("fwd", "bwd", "fwd+bwd"), nbytes={"fwd": 2 * e, "bwd": 3 * e, "fwd+bwd": 5 * e})
        x = dy = None
        r.free()


def bench_norm(r: Runner, op: str, dtype: str, widths, peers: bool):
    import torch
    import torch.nn.functional as F

    from fused_layers import fused_layer_norm, fused_rms_norm

    eps = 1e-5 if op == "layer_norm" else 1e-6
    if op == "layer_norm":
        ref = lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps)  # noqa: E731
        impls = {"fused": lambda x, w, b: fused_layer_norm(x, (x.shape[-1],), w, b, eps)}
    else:
        ref = lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, eps)  # noqa: E731
        impls = {"fused": lambda x, w, b: fused_rms_norm(x, (x.shape[-1],), w, eps)}
    if peers:
        impls["torch"] = ref
        if not r.smoke:
            impls["compile"] = _compile(ref)
            lg = _liger(op)
            if lg is not None and op == "layer_norm":
                impls["liger"] = lambda x, w, b: lg(x, w, b, eps)
            elif lg is not None:
                impls["liger"] = lambda x, w, b: lg(x, w, eps)
    dt = getattr(torch, DTYPES[dtype])
    for n in widths:
        rows = max(1, (64 if r.smoke else ELEMENTS) // n)
        x = torch.randn(rows, n, device=r.dev, dtype=dt, requires_grad=True)
        w = torch.randn(n, device=r.dev, dtype=dt, requires_grad=True)
        b = torch.randn(n, device=r.dev, dtype=dt, requires_grad=True) if op == "layer_norm" else None
        leaves = [t for t in (x, w, b) if t is not None]
        dy = torch.randn_like(x)
        e = x.numel() * x.element_size()
        for name, f in impls.items():
            r.run_impl(op, dtype, shape_name(rows, n), name, lambda f=f: f(x, w, b), leaves, dy,
                       ("fwd", "bwd", "fwd+bwd"), nbytes={"fwd": 2 * e, "bwd": 3 * e, "fwd+bwd": 5 * e})
        x = w = b = dy = leaves = None
        r.free()


def bench_cross_entropy(r: Runner, peers: bool):
    import torch
    import torch.nn.functional as F

    from fused_layers import fused_cross_entropy

    impls = {"fused": fused_cross_entropy}
    if peers:
        impls["torch"] = F.cross_entropy
        impls["torch_fp32"] = lambda x, t: F.cross_entropy(x.float(), t)
        if not r.smoke:
            impls["compile"] = _compile(lambda x, t: F.cross_entropy(x.float(), t))
            if _liger("cross_entropy") is not None:
                impls["liger"] = _liger("cross_entropy")
    rows = 16 if r.smoke else CE_ROWS
    for v in ([64, 1000] if r.smoke else CE_VOCABS):
        x = (torch.randn(rows, v, device=r.dev) * 2).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, v, (rows,), device=r.dev)
        e = x.numel() * x.element_size()
        for name, f in impls.items():
            r.run_impl("cross_entropy", "bf16", shape_name(rows, v), name, lambda f=f: f(x, t), [x], None,
                       ("fwd+bwd",), nbytes={"fwd+bwd": 2 * e}, graph_ok=name != "liger")  # Liger's: not capture-safe
        x = t = None
        r.free()


def bench_linear_cross_entropy(r: Runner, peers: bool):
    import torch
    import torch.nn.functional as F

    from fused_layers import fused_linear_cross_entropy

    def ref(h, w, t):
        return F.cross_entropy(F.linear(h, w).float(), t)

    impls = {"fused": fused_linear_cross_entropy}
    if peers:
        impls["torch"] = ref
        if not r.smoke:
            impls["compile"] = _compile(ref)
            if _liger("linear_cross_entropy") is not None:
                impls["liger"] = _liger("linear_cross_entropy")
    for n, d, v in ([(32, 16, 64)] if r.smoke else LINEAR_CE):
        h = torch.randn(n, d, device=r.dev, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(v, d, device=r.dev) * 0.02).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, v, (n,), device=r.dev)
        for name, f in impls.items():
            r.run_impl("linear_cross_entropy", "bf16", shape_name(n, d, v), name, lambda f=f: f(h, w, t), [h, w],
                       None, ("fwd+bwd",), flops={"fwd+bwd": 6.0 * n * d * v}, graph_ok=name != "liger")
        frozen = w.detach()  # a head that does not train (LoRA): no weight gradient, a third fewer FLOPs
        for name, f in impls.items():
            r.run_impl("linear_cross_entropy", "bf16", shape_name(n, d, v) + " frozen weight", name,
                       lambda f=f: f(h, frozen, t), [h], None, ("fwd+bwd",), flops={"fwd+bwd": 4.0 * n * d * v},
                       graph_ok=name != "liger")
        h = w = t = frozen = None
        r.free()


def bench_attention(r: Runner, peers: bool, flex: bool):
    import torch
    import torch.nn.functional as F

    from fused_layers import fused_attention

    def sdpa(backend=None):
        def f(q, k, v, causal, gqa):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        return f

    # fused: the kernels at every shape; fused_auto: fused_attention's default (SDPA where cuDNN is faster)
    impls = {"fused": lambda q, k, v, causal, gqa: fused_attention(q, k, v, is_causal=causal, enable_gqa=gqa,
                                                                   backend="triton"),
             "fused_auto": lambda q, k, v, causal, gqa: fused_attention(q, k, v, is_causal=causal, enable_gqa=gqa)}
    if peers:
        impls["sdpa"] = sdpa()
        if not r.smoke:
            from torch.nn.attention import SDPBackend

            impls.update(sdpa_flash=sdpa(SDPBackend.FLASH_ATTENTION), sdpa_cudnn=sdpa(SDPBackend.CUDNN_ATTENTION),
                         sdpa_efficient=sdpa(SDPBackend.EFFICIENT_ATTENTION))
    cases = [(1, 2, 2, 32, 16, True)] if r.smoke else ATTENTION
    for B, Hq, Hkv, S, D, causal in cases:
        gqa = Hq != Hkv
        dt = torch.float32 if r.smoke else torch.bfloat16
        q = torch.randn(B, Hq, S, D, device=r.dev, dtype=dt, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device=r.dev, dtype=dt, requires_grad=True)
        v = torch.randn(B, Hkv, S, D, device=r.dev, dtype=dt, requires_grad=True)
        do = torch.randn_like(q)
        fl = 4.0 * B * Hq * S * S * D / (2 if causal else 1)
        case_impls = dict(impls)
        if flex and not r.smoke:
            case_impls["flex"] = _flex(causal, S)
        for name, f in case_impls.items():
            r.run_impl("attention", "bf16" if not r.smoke else "fp32", attention_name(B, Hq, Hkv, S, D, causal), name,
                       lambda f=f: f(q, k, v, causal, gqa), [q, k, v], do, ("fwd", "bwd", "fwd+bwd"),
                       flops={"fwd": fl, "bwd": 2.5 * fl, "fwd+bwd": 3.5 * fl})
        q = k = v = do = None
        r.free()
    _bench_window(r, peers, flex)


def _bench_window(r: Runner, peers: bool, flex: bool):
    """Sliding-window causal attention: ``fused_attention(window=W)`` (key tiles outside the band skipped) against
    SDPA on the materialized band mask (what an unfused HF model with a sliding window runs) and FlexAttention's
    sliding-window block mask (``--flex``).  FLOPs count the band only: S W - W (W - 1) / 2 keys a head."""
    import torch
    import torch.nn.functional as F

    from fused_layers import fused_attention

    for B, Hq, Hkv, S, D, W in [(1, 2, 1, 64, 16, 24)] if r.smoke else ATTENTION_WINDOW:
        dt = torch.float32 if r.smoke else torch.bfloat16
        q = torch.randn(B, Hq, S, D, device=r.dev, dtype=dt, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device=r.dev, dtype=dt, requires_grad=True)
        v = torch.randn(B, Hkv, S, D, device=r.dev, dtype=dt, requires_grad=True)
        do = torch.randn_like(q)
        i = torch.arange(S, device=r.dev)
        band = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - W)  # query i sees keys (i - W, i]
        impls = {"fused": lambda: fused_attention(q, k, v, is_causal=True, enable_gqa=True, window=W)}
        if peers:
            impls["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=band, enable_gqa=True)
            if flex and not r.smoke:
                from torch.nn.attention.flex_attention import create_block_mask, flex_attention

                compiled = torch.compile(flex_attention, dynamic=False)
                bm = create_block_mask(lambda b, h, qi, kv: (qi >= kv) & (qi - kv < W), None, None, S, S,
                                       device="cuda")
                impls["flex"] = lambda: compiled(q, k, v, block_mask=bm, enable_gqa=True)
        fl = 4.0 * B * Hq * D * (S * W - W * (W - 1) / 2)
        name = attention_name(B, Hq, Hkv, S, D, True) + f" window{W}"
        for impl, f in impls.items():
            r.run_impl("attention", "bf16" if not r.smoke else "fp32", name, impl, f, [q, k, v], do,
                       ("fwd", "bwd", "fwd+bwd"), flops={"fwd": fl, "bwd": 2.5 * fl, "fwd+bwd": 3.5 * fl})
        q = k = v = do = band = None
        r.free()


def _flex(causal: bool, S: int):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, S, S, device="cuda") if causal else None
    return lambda q, k, v, causal_, gqa: compiled(q, k, v, block_mask=bm, enable_gqa=gqa)


def _liger_decoder(name: str):
    """Liger-Kernel's SwiGLU / GeGLU product, fused add + RMSNorm (Llama casting) and RoPE, or None."""
    try:
        if name == "silu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            return LigerSiLUMulFunction.apply
        if name == "gelu_tanh":
            from liger_kernel.ops.geglu import LigerGELUMulFunction

            return LigerGELUMulFunction.apply
        if name == "residual_rms_norm":  # (its two outputs: the normalized row and the sum, in either order)
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

            return lambda x, res, w: LigerFusedAddRMSNormFunction.apply(x, res, w, 1e-6, 0.0, "llama", False)
        if name == "rope":
            from liger_kernel.transformers.rope import liger_rotary_pos_emb

            return liger_rotary_pos_emb
    except Exception:  # noqa: BLE001 - Liger is optional
        return None
    return None


def bench_gated(r: Runner, peers: bool):
    """act(gate) * up: bytes a pass must move: forward reads gate and up and writes y, backward reads dy, gate, up
    and writes both gradients."""
    import torch
    import torch.nn.functional as F

    from fused_layers import fused_gated_activation

    for act in ("silu", "gelu_tanh"):
        ref = (lambda g, u: F.silu(g) * u) if act == "silu" else (lambda g, u: F.gelu(g, approximate="tanh") * u)
        impls = {"fused": lambda g, u, act=act: fused_gated_activation(g, u, act)}
        if peers:
            impls["torch"] = ref
            if not r.smoke:
                impls["compile"] = _compile(ref)
                if _liger_decoder(act) is not None:
                    impls["liger"] = _liger_decoder(act)
        for n, inter in ([(16, 40)] if r.smoke else GATED):
            g = torch.randn(n, inter, device=r.dev, dtype=torch.bfloat16, requires_grad=True)
            u = torch.randn_like(g, requires_grad=True)
            dy = torch.randn_like(g)
            e = g.numel() * g.element_size()
            for name, f in impls.items():
                r.run_impl(f"gated_{act}", "bf16", shape_name(n, inter), name, lambda f=f: f(g, u), [g, u], dy,
                           ("fwd", "bwd", "fwd+bwd"), nbytes={"fwd": 3 * e, "bwd": 5 * e, "fwd+bwd": 8 * e})
            g = u = dy = None
            r.free()


def bench_residual_norm(r: Runner, peers: bool):
    """h = x + residual and Llama's RMSNorm of h (both outputs, both gradients): forward reads x and the residual and
    writes h and y, backward reads h, dy and dh and writes dx (the residual's gradient is the same tensor)."""
    import torch

    from fused_layers import fused_add_rms_norm

    def ref(x, res, w):
        h = res + x
        hf = h.float()
        return h, w * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)

    impls = {"fused": lambda x, res, w: fused_add_rms_norm(x, res, w, 1e-6, cast_before_weight=True)}
    if peers:
        impls["torch"] = ref
        if not r.smoke:
            impls["compile"] = _compile(ref)
            if _liger_decoder("residual_rms_norm") is not None:
                impls["liger"] = _liger_decoder("residual_rms_norm")
    for n in ([64] if r.smoke else RESIDUAL_WIDTHS):
        rows = max(1, (64 if r.smoke else ELEMENTS) // n)
        x = torch.randn(rows, n, device=r.dev, dtype=torch.bfloat16, requires_grad=True)
        res = torch.randn_like(x, requires_grad=True)
        w = torch.randn(n, device=r.dev, dtype=torch.bfloat16, requires_grad=True)
        grads = (torch.randn_like(x), torch.randn_like(x))
        e = x.numel() * x.element_size()
        for name, f in impls.items():
            r.run_impl("residual_rms_norm", "bf16", shape_name(rows, n), name, lambda f=f: f(x, res, w), [x, res, w],
                       grads, ("fwd", "bwd", "fwd+bwd"), nbytes={"fwd": 4 * e, "bwd": 4 * e, "fwd+bwd": 8 * e})
        x = res = w = grads = None
        r.free()


def bench_rope(r: Runner, peers: bool):
    """RoPE of q and k from HF's (B, S, D_rot) cos / sin, q and k in HF's layout (a transposed projection output):
    each pass reads q and k and writes their result (cos / sin not counted)."""
    import torch

    from fused_layers import fused_rope

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def ref(q, k, cos, sin):  # HF's (Phi-3's form: partial rotary)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        d = c.shape[-1]
        qr, kr = q[..., :d], k[..., :d]
        return (torch.cat([qr * c + rotate_half(qr) * s, q[..., d:]], -1),
                torch.cat([kr * c + rotate_half(kr) * s, k[..., d:]], -1))

    impls = {"fused": fused_rope}
    if peers:
        impls["torch"] = ref
        if not r.smoke:
            impls["compile"] = _compile(ref)
            lg = _liger_decoder("rope")
            if lg is not None:
                impls["liger"] = lambda q, k, cos, sin: lg(q, k, cos, sin)
    for B, hq, hk, S, D, d_rot in ([(1, 2, 1, 8, 16, 16)] if r.smoke else ROPE):
        q = torch.randn(B, S, hq, D, device=r.dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        k = torch.randn(B, S, hk, D, device=r.dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        inv = 1.0 / (10000.0 ** (torch.arange(0, d_rot, 2, device=r.dev).float() / d_rot))
        fr = torch.arange(S, device=r.dev).float()[:, None] * inv
        emb = torch.cat((fr, fr), -1)[None].expand(B, -1, -1)
        cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
        grads = (torch.randn(q.shape, device=r.dev, dtype=torch.bfloat16),
                 torch.randn(k.shape, device=r.dev, dtype=torch.bfloat16))
        e = (q.numel() + k.numel()) * q.element_size()
        for name, f in impls.items():
            if name == "liger" and d_rot != D:
                continue  # (Liger's RoPE rotates the whole head)
            r.run_impl("rope", "bf16", f"B{B} Hq{hq} Hkv{hk} S{S} D{D} rot{d_rot}", name,
                       lambda f=f: f(q, k, cos, sin), [q, k], grads, ("fwd", "bwd", "fwd+bwd"),
                       nbytes={"fwd": 2 * e, "bwd": 2 * e, "fwd+bwd": 4 * e})
        q = k = cos = sin = grads = None
        r.free()


def run(args) -> int:
    utils.require_cuda("ops", args.smoke)
    import torch

    ops = [o for o in args.ops.split(",") if o]
    bad = sorted(set(ops) - set(OPS))
    if bad:
        print(f"python -m benchmarks ops: unknown op(s) {bad}; choose from {OPS}")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config

    # one compiled graph per shape for the compile peers (more than Dynamo's default 8 recompiles of a function),
    # and no donated buffers: the backward is timed with retain_graph=True
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), 256))
    functorch_config.donated_buffer = False
    r = Runner(args, utils.environment())
    peers = not args.no_peers
    widths = [int(w) for w in args.widths.split(",") if w]
    for op in ops:
        print(f"[ops] {op}", flush=True)
        if op == "softmax" or op in ("layer_norm", "rms_norm"):
            for dtype in [d for d in args.dtypes.split(",") if d]:
                ws = [64, 1000] if r.smoke else (widths or WIDTHS[op])
                if op == "softmax":
                    bench_softmax(r, dtype, ws, peers)
                else:
                    bench_norm(r, op, dtype, ws, peers)
        elif op == "cross_entropy":
            bench_cross_entropy(r, peers)
        elif op == "linear_cross_entropy":
            bench_linear_cross_entropy(r, peers)
        elif op == "gated_activation":
            bench_gated(r, peers)
        elif op == "residual_rms_norm":
            bench_residual_norm(r, peers)
        elif op == "rope":
            bench_rope(r, peers)
        else:
            bench_attention(r, peers, args.flex)
    utils.write_results(args, "ops", r.rows)
    return 0
