"""Cross-entropy benchmark (H200): fused-layers against PyTorch eager, torch.compile and Liger-Kernel.

    python benchmarks/bench_cross_entropy.py --out $OUT            # full run (GPU), json + md
    python benchmarks/bench_cross_entropy.py --out /tmp/x --quick  # two vocabularies, fewer reps
    python benchmarks/bench_cross_entropy.py --out $OUT --sweep    # wide-row config sweep first, + a tuned row

Part 1, the loss on bf16 logits (8,192 rows, vocab 32,000 / 50,304 / 128,256 / 262,144), forward +
backward (``loss.backward()``, the logits' gradient written) per provider:

* ``fused``: ``fused_cross_entropy(x, t)`` (gradient computed in the forward, backward scales it);
* ``torch_fp32``: ``F.cross_entropy(x.float(), t)`` (what LM code writes);
* ``torch_bf16``: ``F.cross_entropy(x, t)``;
* ``compile_fp32``: ``torch.compile`` of ``torch_fp32``;
* ``liger``: ``LigerCrossEntropyLoss()(x, t)`` (when liger_kernel is installed).

``frac`` = (one read of the logits + one write of their gradient) / time / copy bandwidth, where the
copy bandwidth is measured in the same run (a 2 GiB device-to-device ``copy_``; the H200 ceiling
recorded for this project is 4.22 TB/s).  ``extra_MB`` = peak memory during forward + backward above
what was allocated before (logits, targets) minus the gradient itself (which every provider returns).

Part 2, LM head + loss at GPT-2-small shapes (16 x 1024 tokens, d 768, V 50,304): the unfused
``F.cross_entropy(F.linear(h, W).float(), t)`` against ``fused_linear_cross_entropy`` (and Liger's
``LigerFusedLinearCrossEntropyLoss``), in bf16 (h and W bf16) and under bf16 autocast (h, W float32,
as in the demo LM), time of forward + backward (grads of h and W) and peak memory above the inputs.

Timings: ``triton.testing.do_bench`` medians after a warm-up call (do_bench flushes L2 between calls;
eager calls: at these sizes each call is hundreds of microseconds, so host time is a small part).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402  (CUDA-graph replay medians)

COPY_CEILING_GBS = 4220.0
VOCABS = [32000, 50304, 128256, 262144]
ROWS = 8192
DEV = "cuda"
LINEAR_SHAPE = (16 * 1024, 768, 50304)  # tokens, d, V


def _empty_cache():
    if DEV == "cuda":
        torch.cuda.empty_cache()


def dry_run_setup():
    """--cpu-check: the whole script on tiny shapes on the CPU (Triton interpreter), to check its plumbing.
    Timings and memory are meaningless there."""
    global DEV, ROWS, VOCABS, LINEAR_SHAPE, do_bench, peak_extra_mb, measure_copy
    os.environ["TRITON_INTERPRET"] = "1"
    DEV, ROWS, VOCABS, LINEAR_SHAPE = "cpu", 4, [1000, 50304], (300, 16, 1000)

    def _bench(fn, grad_to_none=None, rep=100):
        for g in grad_to_none or ():
            g.grad = None
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    do_bench = _bench
    peak_extra_mb = lambda fn, *a: (fn(), 0.0)[1]  # noqa: E731
    measure_copy = lambda: COPY_CEILING_GBS  # noqa: E731


def do_bench(fn, grad_to_none=None, rep=100):
    from triton.testing import do_bench as _db

    return _db(fn, warmup=25, rep=rep, grad_to_none=grad_to_none, return_mode="median")


def measure_copy(nbytes: int = 2**31) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=DEV).normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src))
    src = dst = None
    return 2 * nbytes / ms / 1e6  # GB/s


def ce_providers():
    from fused_layers import fused_cross_entropy

    torch._dynamo.config.cache_size_limit = 64
    if DEV == "cpu":  # --cpu-check: no torch.compile (minutes on a CPU), no liger (GPU only)
        return {"fused": lambda x, t: fused_cross_entropy(x, t), "torch_fp32": lambda x, t: F.cross_entropy(x.float(), t)}
    out = {
        "fused": lambda x, t: fused_cross_entropy(x, t),
        "torch_fp32": lambda x, t: F.cross_entropy(x.float(), t),
        "torch_bf16": lambda x, t: F.cross_entropy(x, t),
        "compile_fp32": torch.compile(lambda x, t: F.cross_entropy(x.float(), t), dynamic=False),
    }
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss

        out["liger"] = LigerCrossEntropyLoss()
    except Exception as e:  # noqa: BLE001 - liger is optional
        print(f"[liger_kernel not available: {type(e).__name__}: {e}]")
    return out


def peak_extra_mb(fn, base_tensors_grad: torch.Tensor | None = None) -> float:
    """Peak allocated memory during fn() above the memory allocated before it, in MB (minus the grads kept)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    return peak / 1e6


