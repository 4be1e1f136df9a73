"""The C++ fast path of the eager ops (``fused_layers/csrc/fastpath.cpp``): on by default where it builds.

Why: a Python ``torch.autograd.Function`` costs more host time per call than PyTorch's whole op. On the
H200 host, LayerNorm fwd+bwd with every launch stubbed out cost 222 us against aten's 171 us for everything.
The extension puts the autograd node, the allocations and the launches in C++. The kernels stay the ones
Triton compiled: the first call of a plan runs the Python path (Triton compiles and ``Kernel`` binds), then
each compiled kernel is registered with the extension (its loaded ``CUfunction``, grid, shared memory and
parameter kinds), and later calls with that plan go through C++.

Built on first use with the host's C++ compiler and ninja (``pip install 'fused-layers[cpp]'``;
``torch.utils.cpp_extension.load``, cached in torch's extensions directory; ``cuda.h`` from Triton's package,
libcuda opened at run time). A build or registration
failure warns once and leaves every op on the Python path.

Once a shape is registered, the functional API makes one call into the extension (``norm_fast``,
``rms_variant_fast``, ``softmax_fast``, ``attention_fast``), which checks the arguments, finds the plan by
shape / dtypes / device and runs it, or returns None for anything else (the Python path then runs).

Not covered: compiled autograd (``torch._dynamo.compiled_autograd``) cannot trace the C++ nodes, so no C++ node
is made while it is active (``eager_ok``): those calls run the Python path.

Measured on the H200 (-O3 build): 0.50-1.05x of PyTorch's host cost per call (LayerNorm fwd+bwd 0.92x) against
1.38-2.25x for the Python path.  ``FUSED_LAYERS_CPP=0`` turns it off; it is off under the Triton interpreter.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import torch


# On by default (FUSED_LAYERS_CPP unset) except under the Triton interpreter (no compiled kernels to register);
# FUSED_LAYERS_CPP=0 turns it off, =1 forces it on.
def enabled_by(env: Any) -> bool:
    """Whether the fast path is on for these environment variables."""
    flag = env.get("FUSED_LAYERS_CPP", "")
    return flag == "1" or (flag != "0" and env.get("TRITON_INTERPRET", "0") != "1")


EXPLICIT = os.environ.get("FUSED_LAYERS_CPP", "") == "1"
ENABLED = enabled_by(os.environ)
# The fast paths' compile check, called on every eager call: torch's own function, no wrapper around it.
is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
_functorch_active = torch._C._are_functorch_transforms_active
_modules = sys.modules


def _compiled_autograd_active() -> bool:
    """Compiled autograd (``torch._dynamo.compiled_autograd``) is on: it cannot trace the C++ nodes, so a
    forward made now stays on the Python path (its autograd.Function traces).  Two module globals, read
    only once ``torch._dynamo`` has been imported (~40 ns)."""
    ca = _modules.get("torch._dynamo.compiled_autograd")
    return ca is not None and bool(ca.compiled_autograd_enabled or ca.in_compiled_autograd_region)


def eager_ok() -> bool:
    """A C++ node may be made for this call: not traced by Dynamo, no functorch transform, no compiled autograd."""
    return not is_compiling() and not _functorch_active() and not _compiled_autograd_active()
_ext: Any = None
_failed = False
_thread: threading.Thread | None = None  # the background build (extension())
_lock = threading.Lock()

# Triton signature types -> the extension's parameter kinds
_KINDS = {"i32": "i", "u32": "i", "i64": "l", "u64": "l", "fp32": "f"}


def build() -> Any:
    """Compile (or load the cached build of) the extension; raises if it cannot be built."""
    import triton
    from torch.utils.cpp_extension import load

    src = Path(__file__).resolve().parents[1] / "csrc" / "fastpath.cpp"
    inc = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")  # cuda.h
    ldflags = ["-ldl"]
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    if torch.version.cuda and os.path.exists(os.path.join(lib, "libc10_cuda.so")):  # getCurrentCUDAStream
        ldflags += [f"-L{lib}", "-lc10_cuda"]
    # -O3: torch.utils.cpp_extension.load adds no optimization flag of its own (the first GPU runs were -O0:
    # every intrusive_ptr / Tensor / pybind helper a real call, ~2x the host instructions of a call).
    with _build_lock("fused_layers_fastpath"):
        return load("fused_layers_fastpath", sources=[str(src)], extra_include_paths=[inc], extra_ldflags=ldflags,
                    extra_cflags=["-O3", "-DNDEBUG"])


@contextlib.contextmanager
def _build_lock(name: str):
    """Hold an flock on the build directory while torch builds there, and clear a stale torch lock first.

    torch's own build lock is a file (``FileBaton``) that nobody removes when its process exits mid-build: a
    short script whose background build had not finished left one, and every later process then waited on it
    forever (seen on the H200 host: a benchmark with ``extension(wait=True)`` hung until killed).  An flock is
    released by the kernel when its process dies, so inside it any torch lock file is a dead process's."""
    try:
        import fcntl

        from torch.utils.cpp_extension import _get_build_directory

        build_dir = _get_build_directory(name, verbose=False)
    except Exception:  # noqa: BLE001  (no fcntl, or torch moved the helper: torch's lock alone)
        yield
        return
    with open(os.path.join(build_dir, "fused_layers.flock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        stale = os.path.join(build_dir, "lock")
        if os.path.exists(stale):
            warnings.warn(f"fused_layers: removing {stale}, a build lock left by a process that exited mid-build",
                          stacklevel=3)
            try:
                os.remove(stale)
            except FileNotFoundError:
                pass
        yield


def _build_in_background() -> None:
    global _ext, _failed
    try:
        ext = build()
    except Exception as e:  # noqa: BLE001  (no compiler, no headers: the Python path still works)
        _failed = True
        hint = " (pip install 'fused-layers[cpp]' for ninja)" if "ninja" in str(e).lower() else ""
        warnings.warn(f"fused_layers: the C++ fast path did not build{hint} ({type(e).__name__}: {str(e)[:300]}); "
                      "the ops run on the Python path, with more host time per call"
                      + ("" if EXPLICIT else " (FUSED_LAYERS_CPP=0 turns the fast path off and this warning with it)")
                      + ".", stacklevel=2)
    else:
        _ext = ext


def extension(wait: bool = False) -> Any:
    """The built extension, or None: disabled, the build failed (warned once), or it is still building.

    The first call starts the build (tens of seconds the first time on a machine, then torch's cache) on a
    background thread: a training run keeps going on the Python path meanwhile, and its calls switch to the
    C++ path once the build is done.  ``wait=True`` blocks until then (benchmarks, tests)."""
    global _thread
    if _ext is not None or _failed or not ENABLED:
        return _ext
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_build_in_background, name="fused_layers-cpp-build", daemon=True)
            _thread.start()
    if wait:
        _thread.join()
    return _ext


def building() -> bool:
    """True while the background build runs."""
    return _thread is not None and _thread.is_alive()


def fast_call(fn_name: str, *args: Any) -> Any:
    """The one-call fast path of a functional op: ``ext.<fn_name>(*args)``, the output tensor of a call whose
    shape the Python path registered; None when the extension is not loaded, while Dynamo traces, for any
    call the extension declines, and for arguments of the wrong types (the Python path then raises its own
    error).  Callers check ``ENABLED`` first, so the default path pays one attribute read."""
    if is_compiling() or _ext is None or not eager_ok():  # (is_compiling first: Dynamo must not guard on _ext,
        return None                                      # which the background build sets later: a recompile)
    try:
        return getattr(_ext, fn_name)(*args)
    except TypeError:
        return None


def roles(n_ptrs: int, n_ints: int, n_floats: int = 0, floats_first: bool = False, descs: int = 0) -> str:
    """The runtime arguments of a launch, in the kernel's order: 'p' pointer, 'i' int, 'f' float, 'd' a host
    TMA descriptor (TensorDescriptor; see ``register``).  Most kernels take pointers, ints, floats; attention's
    take pointers, floats, ints; the Gluon norm backward pointers, ints, descriptors."""
    mid = "f" * n_floats + "i" * n_ints if floats_first else "i" * n_ints + "f" * n_floats
    return "p" * n_ptrs + mid + "d" * descs


def _kinds(compiled: Any, fn: Any, roles: str) -> str | None:
    """The kernel's runtime parameters as the extension's kinds, or None if this launch cannot be described.
    ``roles`` gives each runtime argument's role in ``fn``'s argument order; an int that Triton specialized
    into a constant (its signature says ``constexpr``) becomes '-'."""
    sig = getattr(getattr(compiled, "src", None), "signature", None)
    names = list(getattr(fn, "arg_names", ()))
    if not isinstance(sig, dict) or len(names) < len(roles):
        return None
    out = []
    for name, role in zip(names, roles):
        ty = sig.get(name)
        if role == "d":  # Triton's launcher expands a TensorDescriptor: the CUtensorMap, its shape, its strides
            m = re.match(r"tensordesc<[^[>]*\[([^]]*)\]", ty) if isinstance(ty, str) else None
            if m is None:
                return None
            ndim = m.group(1).count(",") + 1
            out.append("T" + "i" * ndim + "l" * ndim)
        elif role == "p":
            if not isinstance(ty, str) or not ty.startswith("*"):
                return None
            out.append("p")
        elif role == "i":
            if ty == "constexpr":
                out.append("-")
            elif ty in _KINDS and _KINDS[ty] in "il":
                out.append(_KINDS[ty])
            else:
                return None
        else:
            if ty != "fp32":
                return None
            out.append("f")
    return "".join(out)


UNSUPPORTED = -1


def plan_id(cache: dict, key: Any, register: Callable[..., Any], *args: Any) -> Any:
    """The C++ plan cached under ``key`` in a launch plan's ``cpp`` dict, made by ``register(*args)`` on first
    use; None means the Python path runs this call: ``register`` returned None (a kernel not compiled yet:
    tried again next call) or False (unsupported: cached, never tried again)."""
    nid = cache.get(key)
    if nid is None:
        nid = register(*args)
        if nid is None:
            return None
        cache[key] = nid
    return None if nid is False else nid


def _is_compiled(kernel: Any, key: tuple) -> bool:
    return kernel.compiled(key) is not None


def register_all(device: int, *specs: tuple) -> list | bool | None:
    """Register several kernels of one plan, each spec ``(kernel, dtypes by argument position, ints, role)``
    or ``(..., role, tmas)`` (host TMA descriptors, see ``register``):
    their handles; None if one of them is not compiled for these dtypes yet (nothing is registered: the Python
    path runs, compiles, and the next call tries again); False if one cannot be launched from C++."""
    keys = [spec[0].aligned_key(device, spec[1]) for spec in specs]
    if not all(_is_compiled(spec[0], key) for spec, key in zip(specs, keys)):
        return None
    handles = [register(spec[0], key, device, spec[2], spec[3], *spec[4:]) for spec, key in zip(specs, keys)]
    if any(h is None for h in handles):  # the extension is still building: the next call tries again
        return None
    return False if any(h == UNSUPPORTED for h in handles) else handles


# Triton's device-side TMA element-type codes -> the driver's CUtensorMapDataType (triton/backends/nvidia/driver.py)
_TMA_DTYPE_DEVICE_TO_HOST = {8: 10, 9: 8, 10: 9}


def _tma_specs(md: Any, tmas: tuple) -> list | None:
    """The extension's TMA specs (``register_launch``) of a kernel's host descriptors: ``tmas`` gives each 'd'
    argument's (index of its base among the launch's pointers, shape, strides) as a TensorDescriptor's
    (outermost first, in elements); the rest (box, swizzle, element type) from Triton's ``tensordesc_meta``.
    None where they cannot be described."""
    metas = getattr(md, "tensordesc_meta", None)
    if not metas or len(metas) != len(tmas):
        return None
    out = []
    for (ptr, shape, strides), meta in zip(tmas, metas):
        if not isinstance(meta, dict):
            return None
        box, rank, esize = list(meta["block_size"]), len(shape), int(meta["elem_size"])
        if meta.get("fp4_padded") or len(box) != rank or len(strides) != rank or strides[-1] != 1:
            return None
        dtype = _TMA_DTYPE_DEVICE_TO_HOST.get(int(meta["elem_type"]), int(meta["elem_type"]))
        out.append([int(ptr), dtype, rank, int(meta["swizzle"]), *map(int, reversed(shape)),
                    *(esize * int(s) for s in reversed(strides[:-1])), *map(int, reversed(box))])
    return out


def register(kernel: Any, key: tuple, device: int, ints: tuple, role: str, tmas: tuple = ()) -> int | None:
    """Register ``kernel``'s compiled binary for the tensors of ``key`` (``Kernel``'s device / dtype /
    alignment key) with the extension, for launches whose runtime arguments have ``role`` (see ``roles``) and
    whose ints are ``ints``: its handle; None if it was not compiled for that key yet (the Python path runs
    once more); ``UNSUPPORTED`` if this launch cannot be made from C++.

    ``tmas``: for each 'd' (a host TMA descriptor, as Triton's TensorDescriptor), (index of its base among the
    launch's pointers, shape, strides), fixed by the plan: the extension encodes the descriptor at each launch
    (cuTensorMapEncodeTiled, as Triton's launcher does) and passes its shape and strides after it."""
    ext = extension()
    if ext is None:
        return None if building() else UNSUPPORTED
    compiled = kernel.compiled(key)
    if compiled is None:
        return None
    md = compiled.metadata
    if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "profile_scratch_size", 0)):
        return UNSUPPORTED
    # Global scratch (device-side TMA descriptors): the launch allocates it for the whole grid, as Triton does.
    scratch = int(getattr(md, "global_scratch_size", 0) or 0)
    scratch_bytes = scratch * kernel.grid[0] * kernel.grid[1] * kernel.grid[2] if scratch else 0
    cluster = getattr(md, "cluster_dims", (1, 1, 1))
    if cluster and tuple(cluster) not in ((1, 1, 1), (0, 0, 0)):
        return UNSUPPORTED
    if role.count("i") != len(ints) or role.count("d") != len(tmas):
        return UNSUPPORTED
    kinds = _kinds(compiled, kernel.fn, role)
    if kinds is None:
        return UNSUPPORTED
    specs = _tma_specs(md, tmas) if tmas else []
    if specs is None:
        return UNSUPPORTED
    if tmas:  # the descriptors' shapes and strides follow each of them: the ints in the kernel's order
        it, di, full = iter(ints), iter(tmas), []
        for r in role:
            if r == "i":
                full.append(next(it))
            elif r == "d":
                _, shape, strides = next(di)
                full += [*shape, *strides]
        ints = full
    runtime = len(kinds) - kinds.count("-")
    function = int(compiled.function)
    extra = ext.param_count(function) - runtime  # Triton's trailing scratch pointers (0-2 by version)
    if not 0 <= extra <= 2 or (scratch_bytes and extra < 1):  # -1: a driver that cannot count parameters
        return UNSUPPORTED
    try:
        # launch_pdl: launched by cuLaunchKernelEx with programmatic stream serialization, as Triton's launcher does
        return ext.register_launch(function, device, list(kernel.grid), 32 * md.num_warps, md.shared, kinds,
                                   [int(v) for v in ints], extra, scratch_bytes, specs,
                                   pdl=int(bool(getattr(md, "launch_pdl", False))))
    except RuntimeError:  # the registry is full (a run with very many distinct shapes): the Python path
        return UNSUPPORTED


def register_plan(fn_name: str, *handles: int) -> int | bool:
    """``ext.<fn_name>(*handles)`` (a norm plan over registered launches); False if the registry is full."""
    try:
        return getattr(extension(), fn_name)(*handles)
    except RuntimeError:
        return False
