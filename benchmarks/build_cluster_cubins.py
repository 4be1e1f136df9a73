"""Issue 10: compile the cluster softmax forward (``benchmarks/proto_softmax_cluster.py``) for sm_90 with this
machine's Triton (>= 3.8: Triton 3.6, the H200's, cannot lower its cross-CTA exchange) into cubins, for
``benchmarks/bench_softmax_cluster.py`` to launch on the H200 through the CUDA driver (cluster dims set at launch).

    TRITON_DEFAULT_FP_FUSION=1 python benchmarks/build_cluster_cubins.py .cubins   # then carry .cubins

Each config: (dtype, K CTAs a cluster, P columns a piece, warps, ptxas register cap or 0, divisible) where divisible
compiles N and the row strides as multiples of 16 (16-byte vector loads; Triton's runtime specializes them so), and
not divisible is the ragged form (any N) for the correctness checks.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from proto_softmax_cluster import _softmax_fwd_cluster_kernel as KERNEL

CONFIGS = [
    # session 23 call 3: (dtype, K, P, warps, cap, divisible, DIAG, HOLD_RAW).  The single-block form in this harness
    # (K = 1, no cluster), the no-exchange diagnostic launched as clusters (DIAG = 1: wrong output by design), the
    # exchange form; the 16-bit row held as loaded (HOLD_RAW, as the library's PACKED 16K forward) and capped at 40
    # registers (three 16-warp CTAs an SM)
    *[("bf16", 1, 16384, 16, cap, 1, 0, h) for cap, h in ((0, 0), (40, 1), (0, 1))],
    *[("bf16", k, 16384, 16, cap, 1, d, h) for k in (2, 4, 8) for d in (1, 0) for cap, h in ((0, 0), (40, 1))],
    ("bf16", 4, 8192, 8, 0, 1, 0, 1), ("bf16", 8, 8192, 8, 0, 1, 0, 1), ("bf16", 16, 16384, 16, 40, 1, 0, 1),
    ("fp32", 4, 8192, 16, 0, 1, 0, 0), ("fp32", 8, 16384, 16, 0, 1, 0, 0),
    ("bf16", 2, 16384, 16, 40, 0, 0, 1), ("bf16", 8, 16384, 16, 40, 0, 0, 1), ("fp32", 8, 16384, 16, 0, 0, 0, 0),
    ("fp16", 4, 8192, 8, 0, 0, 0, 1),
]
CONFIGS_CALL1 = [
    # bf16: 16K pieces x 16 warps (the single-block form that reaches 0.91-0.95 at 16K), uncapped and capped at 40
    ("bf16", 2, 16384, 16, 0, 1), ("bf16", 2, 16384, 16, 40, 1), ("bf16", 4, 8192, 8, 0, 1), ("bf16", 4, 8192, 16, 0, 1),
    ("bf16", 4, 16384, 16, 0, 1), ("bf16", 4, 16384, 16, 40, 1), ("bf16", 8, 8192, 8, 0, 1),
    ("bf16", 8, 16384, 16, 0, 1), ("bf16", 8, 16384, 16, 40, 1), ("bf16", 16, 8192, 8, 0, 1),
    ("bf16", 16, 16384, 16, 0, 1), ("bf16", 16, 16384, 16, 40, 1), ("bf16", 8, 32768, 32, 0, 1),
    # fp32: 8K pieces x 16 warps (32 KB), 16K x 16 / 32 warps
    ("fp32", 4, 8192, 16, 0, 1), ("fp32", 2, 16384, 16, 0, 1), ("fp32", 8, 8192, 16, 0, 1), ("fp32", 4, 16384, 16, 0, 1),
    ("fp32", 16, 8192, 16, 0, 1), ("fp32", 8, 16384, 16, 0, 1), ("fp32", 16, 16384, 16, 0, 1),
    ("fp32", 16, 16384, 32, 0, 1),
    # ragged forms for the checks
    ("bf16", 2, 16384, 16, 0, 0), ("bf16", 8, 16384, 16, 0, 0), ("fp32", 8, 16384, 16, 0, 0), ("fp16", 4, 8192, 8, 0, 0),
]


def build(out: str):
    os.makedirs(out, exist_ok=True)
    cub = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    index = []
    for dt, k, p, w, cap, div, *rest in CONFIGS:
        diag, hold = (rest + [0, 0])[:2]
        vec = 16 // {"bf16": 2, "fp16": 2, "fp32": 4}[dt]
        sig = {"x_ptr": f"*{dt}", "y_ptr": f"*{dt}", "N": "i32", "stride_x": "i32", "stride_y": "i32",
               "K": "constexpr", "P": "constexpr", "VEC": "constexpr", "HOLD_RAW": "constexpr", "JOIN": "constexpr",
               "DIAG": "constexpr"}
        attrs = {(i,): [["tt.divisibility", 16]] for i in (range(5) if div else range(2))}
        opts = dict(num_warps=w, num_ctas=k)  # K = 1: a plain launch
        if cap:
            opts["maxnreg"] = cap
        c = triton.compile(GluonASTSource(KERNEL, sig, dict(K=k, P=p, VEC=vec, HOLD_RAW=hold, JOIN=1, DIAG=diag), attrs),
                           target=GPUTarget("cuda", 90, 32), options=opts)
        name = f"{dt}_k{k}_p{p}_w{w}_cap{cap}_{'div' if div else 'rag'}" + (f"_diag{diag}" if diag else "") + ("_hold" if hold else "")
        with open(os.path.join(out, name + ".cubin"), "wb") as f:
            f.write(c.asm["cubin"])
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(c.asm["cubin"])
            f.flush()
            usage = subprocess.run([cub, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        regs, stack = map(int, re.search(r"REG:(\d+) STACK:(\d+)", usage).groups())
        index.append(dict(name=name, dtype=dt, K=k, P=p, warps=w, cap=cap, divisible=div, diag=diag, hold=hold, fn=c.metadata.name,
                          shared=c.metadata.shared, regs=regs, stack=stack, triton=triton.__version__))
        print(index[-1], flush=True)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else ".cubins")