def bench_ce(vocabs, rep, copy_gbs, tuned=None):
    from fused_layers import fused_cross_entropy
    from fused_layers.ops._common import config_override

    rows = []
    base = ce_providers()
    for v in vocabs:
        provs = dict(base)
        if tuned and v in tuned:
            cfg = {k: val for k, val in tuned[v].items() if k != "name"}

            def fused_tuned(x, t):
                return fused_cross_entropy(x, t)

            # The override is entered once around the whole measurement (below), not per call: entering it
            # changes the plan-cache epoch, so a per-call override would re-plan (host time) on every call.
            fused_tuned.override = cfg
            provs = {"fused": provs.pop("fused"), f"fused_tuned[{tuned[v]['name']}]": fused_tuned, **provs}
        x = (torch.randn(ROWS, v, device=DEV) * 2).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, v, (ROWS,), device=DEV)
        ref = F.cross_entropy(x.detach().float(), t).item()
        nbytes = 2 * x.numel() * x.element_size()  # one read of x, one write of dx
        for name, f in provs.items():
            def step(f=f):
                f(x, t).backward()

            override = getattr(f, "override", None)
            ctx = config_override("cross_entropy", **override) if override else contextlib.nullcontext()
            try:
                with ctx:
                    x.grad = None
                    loss = f(x, t)
                    err = abs(loss.item() - ref)
                    loss.backward()
                    dx = x.grad.detach().clone() if name.startswith("fused") else None
                    x.grad = None
                    ms = do_bench(step, grad_to_none=[x], rep=rep)
                    x.grad = None
                    extra = peak_extra_mb(step) - x.numel() * x.element_size() / 1e6
                    x.grad = None
                    # The same step by CUDA-graph replay: no host in the timing (the eager number above keeps
                    # what a training step pays, the few small launches around the main kernel included).
                    ms_graph = float("nan")
                    del loss
                    if DEV == "cuda" and not name.startswith("liger"):  # (Liger's loss is not capture-safe)
                        # A fresh leaf: its AccumulateGrad node is made on the capture stream.  With x's node, made
                        # on the default stream by the eager calls above, the backward's accumulation ran there and
                        # invalidated the capture (session 12, issue10/run18_b/ce_table.log), which also left the
                        # CUDA generator unusable for the next width's torch.randn.
                        xg = x.detach().requires_grad_()

                        def step_graph(f=f, xg=xg):
                            f(xg, t).backward()

                        try:
                            ms_graph = _timing._graph_ms(step_graph, [xg], rep)
                        except Exception as e:  # noqa: BLE001 - a provider that cannot be captured
                            print(f"[{name} V={v}: no graph replay: {type(e).__name__}: {str(e)[:120]}]")
                            torch.cuda.synchronize()
                        x.grad = None
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"[{name} V={v} failed: {type(e).__name__}: {str(e)[:200]}]")
                _empty_cache()
                continue
            gbs = nbytes / ms / 1e6
            row = dict(part="ce", provider=name, vocab=v, rows=ROWS, ms=ms, gbs=gbs, frac=gbs / copy_gbs,
                       extra_MB=extra, loss_abs_err=err, ms_graph=ms_graph,
                       frac_graph=nbytes / ms_graph / 1e6 / copy_gbs)
            if dx is not None:  # gradient check of ours against float32 torch (one sample row set)
                xr = x.detach()[:256].float().requires_grad_()  # noqa: F841 (rows beyond ROWS are cut)
                F.cross_entropy(xr, t[:256], reduction="sum").backward()
                row["grad_max_err"] = (dx[:256].float() * ROWS - xr.grad).abs().max().item()
            rows.append(row)
            print(f"CE V={v:>6} {name:>13}: {ms:8.3f} ms  {gbs:7.0f} GB/s  frac {gbs / copy_gbs:5.3f}  "
                  f"(graph replay {row['frac_graph']:5.3f})  extra {extra:8.0f} MB  |loss err| {err:.2e}", flush=True)
        x = t = None  # free before the next width
        _empty_cache()
    return rows


