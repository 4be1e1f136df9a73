"""benchmarks/ as a product: the committed tables parse, the entry point answers, the figures draw (CPU, no timing)."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import utils

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["ops", "models", "train", "host", "sass"]


@pytest.mark.parametrize("suite", SUITES)
def test_table_parses_with_its_key(suite):
    path = utils.table_path(suite)
    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    assert header == utils.COLUMNS[suite]
    assert header[:5] == ["gpu", "torch", "triton", "commit", "date"]
    rows = utils.read_rows(path)
    assert rows, f"{path} has no rows"
    for r in rows:
        for k in utils.KEY:
            assert r[k], f"{path}: a row without {k}: {r}"
        assert len(r["date"]) == 10 and r["date"][4] == "-" and r["date"][7] == "-", r["date"]
        assert None not in r, f"{path}: a row with more cells than columns: {r}"
    numeric = {"ops": "ms", "models": "speedup", "train": "step_ms", "host": "host_us", "sass": "insns"}[suite]
    assert all(utils.num(r[numeric]) > 0 for r in rows)
    assert utils.latest(rows, utils.CASE[suite])


def test_models_table_has_every_model_and_arm():
    latest = utils.latest(utils.read_rows(utils.table_path("models")), utils.CASE["models"])
    arms = {(r["model"], r["arm"]) for r in latest if r["mode"] == "eager"}
    for m in ("gpt2", "llama", "qwen2", "gemma", "vit"):
        assert (m, "unfused") in arms and (m, "fused") in arms, m
    for m in ("llama", "qwen2", "gemma"):
        assert (m, "liger") in arms, m


def test_append_rows_checks_columns(tmp_path):
    out = tmp_path / "t.csv"
    key = dict(gpu="g", torch="t", triton="tr", commit="c", date="2026-01-01")
    assert utils.append_rows(out, [dict(key, op="softmax", ms=1.5, note="a, b")], "ops") == 1
    utils.append_rows(out, [dict(key, op="softmax", ms=float("nan"))], "ops")
    rows = utils.read_rows(out)
    assert [r["ms"] for r in rows] == ["1.5", ""] and rows[0]["note"] == "a, b"
    with pytest.raises(KeyError):
        utils.append_rows(out, [dict(key, no_such_column=1)], "ops")
    with pytest.raises(ValueError):
        utils.append_rows(out, [key], "models")  # another table's header


def test_row_commit_is_benchmarks_commit_where_set(monkeypatch):
    """A device machine's copy of the tree may carry an older git folder: BENCHMARKS_COMMIT, where set, keys the
    rows; else HEAD's short hash (``+dirty`` when tracked files differ)."""
    monkeypatch.setenv("BENCHMARKS_COMMIT", "abc1234")
    assert utils.git_commit() == "abc1234"
    monkeypatch.delenv("BENCHMARKS_COMMIT")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=utils.ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert utils.git_commit().split("+")[0] == head.stdout.strip()


def test_models_row_note_names_the_library_fallbacks():
    """What fell back during an arm's first steps (``fused_layers.fallbacks()``) goes into its row's note, once each."""
    from benchmarks.models import fallback_note

    msgs = ["fused_layers attention: a mask tensor under torch.compile is not fused; these calls run the model's own "
            "attention implementation ('sdpa').",
            "fused_layers attention: a mask tensor under torch.compile is not fused; these calls run the model's own "
            "attention implementation ('sdpa').",
            "fused_layers: LlamaForCausalLM's LM head + loss are not fused (its lm_head is a Linear8bit); the loss "
            "alone is fused.",
            "fused_attention: value head dim 32 != query head dim 64 is not fused; using SDPA."]
    assert fallback_note(msgs) == ("fell back: attention: a mask tensor under torch.compile | LlamaForCausalLM's LM "
                                   "head + loss are not fused (its lm_head is a Linear8bit) | fused_attention: value "
                                   "head dim 32 != query head dim 64")
    assert fallback_note([]) == ""


