"""sm_90 static scan (no GPU) of the streaming cross-entropy and wide softmax kernels with software-pipelined
chunk loops.

    python benchmarks/scan_stream_stages.py   ->  benchmarks/results/issue10/stream_stages_static_scan_sm90.json

AOT-compiles ``_ce_fwd_kernel`` (stream mode, bf16 logits, class-index targets, gradient) and the wide softmax
kernels for sm_90 with this machine's Triton, with the runtime's specializations of 2-D rows (INNER = 1, unit
column strides), and counts SASS LDGSTS (cp.async: loads pipelined through shared memory) against plain LDG.
A plain ``range`` chunk loop (the default: STAGES = 1, the cross-entropy with PREFETCH = 1) has no LDGSTS;
``tl.range(num_stages=3|4)`` (STAGES; cross_entropy_config.STREAM, softmax_config.WIDE_STAGES) does.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import triton  # noqa: E402
from _sm90 import compile_sm90, signature  # noqa: E402

from fused_layers.ops.cross_entropy import _ce_fwd_kernel  # noqa: E402
from fused_layers.ops.softmax import _softmax_bwd_wide_kernel, _softmax_fwd_wide_kernel  # noqa: E402

rows = []


def scan(label, fn, cx, types, ones, divisible, warps):
    r = compile_sm90(fn, *signature(fn, cx, types, ones, divisible), num_warps=warps)
    row = dict(config=label, regs=r["regs"], stack=r["stack_bytes"], smem=r["shared_bytes"], ldgsts=r["ops"]["LDGSTS"],
               ldg=r["ops"]["LDG"])
    print(row, flush=True)
    rows.append(row)


ce_types = dict(X="*bf16", DX="*bf16", T="*i64", W="*fp32", LOSS="*fp32", DEN="*fp32", RS="*fp32", smoothing="fp32",
                inv_den="fp32")
for name, bn, w, pf, st in (("default 8k w16 pf1", 8192, 16, 1, 1), ("8k w16 st3", 8192, 16, 0, 3), ("4k w8 st3", 4096, 8, 0, 3),
                             ("4k w8 st4", 4096, 8, 0, 4), ("2k w4 st4", 2048, 4, 0, 4)):
    cx = dict(BLOCK_M=1, BLOCK_N=bn, SINGLE=False, SOFT=False, HAS_WEIGHT=False, SMOOTH=False, HAS_GRAD=True,
              DEN_ON_DEVICE=True, HAS_ROW_SCALE=False, PREFETCH=pf, REVERSE=True, LANE_MAX=False, STAGES=st)
    scan(name, _ce_fwd_kernel, cx, ce_types, ("sxc", "stc", "sdc", "INNER", "sxi", "sti", "sdi"), ("C", "sxo", "sdo"), w)

sm_types = dict(X="*bf16", Y="*bf16", DY="*bf16", DX="*bf16", STATS="*fp32", DOT="*fp32", COUNT="*i32")
for kern in (_softmax_fwd_wide_kernel, _softmax_bwd_wide_kernel):
    for stages in (1, 3):
        scan(f"{kern.__name__} 4k w8 STAGES={stages}", kern, dict(SPLITS_P2=4, BLOCK_N=4096, STAGES=stages), sm_types,
             ("INNER", "sxi", "syi", "sdi", "sgi", "sxn", "syn", "sdn", "sgn"), ("N", "PIECE", "sxo", "syo", "sdo", "sgo"), 8)

with open(os.path.join(HERE, "results", "issue10", "stream_stages_static_scan_sm90.json"), "w") as f:
    json.dump(dict(triton=triton.__version__, target="sm_90",
                   kernel="_ce_fwd_kernel (stream, bf16, hard targets, grad); wide softmax", rows=rows), f, indent=1)
