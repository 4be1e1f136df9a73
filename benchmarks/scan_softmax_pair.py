"""sm_90 static scan (Triton 3.6 recommended, as on the GPU) of the softmax SMEM forward with PAIR (two rows an
exchange) beside one row: registers, shared memory, cp.async, MUFU and programs an SM.
    python benchmarks/scan_softmax_pair.py
"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import warnings; warnings.filterwarnings("ignore")
from _sm90 import compile_sm90, signature
from fused_layers.ops import softmax as sm
ONES = ("INNER", "sxn", "syn", "sxi", "syi", "sdn", "sgn", "sdi", "sgi")
for pair in (False, True):
    for blk, wp, st in ((4096, 4, 2), (4096, 4, 3), (2048, 4, 3), (4096, 8, 3)):
        for lean in (False, True):
            r = compile_sm90(sm._softmax_fwd_persist_kernel, *signature(sm._softmax_fwd_persist_kernel, dict(SPLITS_P2=64, BLOCK_N=blk, PHASE=2, LEAN=lean, STAGES=st, PAIR=pair), {"X": "*bf16", "Y": "*bf16", "SLOTS": "*i64"}, ONES, ("sxo", "syo", "N", "PIECE")), num_warps=wp)
            by_regs = 65536 // (wp * 32 * (-(-r["regs"] // 8) * 8))
            by_smem = 233472 // (r["shared_bytes"] + 1024)
            print(f"{'PAIR' if pair else 'one '} {blk//1024}K w{wp} st{st}{' lean' if lean else '     '}: regs {r['regs']} stack {r['stack_bytes']} smem {r['shared_bytes']} LDGSTS {r['ops'].get('LDGSTS', 0)} MUFU {r['ops'].get('MUFU', 0)} programs/SM {min(by_regs, by_smem, 16)}", flush=True)