_PF = dict(wide_mode=1, prefetch=1, reverse=1, lane_max=1)  # per-lane max, prefetch, reversed gradient pass (default)
_PF2 = dict(_PF, prefetch=2)  # two chunks loaded ahead
# The persistent candidates (cross-entropy wide_mode 3, softmax wide_mode 2): name -> (piece columns, warps, most
# programs per SM, LEAN form).
PERSIST_CANDIDATES = {
    name: dict(persist_block=block, persist_warps=warps, persist_per_sm=per_sm, **(dict(persist_lean=True) if lean else {}))
    for name, (block, warps, per_sm, lean) in {
        "2k_w2": (2048, 2, 16, False), "2k_w4": (2048, 4, 16, False), "4k_w4": (4096, 4, 8, False),
        "4k_w8": (4096, 8, 8, False), "8k_w8": (8192, 8, 4, False), "8k_w16": (8192, 16, 4, False),
        "16k_w16": (16384, 16, 2, False),
        "2k_w4_lean": (2048, 4, 16, True), "4k_w4_lean": (4096, 4, 8, True), "4k_w8_lean": (4096, 8, 8, True),
    }.items()
}
# The SMEM-pipelined form (persist_stages: one row in registers, the next rows' piece loads in flight by cp.async,
# the wait a function call; benchmarks/scan_persist_stages.py for registers / shared memory): name -> (piece, warps, stages).
PERSIST_CANDIDATES.update({
    f"smem_{block // 1024}k_w{warps}_st{st}": dict(persist_block=block, persist_warps=warps, persist_per_sm=16, persist_stages=st)
    for block, warps, st in ((4096, 4, 3), (4096, 4, 4), (2048, 4, 3), (2048, 4, 4), (4096, 8, 3), (8192, 8, 3),
                             (4096, 4, 2), (2048, 4, 2), (8192, 8, 2), (8192, 4, 2),
                             (4096, 4, 5), (4096, 4, 6), (8192, 4, 3), (8192, 4, 4))
})
# The SMEM form with LEAN (the statistics pass's exponentials kept for the output / gradient: one exp2 a value
# instead of two; bf16 moves twice fp32's values per byte, and its forward at 0.80-0.84 of copy against fp32's
# 0.88-0.93 at 32K-64K may be the MUFU's share; sm_90 (Triton 3.6): softmax MUFU 38 against 69, the same 56 registers;
# CE 110-112 registers against 72-96, so fewer programs an SM; session 11, not
# yet timed): softmax (persist_*) and CE (persist_*) candidates alike.
PERSIST_CANDIDATES.update({
    f"smem_{block // 1024}k_w{warps}_st{st}_lean": dict(persist_block=block, persist_warps=warps, persist_per_sm=16,
                                                       persist_stages=st, persist_lean=True)
    for block, warps, st in ((4096, 4, 3), (4096, 4, 4), (8192, 8, 3))
})
# The SMEM form with HOLD (softmax only: row k - 1 written after row k is published, from its piece held in registers;
# session 12, not yet timed; sm_90 with Triton 3.6, bf16 fwd / bwd registers: 4K x 4 warps 128 / 128 against the
# default's 56 / 119, 2K x 4 warps 64 / 80: benchmarks/results/issue9/hold_static_scan_sm90_triton36.txt).
PERSIST_CANDIDATES.update({
    f"smem_{block // 1024}k_w{warps}_st{st}_hold": dict(persist_block=block, persist_warps=warps, persist_per_sm=16,
                                                       persist_stages=st, persist_hold=True)
    for block, warps, st in ((4096, 4, 3), (4096, 8, 3), (2048, 4, 3))
})
SWEEP = {
    # one program per row, two passes, the second read from L2
    "stream_8k_w16_base": dict(wide_mode=1, block_n=8192, num_warps=16, prefetch=0, reverse=0, lane_max=0),  # run4's
    "stream_8k_w16_rowmax": dict(_PF, block_n=8192, num_warps=16, lane_max=0),  # max per row (the default until session 4)
    "stream_8k_w16": dict(_PF, block_n=8192, num_warps=16),  # per-lane max
    "stream_8k_w16_pf2": dict(_PF2, block_n=8192, num_warps=16),
    "stream_4k_w8": dict(_PF, block_n=4096, num_warps=8),  # same values per thread, more programs per SM
    "stream_4k_w8_pf2": dict(_PF2, block_n=4096, num_warps=8),
    "stream_2k_w4_pf2": dict(_PF2, block_n=2048, num_warps=4),
    "stream_16k_w32": dict(_PF, block_n=16384, num_warps=32),  # run4's best at 262K (now more registers)
    # chunk loops software-pipelined by Triton (cp.async into shared memory; prefetch off): more bytes in flight
    "stream_8k_w16_st3": dict(_PF, block_n=8192, num_warps=16, lane_max=0, prefetch=0, stages=3),
    "stream_4k_w8_st3": dict(_PF, block_n=4096, num_warps=8, lane_max=0, prefetch=0, stages=3),
    "stream_4k_w8_st4": dict(_PF, block_n=4096, num_warps=8, lane_max=0, prefetch=0, stages=4),  # bf16 default
    "stream_2k_w4_st4": dict(_PF, block_n=2048, num_warps=4, lane_max=0, prefetch=0, stages=4),
    # L2 hints (evict bits: 1 pass-1 evict_last, 2 pass-2 evict_first, 4 .cs gradient stores) on the bf16 default.
    # (Session 9 also swept a capped grid of 1-4 programs per SM looping over the rows: 0.39-0.61, removed.)
    **{f"stream_4k_w8_st4_ev{ev}": dict(_PF, block_n=4096, num_warps=8, lane_max=0, prefetch=0, stages=4, evict=ev)
       for ev in (1, 3, 7)},
    # more bytes in flight per program (deeper pipelines, bigger chunks) with fewer resident programs (rows in
    # flight), so that pass 2's re-read stays in L2 (ncu, session 9 call 2: at 50K the default re-reads 77% from DRAM)
    **{f"stream_{bn // 1024}k_w{w}_st{st}": dict(_PF, block_n=bn, num_warps=w, lane_max=0, prefetch=0, stages=st, evict=7)
       for bn, w, st in ((8192, 16, 4), (8192, 16, 6), (16384, 16, 4), (16384, 32, 4), (4096, 8, 8), (8192, 8, 4))},
    # several programs per row (pieces streamed), second read of a piece from L2
    "split_p16k_b8k_w8": dict(wide_mode=2, piece=16384, split_block=8192, split_warps=8),
    # persistent, co-resident programs holding a piece each in registers, statistics exchanged (one read):
    **{f"persist_{n}": dict(wide_mode=3, **c) for n, c in PERSIST_CANDIDATES.items() if "persist_hold" not in c},  # (HOLD: softmax only)
    # the SMEM form with LAG (row k - 1's loss and gradient after row k is published, its piece re-read from L2;
    # session 10; timed in session 11: it lost, issue10/run16_b/ce.log)
    **{f"persist_smem_{b // 1024}k_w{w}_st{st}_lag": dict(wide_mode=3, persist_block=b, persist_warps=w, persist_per_sm=16,
                                                         persist_stages=st, persist_lag=True)
       for b, w, st in ((4096, 4, 2), (4096, 4, 3), (4096, 4, 4), (2048, 4, 3))},
}
for _c in SWEEP.values():  # a config without stages is a plain range loop (the bf16 default pipelines 4 deep)
    _c.setdefault("stages", 1)
