"""Issue 9's open question: can an op of ours reach PyTorch's host cost per call if its autograd node and
its launches are C++?

Measured on the H200 host (``bench_host.py --breakdown``, session 4 of 2026-12-01): LayerNorm fwd+bwd costs
289 us against PyTorch's 171. With every Triton launch stubbed out, ours still costs 222 us. One C++ autograd
node alone (``y = x * 1.0; y.backward(g)``) costs 122 us. So the Python ``autograd.Function`` is over
budget before any launch. The engine runs a CUDA node's backward on its device thread, and for a Python node
that thread must also take the GIL and run Python.

This probe times one trivial op (y = x * s, forward and backward) five ways, 2,000 calls back to back then
one sync, median of rounds, in us per call:

* ``aten``: ``x * 1.0`` and its backward (PyTorch's C++ node and kernels), the bar;
* ``cpp_node``: a ``torch::autograd::Function`` in C++ whose forward and backward launch a Triton-compiled
  kernel through the CUDA driver (``cuLaunchKernel`` on the cubin Triton built). No Python runs after the call;
* ``py_node_cpp_launch``: a Python ``autograd.Function`` whose forward and backward call the same C++
  launcher (the Python node's share of the cost);
* ``py_node_triton``: a Python ``autograd.Function`` launching through fused_layers' bound launcher (``Kernel``):
  our ops' path today;
* forward only, the same four.

If ``cpp_node`` lands within 10% of ``aten``, issue 9's 1.1x needs our ops' autograd nodes and launches in
C++. That means an extension built at first use with the host compiler, against the ``cuda.h`` that Triton
ships. The probe also checks the C++ launch end to end: its output and gradient against ``x * s``.

    python benchmarks/probe_cpp_autograd.py --out $OUT      # GPU; builds the extension (~1 min) on first run
    python benchmarks/probe_cpp_autograd.py --build-only     # any machine with g++: compile the C++ only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

CPP = r"""
#include <torch/extension.h>
#include <cuda.h>
#include <dlfcn.h>
#include <stdexcept>
#include <string>
#include <vector>
#if __has_include(<c10/cuda/CUDAStream.h>) && __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)  // a CUDA build of torch
#include <c10/cuda/CUDAStream.h>
#define PROBE_HAVE_C10_CUDA 1
#endif

// The CUDA driver, opened at run time as Triton's own launcher does (no link-time dependency on libcuda).
typedef CUresult (*PFN_LoadData)(CUmodule*, const void*);
typedef CUresult (*PFN_GetFunction)(CUfunction*, CUmodule, const char*);
typedef CUresult (*PFN_Launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void**, void**);
typedef CUresult (*PFN_ParamInfo)(CUfunction, size_t, size_t*, size_t*);
static PFN_LoadData p_load = nullptr;
static PFN_GetFunction p_get = nullptr;
static PFN_Launch p_launch = nullptr;
static PFN_ParamInfo p_param_info = nullptr;

static void load_driver() {
  if (p_launch) return;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) throw std::runtime_error("probe: cannot dlopen libcuda.so.1");
  p_load = (PFN_LoadData)dlsym(h, "cuModuleLoadData");
  p_get = (PFN_GetFunction)dlsym(h, "cuModuleGetFunction");
  p_launch = (PFN_Launch)dlsym(h, "cuLaunchKernel");
  p_param_info = (PFN_ParamInfo)dlsym(h, "cuFuncGetParamInfo");  // CUDA >= 12.4; optional
  if (!p_load || !p_get || !p_launch) throw std::runtime_error("probe: missing CUDA driver entry points");
}

static void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw std::runtime_error(std::string("probe: ") + what + " failed: CUresult " + std::to_string((int)r));
}

struct Kern { CUfunction fn; unsigned threads; unsigned shared; int block; int nparams; };
static std::vector<Kern> g_kernels;

