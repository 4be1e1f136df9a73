"""Static scan (sm_90, no GPU needed) of the persistent wide-softmax forward beside the piece-wise one: registers and
SASS instructions per element a thread holds.  Session 8's finding (RUNS_2026-12-01.md): the bf16 persistent forward
runs about 36 SASS instructions per element over the whole kernel (PRMT 156: each bf16 element converted twice;
FADD + FMUL where an FFMA would do), so at the 4 bf16 elements per clock an SM must move at full copy bandwidth it
needs ~3 of the 4 warp-instruction issue slots a clock: issue-bound, where fp32 (2 elements per clock) is not.

    TRITON_INTERPRET= python benchmarks/scan_persist_sass.py
"""
import os
import sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
from _sm90 import signature, compile_sm90
from fused_layers.ops import softmax as sm, cross_entropy as ce
def sm_fwd(block, warps, dt, lean=False):
    fn = sm._softmax_fwd_persist_kernel
    types = {"X": dt, "Y": dt, "SLOTS": "*i64"}
    sig, cx, attrs = signature(fn, dict(SPLITS_P2=64, BLOCK_N=block, PHASE=2, LEAN=lean), types, ones=("INNER", "sxn", "syn", "sxi", "syi"), divisible=("sxo", "syo", "N", "PIECE"))
    return compile_sm90(fn, sig, cx, attrs, warps)
def pw_fwd(block, warps, dt):
    fn = sm._softmax_fwd_wide_kernel
    types = {"X": dt, "Y": dt, "STATS": "*fp32", "COUNT": "*i32"}
    sig, cx, attrs = signature(fn, dict(SPLITS_P2=4, BLOCK_N=block, STAGES=1), types, ones=("INNER", "sxn", "syn", "sxi", "syi"), divisible=("sxo", "syo", "N", "PIECE"))
    return compile_sm90(fn, sig, cx, attrs, warps)
def ce_fwd(block, warps, dt, lean=False):
    fn = ce._ce_fwd_persist_kernel
    types = {"X": dt, "T": "*i64", "W": dt, "LOSS": "*fp32", "DX": dt, "DEN": "*fp32", "RS": dt, "SLOTS": "*i64",
             "inv_den": "fp32"}
    cx = dict(SPLITS_P2=64, BLOCK_N=block, HAS_WEIGHT=False, DEN_ON_DEVICE=True, HAS_ROW_SCALE=False, PHASE=2, LEAN=lean)
    sig, cx, attrs = signature(fn, cx, types, ones=("INNER", "sxc", "sdc", "sxi", "sdi"), divisible=("sxo", "sdo", "C", "PIECE"))
    return compile_sm90(fn, sig, cx, attrs, warps)


for name, f, b, w, dt, kw in [("CE persist bf16 4K w4", ce_fwd, 4096, 4, "*bf16", {}),
                              ("CE persist bf16 4K w4 LEAN", ce_fwd, 4096, 4, "*bf16", dict(lean=True)),
                              ("CE persist bf16 2K w4 LEAN", ce_fwd, 2048, 4, "*bf16", dict(lean=True)),("persist bf16 4K w4", sm_fwd, 4096, 4, "*bf16", {}),
                              ("persist bf16 4K w4 LEAN", sm_fwd, 4096, 4, "*bf16", dict(lean=True)),
                              ("persist bf16 4K w8 LEAN", sm_fwd, 4096, 8, "*bf16", dict(lean=True)),
                              ("persist fp32 2K w4", sm_fwd, 2048, 4, "*fp32", {}),
                              ("persist fp32 2K w4 LEAN", sm_fwd, 2048, 4, "*fp32", dict(lean=True)),
                              ("piecewise bf16 8K w8", pw_fwd, 8192, 8, "*bf16", {})]:
    r = f(b, w, dt, **kw)
    tot = sum(r["ops"].values())
    ept = b // (w * 32)
    top = r["ops"].most_common(12)
    print(f"{name}: regs {r['regs']} total SASS {tot} elems/thread {ept} -> {tot/ept:.1f} instr/elem (whole kernel) top {top}")