SINGLE_SWEEP = {  # one program per row, the whole row in registers: (config, widest vocab)
    "single_32k_w32": (dict(max_single=32768, num_warps=32), 32768),
    "single_64k_w32": (dict(max_single=65536, num_warps=32), 65536),
}


def _name_matches(name: str, pattern: str) -> bool:
    """--sweep-only entries: a name prefix, or ``=name`` for that name alone."""
    return name == pattern[1:] if pattern.startswith("=") else name.startswith(pattern)


def sweep(vocabs, copy_gbs, rep=30, only=None):
    """Fraction of copy of the fused forward+backward per wide-row config (``only``: name prefixes to keep);
    returns {vocab: best config}."""
    from fused_layers import fused_cross_entropy
    from fused_layers.ops._common import config_override

    rows, best = [], {}
    for v in vocabs:
        x = (torch.randn(ROWS, v, device=DEV) * 2).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, v, (ROWS,), device=DEV)
        nbytes = 2 * x.numel() * x.element_size()
        ref = F.cross_entropy(x.detach().float(), t).item()
        configs = {**{n: c for n, (c, widest) in SINGLE_SWEEP.items() if v <= widest and 2 * v > widest}, **SWEEP}
        if only:
            configs = {n: c for n, c in configs.items() if any(_name_matches(n, o) for o in only)}
        for name, cfg in configs.items():
            try:
                with config_override("cross_entropy", **cfg):
                    x.grad = None
                    loss = fused_cross_entropy(x, t)
                    assert abs(loss.item() - ref) <= 0.01 * abs(ref) + 1e-3, (loss.item(), ref)  # bf16 loss
                    ms = do_bench(lambda: fused_cross_entropy(x, t).backward(), grad_to_none=[x], rep=rep)
            except Exception as e:  # noqa: BLE001
                print(f"[sweep V={v} {name} failed: {type(e).__name__}: {str(e)[:160]}]")
                continue
            frac = nbytes / ms / 1e6 / copy_gbs
            rows.append(dict(part="sweep", vocab=v, config=name, ms=ms, frac=frac, **{"cfg": cfg}))
            print(f"SWEEP V={v:>6} {name:>20}: {ms:8.3f} ms  frac {frac:5.3f}", flush=True)
            if v not in best or frac > best[v][1]:
                best[v] = (name, frac)
        x.grad = None
        x = t = None  # free before the next width
        _empty_cache()
    return rows, {v: configs_of(n) | {"name": n} for v, (n, _) in best.items()}


