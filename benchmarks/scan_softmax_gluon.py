"""sm_90 static compile (no GPU) of the TMA row-streaming kernels (fused_layers/ops/softmax_gluon.py) with the GPU
machine's Triton (3.6, a venv of its own): registers, spills, shared memory, TMA instruction counts, for each kernel
with (1, BOX) boxes and with FLAT (1, SUB, BOX) boxes.
    /tmp/v36/bin/python benchmarks/scan_softmax_gluon.py > benchmarks/results/issue10/softmax_gluon_static_scan_sm90_triton36.txt
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".")
import triton  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from _sm90 import compile_sm90  # noqa: E402
from fused_layers.ops import softmax_gluon as sg  # noqa: E402

print("triton", triton.__version__)


def desc(ty, bits, sub, box, flat):
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=3 if flat else 2)
    return f"tensordesc<{ty}[1, {sub}, {box}],{lay!r}>" if flat else f"tensordesc<{ty}[1, {box}],{lay!r}>"


def scan(label, fn, sig, cx, warps):
    sig = {**sig, **{k: "constexpr" for k in cx}}
    try:
        r = compile_sm90(fn, sig, cx, {}, warps, source=GluonASTSource)
    except Exception as e:  # noqa: BLE001
        print(f"{label}: COMPILE FAILED: {str(e)[-1500:]}")
        return
    ops = r["ops"]
    print(f"{label}: regs {r['regs']} stack {r['stack_bytes']} smem {r['shared_bytes']} UTMALDG {ops.get('UTMALDG', 0)} "
          f"UTMASTG {ops.get('UTMASTG', 0)} MUFU {ops.get('MUFU', 0)} BAR {ops.get('BAR', 0)} STL {ops.get('STL', 0)}",
          flush=True)


for flat in (False, True):
    for elem, ty in ((2, "bf16"), (4, "fp32")):
        sub, box, nbuf, nout, warps, _ = sg.CONFIGS[elem]
        d = desc(ty, 8 * elem, sub, box, flat)
        base = dict(SUB=sub, BOX=box, NBUF=nbuf, NOUT=nout, VEC=16 // elem, FLAT=flat, num_warps=warps)
        for hold, split in ((False, False), (True, True)):
            scan(f"fwd {ty} flat={int(flat)} hold={int(hold)} split={int(split)}", sg._softmax_fwd_tma_kernel,
                 {"X": f"*{ty}", "Y": f"*{ty}", "STATS": "*i64", "x_desc": d, "y_desc": d, "M": "i32", "N": "i32",
                  "K": "i32", "SEG": "i32"}, dict(base, HOLD=hold, SPLIT=split, STORE_TMA=True), warps)
        for hold in (False, True):
            scan(f"ce {ty} flat={int(flat)} hold={int(hold)}", sg._ce_fwd_tma_kernel,
                 {"X": f"*{ty}", "T": "*i64", "W": "*fp32", "DEN": "*fp32", "LOSS": "*fp32", "x_desc": d, "g_desc": d,
                  "M": "i32", "C": "i32", "sx": "i32", "ignore_index": "i32"},
                 dict(base, HAS_WEIGHT=True, MEAN=True, HOLD=hold), warps)
        sub, box, nbuf, nout, warps, _ = sg.BWD_CONFIGS[elem]
        d = desc(ty, 8 * elem, sub, box, flat)
        scan(f"bwd {ty} flat={int(flat)}", sg._softmax_bwd_tma_kernel,
             {"Y": f"*{ty}", "y_desc": d, "dy_desc": d, "dx_desc": d, "M": "i32", "N": "i32"},
             dict(SUB=sub, BOX=box, NBUF=nbuf, NOUT=nout, VEC=16 // elem, FLAT=flat, num_warps=warps), warps)