def test_latest_picks_the_newest_row_of_each_case():
    rows = [dict(gpu="g", model="m", mode="eager", arm="fused", date="2026-01-02", v="old"),
            dict(gpu="g", model="m", mode="eager", arm="fused", date="2026-01-03", v="new"),
            dict(gpu="g", model="m", mode="eager", arm="fused", date="2026-01-01", v="older"),
            dict(gpu="g", model="m", mode="eager", arm="unfused", date="2026-01-01", v="base")]
    assert [r["v"] for r in utils.latest(rows, utils.CASE["models"])] == ["new", "base"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_help_lists_every_suite():
    r = _cli("--help")
    assert r.returncode == 0, r.stderr
    for suite in ("ops", "models", "train", "host", "sass", "plot", "table"):
        assert suite in r.stdout
    r = _cli("models", "--help")
    assert r.returncode == 0 and "--rounds" in r.stdout and "--smoke" in r.stdout
    r = _cli("sass", "--help")
    assert r.returncode == 0, r.stderr
    for option in ("--ops", "--jobs", "--check", "--out", "--dry-run"):
        assert option in r.stdout


def test_sass_cases_name_only_what_their_kernels_have():
    """Every case of the sass suite builds its compile signature (no compile): the constexprs and arguments it names
    are its kernel's, every constexpr without a default has a value, and names are unique per op."""
    import dataclasses

    from benchmarks import sass

    for op in sass.OPS:
        cases = sass.cases(op)
        assert cases, op
        assert len({c.name for c in cases}) == len(cases), op
        for c in cases:
            sig, constexprs, _ = c.signature()
            assert list(sig) == sass.Case.kernel_args(c.fn)
            assert set(c.constexprs) <= set(sass.Case.kernel_constexprs(c.fn)), c.name
    c = sass.cases("softmax")[0]
    with pytest.raises(ValueError, match="no constexpr"):
        dataclasses.replace(c, constexprs=dict(c.constexprs, NO_SUCH_CONSTEXPR=1)).signature()
    with pytest.raises(ValueError, match="no value"):
        dataclasses.replace(c, constexprs={}).signature()


def test_sass_check_lists_changed_new_and_gone_cases():
    from benchmarks import sass

    def row(case, sha, date="2026-01-02", triton="3.6.0"):
        return dict(gpu=sass.GPU, triton=triton, date=date, op="norm", case=case, sha=sha, regs="40", shared="0",
                    insns="100", opcodes="FFMA:3 MOV:2")

    table = [row("a", "old"), row("a", "1111", date="2026-01-03"), row("b", "2222"), row("gone", "3333"),
             row("b", "other triton", triton="3.9.0")]
    now = [row("a", "1111"), dict(row("b", "9999"), opcodes="FFMA:4 MOV:2"), row("new", "4444")]
    lines = sass.compare(now, {("norm", c) for c in ("a", "b", "new")}, table, ["norm"], "3.6.0")
    assert sorted(line.split()[0] for line in lines) == ["CHANGED", "GONE", "NEW"]
    assert any("FFMA 3->4" in line for line in lines)
    assert sass.compare(now[:1], {("norm", "a")}, table[:2], ["norm"], "3.6.0") == []


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_gpu_suite_without_cuda_is_one_line_and_exit_2():
    r = _cli("train")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "CUDA" in r.stderr


def test_table_prints_markdown():
    r = _cli("table", "models")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("| model |") and "qwen2" in r.stdout


def test_plot_draws_the_figures_from_the_committed_tables(tmp_path):
    pytest.importorskip("matplotlib")
    r = _cli("plot", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    for name in ("models.png", "ops.png", "train.png"):
        png = tmp_path / name
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_committed_figures_exist():
    for name in ("models.png", "ops.png", "train.png"):
        assert (utils.FIGURES / name).exists(), name


def test_models_globals_switch_gives_each_arm_its_own_module_globals(monkeypatch):
    """Liger rebinds functions of transformers' modules (RoPE); the models suite keeps one set per arm."""
    import types

    from benchmarks.models import GlobalsSwitch

    mod = types.ModuleType("transformers_switch_check")
    mod.rope, mod.other = "original", "untouched"
    monkeypatch.setitem(sys.modules, mod.__name__, mod)

    def patch():
        mod.rope = "patched"
        mod.added = "new"  # a name added (a lazy import) is left alone

    sw = GlobalsSwitch()
    sw.capture(patch)
    assert mod.rope == "original"
    sw.enter(True)
    assert (mod.rope, mod.other) == ("patched", "untouched")
    sw.enter(False)
    assert mod.rope == "original" and mod.added == "new"


def test_gpu_busy_time_counts_overlapping_kernels_once():
    """gpu_busy_ms's union of kernel intervals (microseconds in, milliseconds out): an overlap counts once, a gap
    not at all, whatever the order; without CUDA the measure is NaN, not a number that looks measured."""
    import math

    import torch

    assert utils.union_ms([(0, 1000), (500, 1500), (3000, 3500), (3100, 3200)]) == 2.0
    assert utils.union_ms([(3000, 3500), (0, 1000)]) == 1.5 and utils.union_ms([]) == 0.0
    if not torch.cuda.is_available():
        assert math.isnan(utils.gpu_busy_ms(lambda: None))


def test_models_compiled_routes_option(capsys):
    """--compiled-routes (models and train suites) adds an arm with these compile routes (ops/compile_config.py)
    beside the fused arm, each arm with its own table while it runs; a wrong op or route is refused before anything
    runs."""
    from benchmarks.utils import RouteTables, compiled_routes

    assert compiled_routes("") == {}
    assert compiled_routes("rms_norm_variant=inductor,softmax=kernels") == {"rms_norm_variant": "inductor",
                                                                           "softmax": "kernels"}
    for bad in ("attention=inductor", "softmax=triton", "softmax"):
        with pytest.raises(ValueError, match="expected op=kernels|inductor"):
            compiled_routes(bad)
    from fused_layers.ops import compile_config

    default = compile_config.COMPILED
    tables = RouteTables({"mlp": "kernels", "softmax": "inductor"})
    assert tables.name == "fused[mlp=kernels;softmax=inductor]"
    try:
        tables.enter(tables.name)
        assert (compile_config.COMPILED.mlp, compile_config.COMPILED.softmax) == ("kernels", "inductor")
        assert compile_config.COMPILED.layer_norm == default.layer_norm
        tables.enter("fused")
        assert compile_config.COMPILED is default
    finally:
        compile_config.COMPILED = default
    import argparse

    from benchmarks import models

    p = argparse.ArgumentParser()
    models.add_arguments(p)
    p.add_argument("--smoke", action="store_true")
    assert models.run(p.parse_args(["--smoke", "--compiled-routes", "softmax=fast"])) == 2
    assert "--compiled-routes: 'softmax=fast'" in capsys.readouterr().out
    from benchmarks import training  # the train suite takes the same option

    p = argparse.ArgumentParser()
    training.add_arguments(p)
    p.add_argument("--smoke", action="store_true")
    assert training.run(p.parse_args(["--smoke", "--compiled-routes", "mlp=fast"])) == 2
    assert "--compiled-routes: 'mlp=fast'" in capsys.readouterr().out


def test_models_arms_leave_kinds_out(capsys):
    """--arms fused-<kind>[-<kind>...]: the fused arm without those kinds (what one kind costs or gains in the step),
    fused+<kind> with a kind that is off by default; the arm's swap leaves them alone; an unknown arm or kind is
    refused before anything runs."""
    pytest.importorskip("transformers")
    import argparse

    from benchmarks import models
    from fused_layers.swap import KINDS

    assert models.fused_kinds("fused") is None
    default = [k for k in KINDS if KINDS[k].default]
    assert models.fused_kinds("fused-mlp") == [k for k in default if k != "mlp"]
    assert set(default) - set(models.fused_kinds("fused-mlp-attention")) == {"mlp", "attention"}
    assert models.fused_kinds("fused+mlp_recompute") == [k for k in KINDS if k in default or k == "mlp_recompute"]
    assert models.fused_kinds("fused-mlp+mlp_recompute") == [k for k in KINDS if k in default + ["mlp_recompute"]
                                                             and k != "mlp"]
    arm = models.Arm("gpt2", "fused-mlp", "eager", True, models.GlobalsSwitch())
    assert "mlp" not in arm.swapped and "layer_norm" in arm.swapped, arm.swapped
    p = argparse.ArgumentParser()
    models.add_arguments(p)
    p.add_argument("--smoke", action="store_true")
    for bad, said in (("unfused,fused-mpl", "no kind mpl"), ("fastest", "unknown arm 'fastest'")):
        assert models.run(p.parse_args(["--smoke", "--arms", bad])) == 2
        assert said in capsys.readouterr().out


def test_models_writes_each_case_as_it_ends(tmp_path, monkeypatch):
    """The models suite appends a case's rows (one model, mode, variant) as soon as its subprocess ends: a run
    stopped later (a timeout, a reclaimed GPU machine) keeps what it measured."""
    import json

    from benchmarks import models
    from benchmarks.__main__ import parser

    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if len(calls) > 1:
            raise KeyboardInterrupt  # the run is stopped during the second case
        path = cmd[cmd.index("--child-json") + 1]
        json.dump([{"model": "llama", "mode": "eager", "arm": a, "step_ms": 1.0} for a in ("unfused", "fused")],
                  open(path, "w"))

    monkeypatch.setattr(models.subprocess, "run", fake_run)
    monkeypatch.setattr(models.utils, "require_cuda", lambda *a: None)
    out = tmp_path / "models.csv"
    args = parser().parse_args(["models", "--models", "llama", "--variants", "plain,grad_ckpt", "--arms",
                                "unfused,fused", "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        models.run(args)
    rows = utils.read_rows(out)
    assert len(calls) == 2 and [r["arm"] for r in rows] == ["unfused", "fused"]


def test_models_variants_gradient_checkpointing_and_lora(capsys):
    """--variants: grad_ckpt turns on the model's activation checkpointing, lora wraps it in a PEFT adapter whose
    parameters alone train (the arm's optimizer takes only those), before a fused arm swaps (its LoRA layers too);
    an unknown variant is refused before anything runs."""
    pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import argparse

    from benchmarks import models

    m = models.apply_variant(models.build("llama", smoke=True)[0], "llama", "grad_ckpt")
    assert m.is_gradient_checkpointing
    m = models.apply_variant(models.build("llama", smoke=True)[0], "llama", "lora")
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert isinstance(m, peft.PeftModel) and trainable and all("lora_" in n for n in trainable)
    arm = models.Arm("llama", "fused", "eager", True, models.GlobalsSwitch(), "lora")
    assert isinstance(arm.model, peft.PeftModel) and "lora " in arm.swapped, arm.swapped  # swapped after PEFT
    p = argparse.ArgumentParser()
    models.add_arguments(p)
    p.add_argument("--smoke", action="store_true")
    assert models.run(p.parse_args(["--smoke", "--variants", "qlora"])) == 2
    assert "unknown ['qlora']" in capsys.readouterr().out


def _decoder_grads_agree(dev, dt, atol, rtol):
    import torch

    from benchmarks import host

    for case, (leaves, impls) in host.decoder_cases(dev, dt, smoke=dev == "cpu").items():
        grads = {}
        for name, fn in impls.items():
            for t in leaves:
                t.grad = None
            fn()
            grads[name] = [t.grad.float() for t in leaves]
        assert len(impls) >= 2, case
        for name, gs in grads.items():
            for i, (g, ref) in enumerate(zip(gs, grads["torch"])):
                torch.testing.assert_close(g, ref, atol=atol, rtol=rtol, msg=lambda m: f"{case} {name} leaf {i}: {m}")


def test_host_decoder_cases_compute_the_same_gradients():
    """The host suite times equal work: each decoder case's fused call reaches the leaves' gradients that the
    PyTorch code it stands for computes (float32, the interpreter)."""
    import torch

    _decoder_grads_agree("cpu", torch.float32, 1e-4, 1e-4)


@pytest.mark.gpu
def test_gpu_host_decoder_cases_compute_the_same_gradients():
    """The same in bf16 on the GPU, Liger's peers included where installed."""
    import torch

    _decoder_grads_agree("cuda", torch.bfloat16, 6e-2, 2e-2)
