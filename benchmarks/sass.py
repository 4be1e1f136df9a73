"""sass: the machine code of every default kernel configuration, compiled for sm_90 on the CPU (no GPU needed).

Triton compiles ahead of time for any target, so a CPU machine can check that a change leaves the compiled kernels
alone: each case of benchmarks/sass_cases.py (a kernel, its constexprs, argument types and the 1 / 16-divisibility
specialization a default launch gives) is compiled for sm_90 with the ptxas that ships with Triton, disassembled
with its cuobjdump, and fingerprinted: a hash of the SASS text with the kernel's name, addresses and headers
removed (``sha``), registers, shared memory, instruction count and opcode counts.  Equal fingerprints are
identical machine code.

    python -m benchmarks sass --check                  # before and after a kernel change: exit 1 listing changes
    python -m benchmarks sass                          # append this tree's fingerprints to results/sass.csv
    python -m benchmarks sass --ops norm --jobs 2      # one op, two compiles at a time

``--check`` compares with the newest row of each case compiled by the same Triton version (fingerprints differ
between Triton versions).  Gluon cases compile with Triton 3.6, whose Gluon API the kernels are written against, and
are reported as skipped with another version (``GLUON_API``).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from . import utils

GPU = "sm_90 (offline compile)"  # the table's gpu column
OPS = ("softmax", "cross_entropy", "norm", "attention", "decoder")
GLUON_API = "3.6"  # the Triton whose Gluon API the Gluon kernels are written against
SKIPPED = f"skipped: needs Triton {GLUON_API} Gluon API"

_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")  # an instruction line of cuobjdump -sass, address stripped
_OPCODE = re.compile(r"^(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)")  # its opcode, predicate and modifiers stripped


@dataclasses.dataclass
class Case:
    """One kernel configuration as a default launch compiles it.

    ``types`` {argument: Triton type, e.g. "*bf16", "fp32", "i64", "tensordesc<...>"}: other arguments are i32.
    ``ones``: integer arguments specialized to the constant 1; ``divisible``: those known to be multiples of 16
    (pointers always are).  Constexprs a kernel declares with a default may be left out; a Gluon kernel's
    ``num_warps`` constexpr is the case's ``num_warps``."""

    op: str
    name: str
    fn: Any  # the @triton.jit / @gluon.jit kernel
    constexprs: dict[str, Any]
    types: dict[str, str] = dataclasses.field(default_factory=dict)
    ones: tuple[str, ...] = ()
    divisible: tuple[str, ...] = ()
    num_warps: int = 4
    num_stages: int | None = None
    maxnreg: int | None = None

    @property
    def kernel(self) -> str:
        return self.fn.__name__

    @property
    def gluon(self) -> bool:
        return type(self.fn).__module__.startswith("triton.experimental.gluon")

    @staticmethod
    def kernel_args(fn) -> list[str]:
        return list(inspect.signature(getattr(fn, "fn", fn)).parameters)

    @staticmethod
    def kernel_constexprs(fn) -> dict[str, Any]:
        """{constexpr parameter: its default, or inspect.Parameter.empty} of a kernel (compiled or interpreted)."""
        out = {}
        for p in inspect.signature(getattr(fn, "fn", fn)).parameters.values():
            ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
            if ann.endswith("constexpr"):
                out[p.name] = p.default
        return out

    def signature(self) -> tuple[dict, dict, dict]:
        """(signature, constexprs, attrs) for triton.compile's ASTSource; ValueError where the case names a
        constexpr or argument the kernel does not have, or leaves out a constexpr without a default."""
        names = self.kernel_args(self.fn)
        params = self.kernel_constexprs(self.fn)
        where = f"{self.op} case {self.name!r} ({self.kernel})"
        unknown = [k for k in self.constexprs if k not in params]
        if unknown:
            raise ValueError(f"{where}: the kernel has no constexpr {unknown}")
        unknown = [k for k in (*self.types, *self.ones, *self.divisible) if k not in names or k in params]
        if unknown:
            raise ValueError(f"{where}: the kernel has no runtime argument {unknown}")
        cx = dict(self.constexprs)
        if "num_warps" in params:
            cx["num_warps"] = self.num_warps
        for k, default in params.items():
            if k not in cx:
                if default is inspect.Parameter.empty:
                    raise ValueError(f"{where}: constexpr {k} has no value and no default")
                cx[k] = default
        sig, attrs = {}, {}
        for i, name in enumerate(names):
            if name in cx:
                sig[name] = "constexpr"
            elif name in self.ones:
                sig[name], cx[name] = "constexpr", 1
            else:
                sig[name] = self.types.get(name, "i32")
                if sig[name].startswith("*") or name in self.divisible:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        return sig, cx, attrs