def configs_of(name):
    return dict({**{n: c for n, (c, _) in SINGLE_SWEEP.items()}, **SWEEP}[name])


SOFTMAX_COOP = {"default": {}, "piecewise": dict(wide_mode=0),
                # piece-wise with L2 hints (softmax_config.WIDE_EVICT bits: 1 phase-1 evict_last, 2 phase-2 evict_first, 4 .cs)
                **{f"piecewise_ev{ev}": dict(wide_mode=0, wide_evict=ev) for ev in (1, 3, 7)},
                # piece-wise, bigger pieces with pipelined chunk loops: more bytes in flight per program (ncu: 63% of DRAM
                # peak at 64K bf16 with 1.1x the minimal reads, i.e. latency-bound, not re-read-bound)
                **{f"pwst_b{b // 1024}k_p{p // 1024}k_w{w}_st{st}": dict(wide_mode=0, wide_block=b, wide_piece=p, wide_warps=w,
                                                                         stages=st, wide_evict=7)
                   for b, p, w, st in ((8192, 32768, 8, 4), (8192, 32768, 16, 4), (4096, 32768, 8, 6), (8192, 65536, 16, 4),
                                       (4096, 16384, 8, 4))},
                **{f"persist_{n}": dict(wide_mode=2, **c) for n, c in PERSIST_CANDIDATES.items() if n not in ("2k_w2", "16k_w16")},
                # the SMEM form with LAG (row k - 1 written after row k is published, re-read from L2: the wait off
                # the critical path; session 10; timed in session 11: it lost, issue10/run15_a/smlag.log)
                **{f"persist_smem_{b // 1024}k_w{w}_st{st}_lag": dict(wide_mode=2, persist_block=b, persist_warps=w,
                                                                     persist_per_sm=16, persist_stages=st, persist_lag=True)
                   for b, w, st in ((4096, 4, 2), (4096, 4, 3), (4096, 4, 4), (2048, 4, 3))},
                # DIAGNOSTIC, wrong output by design: the default SMEM form without the exchange between a row's
                # pieces (each normalized by its own statistics): what the publish + wait costs (session 11)
                # (sm_90, Triton 3.6: the diagnostic compiles to 72 registers against the default's 56, so 7 programs
                # an SM against 9: compare it with the default capped at 7, persist_smem_4k_w4_st3_ps7)
                "diag_nosync_smem_4k_w4_st3": dict(wide_mode=2, persist_block=4096, persist_warps=4, persist_per_sm=16,
                                                   persist_stages=3, persist_diag_nosync=True),
                "persist_smem_4k_w4_st3_ps7": dict(wide_mode=2, persist_block=4096, persist_warps=4, persist_per_sm=7,
                                                   persist_stages=3),
                # PAIR (forward): two rows an exchange (sm_90, Triton 3.6: 4K x 8 warps 79 registers, 3 programs an
                # SM; 2K x 4 warps 72, 7; 4K x 4 warps 124, 4 -- left out); session 11, not yet timed
                **{f"persist_smem_{b // 1024}k_w{w}_st3_pair": dict(wide_mode=2, persist_block=b, persist_warps=w,
                                                                   persist_per_sm=16, persist_stages=3, persist_pair=True)
                   for b, w in ((4096, 8), (2048, 4))}}


