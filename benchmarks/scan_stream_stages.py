"""sm_90 static scan (no GPU) of the streaming cross-entropy and wide softmax kernels with software-pipelined
chunk loops.

    python benchmarks/scan_stream_stages.py   ->  benchmarks/results/issue10/stream_stages_static_scan_sm90.json

AOT-compiles ``_ce_fwd_kernel`` (stream mode, bf16 logits, class-index targets, gradient) for sm_90 with this
machine's Triton, with the runtime's specializations of 2-D logits (INNER = 1, unit column stride), and counts
SASS LDGSTS (cp.async: loads pipelined through shared memory) against plain LDG.  A plain ``range`` chunk
loop (the default, PREFETCH = 1) has no LDGSTS; ``tl.range(num_stages=3|4)`` (STAGES) does.  The same for
``_softmax_fwd_wide_kernel`` / ``_softmax_bwd_wide_kernel`` (softmax_config.WIDE_STAGES).
"""
import os, re, subprocess, tempfile, json, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fused_layers.ops.cross_entropy import _ce_fwd_kernel as fn
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
rows = []
for name, bn, w, pf, st in (("default 8k w16 pf1", 8192, 16, 1, 1), ("8k w16 st3", 8192, 16, 0, 3), ("4k w8 st3", 4096, 8, 0, 3),
                             ("4k w8 st4", 4096, 8, 0, 4), ("2k w4 st4", 2048, 4, 0, 4)):
    cx = dict(BLOCK_M=1, BLOCK_N=bn, SINGLE=False, SOFT=False, HAS_WEIGHT=False, SMOOTH=False, HAS_GRAD=True,
              DEN_ON_DEVICE=True, HAS_ROW_SCALE=False, PREFETCH=pf, REVERSE=True, LANE_MAX=False, STAGES=st)
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in cx:
            sig[n] = "constexpr"
        elif n in ("X", "DX"):
            sig[n], attrs[(i,)] = "*bf16", [["tt.divisibility", 16]]
        elif n == "T":
            sig[n] = "*i64"
        elif n in ("W", "LOSS", "DEN", "RS"):
            sig[n] = "*fp32"
        elif n in ("smoothing", "inv_den"):
            sig[n] = "fp32"
        elif n in ("sxc", "stc", "sdc", "INNER", "sxi", "sti", "sdi"):
            sig[n], cx[n] = "constexpr", 1
        else:
            sig[n] = "i32"
            if n in ("C", "sxo", "sdo"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=w))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"]); p = f.name
    sass = subprocess.run([cuobjdump, "-sass", p], capture_output=True, text=True).stdout
    res = subprocess.run([cuobjdump, "--dump-resource-usage", p], capture_output=True, text=True).stdout
    ops = {}
    for line in sass.splitlines():
        o = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)", line)
        if o: ops[o.group(1)] = ops.get(o.group(1), 0) + 1
    m = re.search(r"REG:(\d+) STACK:(\d+)", res)
    row = dict(config=name, regs=int(m.group(1)), stack=int(m.group(2)), smem=k.metadata.shared, ldgsts=ops.get("LDGSTS", 0), ldg=ops.get("LDG", 0))
    print(row, flush=True); rows.append(row)
from fused_layers.ops.softmax import _softmax_bwd_wide_kernel, _softmax_fwd_wide_kernel  # noqa: E402

for kern in (_softmax_fwd_wide_kernel, _softmax_bwd_wide_kernel):
    for stages in (1, 3):
        cx, sig, attrs = {"SPLITS_P2": 4, "BLOCK_N": 4096, "STAGES": stages}, {}, {}
        for i, n in enumerate(kern.arg_names):
            if n in cx:
                sig[n] = "constexpr"
            elif n in ("X", "Y", "DY", "DX"):
                sig[n], attrs[(i,)] = "*bf16", [["tt.divisibility", 16]]
            elif n in ("STATS", "DOT"):
                sig[n], attrs[(i,)] = "*fp32", [["tt.divisibility", 16]]
            elif n == "COUNT":
                sig[n] = "*i32"
            elif n in ("INNER", "sxi", "syi", "sdi", "sgi", "sxn", "syn", "sdn", "sgn"):  # 2-D rows: specialized to 1
                sig[n], cx[n] = "constexpr", 1
            else:
                sig[n] = "i32"
                if n in ("N", "PIECE", "sxo", "syo", "sdo", "sgo"):
                    attrs[(i,)] = [["tt.divisibility", 16]]
        k = triton.compile(ASTSource(kern, sig, cx, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(k.asm["cubin"]); p = f.name
        sass = subprocess.run([cuobjdump, "-sass", p], capture_output=True, text=True).stdout
        res = subprocess.run([cuobjdump, "--dump-resource-usage", p], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+)", res)
        row = dict(config=f"{kern.__name__} 4k w8 STAGES={stages}", regs=int(m.group(1)), stack=int(m.group(2)),
                   smem=k.metadata.shared, ldgsts=sass.count("LDGSTS"))
        print(row, flush=True); rows.append(row)
json.dump(dict(triton=triton.__version__, target="sm_90", kernel="_ce_fwd_kernel (stream, bf16, hard targets, grad); wide softmax",
               rows=rows),
          open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "issue10", "stream_stages_static_scan_sm90.json"), "w"), indent=1)
