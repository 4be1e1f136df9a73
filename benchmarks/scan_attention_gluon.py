"""sm_90 static compile (no GPU) of the Gluon attention kernels (fused_layers/ops/attention_gluon.py) with the GPU
machine's Triton (3.6, in a venv of its own): registers, spills, shared memory, SASS counts (HGMMA = wgmma, UTMALDG /
UTMASTG = TMA loads / stores, SYNCS = mbarrier ops, USETMAXREG = setmaxnreg, STL = spill stores), beside the Triton
forward's numbers of attention_static_scan_variants_triton36.md.
    /tmp/v36/bin/python benchmarks/scan_attention_gluon.py > benchmarks/results/issue13/gluon_static_scan_sm90_triton36.txt
"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import warnings; warnings.filterwarnings("ignore")
import triton
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from _sm90 import compile_sm90
from fused_layers.ops import attention_gluon as ag

print("triton", triton.__version__)
DIV16 = [["tt.divisibility", 16]]
GEO = {"H": "i32", "RB": "i32", "RH": "i32", "CH": "i32"}  # head origins (_head_origin)
GEO_KV = {"G": "i32", "RBk": "i32", "RHk": "i32", "CHk": "i32"}  # the forwards' key / value heads (_kv_origin)


def desc(block, d):
    """The signature type of a bf16 TMA descriptor of ``block`` rows x d columns (the launcher's layout)."""
    return f"tensordesc<bf16[{block}, {d}],{gl.NVMMASharedLayout.get_default_for([block, d], gl.bfloat16)!r}>"


def scan(label, fn, sig, cx, aligned, warps):
    """Compile ``fn`` for sm_90 (``aligned``: names of pointer / integer arguments divisible by 16) and print a line."""
    names = list(sig)
    attrs = {(names.index(a),): DIV16 for a in aligned}
    sig = {**sig, **{k: "constexpr" for k in cx}}
    try:
        r = compile_sm90(fn, sig, cx, attrs, warps, source=GluonASTSource)
    except Exception as e:  # noqa: BLE001
        print(f"{label}: COMPILE FAILED: {str(e)[-3000:]}")
        return
    ops = r["ops"]
    pick = lambda prefix: sum(v for o, v in ops.items() if o.startswith(prefix))  # noqa: E731
    print(f"{label}: regs {r['regs']} stack {r['stack_bytes']} smem {r['shared_bytes']} HGMMA {ops.get('HGMMA', 0)} "
          f"UTMALDG {ops.get('UTMALDG', 0)} UTMASTG {ops.get('UTMASTG', 0)} SYNCS {pick('SYNCS')} "
          f"USETMAXREG {ops.get('USETMAXREG', 0)} STL {ops.get('STL', 0)} MUFU {ops.get('MUFU', 0)} sass {sum(ops.values())}",
          flush=True)


# The forward (one warpgroup of 64 rows a CTA), with and without the persistent grid
for D, (bm, bn, warps, stages) in sorted(ag.CONFIGS.items()):
    for persistent in (False, True):
        for causal in (False, True):
            sig = {"LSE": "*fp32", "q_desc": desc(bm, D), "k_desc": desc(bn, D), "v_desc": desc(bn, D),
                   "o_desc": desc(bm, D), "qk_scale": "fp32", "S": "i32", "BH": "i32", **GEO, **GEO_KV}
            scan(f"D{D} causal={int(causal)} persistent={int(persistent)} {bm}x{bn} w{warps} st{stages}",
                 ag._attn_fwd_gluon_kernel, sig, dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, CAUSAL=causal, STAGES=stages,
                                                      PERSISTENT=persistent, num_warps=warps), ("LSE", "S"), warps)

# Candidate 2: the warp-specialized ping-pong (two consumer warpgroups, a producer warp)
# (persistent=1: one program an SM walking the tiles, the next tile's Q and K / V fetched under the current one)
for D, (bn, stages, cregs, pregs) in sorted(ag.WS_CONFIGS.items()):
    for persistent in (False, True):
        for causal in (False, True):
            sig = {"LSE": "*fp32", "q_desc": desc(64, D), "k_desc": desc(bn, D), "v_desc": desc(bn, D),
                   "o_desc": desc(64, D), "qk_scale": "fp32", "S": "i32", "BH": "i32", **GEO, **GEO_KV}
            scan(f"WS D{D} causal={int(causal)} persistent={int(persistent)} N{bn} st{stages}", ag._attn_fwd_gluon_ws_kernel,
                 sig, dict(BLOCK_N=bn, HEAD_D=D, CAUSAL=causal, STAGES=stages, CONSUMER_REGS=cregs, PRODUCER_REGS=pregs,
                           PERSISTENT=persistent, num_warps=4), ("LSE", "S"), 4)

# The backward's dK / dV candidate
for D, (bm, bn, warps, stages) in sorted(ag.DKDV_CONFIGS.items()):
    for causal in (False, True):
        sig = {"LSE": "*fp32", "DELTA": "*fp32", "DQ": "*fp32", "q_desc": desc(bm, D), "do_desc": desc(bm, D),
               "k_desc": desc(bn, D), "v_desc": desc(bn, D), "dk_desc": desc(bn, D), "dv_desc": desc(bn, D),
               "qk_scale": "fp32", "sm_scale": "fp32", "S": "i32", **GEO, **GEO_KV}
        for gqa, fused in ((False, False), (True, False), (False, True)):
            scan(f"DKDV D{D} causal={int(causal)} gqa={int(gqa)} fused_dq={int(fused)} {bm}x{bn} w{warps} st{stages}",
                 ag._attn_bwd_dkdv_gluon_kernel, sig, dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, CAUSAL=causal, STAGES=stages,
                                                          GQA=gqa, FUSED_DQ=fused, num_warps=warps),
                 ("LSE", "DELTA", "DQ", "S"), warps)

# The backward's dQ kernel (session 14), at its default and a D64 variant with 128-key steps
for D, (bm, bn, warps, stages) in sorted(ag.DQ_CONFIGS.items()) + [(64, (64, 128, 4, 2)), (128, (64, 64, 4, 3))]:
    for causal in (False, True):
        sig = {"LSE": "*fp32", "DELTA": "*fp32", "q_desc": desc(bm, D), "do_desc": desc(bm, D), "k_desc": desc(bn, D),
               "v_desc": desc(bn, D), "dq_desc": desc(bm, D), "qk_scale": "fp32", "sm_scale": "fp32", "S": "i32", **GEO}
        scan(f"DQ D{D} causal={int(causal)} {bm}x{bn} w{warps} st{stages}", ag._attn_bwd_dq_gluon_kernel, sig,
             dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, CAUSAL=causal, STAGES=stages, num_warps=warps),
             ("LSE", "DELTA", "S"), warps)
