"""Issue 9, LayerNorm 16K: is the dW / dB reduce (``_norm_reduce_partials_kernel``, 7.1 us at 16K in session 20's
timeline) slow because its partials come from DRAM, or slow by itself?  Times the reduce alone over G = 132 float32
partial rows of 16,384 columns (dW and dB: LayerNorm; dW: RMSNorm) for several shapes and L2 hints, two ways:
cold (triton's do_bench: L2 flushed before every launch) and warm (a CUDA graph of 20 back-to-back launches over the
same partials, which then sit in L2).  GB/s counts the partials read once.

    python3 benchmarks/diag_norm_reduce.py > $OUT/diag_norm_reduce.txt
    REDUCE_SHAPES='[[32, 128, 3, 4], ...]' (block_g, block_n, stages, warps) times those shapes instead.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
from triton.testing import do_bench

from fused_layers.ops import layer_norm as ln_ops
from fused_layers.ops.layer_norm import config_override

G, N = 132, 16384
SHAPES = [{}, dict(reduce_evict_first=1), dict(reduce_block_g=256, reduce_block_n=16, reduce_stages=1),
          dict(reduce_block_g=256, reduce_block_n=16, reduce_stages=1, reduce_warps=8),
          dict(reduce_block_g=128, reduce_block_n=32, reduce_stages=1, reduce_warps=8),
          dict(reduce_block_g=64, reduce_block_n=64, reduce_stages=2, reduce_warps=8),
          dict(reduce_block_g=32, reduce_block_n=128, reduce_stages=3, reduce_warps=4),
          dict(reduce_block_g=8, reduce_block_n=512, reduce_stages=4, reduce_warps=4)]
if os.environ.get("REDUCE_SHAPES"):
    SHAPES = [{}] + [dict(reduce_block_g=g, reduce_block_n=n, reduce_stages=s, reduce_warps=w)
                     for g, n, s, w in json.loads(os.environ["REDUCE_SHAPES"])]

for has_b in (True, False):
    parts = torch.randn(((2 if has_b else 1) * G * N,), device="cuda")
    dw = torch.empty(N, device="cuda", dtype=torch.bfloat16)
    db = torch.empty(N, device="cuda", dtype=torch.bfloat16)
    nbytes = parts.numel() * 4
    ref = parts.view(-1, G, N).sum(1)
    for cfg in SHAPES:
        with config_override("layer_norm", **cfg):
            k = ln_ops._reduce_kernel(N, G, True, has_b)

            def run():
                k(parts, dw, db, G, N)
            run()
            torch.cuda.synchronize()
            err = (dw.float() - ref[0]).abs().max().item()
            cold = do_bench(run, warmup=25, rep=200, return_mode="median")
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                run()
                with torch.cuda.graph(g, stream=s):
                    for _ in range(20):
                        run()
            torch.cuda.synchronize()
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            ts = []
            for _ in range(10):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                g.replay()
                e1.record()
                torch.cuda.synchronize()
                ts.append(e0.elapsed_time(e1) / 20)
            warm = sorted(ts)[len(ts) // 2]
        print(f"{'ln' if has_b else 'rms'} G{G} N{N} {str(cfg or 'default'):90s} cold {cold * 1e3:6.2f} us "
              f"({nbytes / cold / 1e6:6.0f} GB/s)  warm {warm * 1e3:6.2f} us ({nbytes / warm / 1e6:6.0f} GB/s)  "
              f"max err {err:.3g}", flush=True)
