"""The one path from launchers to Triton launches, custom ops, autograd and the eager fast path.

Every op (softmax, layer/RMS norm, attention, cross-entropy) is written as two plain launcher functions,
``forward(*inputs) -> outputs`` and ``backward(*saved_and_grads) -> grads``, that allocate their
outputs and launch Triton kernels through :class:`Kernel` (bound once per launch plan).  :class:`FusedOp`
turns such a pair into

* two ``torch.library`` ops (``fused_layers::<name>_fwd`` / ``_bwd``) with autograd registered.  On GPU
  machines they are ``torch.library.triton_op``: under ``torch.compile`` Inductor traces into them and
  emits the Triton launches in its own generated code (no opaque call, CUDA-graph friendly); under the
  Triton interpreter (CPU tests) they are opaque ``custom_op`` with the launcher itself as fake kernel;
* an eager fast path: a ``torch.autograd.Function`` straight into the launchers, because the custom-op
  dispatcher costs tens of microseconds a call, as much as a small kernel;
* one call, ``op(*inputs, needs_grad=...)``, choosing between them.

Host cost.  ``kernel[grid](...)`` in Triton 3.x re-binds and re-specializes every argument on every
call (13 us for a trivial kernel on the H200 host).  :class:`Kernel` does that once: the first launch goes
through Triton's JIT (compiling if needed) and keeps the ``CompiledKernel``; later launches call its
C launcher directly with the current CUDA stream, which costs about what ``torch``'s own launch does.  The
compiled binary is specialized on (a) each pointer's 16-byte alignment and dtype and (b) each integer
argument's value being 1 or a multiple of 16; (a) is re-checked on every call (a few ``data_ptr()`` reads),
(b) is the caller's contract: every integer argument must be a function of the plan the ``Kernel`` is
stored in (shapes, strides), never of anything else.  Anything unusual (Triton interpreter, tensor
subclasses, tracing, a Triton whose launch API is not the one checked here) takes Triton's own path.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ._common import HAS_TRITON, INTERPRET, is_compiling

if HAS_TRITON:
    import triton

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functorch_active = torch._C._are_functorch_transforms_active
_get_device = torch._C._cuda_getDevice if torch.cuda.is_available() else None
_get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

try:  # where Triton keeps the launch hooks (profilers set them); checked on every fast launch
    from triton import knobs as _knobs

    _RUNTIME = _knobs.runtime
except Exception:  # pragma: no cover - older Triton: no fast path
    _RUNTIME = None


def _fast_launch_supported() -> bool:
    """The fast path is used only with Triton versions whose JIT launches exactly as replicated here
    (3.4 - 3.9: ``CompiledKernel.run(g0, g1, g2, stream, function, packed_metadata, launch_metadata,
    enter_hook, exit_hook, *all_args)``)."""
    if not HAS_TRITON or INTERPRET or _RUNTIME is None or _get_stream is None:
        return False
    try:
        major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    except ValueError:  # pragma: no cover
        return False
    return (3, 4) <= (major, minor) <= (3, 9)


FAST_LAUNCH = _fast_launch_supported()


def _wrap_triton(fn):
    from torch.library import wrap_triton

    return wrap_triton(fn)


def ensure_triton_allocator() -> None:
    """Device-side tensor descriptors live in a per-launch global scratch buffer that Triton asks its
    allocator for: install a torch one when none is set (Triton's default raises)."""
    try:
        from triton.runtime import _allocation

        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except Exception:  # noqa: BLE001  (another Triton layout: set ours)
        pass
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _hooks_idle() -> bool:
    """True when no launch hook (a profiler such as proton) is installed: then a launch passes no metadata."""
    enter = _RUNTIME.launch_enter_hook
    return enter is None or not getattr(enter, "calls", True)


class Kernel:
    """A Triton JIT kernel bound to one launch plan: a fixed grid and fixed constexpr / launch options.

    ``Kernel(fn, grid, check=(0, 2), BLOCK=..., num_warps=...)(*runtime_args)`` launches
    ``fn[grid](*runtime_args, **meta)``.  Runtime arguments are positional, in the kernel's order; the
    constexprs come from ``meta``.  ``check`` lists the positions of the tensor arguments whose dtype or
    16-byte alignment is not fixed by the plan (the caller's inputs; outputs the launcher allocates itself
    are always aligned and of the plan's dtype); ``None`` checks every tensor.  See the module docstring
    for what is cached and what the caller guarantees.
    """

    __slots__ = ("fn", "grid", "meta", "check", "_bins", "_tail", "_compiled")

    def __init__(self, fn: Any, grid: Sequence[int], check: Sequence[int] | None = None, **meta: Any) -> None:
        self.fn = fn
        g = tuple(int(x) for x in grid)
        self.grid = g + (1,) * (3 - len(g))
        self.meta = meta
        self.check = None if check is None else tuple(check)
        self._bins: dict[tuple, Callable] = {}
        self._tail: tuple | None = None  # constexpr values appended after the runtime args
        self._compiled: dict[tuple, Any] = {}  # key -> Triton's compiled kernel (for the C++ fast path, ops/_cpp.py)

    # -- Triton's own path (first call, interpreter, tracing) ---------------------------------------
    def _slow(self, args: tuple) -> Any:
        if type(args[0]) not in _PLAIN:  # FakeTensor / FunctionalTensor: shape propagation or tracing
            if INTERPRET:  # the opaque op's fake kernel (see _register): nothing to launch
                return None
            return _wrap_triton(self.fn)[self.grid](*args, **self.meta)  # make_fx / Inductor see the launch
        if INTERPRET:
            # numpy warns on masked-out lanes (-inf - -inf, 0/0) that the kernel never stores: not ours to show.
            import numpy as np

            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                return self.fn[self.grid](*args, **self.meta)
        return self.fn[self.grid](*args, **self.meta)

    def _fire(self, compiled: Any) -> Callable | None:
        """The most direct launch of ``compiled``: ``fire(stream, args)``; None if it cannot be bound."""
        run = compiled.run  # the launcher (loads the binary on first use)
        function, packed = compiled.function, compiled.packed_metadata
        g0, g1, g2 = self.grid
        tail = self._tail
        launch = getattr(run, "launch", None)
        code = getattr(type(run).__call__, "__code__", None)
        if (
            launch is not None
            and code is not None
            and code.co_argcount == 6  # Triton 3.6: __call__(self, gridX, gridY, gridZ, stream, function, *args)
            and code.co_varnames[:6] == ("self", "gridX", "gridY", "gridZ", "stream", "function")
            and getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0
        ):
            # Skip the Python wrapper that only allocates scratch this kernel does not use.
            coop, pdl = run.launch_cooperative_grid, run.launch_pdl

            def fire(stream, args):
                launch(g0, g1, g2, stream, function, coop, pdl, None, None, packed, None, None, None, *args, *tail)

            return fire

        def fire_generic(stream, args):
            run(g0, g1, g2, stream, function, packed, None, None, None, *args, *tail)

        return fire_generic

    def _bind(self, args: tuple, key: tuple, compiled: Any) -> None:
        """Keep a direct launch of ``compiled`` for calls whose checked tensors match ``key``."""
        if self._tail is None:
            names = list(getattr(self.fn, "arg_names", ()))
            n = len(args)
            tail = []
            for name in names[n:]:
                if name not in self.meta:  # a defaulted runtime argument: not bound here
                    return
                tail.append(self.meta[name])
            if not names or any(name in self.meta for name in names[:n]):  # a constexpr before a runtime arg
                return
            self._tail = tuple(tail)
        if self.check is None:
            self.check = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        fire = self._fire(compiled)
        if fire is not None:
            self._bins[key] = fire
            self._compiled[key] = compiled

    def aligned_key(self, device: int, dtypes: Sequence[torch.dtype]) -> tuple | None:
        """The bind key of a call on CUDA device ``device`` whose arguments have ``dtypes`` (by position) and
        16-byte aligned data."""
        if self.check is None:
            return None
        return (device, *[(dtypes[i], 0) for i in self.check])

    def compiled(self, key: tuple | None) -> Any:
        """Triton's compiled kernel bound for ``key``, or None (not launched with such arguments yet)."""
        return None if key is None else self._compiled.get(key)

    def __call__(self, *args: Any) -> None:
        if FAST_LAUNCH and type(args[0]) in _PLAIN:
            dev = args[0].get_device()
            if dev != _get_device() and dev >= 0:
                # Triton launches on the current device; the tensors' device decides, as for aten's ops
                # (a model on cuda:1 without torch.cuda.set_device(1)).  Binaries are per device: so is the key.
                with torch.cuda.device(dev):
                    return self(*args)
            check = self.check
            if check is None:
                key = None
            else:
                key = (dev, *[(args[i].dtype, args[i].data_ptr() & 15) for i in check])
                fire = self._bins.get(key)
                if fire is not None and _hooks_idle():
                    fire(_get_stream(dev), args)
                    return
            compiled = self.fn[self.grid](*args, **self.meta)  # Triton's path: compiles on a new key
            if compiled is not None and hasattr(compiled, "packed_metadata"):
                if key is None:
                    self.check = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
                    key = (dev, *[(args[i].dtype, args[i].data_ptr() & 15) for i in self.check])
                self._bind(args, key, compiled)
            return
        if type(args[0]) in _PLAIN and _get_device is not None and 0 <= args[0].get_device() != _get_device():
            with torch.cuda.device(args[0].get_device()):  # as above, for Triton's own launch path
                return self._slow(args)
        self._slow(args)


# ==================================================================================================
# Registration
# ==================================================================================================
def _register(name: str, fn: Callable) -> Any:
    """``fn`` (annotated; every launch through :class:`Kernel`) as the op ``fused_layers::<name>``."""
    qualname = f"fused_layers::{name}"
    if INTERPRET or not HAS_TRITON:
        # Under the interpreter Inductor cannot emit the kernels (CPU): an opaque op whose fake kernel is
        # the launcher itself (on fake tensors its launches do nothing, see Kernel._slow).
        op = torch.library.custom_op(qualname, fn, mutates_args=())
        op.register_fake(fn)
        return op
    return torch.library.triton_op(qualname, fn, mutates_args=())


class FusedOp:
    """Launchers -> custom ops + autograd + eager fast path, for one op.

    Args:
        name: op name; registers ``fused_layers::<name>_fwd`` and ``fused_layers::<name>_bwd``.
        forward: ``forward(*inputs) -> Tensor | tuple[Tensor, ...]``, fully annotated (the op schema is
            inferred from it); the first output is the op's result, the others (saved statistics) are
            non-differentiable.
        backward: ``backward(...) -> Tensor | tuple[Tensor, ...]``, annotated; called by ``grads``.
        setup_context: ``setup_context(ctx, inputs, outputs)``: save what the backward needs
            (``ctx.save_for_backward`` and attributes); ``outputs`` is always a tuple.
        grads: ``grads(ctx, backward, grad_out) -> tuple`` (one entry per input): run ``backward`` (the op
            under torch.compile, the launcher in eager) on the saved values and ``grad_out``, the gradient
            of the first output.
        eager_forward / eager_backward: optional launcher variants for the eager path (same results, but
            free to return ``None`` where the op must return an empty placeholder tensor).
        outputs: how many leading outputs are the op's differentiable results (default 1); with more, the op
            returns a tuple of them and ``grads`` takes one gradient per result (``None`` where none flowed),
            ``grads(ctx, backward, *grad_outs)``.
    """

    def __init__(
        self,
        name: str,
        forward: Callable,
        backward: Callable,
        setup_context: Callable,
        grads: Callable,
        eager_forward: Callable | None = None,
        eager_backward: Callable | None = None,
        outputs: int = 1,
    ) -> None:
        self.name = name
        self.outputs = n_out = outputs
        self.forward = eager_forward or forward
        self.backward = eager_backward or backward
        self.fwd_op = _register(f"{name}_fwd", forward)
        self.bwd_op = _register(f"{name}_bwd", backward)
        bwd_op = self.bwd_op

        def _setup(ctx, inputs, output):
            outs = output if isinstance(output, tuple) else (output,)
            if len(outs) > n_out:
                ctx.mark_non_differentiable(*outs[n_out:])
            setup_context(ctx, inputs, outs)

        def _backward(ctx, *grad_outputs):
            return grads(ctx, bwd_op, *grad_outputs[:n_out])

        self.fwd_op.register_autograd(_backward, setup_context=_setup)

        eager_fwd, eager_bwd = self.forward, self.backward

        class _Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                outs = eager_fwd(*inputs)
                if not isinstance(outs, tuple):
                    outs = (outs,)
                setup_context(ctx, inputs, outs)
                if n_out > 1:
                    ctx.set_materialize_grads(False)  # an unused result's gradient arrives as None, not zeros
                    return outs[:n_out]
                return outs[0]

            @staticmethod
            def backward(ctx, *grad_outs):
                return grads(ctx, eager_bwd, *grad_outs)

        _Function.__name__ = _Function.__qualname__ = f"{name.title().replace('_', '')}Function"
        self.function = _Function
        # torch.autograd.Function.apply is a Python wrapper (default-argument binding for setup_context
        # style Functions, unwrapping of dead functorch wrappers) around the C apply; neither applies
        # here outside functorch transforms, and the wrapper costs several microseconds a call.
        self._apply = super(torch.autograd.Function, _Function).apply

    def __call__(self, *inputs: Any, needs_grad: bool) -> torch.Tensor:
        """The op's result: the registered op while Dynamo traces, else the eager direct path."""
        n = self.outputs
        if is_compiling():
            out = self.fwd_op(*inputs)
            if n > 1:
                return tuple(out[:n])
            return out[0] if isinstance(out, (tuple, list)) else out
        if needs_grad:
            if _functorch_active():
                return self.function.apply(*inputs)
            return self._apply(*inputs)
        out = self.forward(*inputs)
        if n > 1:
            return tuple(out[:n])
        return out[0] if type(out) is tuple else out