# --------------------------------------------------------------------------------------------------
# Compiling (in a worker process when --jobs > 1)
# --------------------------------------------------------------------------------------------------
_CASES: dict[str, list[Case]] = {}


def _setup() -> None:
    """Compiled kernels, not the interpreter; Triton's launch default for FMA fusion."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def cases(op: str) -> list[Case]:
    """The cases of ``op`` (benchmarks/sass_cases.py), built once per process."""
    if op not in _CASES:
        from . import sass_cases

        _CASES[op] = list(sass_cases.OPS[op]())
    return _CASES[op]


def fingerprint(case: Case) -> dict:
    """Compile ``case`` for sm_90 and fingerprint its SASS: sha, regs, shared, insns, opcodes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if case.gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        Source = ASTSource
    sig, cx, attrs = case.signature()
    options = dict(num_warps=case.num_warps)
    if case.num_stages is not None:
        options["num_stages"] = case.num_stages
    if case.maxnreg is not None:
        options["maxnreg"] = case.maxnreg
    k = triton.compile(Source(case.fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(k.asm["cubin"])
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    insns = [m.group(1) for m in map(_INSN.search, sass.splitlines()) if m]
    text = "\n".join(insns).replace(case.kernel, "KERNEL")
    regs = re.search(r"REG:(\d+)", usage)
    ops = Counter(o.group(1) for o in map(_OPCODE.search, insns) if o)
    return dict(sha=hashlib.sha1(text.encode()).hexdigest()[:16], regs=int(regs.group(1)) if regs else "",
                shared=k.metadata.shared, insns=len(insns),
                opcodes=" ".join(f"{op}:{n}" for op, n in sorted(ops.items(), key=lambda t: (-t[1], t[0]))))


def _compile(op: str, index: int) -> tuple[str, int, dict]:
    """(op, index, fingerprint, or {"error": ...} / {"skipped": ...})."""
    import triton

    case = cases(op)[index]
    if case.gluon and not triton.__version__.startswith(GLUON_API + "."):
        return op, index, dict(skipped=SKIPPED)  # Triton 3.9 fails on every one of them: the API moved
    try:
        return op, index, fingerprint(case)
    except Exception as e:  # a case that does not compile is reported; the others still run
        return op, index, dict(error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")


def _worker_init() -> None:
    _setup()
    sys.path.insert(0, str(utils.ROOT))


# --------------------------------------------------------------------------------------------------
# The suite
# --------------------------------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--jobs", type=int, default=1, help="compiles at a time (processes; compiles are CPU bound)")
    p.add_argument("--check", action="store_true",
                   help="compare with the newest rows of this Triton version in the table, write nothing; exit 1 "
                        "listing every case that changed, is new, is gone, or fails to compile")
    p.add_argument("--out", help="table to append to, or to --check against (default: benchmarks/results/sass.csv)")
    p.add_argument("--dry-run", action="store_true", help="compile and print, write no row")


def _key(triton_version: str) -> dict:
    import torch

    return {"gpu": GPU, "torch": torch.__version__, "triton": triton_version, "commit": utils.git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def _opcode_delta(old: str, new: str) -> str:
    """The opcodes whose counts differ, ``OP old->new``."""
    a, b = (dict((o, int(n)) for o, _, n in (t.partition(":") for t in s.split())) for s in (old, new))
    return " ".join(f"{o} {a.get(o, 0)}->{b.get(o, 0)}" for o in sorted(set(a) | set(b)) if a.get(o) != b.get(o))


def compare(rows: list[dict], names: set[tuple[str, str]], table: list[dict], ops: list[str],
            triton_version: str) -> list[str]:
    """One line per difference between this run's ``rows`` (of the cases ``names``, (op, case), compiled or not) and
    the newest rows of the same Triton in ``table``."""
    old = {(r["op"], r["case"]): r
           for r in utils.latest([r for r in table if r["gpu"] == GPU and r["triton"] == triton_version],
                                 utils.CASE["sass"]) if r["op"] in ops}
    new = {(r["op"], r["case"]): r for r in rows}
    lines = []
    for key, r in new.items():
        o = old.get(key)
        if o is None:
            lines.append(f"NEW      {key[0]}: {key[1]}")
        elif o["sha"] != r["sha"]:
            lines.append(f"CHANGED  {key[0]}: {key[1]}: regs {o['regs']}->{r['regs']}, shared {o['shared']}->"
                         f"{r['shared']}, insns {o['insns']}->{r['insns']}; "
                         f"{_opcode_delta(o['opcodes'], r['opcodes']) or 'same opcode counts'}")
    lines += [f"GONE     {op}: {case} (no such case now)" for op, case in old if (op, case) not in names]
    return lines


def run(args) -> int:
    _setup()
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        print(f"python -m benchmarks sass: no op {unknown}; ops: {','.join(OPS)}", file=sys.stderr)
        return 2
    import triton

    key = _key(triton.__version__)  # the tree as it is when the compiles start
    todo = [(op, i) for op in ops for i in range(len(cases(op)))]
    print(f"[sass] {len(todo)} cases ({', '.join(f'{op} {len(cases(op))}' for op in ops)}), sm_90, "
          f"triton {triton.__version__}, {args.jobs} job(s)", flush=True)
    t0 = time.perf_counter()
    results: dict[tuple[str, int], dict] = {}

    def report(op, i, res):
        results[(op, i)] = res
        case = cases(op)[i]
        if "sha" in res:
            what = f"{res['sha']}  regs {res['regs']:>3}  shared {res['shared']:>6}  insns {res['insns']:>5}"
        else:
            what = res.get("skipped") or f"ERROR {res['error']}"
        print(f"{op:13s} {case.name:64s} {what}", flush=True)

    if args.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_init) as pool:
            for fut in as_completed([pool.submit(_compile, op, i) for op, i in todo]):
                report(*fut.result())
    else:
        for op, i in todo:
            report(*_compile(op, i))

    rows = [dict(key, op=op, case=cases(op)[i].name, kernel=cases(op)[i].kernel, **results[(op, i)])
            for op, i in todo if "sha" in results[(op, i)]]
    skipped = sum("skipped" in r for r in results.values())
    errors = [(op, cases(op)[i].name, r["error"]) for (op, i), r in results.items() if "error" in r]
    print(f"[sass] {len(rows)} compiled, {skipped} skipped, {len(errors)} failed in {time.perf_counter() - t0:.0f} s")
    out = Path(args.out) if args.out else utils.table_path("sass")
    if args.check:
        table = utils.read_rows(out) if out.exists() else []
        names = {(op, cases(op)[i].name) for op, i in todo}
        lines = compare(rows, names, table, ops, triton.__version__)
        lines += [f"ERROR    {op}: {name}: {err}" for op, name, err in errors]
        print("\n".join(lines) if lines else f"[sass] every case identical to the newest rows of triton "
                                                f"{triton.__version__} in {out}")
        return 1 if lines else 0
    for op, name, err in errors:
        print(f"ERROR {op}: {name}: {err}", file=sys.stderr)
    utils.write_results(args, "sass", rows)
    return 1 if errors else 0
