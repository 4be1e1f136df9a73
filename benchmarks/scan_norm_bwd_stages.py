"""sm_90 static scan (no GPU) of the LayerNorm backward with and without a software-pipelined row loop.

    python benchmarks/scan_norm_bwd_stages.py   ->  benchmarks/results/issue9/norm_bwd_stages_static_scan_sm90.json

AOT-compiles ``_norm_bwd_kernel`` (single block, bf16, LayerNorm with weight and bias) for sm_90 with this
machine's Triton at the tuned (BLOCK_M, num_warps) of widths 1,024 and 4,096, and counts SASS LDGSTS
(cp.async into shared memory) against LDG.  STAGES (tl.range num_stages) pipelines the row loop; the launch
option num_stages alone, which the earlier ``bwd_stages`` sweep set, leaves the SASS without LDGSTS.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import triton  # noqa: E402
from _sm90 import compile_sm90, signature  # noqa: E402

from fused_layers.ops.layer_norm import _norm_bwd_kernel as fn  # noqa: E402

types = dict(X="*bf16", DY="*bf16", DX="*bf16", W="*bf16", STATS="*fp32", PARTS="*fp32")
rows = []
for n, bm, w in ((1024, 4, 4), (4096, 1, 8)):  # layer_norm_config's tuned bf16 entries
    for stages, opt in ((1, 1), (1, 3), (2, 2), (3, 3), (4, 4)):
        cx = dict(IS_RMS=False, HAS_W=True, HAS_B=True, BLOCK_M=bm, BLOCK_N=n, CAST_BEFORE_W=False, STAGES=stages)
        r = compile_sm90(fn, *signature(fn, cx, types, divisible=("N", "sx", "sdy")), num_warps=w, num_stages=opt)
        row = dict(width=n, block_m=bm, warps=w, STAGES=stages, launch_num_stages=opt, regs=r["regs"],
                   stack=r["stack_bytes"], smem=r["shared_bytes"], ldgsts=r["ops"]["LDGSTS"], ldg=r["ops"]["LDG"])
        print(row, flush=True)
        rows.append(row)
with open(os.path.join(HERE, "results", "issue9", "norm_bwd_stages_static_scan_sm90.json"), "w") as f:
    json.dump(dict(triton=triton.__version__, target="sm_90", kernel="_norm_bwd_kernel (LayerNorm, bf16, weight + bias)",
                   rows=rows), f, indent=1)
