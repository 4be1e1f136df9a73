"""sm_90 static scan (no GPU) of the session-11 candidates (softmax / CE SMEM+LEAN, the no-exchange diagnostics,
the packed LayerNorm backward) beside the defaults, with the GPU machine's Triton (3.6: pip install triton==3.6.0 in
a venv of its own):  python benchmarks/scan_persist_candidates.py > benchmarks/results/issue10/persist_candidates_static_scan_sm90_triton36.txt
"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import warnings; warnings.filterwarnings("ignore")
import triton
from _sm90 import compile_sm90, signature
from fused_layers.ops import softmax as sm, layer_norm as ln, cross_entropy as ce
ONES = ("INNER", "sxn", "syn", "sxi", "syi", "sdn", "sgn", "sdi", "sgi")
print("triton", triton.__version__)
def show(label, r):
    print(f"{label}: regs {r['regs']} stack {r['stack_bytes']} smem {r['shared_bytes']} sass {sum(r['ops'].values())} LDGSTS {r['ops'].get('LDGSTS', 0)} MUFU {r['ops'].get('MUFU', 0)}", flush=True)
for lean in (False, True):
    for blk, wp, st in ((4096, 4, 3), (4096, 4, 4), (8192, 8, 3)):
        r = compile_sm90(sm._softmax_fwd_persist_kernel, *signature(sm._softmax_fwd_persist_kernel, dict(SPLITS_P2=64, BLOCK_N=blk, PHASE=2, LEAN=lean, STAGES=st), {"X": "*bf16", "Y": "*bf16", "SLOTS": "*i64"}, ONES, ("sxo", "syo", "N", "PIECE")), num_warps=wp)
        show(f"softmax fwd bf16 {blk//1024}K w{wp} st{st}{' LEAN' if lean else ''}", r)
r = compile_sm90(sm._softmax_fwd_persist_kernel, *signature(sm._softmax_fwd_persist_kernel, dict(SPLITS_P2=64, BLOCK_N=4096, PHASE=2, STAGES=3, DIAG_NOSYNC=True), {"X": "*bf16", "Y": "*bf16", "SLOTS": "*i64"}, ONES, ("sxo", "syo", "N", "PIECE")), num_warps=4)
show("softmax fwd bf16 4K w4 st3 DIAG_NOSYNC", r)
types = {"X": "*bf16", "DY": "*bf16", "DX": "*bf16", "W": "*bf16", "STATS": "*fp32", "PARTS": "*fp32", "SLOTS": "*i64"}
for rms, blk, wp in ((False, 2048, 4), (True, 2048, 4), (False, 4096, 8), (True, 4096, 8), (False, 8192, 16)):
    for extra in ({}, {"PACK": True}, {"DIAG_NOSYNC": True}):
        if rms and extra.get("PACK"):
            continue
        cx = dict(IS_RMS=rms, HAS_W=True, HAS_B=not rms, BLOCK_N=blk, PHASE=2, CAST_BEFORE_W=False, STAGES=3, **extra)
        r = compile_sm90(ln._norm_bwd_persist_kernel, *signature(ln._norm_bwd_persist_kernel, cx, types, (), ("sx", "sdy", "N", "PIECE")), num_warps=wp)
        show(f"{'rms' if rms else 'ln'} bwd bf16 {blk//1024}K w{wp} st3 {'+'.join(extra) or 'default'}", r)
ctypes_ = {"X": "*bf16", "T": "*i64", "W": "*bf16", "LOSS": "*fp32", "DX": "*bf16", "DEN": "*fp32", "RS": "*bf16", "SLOTS": "*i64", "inv_den": "fp32"}
for lean in (False, True):
    for st in (3, 4):
        cx = dict(SPLITS_P2=64, BLOCK_N=4096, HAS_WEIGHT=False, DEN_ON_DEVICE=True, HAS_ROW_SCALE=False, PHASE=2, LEAN=lean, STAGES=st)
        r = compile_sm90(ce._ce_fwd_persist_kernel, *signature(ce._ce_fwd_persist_kernel, cx, ctypes_, ("INNER", "sxc", "sdc", "sxi", "sdi"), ("sxo", "sdo", "C", "PIECE")), num_warps=4)
        show(f"CE bf16 4K w4 st{st}{' LEAN' if lean else ''}", r)