def bench_softmax_coop(copy_gbs, rep=40, dtypes=(torch.bfloat16, torch.float32), only=None):
    """Issue part 4: the wide-row softmax kernels (the defaults, piece-wise, persistent: pieces in
    registers), 2^26 elements; fraction of copy (fwd: read x + write y; bwd: read y, dy + write dx)."""
    from fused_layers import fused_softmax
    from fused_layers.ops._common import config_override
    from fused_layers.ops.softmax import softmax_backward

    rows = []
    widths = [32768, 65536, 131072, 262144] if DEV == "cuda" else [64]
    for dtype, n in [(d, n) for d in dtypes for n in widths]:
        m = max(1, 2**26 // n) if DEV == "cuda" else 2
        x = torch.randn(m, n, device=DEV, dtype=dtype).requires_grad_()
        dy = torch.randn_like(x)
        for name, cfg in SOFTMAX_COOP.items():
            if only and name != "default" and not any(_name_matches(name, o) for o in only):
                continue
            if n <= 32768 and name != "default":
                cfg = dict(cfg, max_single_block=16384)
            try:
                with config_override("softmax", **cfg):
                    y = fused_softmax(x, -1)
                    err = (y.float() - torch.softmax(x.detach().float(), -1)).abs().max().item()
                    yd = y.detach()
                    fwd = do_bench(lambda: fused_softmax(x.detach(), -1), rep=rep)
                    bwd = do_bench(lambda: softmax_backward(yd, dy, 1), rep=rep)  # the backward op itself
                    bwd_ag = do_bench(lambda: torch.autograd.grad(y, x, dy, retain_graph=True), rep=rep)
                    fwd_g = bwd_g = float("nan")
                    if DEV == "cuda":
                        fwd_g = _timing.bench(lambda: fused_softmax(x.detach(), -1), rep=rep)
                        bwd_g = _timing.bench(lambda: softmax_backward(yd, dy, 1), rep=rep)
            except Exception as e:  # noqa: BLE001
                print(f"[softmax {name} N={n} failed: {type(e).__name__}: {str(e)[:160]}]")
                continue
            nb = x.numel() * x.element_size()
            fr, br = 2 * nb / fwd / 1e6 / copy_gbs, 3 * nb / bwd / 1e6 / copy_gbs
            frg, brg, bra = 2 * nb / fwd_g / 1e6 / copy_gbs, 3 * nb / bwd_g / 1e6 / copy_gbs, 3 * nb / bwd_ag / 1e6 / copy_gbs
            rows.append(dict(part="softmax_coop", dtype=str(dtype).split(".")[-1], width=n, config=name, fwd_ms=fwd, bwd_ms=bwd,
                             fwd_frac=fr, bwd_frac=br, fwd_graph_frac=frg, bwd_graph_frac=brg, bwd_autograd_frac=bra,
                             max_err=err))
            print(f"SOFTMAX {str(dtype).split('.')[-1]:>8} N={n:>6} {name:>15}: fwd {fr:5.3f}  bwd {br:5.3f} of copy  "
                  f"(graph replay {frg:5.3f} / {brg:5.3f}; bwd through autograd.grad {bra:5.3f})  max err {err:.1e}", flush=True)
        x = dy = y = None
        _empty_cache()
    return rows


def bench_linear(rep, quick):
    from fused_layers import fused_linear_cross_entropy

    n, d, v = LINEAR_SHAPE
    rows = []
    t = torch.randint(0, v, (n,), device=DEV)
    settings = {"bf16": (torch.bfloat16, False), "autocast_bf16": (torch.float32, True)}
    for setting, (dtype, autocast) in settings.items():
        h = torch.randn(n, d, device=DEV, dtype=dtype).requires_grad_()
        w = (torch.randn(v, d, device=DEV) * 0.02).to(dtype).requires_grad_()
        provs = {
            "unfused": lambda: F.cross_entropy(F.linear(h, w).float(), t),
            "fused_linear": lambda: fused_linear_cross_entropy(h, w, t),
        }
        if not autocast and DEV == "cuda":
            try:
                from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

                liger = LigerFusedLinearCrossEntropyLoss()
                provs["liger_linear"] = lambda: liger(w, h, t)
            except Exception as e:  # noqa: BLE001
                print(f"[liger fused linear CE not available: {type(e).__name__}: {e}]")
        for name, f in provs.items():
            def step(f=f):
                with torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast):
                    loss = f()
                loss.backward()

            try:
                h.grad = w.grad = None
                step()
                h.grad = w.grad = None
                ms = do_bench(step, grad_to_none=[h, w], rep=rep)
                h.grad = w.grad = None
                peak = peak_extra_mb(step)
                h.grad = w.grad = None
            except Exception as e:  # noqa: BLE001
                print(f"[{name} {setting} failed: {type(e).__name__}: {str(e)[:200]}]")
                _empty_cache()
                continue
            rows.append(dict(part="linear", setting=setting, provider=name, tokens=n, d=d, vocab=v, ms=ms, peak_MB=peak))
            print(f"LINEAR {setting:>13} {name:>13}: {ms:8.3f} ms  peak above inputs {peak:8.0f} MB", flush=True)
        h = w = None
        _empty_cache()
    return rows


