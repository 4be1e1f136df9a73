"""sm_90 static scan (Triton 3.6 venv) of the persistent softmax forward with PACKED pieces (session 22, commit 9aad3c2 of
the persist_packed candidate; reverted after it lost: run it at that commit).
    /tmp/v36/bin/python benchmarks/scan_softmax_persist_packed.py
"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import warnings; warnings.filterwarnings("ignore")
from _sm90 import compile_sm90, signature
from fused_layers.ops import softmax as sm
ONES = ("INNER", "sxn", "syn", "sxi", "syi")
for block, warps, st, packed, cap in ((4096, 4, 3, False, None), (4096, 4, 3, True, None), (4096, 4, 3, True, 40),
                                      (8192, 8, 3, False, None), (8192, 8, 2, True, 40), (16384, 16, 2, False, None),
                                      (16384, 16, 2, True, None), (16384, 16, 2, True, 40), (16384, 16, 2, True, 48),
                                      (16384, 16, 3, True, 40)):
    types = {"X": "*bf16", "Y": "*bf16", "SLOTS": "*i64"}
    cx = dict(SPLITS_P2=64, BLOCK_N=block, PHASE=2, LEAN=False, STAGES=st, PACKED=packed)
    r = compile_sm90(sm._softmax_fwd_persist_kernel, *signature(sm._softmax_fwd_persist_kernel, cx, types, ONES,
                     ("sxo", "syo", "N", "PIECE")), num_warps=warps, maxnreg=cap)
    ops = r["ops"]
    print(f"{block}x{warps} st{st} packed={packed} cap={cap}: regs {r['regs']} stack {r['stack_bytes']} smem {r['shared_bytes']} "
          f"by_regs {65536 // (warps * 32 * max(r['regs'], 1))} by_smem {233472 // (r['shared_bytes'] + 1024)} "
          f"LDGSTS {ops.get('LDGSTS', 0)} STL {ops.get('STL', 0)} MUFU {ops.get('MUFU', 0)} PRMT {ops.get('PRMT', 0)} sass {sum(ops.values())}", flush=True)
