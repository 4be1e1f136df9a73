"""sm_90 static compile (no GPU) of the TMA row-streaming kernels (fused_layers/ops/softmax_gluon.py) with the GPU
machine's Triton (3.6, a venv of its own): registers, spills, shared memory, TMA instruction counts.
    /tmp/v36/bin/python benchmarks/scan_softmax_gluon.py
"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import re, subprocess, tempfile
from collections import Counter
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from _sm90 import _CUOBJDUMP, _OPCODE
from fused_layers.ops import softmax_gluon as sg
for elem, ty in ((2, "bf16"), (4, "fp32")):
    sub, box, nbuf, nout, warps, per_sm = sg.CONFIGS[elem]
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8*elem, rank=2)
    d = f"tensordesc<{ty}[1, {box}],{lay!r}>"
    sig = {"X": f"*{ty}", "Y": f"*{ty}", "STATS": "*i64", "x_desc": d, "y_desc": d, "M": "i32", "N": "i32", "K": "i32", "SEG": "i32"}
    cx = dict(SUB=sub, BOX=box, NBUF=nbuf, NOUT=nout, VEC=16 // elem, HOLD=elem == 2, SPLIT=True, FLAT=False, STORE_TMA=True, num_warps=warps)
    sig.update({k: "constexpr" for k in cx})
    k = triton.compile(GluonASTSource(sg._softmax_fwd_tma_kernel, sig, cx, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"]); path = f.name
    usage = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True).stdout
    sass = subprocess.run([_CUOBJDUMP, "-sass", path], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    ops = Counter(op.group(1) for op in map(_OPCODE.search, sass.splitlines()) if op)
    print(ty, "regs", m.group(1), "stack", m.group(2), "smem", k.metadata.shared, "UTMALDG", ops.get("UTMALDG"), "UTMASTG", ops.get("UTMASTG"), "MUFU", ops.get("MUFU"), "BAR", ops.get("BAR"), "STL", ops.get("STL", 0))
for elem, ty in ((2, "bf16"),):
    sub, box, nbuf, nout, warps, per_sm = sg.CONFIGS[elem]
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8*elem, rank=2)
    d = f"tensordesc<{ty}[1, {box}],{lay!r}>"
    for hw in (False, True):
        sig = {"X": f"*{ty}", "T": "*i64", "W": "*fp32", "DEN": "*fp32", "LOSS": "*fp32", "x_desc": d, "g_desc": d, "M": "i32", "C": "i32", "sx": "i32", "ignore_index": "i32"}
        cx = dict(HAS_WEIGHT=hw, MEAN=True, SUB=sub, BOX=box, NBUF=nbuf, NOUT=nout, VEC=16 // elem, num_warps=warps)
        sig.update({k: "constexpr" for k in cx})
        k = triton.compile(GluonASTSource(sg._ce_fwd_tma_kernel, sig, cx, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
        print("ce", ty, hw, "regs", k.n_regs if hasattr(k, "n_regs") else "?", "smem", k.metadata.shared)
for elem, ty in ((2, "bf16"), (4, "fp32")):
    sub, box, nbuf, nout, warps, per_sm = sg.BWD_CONFIGS[elem]
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8*elem, rank=2)
    d = f"tensordesc<{ty}[1, {box}],{lay!r}>"
    sig = {"Y": f"*{ty}", "y_desc": d, "dy_desc": d, "dx_desc": d, "M": "i32", "N": "i32"}
    cx = dict(SUB=sub, BOX=box, NBUF=nbuf, NOUT=nout, VEC=16 // elem, num_warps=warps)
    sig.update({k: "constexpr" for k in cx})
    k = triton.compile(GluonASTSource(sg._softmax_bwd_tma_kernel, sig, cx, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    print("bwd", ty, "smem", k.metadata.shared)
