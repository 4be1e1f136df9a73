"""sm_90 static compile (no GPU) of the Gluon row backward of the norms (fused_layers/ops/layer_norm_gluon.py) with the
GPU machine's Triton (3.6, a venv of its own): registers, spills, shared memory, SASS counts.
    /tmp/v36/bin/python benchmarks/scan_norm_gluon.py > benchmarks/results/issue9/norm_gluon_static_scan_sm90_triton36.txt
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".")
import warnings  # noqa: E402

warnings.filterwarnings("ignore")
import triton  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from _sm90 import compile_sm90  # noqa: E402
from fused_layers.ops import layer_norm_gluon as lg  # noqa: E402

print("triton", triton.__version__)
DIV16 = [["tt.divisibility", 16]]


def desc(dtype, block):
    bits = 32 if dtype == "fp32" else 16
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=len(block))
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{lay!r}>"


# (N, dtype, is_rms, has_w, has_b, ring rows, dB in shared memory, warps, weight as float32): the default form over
# widths / dtypes / affine forms, then the variants of session 18 where they fit
CASES = [(N, dt, *f, lg.STAGES, False, lg.WARPS, False) for N in (16384, 8192, 4096) for dt in ("bf16", "fp32")
         for f in ((False, True, True), (True, True, False), (False, False, False))
         if not (dt == "fp32" and N > 8192)]  # (fp32 16K: 2 x 128 KB of ring does not fit; supported() refuses it)
LN, RMS = (False, True, True), (True, True, False)
CASES += [(16384, "bf16", *LN, 2, True, 16, False), (16384, "bf16", *LN, 3, False, 16, False),
          (16384, "bf16", *RMS, 3, False, 16, False), (8192, "bf16", *LN, 3, True, 16, False),
          (8192, "bf16", *LN, 2, True, 16, False), (8192, "bf16", *LN, 4, False, 16, False),
          (16384, "bf16", *LN, 2, False, 16, True), (16384, "bf16", *RMS, 2, False, 16, True),
          (16384, "bf16", *LN, 2, False, 32, False), (16384, "bf16", *LN, 2, True, 32, False),
          (16384, "bf16", *RMS, 2, False, 32, False), (16384, "bf16", *LN, 2, False, 32, True),
          (16384, "bf16", *RMS, 2, False, 32, True), (8192, "bf16", *LN, 2, False, 16, True)]
CASES = [c + (False, False) for c in CASES] + [(16384, "bf16", *LN, 2, False, 16, False, True, False),
                                                (16384, "bf16", *RMS, 2, False, 16, False, True, False),
                                                (16384, "bf16", *LN, 2, False, 16, False, False, True),
                                                (16384, "bf16", *RMS, 2, False, 16, False, False, True),
                                                (8192, "bf16", *LN, 2, False, 16, False, False, True)]
CASES = [c + (False,) for c in CASES] + [(16384, "bf16", *LN, 2, False, 16, False, False, True, True),  # session 19
                                         (16384, "bf16", *LN, 2, False, 16, False, False, False, True)]
CASES = [c + (0,) for c in CASES] + [(16384, "bf16", *LN, 2, False, 16, False, False, True, True, 2),  # session 20: PDL
                                     (16384, "bf16", *RMS, 2, False, 16, False, False, False, False, 2),
                                     (16384, "bf16", *RMS, 2, False, 16, False, False, False, False, 1)]
if os.environ.get("SCAN_ONLY") == "pdl":
    CASES = [c for c in CASES if c[-1] or (c[:3] == (16384, "bf16", True) and c[4] and c[5] == 2 and c[7] == 16
                                           and not (c[6] or c[8] or c[9] or c[10] or c[11]))
             or (c[:3] == (16384, "bf16", False) and c[4] and c[10] and c[11] and c[7] == 16 and c[5] == 2 and not c[9])]
if os.environ.get("SCAN_ONLY") == "fold_mean":
    CASES = [c for c in CASES if c[:3] == (16384, "bf16", False) and c[4] and not (c[6] or c[8] or c[9]) and c[5] == 2
             and c[7] == 16]
for N, dt, is_rms, has_w, has_b, stages, db_smem, warps, w_f32, device_desc, smem_sums, fold_mean, pdl in CASES:
    R = N // lg.BOX
    sig = {"X": f"*{dt}", "DY": f"*{dt}", "DX": f"*{dt}", "W": f"*{dt}", "STATS": "*fp32", "PARTS": "*fp32",
           "M": "i32", "N": "i32", "sx": "i32", "sdy": "i32"}
    if device_desc:
        sig.update(x_desc="constexpr", dy_desc="constexpr", w_desc="constexpr")
    else:
        sig.update(x_desc=desc(dt, [1, R, 256]), dy_desc=desc(dt, [1, R, 256]),
                   w_desc=desc(dt, [R, 256]) if has_w else desc(dt, [1, R, 256]))
    bits = 32 if dt == "fp32" else 16
    cx = dict(**(dict(x_desc=None, dy_desc=None, w_desc=None) if device_desc else {}), IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_b, R=R, VEC=16 // (4 if dt == "fp32" else 2),
              STAGES=stages, DB_SMEM=db_smem, W_F32=w_f32, X_BITS=bits, W_BITS=bits, DEVICE_DESC=device_desc, SMEM_SUMS=smem_sums, FOLD_MEAN=fold_mean,
              PDL_WAIT=pdl >= 2, PDL_TRIGGER=pdl >= 1, num_warps=warps)
    names = list(sig)
    attrs = {(names.index(a),): DIV16 for a in ("X", "DY", "DX", "W", "STATS", "PARTS", "N", "sx", "sdy")}
    label = f"N{N} {dt} {'rms' if is_rms else 'ln'} w={int(has_w)} b={int(has_b)} stages={stages} db_smem={int(db_smem)} warps={warps} w_f32={int(w_f32)} device_desc={int(device_desc)} smem_sums={int(smem_sums)} fold_mean={int(fold_mean)} pdl={pdl}"
    try:
        r = compile_sm90(lg._norm_bwd_rows_gluon_kernel, {**sig, **{k: "constexpr" for k in cx}}, cx, attrs,
                         warps, source=GluonASTSource)
    except Exception as e:  # noqa: BLE001
        print(f"{label}: COMPILE FAILED: {str(e)[-2500:]}", flush=True)
        continue
    ops = r["ops"]
    print(f"{label}: regs {r['regs']} stack {r['stack_bytes']} smem {r['shared_bytes']} scratch {r['global_scratch']} "
          f"UTMALDG {ops.get('UTMALDG', 0)} LDS {sum(v for o, v in ops.items() if o.startswith('LDS'))} "
          f"STG {sum(v for o, v in ops.items() if o.startswith('STG'))} BAR {ops.get('BAR', 0)} "
          f"STL {ops.get('STL', 0)} sass {sum(ops.values())}", flush=True)
