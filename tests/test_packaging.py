"""Packaging: ``pip install fused-layers`` needs torch and triton only, and the wheel holds ``fused_layers`` only.

The training stack (Lightning, Hydra, OmegaConf, W&B) is the ``[train]`` extra: importing the library, any of
its modules but ``fused_layers.lightning``, must not import it; ``fused_layers.lightning`` without Lightning
says which extra to install.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAINING_STACK = {"lightning", "lightning_fabric", "pytorch_lightning", "hydra", "omegaconf", "wandb"}


def _python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_library_imports_no_training_stack():
    """Every module of the package but ``fused_layers.lightning``, imported in a fresh interpreter."""
    code = f"""
import importlib, pkgutil, sys
import fused_layers
for m in pkgutil.walk_packages(fused_layers.__path__, "fused_layers."):
    if m.name != "fused_layers.lightning":
        importlib.import_module(m.name)
print(sorted({TRAINING_STACK!r} & {{m.split(".")[0] for m in sys.modules}}))
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout


def test_lightning_module_without_lightning_names_the_extra():
    code = """
import sys
sys.modules["lightning"] = None  # as if Lightning were not installed
try:
    import fused_layers.lightning
except ImportError as e:
    print(e)
else:
    print("imported")
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pip install 'fused-layers[train]'" in r.stdout, r.stdout


def test_callback_is_importable_from_the_package_and_is_the_jobs_target():
    pytest.importorskip("lightning")
    import fused_layers.lightning as fl
    from lm_demo.config import FusedCallbackConfig

    assert FusedCallbackConfig._target_ == "fused_layers.lightning.FusedLayersCallback"
    assert issubclass(fl.FusedLayersCallback, __import__("lightning").pytorch.Callback)


def test_dependencies_and_packages():
    """Install requirements are torch and triton; the training stack is the [train] extra, which [test] includes;
    the wheel's packages are fused_layers and its subpackages (found as setuptools finds them)."""
    from setuptools import find_packages

    cfg = _pyproject()
    names = {d.split(";")[0].split(">")[0].split("=")[0].split("[")[0].strip() for d in cfg["project"]["dependencies"]}
    assert names == {"torch", "triton"}
    extras = cfg["project"]["optional-dependencies"]
    assert {"lightning", "hydra-core", "omegaconf", "wandb"} <= {d.split(">")[0] for d in extras["train"]}
    assert "fused-layers[train]" in extras["test"] and "fused-layers[test]" in extras["dev"]
    packages = find_packages(where=str(ROOT), **cfg["tool"]["setuptools"]["packages"]["find"])
    assert "fused_layers" in packages and {p.split(".")[0] for p in packages} == {"fused_layers"}, packages


@pytest.mark.slow
def test_wheel_holds_fused_layers_only(tmp_path):
    """Build the wheel from a copy of the sources (no build/ left in the checkout) and list its top level."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("fused_layers", "callbacks"):  # callbacks/ is copied so that leaving it out is what is tested
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    try:  # the installed setuptools when it is new enough (no download), else pip's isolated build
        import setuptools

        isolation = [] if int(setuptools.__version__.split(".")[0]) < 77 else ["--no-build-isolation"]
    except ImportError:
        isolation = []
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(tmp_path / "w"),
                        str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "w").glob("fused_layers-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"fused_layers", wheel.name.rsplit("-", 3)[0] + ".dist-info"}
    assert "fused_layers/csrc/fastpath.cpp" in names and "fused_layers/lightning.py" in names