def bench_passes(vocabs, rep, copy_gbs):
    """Where the streaming kernel's time goes (bf16, ROWS rows): the loss alone (no gradient: pass 1 only,
    one read of the logits) against loss + gradient in the forward (pass 1, then pass 2 re-reads each
    chunk and writes the gradient).  Pass 2's time, as a bandwidth for two views of its traffic: a read from
    DRAM plus the write (2 units), or the write alone (1 unit: the re-read hit L2).  Whichever view is near
    the copy ceiling says where the re-read came from."""
    from fused_layers import fused_cross_entropy

    rows = []
    for v in vocabs:
        x = torch.randn(ROWS, v, device=DEV, dtype=torch.bfloat16)
        t = torch.randint(0, v, (ROWS,), device=DEV)
        xg = x.detach().clone().requires_grad_(True)
        unit = ROWS * v * 2  # bytes of one pass over the logits
        with torch.no_grad():
            p1 = do_bench(lambda: fused_cross_entropy(x, t), rep=rep)
        both = do_bench(lambda: fused_cross_entropy(xg, t), grad_to_none=[xg], rep=rep)  # forward only
        p2 = max(both - p1, 1e-9)
        row = dict(part="passes", vocab=v, loss_only_ms=p1, loss_and_grad_ms=both, pass2_ms=p2,
                   pass1_frac=unit / p1 / 1e6 / copy_gbs,
                   pass2_frac_if_dram=2 * unit / p2 / 1e6 / copy_gbs,
                   pass2_frac_if_l2=unit / p2 / 1e6 / copy_gbs,
                   total_frac_counted=2 * unit / both / 1e6 / copy_gbs,
                   total_frac_actual_3_units=3 * unit / both / 1e6 / copy_gbs)
        print(row, flush=True)
        rows.append(row)
        x = t = xg = None
        _empty_cache()
    return rows


