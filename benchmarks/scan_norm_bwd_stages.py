"""sm_90 static scan (no GPU) of the LayerNorm backward with and without a software-pipelined row loop.

    python benchmarks/scan_norm_bwd_stages.py   ->  benchmarks/results/issue9/norm_bwd_stages_static_scan_sm90.json

AOT-compiles ``_norm_bwd_kernel`` (single block, bf16, LayerNorm with weight and bias) for sm_90 with this
machine's Triton at the tuned (BLOCK_M, num_warps) of widths 1,024 and 4,096, and counts SASS LDGSTS
(cp.async into shared memory) against LDG.  STAGES (tl.range num_stages) pipelines the row loop; the launch
option num_stages alone, which the earlier ``bwd_stages`` sweep set, leaves the SASS without LDGSTS.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from fused_layers.ops.layer_norm import _norm_bwd_kernel as fn  # noqa: E402

cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
rows = []
for n, bm, w in ((1024, 4, 4), (4096, 1, 8)):  # layer_norm_config's tuned bf16 entries
    for stages, opt in ((1, 1), (1, 3), (2, 2), (3, 3), (4, 4)):
        cx = dict(IS_RMS=False, HAS_W=True, HAS_B=True, BLOCK_M=bm, BLOCK_N=n, CAST_BEFORE_W=False, STAGES=stages)
        sig, attrs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in cx:
                sig[name] = "constexpr"
            elif name in ("X", "DY", "DX", "W"):
                sig[name], attrs[(i,)] = "*bf16", [["tt.divisibility", 16]]
            elif name in ("STATS", "PARTS"):
                sig[name], attrs[(i,)] = "*fp32", [["tt.divisibility", 16]]
            else:
                sig[name] = "i32"
                if name in ("N", "sx", "sdy"):
                    attrs[(i,)] = [["tt.divisibility", 16]]
        k = triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=w, num_stages=opt))
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(k.asm["cubin"])
            path = f.name
        sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True).stdout
        res = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True).stdout
        os.remove(path)
        ops = {}
        for line in sass.splitlines():
            o = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)", line)
            if o:
                ops[o.group(1)] = ops.get(o.group(1), 0) + 1
        m = re.search(r"REG:(\d+) STACK:(\d+)", res)
        row = dict(width=n, block_m=bm, warps=w, STAGES=stages, launch_num_stages=opt, regs=int(m.group(1)),
                   stack=int(m.group(2)), smem=k.metadata.shared, ldgsts=ops.get("LDGSTS", 0), ldg=ops.get("LDG", 0))
        print(row, flush=True)
        rows.append(row)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "issue9", "norm_bwd_stages_static_scan_sm90.json")
json.dump(dict(triton=triton.__version__, target="sm_90", kernel="_norm_bwd_kernel (LayerNorm, bf16, weight + bias)",
               rows=rows), open(out, "w"), indent=1)