// Load a Triton cubin; returns its handle and how many parameters the function takes (-1: not known).
std::vector<int64_t> register_kernel(py::bytes cubin, const std::string& name, int64_t num_warps, int64_t shared,
                                     int64_t block) {
  load_driver();
  std::string image = cubin;
  CUmodule mod;
  check(p_load(&mod, image.data()), "cuModuleLoadData");
  CUfunction fn;
  check(p_get(&fn, mod, name.c_str()), "cuModuleGetFunction");
  int nparams = -1;
  if (p_param_info) {
    size_t off, size;
    nparams = 0;
    while (nparams < 64 && p_param_info(fn, (size_t)nparams, &off, &size) == CUDA_SUCCESS) ++nparams;
  }
  g_kernels.push_back({fn, (unsigned)(32 * num_warps), (unsigned)shared, (int)block, nparams});
  return {(int64_t)g_kernels.size() - 1, nparams};
}

// y = x * s over n float32 elements: params (X, Y, n, s) then Triton's scratch pointers (null: none used).
static void launch_scale(int64_t k, const at::Tensor& x, const at::Tensor& y, double s) {
  const Kern& K = g_kernels.at((size_t)k);
  CUdeviceptr px = (CUdeviceptr)x.data_ptr(), py = (CUdeviceptr)y.data_ptr(), null_ptr = 0;
  int32_t n = (int32_t)x.numel();
  float sf = (float)s;
  void* params[8] = {&px, &py, &n, &sf, &null_ptr, &null_ptr, &null_ptr, &null_ptr};
  unsigned grid = (unsigned)((n + K.block - 1) / K.block);
#ifdef PROBE_HAVE_C10_CUDA
  CUstream stream = (CUstream)c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
#else
  CUstream stream = nullptr;
#endif
  check(p_launch(K.fn, grid, 1, 1, K.threads, 1, 1, K.shared, stream, params, nullptr), "cuLaunchKernel");
}

at::Tensor scale_plain(const at::Tensor& x, int64_t k, double s) {
  at::Tensor y = at::empty_like(x);
  launch_scale(k, x, y, s);
  return y;
}

struct ScaleFn : public torch::autograd::Function<ScaleFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t k, double s) {
    ctx->saved_data["k"] = k;
    ctx->saved_data["s"] = s;
    return scale_plain(x, k, s);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::tensor_list g) {
    int64_t k = ctx->saved_data["k"].toInt();
    double s = ctx->saved_data["s"].toDouble();
    at::Tensor go = g[0].contiguous();
    return {scale_plain(go, k, s), at::Tensor(), at::Tensor()};
  }
};

