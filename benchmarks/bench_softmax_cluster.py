"""Issue 10: the cluster softmax forward (``benchmarks/proto_softmax_cluster.py``) on the H200, from cubins built on
the CPU machine with Triton >= 3.8 (``benchmarks/build_cluster_cubins.py``; the H200's Triton 3.6 cannot lower the
kernel's cross-CTA exchange), launched through the CUDA driver with the cluster dims set (cuLaunchKernelEx).

    python3 benchmarks/bench_softmax_cluster.py .cubins > $OUT/cluster.txt

First the checks (every cubin against torch.softmax in float64 on fresh random rows, ragged widths, special values,
the output poisoned before each run), then the timing of the divisible forms against fused_softmax (the library's
default) and torch.softmax in the same run: 2^26 elements, do_bench (L2 flushed) and CUDA-graph replay, fraction of
the 4.22 TB/s copy for one read and one write.
"""
import ctypes
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from cuda.bindings import driver as cu

import _timing

TOTAL = 2**26
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _ok(res):
    err = res[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver: {err}")
    return res[1] if len(res) == 2 else res[1:]


class Cubin:
    def __init__(self, folder, meta):
        self.meta = meta
        with open(os.path.join(folder, meta["name"] + ".cubin"), "rb") as f:
            data = f.read()
        self.mod = _ok(cu.cuModuleLoadData(data))
        self.fn = _ok(cu.cuModuleGetFunction(self.mod, meta["fn"].encode()))
        if meta["K"] > 8:
            _ok((cu.cuFuncSetAttribute(self.fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)[0], None))

    def __call__(self, x, y):
        m = self.meta
        n = x.shape[1]
        assert m["K"] * m["P"] >= n and x.stride(1) == 1 and y.stride(1) == 1
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = x.shape[0] * m["K"], 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 32 * m["warps"], 1, 1
        cfg.sharedMemBytes = m["shared"]
        cfg.hStream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = m["K"], 1, 1
        cfg.attrs = [attr] if m["K"] > 1 else []
        cfg.numAttrs = 1 if m["K"] > 1 else 0
        args = ((x.data_ptr(), y.data_ptr(), n, x.stride(0), y.stride(0), 0, 0),
                (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p,
                 ctypes.c_void_p))
        _ok((cu.cuLaunchKernelEx(cfg, self.fn, args, 0)[0], None))
        return y


def check(k, dtype, n, rows=37, special=False):
    x = (torch.randn(rows, n, device="cuda", dtype=torch.float32) * 4).to(dtype)
    if special:
        x[1] = float("-inf")  # all -inf: NaN row
        x[2, n // 3] = float("nan")
        x[3, n - 1] = float("inf")
        x[4, : n // 2] = float("-inf")
    y = torch.full_like(x, float("nan") if not special else 7.0)
    k(x, y)
    torch.cuda.synchronize()
    ref = torch.softmax(x.double(), -1)
    same_nan = torch.equal(torch.isnan(y), torch.isnan(ref))
    fin = ~torch.isnan(ref)
    err = (y.double() - ref)[fin].abs().max().item()
    tol = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-6}[dtype]
    rel = ((y.double() - ref)[fin].abs() / ref[fin].abs().clamp_min(1e-30)).max().item()
    ok = same_nan and err < tol
    return ok, err, rel


def main(folder):
    with open(os.path.join(folder, "index.json")) as f:
        index = json.load(f)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; cubins built with Triton {index[0]['triton']}")
    kernels = {m["name"]: Cubin(folder, m) for m in index}
    bad = 0
    print("\n## checks (max abs error against float64, NaN pattern as torch)")
    for name, k in kernels.items():
        m = k.meta
        if m.get("diag"):  # wrong output by design
            continue
        dtype = DT[m["dtype"]]
        full = m["K"] * m["P"]
        widths = [full, full - 16, full - m["P"] - 16 if m["K"] > 1 else full // 2] if m["divisible"] else \
            [full, full - 1, full - m["P"] + 1 if m["K"] > 1 else full - 7, (m["K"] - 1) * m["P"] // 2 + 3, 13]
        for n in widths:
            for special in (False, True):
                ok, err, rel = check(k, dtype, n, special=special)
                bad += not ok
                print(f"{name:32s} N={n:7d} special={int(special)} {'ok ' if ok else 'BAD'} abs {err:.2e} rel {rel:.2e}",
                      flush=True)
    print(f"checks: {'all ok' if not bad else f'{bad} BAD'}")

    print("\n## timing, fraction of copy (do_bench / graph)")
    from fused_layers import fused_softmax
    from fused_layers.ops import _cpp
    _cpp.extension(wait=True)
    by_width = {}
    for name, k in kernels.items():
        m = k.meta
        if not m["divisible"]:
            continue
        n = m["K"] * m["P"]
        by_width.setdefault((m["dtype"], n), []).append(k)
    for (dt, n), ks in sorted(by_width.items()):
        dtype = DT[dt]
        x = (torch.randn(TOTAL // n, n, device="cuda") * 3).to(dtype)
        y = torch.empty_like(x)
        nb = 2 * x.numel() * x.element_size()
        rows = [("fused_softmax (default)", lambda: fused_softmax(x, -1)), ("torch.softmax", lambda: torch.softmax(x, -1))]
        rows += [(k.meta["name"] + f" (regs {k.meta['regs']}, stack {k.meta['stack']})", (lambda k=k: k(x, y))) for k in ks]
        rows += [("fused_softmax (default, again)", lambda: fused_softmax(x, -1))]
        for label, f in rows:
            try:
                d, g = _timing.fractions_of_copy(f, nb)
                print(f"{dt} {n:7d} {label:60s} do_bench {d:.3f}  graph {g:.3f}", flush=True)
            except Exception as e:
                print(f"{dt} {n:7d} {label:60s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    main(sys.argv[1] if len(sys.argv) > 1 else ".cubins")
