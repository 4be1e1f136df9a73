"""Test set-up: Triton interpreter on CPU-only machines, a `gpu` marker, seeded fresh inputs.

TRITON_INTERPRET must be set before any kernel module is imported, hence at the top of this file.
"""

import contextlib
import gc
import os
import random
import tempfile
import zlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def _interpreter_rounds_bf16_to_nearest() -> None:
    """Triton's interpreter converts float32 to bfloat16 by truncation (toward zero), where the GPU rounds to nearest
    even: every bf16 output of a CPU run was biased by up to one unit, and summed over rows that took a correct weight
    gradient past the 16-bit bound (test_linear_cross_entropy_half, FUSED_TEST_SEED=289500716: 1.09 of it; 0.51 with
    rounding).  Its float32 -> bfloat16 cast is replaced by torch's, which rounds as the GPU does."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            y = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
            return interpreter.TensorHandle(y.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    interpreter.InterpreterBuilder.cast_impl = cast_impl


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_rounds_bf16_to_nearest()

# Fresh inputs on every run, reproducible from the printed seed: FUSED_TEST_SEED=<n> pytest ...
# The seed is in the header and, after a failure, in the failure report and the terminal summary.
BASE_SEED = int(os.environ.get("FUSED_TEST_SEED", random.SystemRandom().randrange(2**31)))
os.environ["FUSED_TEST_SEED"] = str(BASE_SEED)  # pytest-xdist workers (-n 2) inherit it: one seed for the run
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    torch.set_num_threads(1)  # one worker per core (the interpreter's numpy is single-threaded anyway)
HAS_CUDA = torch.cuda.is_available()


def pytest_report_header(config):
    interpret = os.environ.get("TRITON_INTERPRET", "0")
    return f"fused-layers: FUSED_TEST_SEED={BASE_SEED} cuda={HAS_CUDA} TRITON_INTERPRET={interpret}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Every failed test's report carries the seed that reproduces it (shown with -q too)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        seed = (BASE_SEED + zlib.crc32(item.nodeid.encode())) % 2**31
        rep.sections.append(("fused-layers seed",
                             f"reproduce with: FUSED_TEST_SEED={BASE_SEED} (this test's seed {seed})"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After failures, one line with the seed, whatever the verbosity / --show-capture / --tb flags."""
    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.write_line(f"fused-layers: inputs were drawn with FUSED_TEST_SEED={BASE_SEED}; "
                                    f"rerun with FUSED_TEST_SEED={BASE_SEED} python -m pytest ... to reproduce")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _kernels_not_cudnn(monkeypatch):
    """``fused_attention`` calls run the Triton kernels (``backend="triton"``) unless a test names its backend:
    where cuDNN is measured faster the library's default (``"auto"``) hands the call to SDPA, and a test of the
    kernels would then test cuDNN.  The routing tests pass ``backend="auto"``."""
    monkeypatch.setattr("fused_layers.ops.attention.DEFAULT_BACKEND", "triton")


@pytest.fixture(autouse=True)
def _seed(request):
    """Seed torch/random per test from the run's base seed and the test id."""
    seed = (BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**31
    torch.manual_seed(seed)
    random.seed(seed)
    yield seed


BIG = pytest.mark.gpu_memory  # a GPU case of several GiB: it holds the device alone (_device_share)
ALONE = ("gpu_memory",)  # marks that hold the device alone (large cases: other workers' memory would not fit)


@contextlib.contextmanager
def _device_share(exclusive):
    """One GPU shared by the xdist workers of a run (`-m gpu -n 8`): a test with a mark of ALONE holds the device
    alone, the others share it.  A reader-writer lock on two files of the run: a writer takes the turnstile,
    then waits out the current readers; new readers queue at the turnstile, so the writer is never starved."""
    import fcntl  # POSIX only, as the GPU runs are

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getppid()))
    base = os.path.join(tempfile.gettempdir(), f"fused-layers-gpu-{run}")
    with open(base + ".turnstile", "a") as gate, open(base + ".lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _gpu_memory(request):
    """GPU tests return their cached blocks to the device when they end, so that eight workers fit on one GPU; the
    large ones (`gpu_memory`) run alone (without this, `-n 8` on an 80 GB H100 failed six of them out of memory)."""
    if not (HAS_CUDA and "gpu" in request.keywords):
        yield
        return
    with _device_share(any(m in request.keywords for m in ALONE)):
        try:
            yield
        finally:
            gc.collect()
            torch.cuda.empty_cache()


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"


# Per-dtype tolerances (atol, rtol) for outputs of memory-bound ops computed in float32 from
# inputs of the given dtype, compared with a float64 reference.
TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_same_step(a, b, tol=2e-5):
    """Two training steps of a model, swapped (``b``) and not (``a``), each (output, {parameter: gradient}): the
    output and every gradient within ``tol`` (float32 models), the same parameters with gradients."""
    (oa, ga), (ob, gb) = a, b
    torch.testing.assert_close(ob, oa, atol=tol, rtol=tol)
    assert ga.keys() == gb.keys() and len(ga) > 0
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=tol, rtol=tol, msg=lambda m: f"{n}: {m}")


@pytest.fixture
def torch_2_11_sdpa_flops(monkeypatch):
    """torch 2.11's SDPA FLOP formulas, which raise unless key / value have the query's head count (GQA is rejected),
    counting the CPU's SDPA ops too (torch counts none for them): FlopCounterMode on the CPU meets what an H100 met."""
    from torch.utils import flop_counter

    def as_torch_2_11(count):
        def strict(*shapes):
            if len({tuple(s)[1] for s in shapes}) != 1:
                raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
            return count(*shapes)
        return strict

    aten, registry = torch.ops.aten, flop_counter.flop_registry
    for name in ("sdpa_flop_count", "sdpa_backward_flop_count"):
        monkeypatch.setattr(flop_counter, name, as_torch_2_11(getattr(flop_counter, name)))
    monkeypatch.setitem(registry, aten._scaled_dot_product_flash_attention_for_cpu,
                        registry[aten._scaled_dot_product_flash_attention])
    monkeypatch.setitem(registry, aten._scaled_dot_product_flash_attention_for_cpu_backward,
                        registry[aten._scaled_dot_product_flash_attention_backward])
