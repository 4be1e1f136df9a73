"""sm_90 static scan (no GPU) of the persistent wide-row kernels' SMEM-pipelined form (``persist_stages``) against the
register-pipelined one: registers, shared memory, LDGSTS (cp.async: the next rows' piece loads issued ahead) and the
programs an SM holds by registers (65,536 / (threads x registers)) -- session 9's counters tie the persistent kernels'
bandwidth to the bytes in flight per SM.

    python benchmarks/scan_persist_stages.py   ->  benchmarks/results/issue10/persist_stages_static_scan_sm90.json
"""
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import triton  # noqa: E402
from _sm90 import compile_sm90, signature  # noqa: E402

from fused_layers.ops import cross_entropy as ce  # noqa: E402
from fused_layers.ops import softmax as sm  # noqa: E402

ONES = ("INNER", "sxn", "syn", "sxi", "syi", "sdn", "sgn", "sdi", "sgi")
rows = []


def scan(label, fn, cx, types, warps, ones=ONES, divisible=("sxo", "syo", "sdo", "sgo", "N", "PIECE")):
    r = compile_sm90(fn, *signature(fn, cx, types, ones, divisible), num_warps=warps)
    by_regs = 65536 // (warps * 32 * max(r["regs"], 1))
    row = dict(config=label, regs=r["regs"], stack=r["stack_bytes"], smem=r["shared_bytes"], ldgsts=r["ops"]["LDGSTS"],
               ldg=r["ops"]["LDG"], programs_per_sm_by_regs=by_regs)
    print(row, flush=True)
    rows.append(row)


for dt in ("*bf16", "*fp32"):
    for block, warps, st in ((4096, 4, 1), (4096, 4, 3), (4096, 4, 4), (2048, 4, 3), (4096, 8, 3), (8192, 8, 3)):
        types = {"X": dt, "Y": dt, "SLOTS": "*i64"}
        scan(f"softmax fwd {dt[1:]} {block // 1024}K w{warps} stages {st}", sm._softmax_fwd_persist_kernel,
             dict(SPLITS_P2=64, BLOCK_N=block, PHASE=2, LEAN=False, STAGES=st), types, warps)
        types = {"Y": dt, "DY": dt, "DX": dt, "SLOTS": "*i64"}
        scan(f"softmax bwd {dt[1:]} {block // 1024}K w{warps} stages {st}", sm._softmax_bwd_persist_kernel,
             dict(SPLITS_P2=64, BLOCK_N=block, PHASE=2, STAGES=st), types, warps)
if hasattr(ce, "_ce_fwd_persist_kernel"):
    for block, warps, st in ((4096, 4, 1), (4096, 4, 3), (2048, 4, 3), (4096, 8, 3)):
        types = {"X": "*bf16", "T": "*i64", "W": "*bf16", "LOSS": "*fp32", "DX": "*bf16", "DEN": "*fp32", "RS": "*bf16",
                 "SLOTS": "*i64", "inv_den": "fp32"}
        cx = dict(SPLITS_P2=64, BLOCK_N=block, HAS_WEIGHT=False, DEN_ON_DEVICE=True, HAS_ROW_SCALE=False, PHASE=2, LEAN=False)
        cx["STAGES"] = st
        try:
            scan(f"CE bf16 {block // 1024}K w{warps} stages {st}", ce._ce_fwd_persist_kernel, cx, types, warps,
                 ones=("INNER", "sxc", "sdc", "sxi", "sdi"), divisible=("sxo", "sdo", "C", "PIECE"))
        except Exception as e:  # noqa: BLE001 - a form the kernel does not have yet
            print(f"CE {block} w{warps} stages {st}: {type(e).__name__}: {str(e)[:120]}")

with open(os.path.join(HERE, "results", "issue10", "persist_stages_static_scan_sm90.json"), "w") as f:
    json.dump(dict(triton=triton.__version__, target="sm_90", rows=rows), f, indent=1)
