"""Static scan (sm_90, no GPU needed): the width of the persistent kernels' global accesses on 16-bit rows that are
not 16-element aligned, plain against VEC8 (ops/_rowsync.py), beside aligned rows.  Counts the SASS memory
instructions with their modifiers (LDGSTS.E.BYPASS.128 = a 16-byte cp.async; .64 / .32 / none = narrower).

    TRITON_INTERPRET= python benchmarks/scan_vec8.py      (a Triton with sm_90 tools, e.g. the H200's 3.6)
"""
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from _sm90 import _CUOBJDUMP, signature  # noqa: E402
from fused_layers.ops import cross_entropy as ce  # noqa: E402
from fused_layers.ops import softmax as sm  # noqa: E402

MEM = re.compile(r"\b((?:LDGSTS|LDG|STG|LDS|STS)(?:\.[A-Z0-9_]+)*)")


INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)(.*)")


def scan(fn, cx, types, ones, divisible, warps, stages=None):
    """(Counter of the memory instructions with their modifiers, SASS instructions in all, in the row loop)."""
    sig, cx, attrs = signature(fn, cx, types, ones=ones, divisible=divisible)
    options = dict(num_warps=warps)
    if stages:
        options["num_stages"] = stages
    k = triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    sass = subprocess.run([_CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    os.remove(f.name)
    insns = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in map(INSN.search, sass.splitlines()) if m]
    lo = hi = 0  # the row loop: the widest backward branch
    for addr, op, rest in insns:
        t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if t and int(t.group(1), 16) < addr and addr - int(t.group(1), 16) > hi - lo:
            lo, hi = int(t.group(1), 16), addr
    loop = sum(1 for addr, _, _ in insns if lo <= addr <= hi)
    return Counter(m.group(1) for m in map(MEM.search, sass.splitlines()) if m), len(insns), loop


def show(name, res):
    ops, total, loop = res
    mem = "  ".join(f"{k} {v}" for k, v in sorted(ops.items()) if k.startswith(("LDG", "STG")))
    print(f"{name:44s} SASS {total:5d} (row loop {loop:4d})  {mem}")


CE_T = {"X": "*bf16", "T": "*i64", "W": "*bf16", "LOSS": "*fp32", "DX": "*bf16", "DEN": "*fp32", "RS": "*bf16",
        "SLOTS": "*i64", "inv_den": "fp32"}
CE_CX = dict(SPLITS_P2=16, BLOCK_N=4096, HAS_WEIGHT=False, DEN_ON_DEVICE=True, HAS_ROW_SCALE=False, PHASE=2, STAGES=4)
ONES = ("INNER", "sxc", "sdc", "sxi", "sdi")
V64 = dict(VEC8=True, VEC_WIN=64)
for name, extra, div in (("CE aligned (C, strides multiples of 16)", {}, ("sxo", "sdo", "C", "PIECE")),
                         ("CE misaligned, plain", {}, ("PIECE",)),
                         ("CE misaligned, VEC8 (16-byte window)", dict(VEC8=True), ("PIECE",)),
                         ("CE misaligned, VEC8 (128-byte window)", V64, ("PIECE",))):
    show(name, scan(ce._ce_fwd_persist_kernel, dict(CE_CX, **extra), CE_T, ONES, div, 4))
SM_ONES = ("INNER", "sxn", "syn", "sxi", "syi")
for name, extra, div in (("softmax fwd aligned", {}, ("sxo", "syo", "N", "PIECE")),
                         ("softmax fwd misaligned, plain", {}, ("PIECE",)),
                         ("softmax fwd misaligned, VEC8 (128-byte window)", V64, ("PIECE",))):
    show(name, scan(sm._softmax_fwd_persist_kernel, dict(SPLITS_P2=16, BLOCK_N=4096, PHASE=2, STAGES=3, **extra),
                    {"X": "*bf16", "Y": "*bf16", "SLOTS": "*i64"}, SM_ONES, div, 4))
for name, extra, div in (("softmax bwd aligned", {}, ("syo", "sdo", "sgo", "N", "PIECE")),
                         ("softmax bwd misaligned, plain", {}, ("PIECE",)),
                         ("softmax bwd misaligned, VEC8 (128-byte window)", V64, ("PIECE",))):
    show(name, scan(sm._softmax_bwd_persist_kernel, dict(SPLITS_P2=16, BLOCK_N=4096, PHASE=2, STAGES=3, **extra),
                    {"Y": "*bf16", "DY": "*bf16", "DX": "*bf16", "SLOTS": "*i64"},
                    ("INNER", "syn", "sdn", "sgn", "syi", "sdi", "sgi"), div, 8))
