"""Ahead-of-time compile of a Triton kernel for sm_90 on a machine without a GPU, and what its SASS holds.

Shared by the static scans (``bench_attention.py --static-scan*``, ``scan_norm_bwd_stages.py``,
``scan_stream_stages.py``): registers and spill stack a thread, shared memory, and a count of every SASS
opcode (cuobjdump from Triton's own CUDA tools), e.g. HGMMA (wgmma), LDGSTS (cp.async), UTMALDG / UTMAREDG
(TMA loads / reduce-adds).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)")


def signature(fn, constexprs: dict, types: dict[str, str], ones=(), divisible=()) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attributes) for ``triton.compile`` of ``fn``: each argument named in
    ``constexprs`` is a constexpr; each in ``ones`` the constexpr 1 (what Triton's runtime specializes a value
    of 1 to: unit strides, INNER = 1 of 2-D rows); the others take their type from ``types`` (default i32).
    Pointer arguments are 16-byte aligned, as torch allocations are, and so are the integers in
    ``divisible`` (multiples of 16, as the runtime specializes them)."""
    sig, cx, attrs = {}, dict(constexprs), {}
    # A constexpr parameter left out takes its default, as a launch does (not a runtime i32: that compiled every
    # constexpr-guarded branch into the binary and inflated registers and code; found in session 11).
    for prm in getattr(fn, "params", ()):
        if prm.is_constexpr and prm.name not in cx and getattr(prm, "has_default", False):
            cx[prm.name] = prm.default
    for i, name in enumerate(fn.arg_names):
        if name in cx:
            sig[name] = "constexpr"
        elif name in ones:
            sig[name], cx[name] = "constexpr", 1
        else:
            sig[name] = types.get(name, "i32")
            if sig[name].startswith("*") or name in divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, cx, attrs


def compile_sm90(fn, sig: dict, constexprs: dict, attrs: dict, num_warps: int, num_stages: int | None = None,
                 source=ASTSource, maxnreg: int | None = None) -> dict:
    """Compile for sm_90 (``source``: Triton's ASTSource, or Gluon's GluonASTSource for a Gluon kernel); returns
    regs, stack_bytes, shared_bytes, global_scratch, total_warps and ``ops``, a Counter of the SASS opcodes."""
    options = dict(num_warps=num_warps)
    if num_stages is not None:
        options["num_stages"] = num_stages
    if maxnreg is not None:  # ptxas's register cap (Triton's maxnreg launch option)
        options["maxnreg"] = maxnreg
    k = triton.compile(source(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
        path = f.name
    try:
        usage = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True).stdout
        sass = subprocess.run([_CUOBJDUMP, "-sass", path], capture_output=True, text=True).stdout
    finally:
        os.remove(path)
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    ops = Counter(op.group(1) for op in map(_OPCODE.search, sass.splitlines()) if op)
    return dict(regs=int(m.group(1)), stack_bytes=int(m.group(2)), shared_bytes=k.metadata.shared,
                global_scratch=getattr(k.metadata, "global_scratch_size", None),
                total_warps=getattr(k.metadata, "num_warps", None), ops=ops)
