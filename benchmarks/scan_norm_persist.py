"""sm_90 static scan (no GPU) of the persistent wide-row norm backward (``_norm_bwd_persist_kernel``, opt-in
``bwd_persist``) for the sweep of ``benchmarks/gpu_session15_a.sh``: registers, spill stack, shared memory, LDGSTS
(cp.async: the SMEM-pipelined row loop) and the programs an SM holds by registers and by shared memory.

    python benchmarks/scan_norm_persist.py   ->  benchmarks/results/issue9/norm_persist_static_scan_sm90.json
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

from fused_layers.ops import layer_norm as ln  # noqa: E402

rows = []
for rms in (False, True):
    for block, warps, st in ((2048, 4, 3), (4096, 4, 3), (4096, 8, 1), (4096, 8, 3), (4096, 8, 4), (8192, 8, 3),
                             (8192, 16, 3), (4096, 16, 3)):
        types = {"X": "*bf16", "DY": "*bf16", "DX": "*bf16", "W": "*bf16", "STATS": "*fp32", "PARTS": "*fp32",
                 "SLOTS": "*i64"}
        cx = dict(IS_RMS=rms, HAS_W=True, HAS_B=not rms, BLOCK_N=block, PHASE=2, CAST_BEFORE_W=False, STAGES=st)
        label = f"{'rms' if rms else 'ln'} bf16 {block // 1024}K w{warps} stages {st}"
        try:
            r = compile_sm90(ln._norm_bwd_persist_kernel, *signature(ln._norm_bwd_persist_kernel, cx, types, (),
                                                                       ("sx", "sdy", "N", "PIECE")), num_warps=warps)
        except Exception as e:  # noqa: BLE001
            print(f"{label}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        by_regs = 65536 // (warps * 32 * max(r["regs"], 1))
        by_smem = 233472 // (r["shared_bytes"] + 1024) if r["shared_bytes"] else 32
        row = dict(config=label, regs=r["regs"], stack=r["stack_bytes"], smem=r["shared_bytes"], ldgsts=r["ops"]["LDGSTS"],
                   ldg=r["ops"]["LDG"], programs_per_sm=min(by_regs, by_smem, 64 // warps))
        print(row, flush=True)
        rows.append(row)
os.makedirs(os.path.join(HERE, "results", "issue9"), exist_ok=True)
with open(os.path.join(HERE, "results", "issue9", "norm_persist_static_scan_sm90.json"), "w") as f:
    json.dump(dict(triton=triton.__version__, target="sm_90", rows=rows), f, indent=1)
