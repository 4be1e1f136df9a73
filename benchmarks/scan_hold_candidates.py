"""sm_90 static scan (no GPU) of the HOLD candidates (session 12) of the persistent norm backward and the softmax SMEM form
beside the defaults,
with the GPU machine's Triton (3.6: pip install triton==3.6.0 in a venv of its own):
    python benchmarks/scan_hold_candidates.py > benchmarks/results/issue9/hold_static_scan_sm90_triton36.txt
"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import warnings; warnings.filterwarnings("ignore")
import triton
from _sm90 import compile_sm90, signature
from fused_layers.ops import layer_norm as ln
print("triton", triton.__version__)
def show(label, r):
    print(f"{label}: regs {r['regs']} stack {r['stack_bytes']} smem {r['shared_bytes']} sass {sum(r['ops'].values())} LDGSTS {r['ops'].get('LDGSTS', 0)}", flush=True)
types = {"X": "*bf16", "DY": "*bf16", "DX": "*bf16", "W": "*bf16", "STATS": "*fp32", "PARTS": "*fp32", "SLOTS": "*i64"}
for rms, blk, wp in ((False, 2048, 4), (True, 2048, 4), (False, 4096, 8), (True, 4096, 8)):
    for extra in ({"PACK": not rms}, {"PACK": not rms, "HOLD": True}):
        for st in (3, 2):
            cx = dict(IS_RMS=rms, HAS_W=True, HAS_B=not rms, BLOCK_N=blk, PHASE=2, CAST_BEFORE_W=False, STAGES=st, **extra)
            r = compile_sm90(ln._norm_bwd_persist_kernel, *signature(ln._norm_bwd_persist_kernel, cx, types, (), ("sx", "sdy", "N", "PIECE")), num_warps=wp)
            show(f"{'rms' if rms else 'ln'} bwd bf16 {blk//1024}K w{wp} st{st} {'+'.join(k for k,v in extra.items() if v) or 'default'}", r)
# The softmax SMEM form's HOLD candidate (session 12; row k - 1's piece from registers, LAG's schedule) beside the
# default and LAG, bf16, 4K x 4 warps x 3 stages (the 16-bit default) and 2K x 4 warps.
from fused_layers.ops import softmax as sm
ONES = ("INNER", "sxn", "syn", "sxi", "syi", "sdn", "sgn", "sdi", "sgi")
for blk, wp in ((4096, 4), (2048, 4)):
    for extra in ({}, {"LAG": True}, {"HOLD": True}):
        name = "+".join(extra) or "default"
        r = compile_sm90(sm._softmax_fwd_persist_kernel, *signature(sm._softmax_fwd_persist_kernel, dict(SPLITS_P2=64, BLOCK_N=blk, PHASE=2, STAGES=3, **extra),
                         {"X": "*bf16", "Y": "*bf16", "SLOTS": "*i64"}, ONES, ("sxo", "syo", "N", "PIECE")), num_warps=wp)
        show(f"softmax fwd bf16 {blk // 1024}K w{wp} st3 {name}", r)
        r = compile_sm90(sm._softmax_bwd_persist_kernel, *signature(sm._softmax_bwd_persist_kernel, dict(SPLITS_P2=64, BLOCK_N=blk, PHASE=2, STAGES=3, **extra),
                         {"Y": "*bf16", "DY": "*bf16", "DX": "*bf16", "SLOTS": "*i64"}, ONES, ("syo", "sdo", "sgo", "N", "PIECE")), num_warps=wp)
        show(f"softmax bwd bf16 {blk // 1024}K w{wp} st3 {name}", r)