def write(out_dir, meta, rows, show=False):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "cross_entropy_h200.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    lines = [f"# Cross-entropy, {meta['device']} (copy {meta['copy_gbs']:.0f} GB/s measured)"]
    ce = [r for r in rows if r["part"] == "ce"]
    if ce:
        lines += ["", "## Loss on bf16 logits, 8,192 rows: forward + backward", "",
                  "`frac of copy`: do_bench of the eager step (what a training step pays); `graph replay`: the same step "
                  "replayed from a CUDA graph (no host in the timing; '-' where a provider cannot be captured).", "",
                  "| vocab | provider | ms | GB/s | frac of copy | graph replay | extra peak MB | time vs best fused |",
                  "|---|---|---|---|---|---|---|---|"]
    sw = [r for r in rows if r["part"] == "sweep"]
    for v in sorted({r["vocab"] for r in ce}):
        group = [r for r in ce if r["vocab"] == v]
        fused = min((r["ms"] for r in group if r["provider"].startswith("fused")), default=None)
        for r in group:
            rel = f"{r['ms'] / fused:.2f}x" if fused else "-"
            fg = r.get("frac_graph", float("nan"))
            fg = "-" if fg != fg else f"{fg:.3f}"
            lines.append(f"| {v} | {r['provider']} | {r['ms']:.3f} | {r['gbs']:.0f} | {r['frac']:.3f} | {fg} | {r['extra_MB']:.0f} | {rel} |")
    if sw:
        lines += ["", "## Sweep of the wide-row configs (fused, forward + backward, bf16)", "",
                  "| vocab | config | ms | frac of copy |", "|---|---|---|---|"]
        for r in sw:
            lines.append(f"| {r['vocab']} | {r['config']} | {r['ms']:.3f} | {r['frac']:.3f} |")
    smc = [r for r in rows if r["part"] == "softmax_coop"]
    if smc:
        lines += ["", "## Wide softmax (issue part 4): the wide-row kernels, 2^26 elements", "",
                  "do_bench (L2 flushed between calls) of the forward and of the backward op itself; CUDA-graph replay of "
                  "the same calls (no host in the timing); and the backward through `torch.autograd.grad`, whose host "
                  "path (autograd engine, device thread) outlasts do_bench's L2 flush at these sizes, so that column "
                  "times the host as much as the kernel (session 11, issue10/run16_b: 0.47-0.91 for a kernel at 0.85-0.91).",
                  "", "| dtype | width | config | fwd frac of copy | bwd frac of copy | fwd / bwd graph replay | bwd via autograd.grad | max err |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in smc:
            lines.append(f"| {r.get('dtype', 'bfloat16')} | {r['width']} | {r['config']} | {r['fwd_frac']:.3f} | "
                         f"{r['bwd_frac']:.3f} | {r.get('fwd_graph_frac', float('nan')):.3f} / {r.get('bwd_graph_frac', float('nan')):.3f} | "
                         f"{r.get('bwd_autograd_frac', float('nan')):.3f} | {r['max_err']:.1e} |")
    ps = [r for r in rows if r["part"] == "passes"]
    if ps:
        lines += ["", "## Where the streaming kernel's time goes: pass 1 (statistics) vs pass 2 (re-read + gradient), bf16", "",
                  "Fractions of the copy ceiling.  pass 2 \"if DRAM\": its time as a read + a write; \"if L2\": as the write alone.",
                  "", "| vocab | loss only ms | loss + grad ms | pass 1 frac | pass 2 frac if DRAM | pass 2 frac if L2 | counted (1R+1W) | actual if 2R+1W |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in ps:
            lines.append(f"| {r['vocab']} | {r['loss_only_ms']:.3f} | {r['loss_and_grad_ms']:.3f} | {r['pass1_frac']:.3f} | "
                         f"{r['pass2_frac_if_dram']:.3f} | {r['pass2_frac_if_l2']:.3f} | {r['total_frac_counted']:.3f} | "
                         f"{r['total_frac_actual_3_units']:.3f} |")
    lin = [r for r in rows if r["part"] == "linear"]
    if lin:
        lines += ["", "## LM head + loss, 16 x 1024 tokens, d 768, V 50,304: forward + backward", "",
                  "| setting | provider | ms | peak MB above inputs |", "|---|---|---|---|"]
        for r in lin:
            lines.append(f"| {r['setting']} | {r['provider']} | {r['ms']:.3f} | {r['peak_MB']:.0f} |")
    with open(os.path.join(out_dir, "cross_entropy_h200.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if show:
        print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-linear", action="store_true")
    ap.add_argument("--skip-softmax", action="store_true", help="skip the wide softmax section")
    ap.add_argument("--sweep", action="store_true", help="sweep the wide-row configs first; add a tuned row")
    ap.add_argument("--sweep-only", default=None, help="comma-separated config-name prefixes: sweep only those")
    ap.add_argument("--softmax-only", action="store_true", help="only the wide softmax section")
    ap.add_argument("--sweep-stop", action="store_true", help="stop after the sweep (no provider table)")
    ap.add_argument("--cpu-check", action="store_true", help="tiny shapes on the CPU (interpreter): plumbing only")
    ap.add_argument("--passes-only", action="store_true", help="only the pass-1 / pass-2 breakdown of the streaming kernel")
    ap.add_argument("--vocabs", default=None, help="comma-separated vocabulary sizes instead of the issue's four "
                    "(e.g. 50257,30522,100277: sizes that are not a multiple of 16)")
    args = ap.parse_args()
    if torch.cuda.is_available():
        from fused_layers.ops import _cpp

        # The C++ fast path built (or loaded from torch's cache) before anything is timed: it builds on a background
        # thread, and calls timed meanwhile took the Python path (session 25: do_bench read the first float32 softmax
        # at 0.013 of copy and the first CE at 0.48, graph replay 0.93 / 0.79).
        _cpp.extension(wait=True)
    if args.cpu_check:
        dry_run_setup()
    t0 = time.time()
    copy_gbs = measure_copy()
    print(f"copy: {copy_gbs:.0f} GB/s (recorded ceiling {COPY_CEILING_GBS:.0f})", flush=True)
    rep = 40 if args.quick else 100
    vocabs = [v for v in (50304, 262144) if v in VOCABS] if args.quick else VOCABS
    if args.vocabs:
        vocabs = [int(v) for v in args.vocabs.split(",")]
    import signal

    import triton

    rows, tuned = [], None
    meta = dict(device=torch.cuda.get_device_name() if DEV == "cuda" else "cpu", copy_gbs=copy_gbs, partial=True)

    def on_term(*_):  # killed by a timeout: keep what was measured
        write(args.out, meta, rows)
        sys.exit(124)

    signal.signal(signal.SIGTERM, on_term)
    if args.passes_only:
        rows = bench_passes(vocabs, rep, copy_gbs)
        meta.update(partial=False, command=" ".join(sys.argv), torch=torch.__version__, triton=triton.__version__)
        write(args.out, meta, rows, show=True)
        return
    only = args.sweep_only.split(",") if args.sweep_only else None
    if args.softmax_only:
        rows = bench_softmax_coop(copy_gbs, only=only)
        meta.update(partial=False, command=" ".join(sys.argv), torch=torch.__version__, triton=triton.__version__)
        write(args.out, meta, rows, show=True)
        return
    if args.sweep:
        rows, tuned = sweep(vocabs, copy_gbs, only=only)
        print("sweep winners:", json.dumps(tuned), flush=True)
        meta["tuned"] = {str(k): v for k, v in tuned.items()}
        write(args.out, meta, rows)
        if args.sweep_stop:
            write(args.out, meta, rows, show=True)
            return
    rows += bench_ce(vocabs, rep, copy_gbs, tuned)
    write(args.out, meta, rows)
    if not args.skip_linear:
        rows += bench_linear(rep, args.quick)
        write(args.out, meta, rows)
    if not args.skip_softmax:
        rows += bench_softmax_coop(copy_gbs)

    meta = dict(tuned={str(k): v for k, v in (tuned or {}).items()}, device=torch.cuda.get_device_name() if DEV == "cuda" else "cpu (--cpu-check: numbers meaningless)", torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), copy_gbs=copy_gbs, seconds=time.time() - t0,
                command=" ".join(sys.argv))
    write(args.out, meta, rows, show=True)


if __name__ == "__main__":
    main()
