"""Issue 10, the bf16 softmax forward (target 0.90 of copy): the PACKED single-block forward (the 16-bit row held
as loaded, converted at each pass, ptxas's register cap; softmax_config.PACKED_SINGLE_BLOCK) against the defaults,
by do_bench (L2 flushed) and CUDA-graph replay; 2^26 elements, fraction of the 4.22 TB/s copy for one read and one
write; the max abs error against torch.softmax in float32 beside each.

    python3 benchmarks/sweep_softmax_packed.py > $OUT/sweep_softmax_packed.txt
    SWEEP='{"32768": [{"persist_block": 16384}]}' FP16=1 ... times those configs (by width) instead; FP16=1 adds fp16;
    DTYPES=float32 times those dtypes only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch

import _timing
from fused_layers import fused_softmax
from fused_layers.ops import _cpp
from fused_layers.ops._common import config_override

TOTAL = 2**26
_cpp.extension(wait=True)


def pk(warps, cap):
    return dict(packed=1, packed_warps=warps, packed_maxnreg=cap)


CASES = {
    16384: [pk(16, 40), pk(16, 48), pk(16, 0), pk(8, 64)],
    32768: [pk(16, 64), pk(16, 72), pk(16, 0), pk(32, 0), pk(32, 32), dict(persist_max_single_block=32768)],
    65536: [pk(32, 64), pk(32, 0)],
}
if os.environ.get("SWEEP"):
    CASES = {int(k): v for k, v in json.loads(os.environ["SWEEP"]).items()}
dtypes = [torch.bfloat16] + ([torch.float16] if os.environ.get("FP16") else [])
if os.environ.get("DTYPES"):  # e.g. DTYPES=float32 (session 22: the float32 forward's persistent forms)
    dtypes = [getattr(torch, d) for d in os.environ["DTYPES"].split(",")]
for dtype in dtypes:
    for n, cands in CASES.items():
        x = torch.randn(TOTAL // n, n, device="cuda", dtype=dtype) * 3
        ref = torch.softmax(x.float(), -1)
        nb = 2 * x.numel() * x.element_size()
        for cfg in [{}] + cands + [{}]:
            try:
                with config_override("softmax", **cfg):
                    f = lambda: fused_softmax(x, -1)  # noqa: E731
                    y = f()
                    err = (y.float() - ref).abs().max().item()
                    d, g = _timing.fractions_of_copy(f, nb)
                print(f"{str(dtype)[6:]} {n} {str(cfg or 'default'):80s} do_bench {d:.3f}  graph {g:.3f}  "
                      f"err {err:.2e}", flush=True)
            except Exception as e:  # keep the other candidates
                print(f"{n} {cfg} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
