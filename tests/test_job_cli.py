"""train.py's face: every config error is one line naming the key, exit code 2, and nothing created; ``--help``
lists the groups and the main keys with one line each; the console handler and the progress bar.

Most error forms run `preflight` in-process (what ``python train.py ARGS`` runs before Hydra); a few go through
the real command to show that train.py calls it before Hydra makes a run dir. Every case runs in an empty
working directory and checks that it stays empty (no ``outputs/``, ``multirun/``, W&B run or dataset).
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lm_demo import cli  # noqa: E402
from lm_demo.config import (  # noqa: E402
    DataConfig,
    FusedCallbackConfig,
    LlamaModelConfig,
    ModelConfig,
    StrategyConfig,
    TrainConfig,
    TrainerConfig,
    key_help,
)
from lm_demo.console import ConsoleHandler, console_only, progress_bar  # noqa: E402

TRAIN = str(ROOT / "train.py")


def preflight(capsys, *args: str) -> tuple[int, str, str]:
    """``python train.py ARGS`` up to where Hydra would take over: (exit code, stdout, stderr); 0 if it returned."""
    try:
        cli.preflight(list(args), app_file=TRAIN)
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run([sys.executable, TRAIN, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


# ------------------------------------------------------------------------------------------------
# config errors
# ------------------------------------------------------------------------------------------------
ERRORS = [
    # a value of the wrong type, as Hydra's merge reports it
    (["fused=maybe"], "fused", ["'maybe'", "true or false"]),
    (["model.attn_impl=flash"], "model.attn_impl", ["'flash'", "reference, sdpa"]),
    (["data.batch_size=abc"], "data.batch_size", ["'abc'", "integer"]),
    (["model.betas=3"], "model.betas", ["list"]),
    # misspelt keys: the nearest one suggested
    (["trainer.max_step=5"], "trainer.max_step", ["no such key", "did you mean trainer.max_steps?"]),
    (["fuse=true"], "fuse", ["did you mean fused?"]),
    (["callbacks.fused.polcy=faster"], "callbacks.fused.polcy", ["did you mean callbacks.fused.policy?"]),
    (["model.batch_size=8"], "model.batch_size", ["did you mean data.batch_size?"]),
    (["trainer.frobnicate=1"], "trainer.frobnicate", ["no such key", "+trainer.frobnicate="]),
    (["hydra.run.dri=x"], "hydra.run.dri", ["did you mean hydra.run.dir?"]),
    # unknown groups and options
    (["model=gpt3"], "model", ["'gpt3'", "gpt2_small, llama_1b, llama_tiny, tiny"]),
    (["strategy=nccl"], "strategy", ["'nccl'", "auto, ddp, deepspeed, fsdp, fsdp2"]),
    (["logger=[wandb,nope]"], "logger", ["'nope'", "csv, none, wandb"]),
    (["hydra/launcher=nope"], "hydra.launcher", ["'nope'", "basic"]),
    (["foo/bar=baz"], "foo/bar", ["no such config group"]),
    # Hydra's override syntax
    (["fused=[1"], "fused", ["cannot read"]),
    (["+fused=true"], "fused", ["already in the config", "fused="]),
    (["~callbacks.nope"], "callbacks.nope", ["nothing to delete"]),
    (["fused=false,true"], "fused", ["sweep", "-m"]),
    (["model.lr=${nope}"], "model.lr", ["nope"]),
    # what only the check sees, blaming the right key
    (["model.d_model=-1"], "model.d_model", [">= 1", "-1"]),
    (["model.n_head=3"], "model.n_head", ["divide", "128"]),
    (["data.path=/nonexistent.txt"], "data.path", ["no such file"]),
    (["callbacks.fused.policy=fastest"], "callbacks.fused.policy", ["fastest"]),
    (["ckpt_path=last"], "ckpt_path", ["no checkpoints/last.ckpt"]),
    # the Llama family and the strategy group
    (["model=llama_tiny", "model.n_kv_head=3"], "model.n_kv_head", ["divide", "model.n_head (4)"]),
    (["model=llama_tiny", "model.attn_impl=reference"], "model.attn_impl", ["'reference'", "sdpa, eager"]),
    (["model=llama_tiny", "model.gradient_checkpointing=maybe"], "model.gradient_checkpointing", ["true or false"]),
    (["model=llama_tiny", "model.mlp_ratio=2"], "model.mlp_ratio", ["no such key"]),
    (["model=llama_tiny", "model.rope_theta=0"], "model.rope_theta", ["> 0"]),
    (["model=llama_tiny", "model.vocab_size=100"], "model.vocab_size", [">= 256", "bytes"]),
    (["model=llama_tiny", "data=synthetic", "data.vocab_size=1000"], "data.vocab_size", ["<= model.vocab_size"]),
    (["strategy.name=nccl"], "strategy.name", ["'nccl'", "allowed"]),
    (["strategy=fsdp", "strategy.sharding_strategy=FULL"], "strategy.sharding_strategy", ["FULL_SHARD"]),
    (["strategy=ddp", "trainer.strategy=fsdp"], "trainer.strategy", ["both pick a strategy"]),
    (["strategy=fsdp", "trainer.accelerator=cpu"], "trainer.accelerator", ["needs GPUs", "ddp or fsdp2"]),
    (["strategy=fsdp2", "trainer.precision=16-mixed"], "trainer.precision", ["bf16-mixed"]),
    (["strategy=fsdp2", "model._target_=my.Model"], "strategy", ["configure_model"]),
    # a multirun: every job is checked before the sweep dir exists
    (["-m", "fused=false,true", "model.d_model=64,-1"], "model.d_model", ["-1"]),
    (["-m", "fused=false,maybe"], "fused", ["'maybe'"]),
    # Hydra's command-line flags
    (["--bogus"], "--bogus", ["unknown option"]),
    (["--cfg", "job", "fuse=1"], "fuse", ["did you mean fused?"]),
]


@pytest.mark.parametrize("args, key, words", ERRORS, ids=[" ".join(a) for a, _, _ in ERRORS])
def test_config_error_is_one_line_naming_the_key(tmp_path, monkeypatch, capsys, args, key, words):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    code, out, err = preflight(capsys, *args)
    assert code == 2, (code, out, err)
    assert err.endswith("\n") and err.count("\n") == 1 and err.startswith(f"config error: {key}: "), err
    for w in words:
        assert w in err, (w, err)
    assert out == ""
    assert list(tmp_path.iterdir()) == []  # no outputs/, multirun/, W&B run or dataset


def test_valid_commands_pass_the_preflight(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for args in ([], ["fused=true", "model=gpt2_small", "trainer=gpu"],
                 ["model=llama_1b", "trainer=gpu", "trainer.devices=2", "strategy=fsdp2", "fused=true"],
                 ["-m", "fused=false,true", "model=llama_tiny", "data=synthetic", "strategy=ddp,fsdp2"],
                 ["trainer.devices=2", "trainer.strategy=ddp"],
                 ["-m", "fused=false,true", "model.d_model=64,128"],
                 ["+trainer.detect_anomaly=true", "~callbacks.throughput", "logger=[csv,wandb]"],
                 ["--cfg", "job"]):
        code, out, err = preflight(capsys, *args)
        assert (code, out, err) == (0, "", ""), args
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, key", [
    (["fused=maybe"], "fused"),
    (["trainer.max_step=5"], "trainer.max_step"),
    (["model.d_model=-1"], "model.d_model"),
    (["-m", "fused=false,true", "data.path=/nonexistent.txt"], "data.path"),
])
def test_cli_config_error_creates_nothing(tmp_path, args, key):
    """The real command: train.py runs the preflight before Hydra makes outputs/ or multirun/."""
    r = run(tmp_path, *args)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"config error: {key}: "), r.stderr[-2000:]
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed")
def test_deepspeed_strategy_without_deepspeed_is_one_line(tmp_path):
    """The real command: strategy=deepspeed where deepspeed is not installed: one line, exit 2, nothing made."""
    r = run(tmp_path, "strategy=deepspeed", "model=llama_tiny")
    assert r.returncode == 2 and r.stdout == "" and list(tmp_path.iterdir()) == []
    assert r.stderr == ("config error: strategy: deepspeed is not installed (pip install deepspeed); "
                        "or pick strategy=fsdp2, fsdp or ddp\n"), r.stderr[-2000:]


def test_llama_without_transformers_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else
                        find_spec(name, *a))
    code, out, err = preflight(capsys, "model=llama_tiny")
    assert code == 2 and out == "" and list(tmp_path.iterdir()) == []
    assert err.startswith("config error: model: lm_demo.model.LlamaLM builds transformers' LlamaForCausalLM") and \
        "pip install 'fused-layers[hf]'" in err and err.count("\n") == 1, err


def test_config_error_inside_the_job_removes_the_run_dir(tmp_path):
    """A config error that only the job sees (the preflight skipped here, as if a file vanished in between):
    the same one line and exit code 2, and the run dir Hydra had made is gone again."""
    script = ("import runpy, sys\n"
              "import lm_demo.cli\n"
              "lm_demo.cli.preflight = lambda *a, **k: None\n"
              f"sys.argv = [{TRAIN!r}, 'data.path=/nonexistent.txt']\n"
              f"runpy.run_path({TRAIN!r}, run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == "config error: data.path: '/nonexistent.txt': no such file", r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_remove_run_dir_keeps_what_is_not_hydras(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "outputs" / "2030-01-01" / "12-00-00"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "train.log").write_text("")
    (tmp_path / "outputs" / "2030-01-01" / "11-00-00").mkdir()  # an earlier run of that day
    cli.remove_run_dir(run_dir)
    assert not run_dir.exists() and (tmp_path / "outputs" / "2030-01-01" / "11-00-00").is_dir()
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "notes.txt").write_text("mine")
    cli.remove_run_dir(run_dir)
    assert (run_dir / "notes.txt").is_file() and not (run_dir / ".hydra").exists()


# ------------------------------------------------------------------------------------------------
# --help
# ------------------------------------------------------------------------------------------------
def test_help_lists_groups_options_and_main_keys(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = preflight(capsys, "--help")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) <= 100 and max(len(line) for line in lines) <= 120  # a screen or two
    start = lines.index("config groups (GROUP=OPTION; * = selected):")
    groups = lines[start + 1:lines.index("", start)]
    listed, group = {}, None
    for line in groups:
        if not line.startswith("    "):
            group = line.split()[0]
            listed[group] = []
        else:
            tokens = line.split()
            listed[group].append(tokens[1] if tokens[0] == "*" else tokens[0])
    assert listed == {"model": ["gpt2_small", "llama_1b", "llama_tiny", "tiny"], "data": ["synthetic", "text"],
                      "trainer": ["default", "gpu"], "strategy": ["auto", "ddp", "deepspeed", "fsdp", "fsdp2"],
                      "callbacks": ["checkpoint", "default", "fused", "throughput"], "logger": ["csv", "none", "wandb"]}
    assert "* tiny" in out and "* text" in out and "* wandb" in out and "* auto" in out  # the defaults are marked
    main = {k: desc for k, (desc, is_main) in key_help().items() if is_main}
    for key in ("fused", "seed", "ckpt_path", "model.d_model", "model.attn_impl", "data.path", "trainer.max_steps",
                "trainer.precision", "callbacks.fused.policy", "logger.wandb.offline"):
        line = next((line for line in lines if line.split()[:1] == [key]), None)
        assert line is not None and main[key].split()[0] in line, key
    assert any(line.split()[:2] == ["trainer.max_steps", "250"] for line in lines)  # the composed value
    assert "model.mlp_ratio" not in out  # a detail: --help-all
    assert list(tmp_path.iterdir()) == []


def test_help_all_lists_every_documented_key_and_follows_overrides(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = preflight(capsys, "--help-all", "model=gpt2_small")
    assert code == 0
    keys = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()}
    assert set(key_help()) <= keys, set(key_help()) - keys
    assert any(line.split()[:2] == ["model.d_model", "768"] for line in out.splitlines())
    assert any(line.split()[:2] == ["*", "gpt2_small"] for line in out.splitlines())
    # the Llama family: its own schema's keys, with their values
    code, out, _ = preflight(capsys, "--help-all", "model=llama_1b", "strategy=fsdp2")
    keys = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()}
    assert code == 0 and set(key_help(model=LlamaModelConfig)) <= keys
    assert "model.mlp_ratio" not in keys and "model.n_kv_head" in keys
    for key, value in (("model.vocab_size", "128256"), ("model.n_kv_head", "8"), ("strategy.name", "fsdp2"),
                       ("model.gradient_checkpointing", "false")):
        assert any(line.split()[:2] == [key, value] for line in out.splitlines()), key


def test_every_schema_field_has_a_description():
    import dataclasses

    for schema in (TrainConfig, ModelConfig, LlamaModelConfig, StrategyConfig, DataConfig, TrainerConfig,
                   FusedCallbackConfig):
        for f in dataclasses.fields(schema):
            if f.name != "_target_" and f.name not in ("model", "data", "trainer", "strategy", "callbacks", "logger"):
                assert f.metadata.get("help"), f"{schema.__name__}.{f.name}"


def test_hydra_help_stays_reachable(tmp_path):
    r = run(tmp_path, "--hydra-help")
    assert r.returncode == 0 and "Hydra" in r.stdout and "--hydra-help" in r.stdout, r.stderr[-2000:]
    r = run(tmp_path, "--help")
    assert r.returncode == 0 and "config groups" in r.stdout and "--hydra-help" in r.stdout
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# the console
# ------------------------------------------------------------------------------------------------
def _record(name: str, level: int, pathname: str, **extra) -> logging.LogRecord:
    r = logging.LogRecord(name, level, pathname, 1, "msg", None, None)
    r.__dict__.update(extra)
    return r


def test_console_keeps_lightnings_info_lines_in_the_log_file_only():
    import lightning

    inside = os.path.join(os.path.dirname(lightning.__file__), "pytorch", "loops", "fit_loop.py")
    # "`Trainer.fit` stopped: ...": Lightning's own info line
    assert not console_only(_record("lightning.pytorch.utilities.rank_zero", logging.INFO, inside))
    assert console_only(_record("lightning.pytorch.utilities.rank_zero", logging.WARNING, inside))
    ours = str(ROOT / "callbacks" / "fused.py")  # a callback's report through rank_zero_info
    assert console_only(_record("lightning.pytorch.utilities.rank_zero", logging.INFO, ours))
    assert not console_only(_record("train", logging.INFO, TRAIN, console=False))
    assert console_only(_record("train", logging.INFO, TRAIN))


def test_console_handler_writes_to_the_stdout_of_the_moment(monkeypatch):
    """A live progress bar replaces sys.stdout with a proxy that prints above the bar: log lines must follow."""
    handler = ConsoleHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", first)
    handler.emit(_record("train", logging.INFO, TRAIN))
    monkeypatch.setattr(sys, "stdout", second)
    handler.emit(_record("train", logging.INFO, TRAIN))
    assert first.getvalue() == second.getvalue() == "msg\n"


def test_progress_bar_labels_are_plain():
    from types import SimpleNamespace

    bar = progress_bar()
    if bar is None:
        pytest.skip("rich is not installed: Lightning's own bar")
    bar._trainer = SimpleNamespace(max_epochs=-1)  # bounded by trainer.max_steps
    assert bar._get_train_description(0).strip() == "Epoch 0"
    bar._trainer = SimpleNamespace(max_epochs=3)
    assert bar._get_train_description(1).strip() == "Epoch 1/2"
