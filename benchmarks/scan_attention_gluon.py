"""sm_90 static compile (no GPU) of the Gluon attention forward (fused_layers/ops/attention_gluon.py) with the GPU
machine's Triton (3.6, in a venv of its own): registers, spills, shared memory, SASS counts (HGMMA = wgmma, UTMALDG =
TMA loads, SYNCS = mbarrier ops), beside the Triton forward's numbers of attention_static_scan_variants_triton36.md.
    /tmp/v36/bin/python benchmarks/scan_attention_gluon.py > benchmarks/results/issue13/gluon_static_scan_sm90_triton36.txt
"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import warnings; warnings.filterwarnings("ignore")
import re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from _sm90 import _CUOBJDUMP, _OPCODE
from collections import Counter
from fused_layers.ops import attention_gluon as ag

print("triton", triton.__version__)
fn = ag._attn_fwd_gluon_kernel
for D, (bm, bn, warps, stages) in sorted(ag.CONFIGS.items()):
  for persistent in (False, True):
    for causal in (False, True):
        ql = gl.NVMMASharedLayout.get_default_for([bm, D], gl.bfloat16)
        kl = gl.NVMMASharedLayout.get_default_for([bn, D], gl.bfloat16)
        sig = {"q_desc": f"tensordesc<bf16[{bm}, {D}],{ql!r}>", "k_desc": f"tensordesc<bf16[{bn}, {D}],{kl!r}>",
               "v_desc": f"tensordesc<bf16[{bn}, {D}],{kl!r}>", "o_desc": f"tensordesc<bf16[{bm}, {D}],{ql!r}>",
               "LSE": "*fp32", "qk_scale": "fp32", "S": "i32", "BH": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
               "HEAD_D": "constexpr", "CAUSAL": "constexpr", "STAGES": "constexpr", "PERSISTENT": "constexpr",
               "num_warps": "constexpr"}
        cx = dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, CAUSAL=causal, STAGES=stages, PERSISTENT=persistent, num_warps=warps)
        attrs = {(4,): [["tt.divisibility", 16]], (6,): [["tt.divisibility", 16]]}
        try:
            k = triton.compile(GluonASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
        except Exception as e:  # noqa: BLE001
            print(f"D{D} causal={int(causal)} persistent={int(persistent)}: COMPILE FAILED: {str(e)[:3000]}")
            continue
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(k.asm["cubin"]); path = f.name
        usage = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True).stdout
        sass = subprocess.run([_CUOBJDUMP, "-sass", path], capture_output=True, text=True).stdout
        os.remove(path)
        m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        ops = Counter(op.group(1) for op in map(_OPCODE.search, sass.splitlines()) if op)
        print(f"D{D} causal={int(causal)} persistent={int(persistent)} {bm}x{bn} w{warps} st{stages}: regs {m.group(1)} stack {m.group(2)} smem {k.metadata.shared} "
              f"HGMMA {ops.get('HGMMA', 0)} UTMALDG {ops.get('UTMALDG', 0)} UTMASTG {ops.get('UTMASTG', 0)} SYNCS {sum(v for o, v in ops.items() if o.startswith('SYNCS'))} "
              f"WARPGROUP {sum(v for o, v in ops.items() if o.startswith('WARPGROUP'))} MUFU {ops.get('MUFU', 0)} sass {sum(ops.values())}", flush=True)
        if os.environ.get("DUMP"):
            open(f"/tmp/gluon_attn_D{D}_c{int(causal)}.sass", "w").write(sass)
            open(f"/tmp/gluon_attn_D{D}_c{int(causal)}.ttgir", "w").write(k.asm["ttgir"])

# Candidate 2: the warp-specialized ping-pong (two consumer warpgroups, a producer warp; USETMAXREG = setmaxnreg)
fn = ag._attn_fwd_gluon_ws_kernel
for D, (bn, stages, cr, pr) in sorted(ag.WS_CONFIGS.items()):
    for causal in (False, True):
        ql = gl.NVMMASharedLayout.get_default_for([64, D], gl.bfloat16)
        kl = gl.NVMMASharedLayout.get_default_for([bn, D], gl.bfloat16)
        sig = {"q_desc": f"tensordesc<bf16[64, {D}],{ql!r}>", "k_desc": f"tensordesc<bf16[{bn}, {D}],{kl!r}>",
               "v_desc": f"tensordesc<bf16[{bn}, {D}],{kl!r}>", "o_desc": f"tensordesc<bf16[64, {D}],{ql!r}>",
               "LSE": "*fp32", "qk_scale": "fp32", "S": "i32", "BLOCK_N": "constexpr", "HEAD_D": "constexpr",
               "CAUSAL": "constexpr", "STAGES": "constexpr", "CONSUMER_REGS": "constexpr", "PRODUCER_REGS": "constexpr",
               "num_warps": "constexpr"}
        cx = dict(BLOCK_N=bn, HEAD_D=D, CAUSAL=causal, STAGES=stages, CONSUMER_REGS=cr, PRODUCER_REGS=pr, num_warps=4)
        attrs = {(4,): [["tt.divisibility", 16]], (6,): [["tt.divisibility", 16]]}
        try:
            k = triton.compile(GluonASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
        except Exception as e:
            print(f"WS D{D} causal={int(causal)}: COMPILE FAILED: {str(e)[-3000:]}"); continue
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(k.asm["cubin"]); path = f.name
        usage = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True).stdout
        sass = subprocess.run([_CUOBJDUMP, "-sass", path], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        ops = Counter(op.group(1) for op in map(_OPCODE.search, sass.splitlines()) if op)
        print(f"WS D{D} causal={int(causal)} N{bn} st{stages}: regs {m.group(1)} stack {m.group(2)} smem {k.metadata.shared} HGMMA {ops.get('HGMMA',0)} UTMALDG {ops.get('UTMALDG',0)} SYNCS {sum(v for o,v in ops.items() if o.startswith('SYNCS'))} USETMAXREG {ops.get('USETMAXREG',0)} sass {sum(ops.values())}", flush=True)
        os.remove(path)

# The dK / dV candidate of the backward
fn = ag._attn_bwd_dkdv_gluon_kernel
for D, (bm, bn, warps, stages) in sorted(ag.DKDV_CONFIGS.items()):
    for causal in (False, True):
        ml = gl.NVMMASharedLayout.get_default_for([bm, D], gl.bfloat16)
        nl = gl.NVMMASharedLayout.get_default_for([bn, D], gl.bfloat16)
        sig = {"q_desc": f"tensordesc<bf16[{bm}, {D}],{ml!r}>", "do_desc": f"tensordesc<bf16[{bm}, {D}],{ml!r}>",
               "k_desc": f"tensordesc<bf16[{bn}, {D}],{nl!r}>", "v_desc": f"tensordesc<bf16[{bn}, {D}],{nl!r}>",
               "dk_desc": f"tensordesc<bf16[{bn}, {D}],{nl!r}>", "dv_desc": f"tensordesc<bf16[{bn}, {D}],{nl!r}>",
               "LSE": "*fp32", "DELTA": "*fp32", "qk_scale": "fp32", "sm_scale": "fp32", "S": "i32",
               "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "HEAD_D": "constexpr", "CAUSAL": "constexpr",
               "STAGES": "constexpr", "num_warps": "constexpr"}
        cx = dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, CAUSAL=causal, STAGES=stages, num_warps=warps)
        attrs = {(6,): [["tt.divisibility", 16]], (7,): [["tt.divisibility", 16]], (10,): [["tt.divisibility", 16]]}
        try:
            k = triton.compile(GluonASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
        except Exception as e:  # noqa: BLE001
            print(f"DKDV D{D} causal={int(causal)}: COMPILE FAILED: {str(e)[-3000:]}")
            continue
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(k.asm["cubin"]); path = f.name
        usage = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True).stdout
        sass = subprocess.run([_CUOBJDUMP, "-sass", path], capture_output=True, text=True).stdout
        os.remove(path)
        m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        ops = Counter(op.group(1) for op in map(_OPCODE.search, sass.splitlines()) if op)
        print(f"DKDV D{D} causal={int(causal)} {bm}x{bn} w{warps} st{stages}: regs {m.group(1)} stack {m.group(2)} smem {k.metadata.shared} "
              f"HGMMA {ops.get('HGMMA', 0)} UTMALDG {ops.get('UTMALDG', 0)} UTMASTG {ops.get('UTMASTG', 0)} LDS {ops.get('LDS', 0)} STS {ops.get('STS', 0)} "
              f"STL {ops.get('STL', 0)} MUFU {ops.get('MUFU', 0)} sass {sum(ops.values())}", flush=True)