at::Tensor scale_autograd(const at::Tensor& x, int64_t k, double s) { return ScaleFn::apply(x, k, s); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_kernel", &register_kernel);
  m.def("scale_plain", &scale_plain);
  m.def("scale_autograd", &scale_autograd);
}
"""


@triton.jit
def _scale_kernel(
    X,  # pointer to the input, float32 [n]
    Y,  # pointer to the output, float32 [n]
    n,  # number of elements
    s,  # scale
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0)
    tl.store(Y + offs, x * s, mask=m)


BLOCK = 1024


def build(verbose: bool = False):
    from torch.utils.cpp_extension import load_inline

    inc = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")  # cuda.h, as Triton builds with
    ldflags = ["-ldl"]
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    if torch.version.cuda and os.path.exists(os.path.join(lib, "libc10_cuda.so")):  # getCurrentCUDAStream
        ldflags += [f"-L{lib}", "-lc10_cuda"]
    return load_inline("fused_layers_probe_cpp_autograd", cpp_sources=[CPP], extra_include_paths=[inc],
                       extra_ldflags=ldflags, verbose=verbose)


def per_call_us(fn, calls: int, rounds: int) -> float:
    vals = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        vals.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(vals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--build-only", action="store_true", help="compile the C++ extension and stop (no GPU needed)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    ext = build()
    print(f"extension built / loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.build_only:
        return
    if not torch.cuda.is_available():
        raise SystemExit("probe_cpp_autograd.py needs a CUDA GPU to time (use --build-only to compile the C++ only)")

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fused_layers.ops._library import Kernel

    dev = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability()
    sig = {"X": "*fp32", "Y": "*fp32", "n": "i32", "s": "fp32", "BLOCK": "constexpr"}
    compiled = triton.compile(ASTSource(_scale_kernel, sig, {"BLOCK": BLOCK}), target=GPUTarget("cuda", major * 10 + minor, 32),
                              options=dict(num_warps=4))
    md = compiled.metadata
    handle, nparams = ext.register_kernel(compiled.asm["cubin"], md.name, md.num_warps, md.shared, BLOCK)
    print(f"kernel {md.name}: {nparams} parameters (4 + Triton's scratch pointers), shared {md.shared} B", flush=True)

    x = torch.randn(8, 768, device=dev)
    g = torch.randn_like(x)
    s = 1.0
    # Correctness of the C++ launch, forward and backward, against aten.
    xa = x.clone().requires_grad_()
    y = ext.scale_autograd(xa, handle, 0.5)
    (gx,) = torch.autograd.grad(y, xa, g)
    torch.testing.assert_close(y, x * 0.5)
    torch.testing.assert_close(gx, g * 0.5)

    grid = (triton.cdiv(x.numel(), BLOCK), 1, 1)
    kern = Kernel(_scale_kernel, grid, check=(0, 1), BLOCK=BLOCK, num_warps=4)

    class PyCpp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return ext.scale_plain(t, handle, s)

        @staticmethod
        def backward(ctx, go):
            return ext.scale_plain(go.contiguous(), handle, s)

    def triton_scale(t):
        out = torch.empty_like(t)
        kern(t, out, t.numel(), s)
        return out

    class PyTriton(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return triton_scale(t)

        @staticmethod
        def backward(ctx, go):
            return triton_scale(go.contiguous())

    xr = x.clone().requires_grad_()
    variants = {
        "aten": (lambda: xr * s, lambda: (xr * s).backward(g)),
        "cpp_node": (lambda: ext.scale_autograd(xr, handle, s), lambda: ext.scale_autograd(xr, handle, s).backward(g)),
        "py_node_cpp_launch": (lambda: PyCpp.apply(xr), lambda: PyCpp.apply(xr).backward(g)),
        "py_node_triton": (lambda: PyTriton.apply(xr), lambda: PyTriton.apply(xr).backward(g)),
    }
    for fwd, fb in variants.values():  # warm-up: compile, bind, first launches
        for _ in range(20):
            fwd()
            fb()
    torch.cuda.synchronize()
    res = {}
    for name, (fwd, fb) in variants.items():
        with torch.no_grad():
            f_us = per_call_us(fwd, args.calls, args.rounds)
        res[name] = {"fwd_us": f_us, "fwd_bwd_us": per_call_us(fb, args.calls, args.rounds)}
        xr.grad = None
    base = res["aten"]
    lines = [f"# C++ autograd node + driver launch of a Triton cubin: host cost per call (us), {torch.cuda.get_device_name()}",
             "", f"torch {torch.__version__}, triton {triton.__version__}; (8, 768) float32, {args.calls} calls then one sync, "
             f"median of {args.rounds} rounds. `python benchmarks/probe_cpp_autograd.py`", "",
             "| variant | fwd (no grad) | vs aten | fwd+bwd | vs aten |", "|---|---|---|---|---|"]
    for name, r in res.items():
        lines.append(f"| {name} | {r['fwd_us']:.1f} | {r['fwd_us'] / base['fwd_us']:.2f} | {r['fwd_bwd_us']:.1f} | "
                     f"{r['fwd_bwd_us'] / base['fwd_bwd_us']:.2f} |")
    md_text = "\n".join(lines) + "\n"
    print(md_text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "probe_cpp_autograd.json"), "w") as fh:
            json.dump(dict(results=res, kernel_params=nparams), fh, indent=1)
        with open(os.path.join(args.out, "probe_cpp_autograd.md"), "w") as fh:
            fh.write(md_text)


if __name__ == "__main__":
    main()
