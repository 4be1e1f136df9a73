"""train.py + conf/: compose the real config (shrunk: CPU, a 1-layer GPT, a few steps) and run it.

fused=false and fused=true train; the W&B offline run carries `fused`, the tag, the group and the
speedup keys; the multirun comparison is produced by `python train.py -m fused=false,true`; bad
overrides fail clearly; the console is quiet; a run resumes from its checkpoint. Plus the demo's data
split and model (reference attention == SDPA). The command line's errors and --help: test_job_cli.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TOL
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train as train_script  # noqa: E402  (registers the schema and resolvers)
from lm_demo.compare import compare  # noqa: E402
from lm_demo.config import ConfigError, resolve_ckpt_path  # noqa: E402
from lm_demo.data import ByteLMDataModule  # noqa: E402
from lm_demo.model import GPTLM  # noqa: E402

# A 1-layer, 32-wide GPT on 32-byte sequences, batch 2: each step is a few interpreter launches.
SHRINK = [
    "model.d_model=32", "model.n_layer=1", "model.n_head=2", "model.seq_len=32", "model.warmup_steps=1",
    "data.batch_size=2", "data.max_bytes=100000",
    "trainer.accelerator=cpu", "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false", "trainer.enable_checkpointing=false",
    "callbacks.fused.warmup_steps=1", "callbacks.fused.max_measure_seconds=1.0",
    "callbacks.throughput.window_size=2",
]


def compose_cfg(out_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[*SHRINK, f"output_dir={out_dir}", *overrides])


def records_of(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def read_wandb_records(path: Path) -> list:
    """Records of an offline ``run-*.wandb`` file (LevelDB-log framing: 32 KiB blocks, 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, block, buf, chunks = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:  # FULL
            chunks.append(chunk)
        elif kind == 2:  # FIRST
            buf = chunk
        elif kind == 3:  # MIDDLE
            buf += chunk
        elif kind == 4:  # LAST
            chunks.append(buf + chunk)
        elif length == 0:  # zero padding up to the block end
            pos += block - pos % block if pos % block else 0
    records = []
    for c in chunks:
        r = pb.Record()
        r.ParseFromString(c)
        records.append(r)
    return records


def wandb_run_records(out_dir: Path, timeout_s: float = 30.0) -> list:
    """The records of the one offline run under ``out_dir``, once W&B's service has written them all (its
    writer is a separate process: ``wandb.finish()`` can return before the file holds the exit record)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        files = list(out_dir.glob("wandb/offline-run-*/run-*.wandb"))
        assert len(files) <= 1, files
        records = read_wandb_records(files[0]) if files else []
        kinds = {r.WhichOneof("record_type") for r in records}
        if {"run", "exit"} <= kinds or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def finite(x) -> bool:
    return x is not None and math.isfinite(x)


# ------------------------------------------------------------------------------------------------
# config
# ------------------------------------------------------------------------------------------------
def test_default_config_composes(tmp_path):
    cfg = compose_cfg(tmp_path)
    assert cfg.fused is False and cfg.run_tag == "unfused"
    assert cfg.callbacks.fused._target_ == "fused_layers.lightning.FusedLayersCallback"
    assert cfg.callbacks.fused.enabled is False
    assert set(cfg.logger) == {"wandb"} and cfg.logger.wandb.offline is True
    assert cfg.logger.wandb.save_dir == str(tmp_path) and cfg.logger.wandb.tags == ["unfused"]
    assert cfg.data.seq_len == cfg.model.seq_len == 32
    cfg = compose_cfg(tmp_path, "fused=true", "~callbacks.throughput", "logger=none", "model=gpt2_small", "trainer=gpu")
    assert cfg.callbacks.fused.enabled is True and cfg.run_tag == "fused" and "throughput" not in cfg.callbacks
    assert cfg.logger == {} and cfg.trainer.precision == "bf16-mixed" and cfg.model.seq_len == 32  # SHRINK wins


@pytest.mark.parametrize(
    "override, words",
    [
        ("fused=maybe", ["maybe", "bool"]),
        ("fuse=true", ["fuse"]),
        ("trainer.max_step=3", ["max_step"]),
        ("model.attn_impl=flash", ["flash", "reference", "sdpa"]),
        ("callbacks.fused.polcy=faster", ["polcy"]),
        ("model=gpt3", ["gpt3", "gpt2_small", "tiny"]),
    ],
)
def test_bad_overrides_fail_clearly(tmp_path, override, words):
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as e:
        compose_cfg(tmp_path, override)
    msg = str(e.value) + str(e.value.__cause__ or "")
    for w in words:
        assert w in msg, (override, msg)


# ------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_unfused_trains_csv(tmp_path):
    s = train_script.train(compose_cfg(tmp_path, "fused=false", "logger=csv"))
    assert s["fused"] is False and s["global_step"] == 4
    assert finite(s["metrics"]["train/loss"]) and finite(s["metrics"]["val/loss"])
    assert s["metrics"]["train/device/items_per_sec"] > 0  # ThroughputMonitor's tokens/s (window of 2)
    assert not any(k.startswith("fused/") for k in s["metrics"])  # no callback, no swap
    assert json.loads((tmp_path / "summary.json").read_text())["metrics"] == s["metrics"]
    assert "val/loss" in (tmp_path / "csv" / "metrics.csv").read_text()


@pytest.mark.slow
def test_unfused_sdpa_trains_without_logger(tmp_path):
    s = train_script.train(compose_cfg(tmp_path, "model.attn_impl=sdpa", "logger=none", "~callbacks.throughput"))
    assert s["attn_impl"] == "sdpa" and finite(s["metrics"]["val/loss"])
    assert not (tmp_path / "wandb").exists() and not (tmp_path / "csv").exists()


@pytest.mark.slow
def test_fused_trains_and_logs_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    s = train_script.train(compose_cfg(tmp_path, "fused=true", "run_group=test-sweep"))
    m = s["metrics"]
    assert s["fused"] is True and finite(m["train/loss"]) and finite(m["val/loss"])
    # the callback swapped (interpreter on this CPU) and timed the modules within its time budget: at least the
    # first one recorded (layer_norm); on a loaded machine the budget may end before the others
    measured = {k for k in m if k.startswith("fused/speedup/")}
    assert "fused/speedup/layer_norm" in measured
    assert measured <= {f"fused/speedup/{kind}" for kind in s["fused_layers"]["swapped"]}
    records = wandb_run_records(tmp_path)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_group == "test-sweep" and list(run.tags) == ["fused"]
    config = {u.key: json.loads(u.value_json) for c in records_of(records, "config") for u in c.update}
    assert config["fused"] is True and config["model"]["attn_impl"] == "reference"
    logged = {i.key or "/".join(i.nested_key) for h in records_of(records, "history") for i in h.item}
    assert measured | {"train/loss", "val/loss"} <= logged, sorted(logged)


@pytest.mark.slow
def test_multirun_writes_comparison(tmp_path):
    """`python train.py -m fused=false,true`: both runs, then compare.py's table and plot in the sweep dir."""
    cmd = [sys.executable, "train.py", "-m", "fused=false,true", *SHRINK, "logger=csv", f"hydra.sweep.dir={tmp_path}"]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fused vs unfused (2 runs" in r.stdout, r.stdout[-3000:]
    for f in ("comparison.md", "comparison.json", "comparison.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    result = json.loads((tmp_path / "comparison.json").read_text())
    rows = {row["label"]: row for row in result["rows"]}
    assert set(rows) == {"fused=false", "fused=true"} and result["baseline"] == "fused=false"
    fused_row = rows["fused=true"]
    assert "fused/speedup/layer_norm" in result["per_module_kinds"]
    fused_summary = [json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json")]
    fused_summary = [s for s in fused_summary if s.get("fused")]
    assert len(fused_summary) == 1  # the fused run's own logged ledger speedup, carried into the comparison
    assert fused_row["fused/speedup/layer_norm"] == fused_summary[0]["metrics"]["fused/speedup/layer_norm"]
    assert fused_row["tag"] == "fused" and fused_row["swapped"] == {"layer_norm": 3, "attention": 1, "cross_entropy": 1,
                                                                     "mlp": 1}
    assert rows["fused=false"]["tag"] == "unfused" and rows["fused=false"]["swapped"] == {}
    for row in rows.values():
        assert row["tokens_per_sec"] > 0 and finite(row["val_loss"]) and finite(row["train_loss"])
        assert row["tokens_lo"] <= row["tokens_per_sec"] <= row["tokens_hi"]  # median with its spread
    assert result["best_unfused"] == "fused=false"
    assert rows["fused=true"]["vs_best_unfused"] == pytest.approx(  # fused tokens/s over the best unfused run's
        rows["fused=true"]["tokens_per_sec"] / rows["fused=false"]["tokens_per_sec"])
    md = (tmp_path / "comparison.md").read_text()
    assert "vs best unfused" in md and "no unfused SDPA baseline" in md and "[" in md
    # Same seed, same data, float32: the fused run's losses are the unfused run's, step by step, within float32's
    # tolerances (conftest.TOL; measured ~1e-7 relative after 4 Adam steps), not merely finite.
    runs = {s["fused"]: s for s in (json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json"))}
    atol, rtol = TOL[torch.float32]
    for key in ("train/loss", "val/loss"):
        fused_h, unfused_h = runs[True]["history"][key], runs[False]["history"][key]
        steps = [s for s, _ in fused_h]
        assert steps == [s for s, _ in unfused_h] and len(steps) >= (4 if key == "train/loss" else 2), steps
        for (step, a), (_, b) in zip(fused_h, unfused_h):
            assert abs(a - b) <= atol + rtol * abs(b), (key, step, a, b)
    groups = {json.loads(p.read_text())["group"] for p in tmp_path.glob("*/summary.json")}
    assert len(groups) == 1  # one W&B group per sweep
    # compare.py is also a command
    assert compare(tmp_path, plot=False, echo=False)["rows"] == result["rows"]


# ------------------------------------------------------------------------------------------------
# a new user's first hour: config checked before anything starts, a quiet console, resume
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data.path=/nonexistent.txt"], "data.path"),
        (["callbacks.fused.policy=fastest"], "callbacks.fused.policy"),  # checked while fused=false too
        (["callbacks.fused.ab_compiled=sometimes"], "callbacks.fused.ab_compiled"),
        (["+callbacks.fused.kinds.layernorm=true"], "callbacks.fused.kinds"),
        (["callbacks.throughput.flops_from=guess"], "callbacks.throughput.flops_from"),
        (["++callbacks.fused.mapping={torch.nn.GELU:layer_nrm}"], "callbacks.fused.mapping"),
        (["+callbacks.throughput.windowsize=3"], "callbacks.throughput"),
        (["ckpt_path=/nonexistent.ckpt"], "ckpt_path"),
        (["model.n_head=3"], "model.n_head"),
        (["model.d_model=-1"], "model.d_model"),  # its own key, not n_head's
    ],
)
def test_config_checked_before_anything_starts(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as e:
        train_script.train(compose_cfg(tmp_path, *overrides))
    assert str(e.value).startswith(f"{key}: ") and "\n" not in str(e.value), str(e.value)
    assert list(tmp_path.iterdir()) == []  # no W&B run dir, no logs, nothing to sync


def test_cli_config_error_is_one_line_and_leaves_no_wandb_run(tmp_path):
    r = subprocess.run([sys.executable, "train.py", "data.path=/nonexistent.txt", f"hydra.run.dir={tmp_path / 'run'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == "config error: data.path: '/nonexistent.txt': no such file", r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # no run dir, no W&B run


def test_failure_report_prints_seed_whatever_the_flags(tmp_path):
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert 1 == 2\n")
    env = {**os.environ, "FUSED_TEST_SEED": "4242"}
    for flags in (["-q"], ["-qq", "--show-capture=no", "--tb=no", "-rN"]):
        r = subprocess.run([sys.executable, "-m", "pytest", "test_fails.py", "-p", "no:cacheprovider", *flags],
                           cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 1, r.stdout[-2000:]
        assert "FUSED_TEST_SEED=4242" in r.stdout, (flags, r.stdout[-2000:])


@pytest.mark.slow
def test_fused_run_that_swaps_nothing_is_labelled_so(tmp_path, monkeypatch):
    """fused=true where the kernels cannot run: summary, W&B tag/config/summary and the comparison say
    "fused (0 swapped)", with 0 per kind, and show no speedup."""
    import fused_layers.lightning as fused_cb

    monkeypatch.setattr(fused_cb, "kernels_runnable", lambda device: False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    s = train_script.train(compose_cfg(tmp_path, "fused=true", "trainer.max_steps=2"))
    assert s["fused"] is True and s["fused_effective"] is False and s["tag"] == "fused (0 swapped)"
    assert s["fused_layers"]["swapped_total"] == 0 and set(s["fused_layers"]["swapped"].values()) == {0}
    assert not any(k.startswith(("fused/speedup/", "fused/step_speedup/")) for k in s["metrics"])
    records = wandb_run_records(tmp_path)
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert list(runs[-1].tags) == ["fused (0 swapped)"]
    config = {u.key: json.loads(u.value_json) for c in records_of(records, "config") for u in c.update}
    assert config["fused_effective"] is False and config["fused_swapped"]["layer_norm"] == 0
    summ = {u.key: u.value_json for c in records_of(records, "summary") for u in c.update}
    assert summ["fused/swapped_total"] == "0"
    # comparison against an unfused twin: labelled as what it was, no ratio
    (tmp_path / "0").mkdir(), (tmp_path / "1").mkdir()
    base = dict(s, fused=False, fused_effective=False, fused_layers=None, tag="unfused", overrides=["fused=false"])
    (tmp_path / "0" / "summary.json").write_text(json.dumps(base))
    (tmp_path / "1" / "summary.json").write_text(json.dumps(dict(s, overrides=["fused=true"])))
    rows = {r["label"]: r for r in compare(tmp_path, plot=False, echo=False)["rows"]}
    assert rows["fused=true"]["tag"] == "fused (0 swapped)" and rows["fused=true"]["vs_base"] is None
    assert "nothing was swapped" in (tmp_path / "comparison.md").read_text()


@pytest.mark.slow
def test_cli_console_is_quiet_and_ends_with_a_summary(tmp_path):
    """Console of a real run: no Lightning tips or info lines, no deprecation warning, no wandb: lines, no numpy
    warnings from the interpreter; a final summary with throughput, losses and where every output is."""
    cmd = [sys.executable, "train.py", "fused=true", *SHRINK, "trainer.max_steps=3", "trainer.val_check_interval=100",
           "trainer.enable_checkpointing=true", "logger=[wandb,csv]", f"hydra.run.dir={tmp_path}"]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("WANDB_SILENT", None)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for noise in ("Tip:", "wandb:", "LeafSpec", "RuntimeWarning", "anonymous", "weights_only", "GPU available",
                  "`Trainer.fit` stopped", "INFO:", "callback throughput:"):
        assert noise not in out, (noise, out[-3000:])
    assert "fused_layers swap report: 6 swapped" in out
    assert "[fused] 3 steps" in out and "tokens/s" in out and "val/loss" in out  # validated at the end (interval 100)
    assert "train/loss nan" not in out  # the end-of-fit validation clears callback_metrics; the summary keeps the loss
    m = json.loads((tmp_path / "summary.json").read_text())["metrics"]
    assert math.isfinite(m["train/loss"]) and math.isfinite(m["val/loss"])
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    for line in ("summary:", f"metrics:    {tmp_path / 'csv' / 'metrics.csv'}", f"checkpoint: {ckpt}",
                 f"resume: python train.py ckpt_path={ckpt}", "W&B offline run:", "wandb leet", "wandb sync",
                 "logger.wandb.offline=false"):
        assert line in out, (line, out[-3000:])
    log_file = (tmp_path / "train.log").read_text()
    assert "GPU available" in log_file and "callback throughput:" in log_file  # the log file keeps them
    wandb_cli = str(Path(sys.executable).parent / "wandb")
    leet = subprocess.run([wandb_cli, "leet", "--help"], capture_output=True, text=True, timeout=120)
    assert leet.returncode == 0 and "terminal UI" in leet.stdout  # the viewer the summary line names exists


@pytest.mark.slow
def test_resume_across_fused_and_unfused(tmp_path):
    """ckpt_path continues a run (step, optimizer state), fused or not, and the checkpoint loads both ways;
    runs shorter than the validation interval still validate at the end."""
    common = ["logger=csv", "trainer.enable_checkpointing=true", "trainer.val_check_interval=100"]
    no_measure = "callbacks.fused.measure=false"
    a = train_script.train(compose_cfg(tmp_path / "a", *common, "fused=true", "trainer.max_steps=2", no_measure))
    assert a["global_step"] == 2 and finite(a["metrics"]["val/loss"]) and a["tag"] == "fused"
    ck_a = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert a["checkpoint"] == str(ck_a) and ck_a.is_file()
    b = train_script.train(compose_cfg(tmp_path / "b", *common, "fused=false", "trainer.max_steps=4",
                                       f"ckpt_path={ck_a}"))
    assert b["global_step"] == 4 and b["resumed_from"] == str(ck_a) and b["tag"] == "unfused"
    state = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=False)
    adam = state["optimizer_states"][0]["state"]
    assert all(int(v["step"]) == 4 for v in adam.values())  # 2 steps restored + 2 more: optimizer state continued
    c = train_script.train(compose_cfg(tmp_path / "c", *common, "fused=true", "trainer.max_steps=5", no_measure,
                                       f"ckpt_path={tmp_path / 'b' / 'checkpoints' / 'last.ckpt'}"))
    assert c["global_step"] == 5 and c["fused_layers"]["swapped_total"] == 6
    with pytest.raises(ConfigError, match="model.d_model=32, the config has model.d_model=64"):
        train_script.train(compose_cfg(tmp_path / "d", *common, "model.d_model=64", f"ckpt_path={ck_a}"))


def test_comparison_medians_spreads_noise_and_best_unfused(tmp_path):
    """comparison.md: median [min-max] per variant, "within noise" where ranges overlap, the ratio against the
    fastest unfused variant (SDPA, compiled SDPA), the in-run step A/B; notes when a baseline is missing."""
    def job(i, overrides, fused, attn, compiled, tps, swapped=None, extra=None, wiggle=0.01):
        d = tmp_path / str(i)
        d.mkdir()
        hist = [[st, tps * (1 + wiggle * ((st // 10) % 3 - 1))] for st in range(9, 100, 10)]
        m = {"train/device/items_per_sec": tps, "train/loss": 2.0, "val/loss": 2.1, **(extra or {})}
        swapped = swapped or {}
        fl = {"swapped": swapped, "swapped_total": sum(swapped.values()), "ab_status": "A/B-measured"}
        fl = fl if fused else None
        (d / "summary.json").write_text(json.dumps({
            "fused": fused, "attn_impl": attn, "compile": compiled, "overrides": overrides, "metrics": m,
            "fused_layers": fl, "history": {"train/device/items_per_sec": hist}}))

    job(0, ["fused=false", "model.attn_impl=reference"], False, "reference", False, 100_000)
    job(1, ["fused=true", "model.attn_impl=reference"], True, "reference", False, 250_000,
        {"attention": 4, "layer_norm": 9},
        {"fused/step_speedup/all": 2.5, "fused/step_speedup_lo/all": 2.4, "fused/step_speedup_hi/all": 2.6})
    job(2, ["fused=false", "model.attn_impl=sdpa"], False, "sdpa", False, 240_000)
    job(3, ["fused=true", "model.attn_impl=sdpa"], True, "sdpa", False, 241_000, {"layer_norm": 9})
    res = compare(tmp_path, plot=False, echo=False)
    rows = {r["label"]: r for r in res["rows"]}
    assert res["best_unfused"] == "fused=false model.attn_impl=sdpa"
    assert rows["fused=true model.attn_impl=reference"]["vs_best_unfused"] == pytest.approx(250 / 240, rel=0.02)
    assert rows["fused=true model.attn_impl=sdpa"]["vs_best_unfused_noise"] is True  # 241k vs 240k: noise
    assert rows["fused=true model.attn_impl=reference"]["vs_base_noise"] is False
    md = (tmp_path / "comparison.md").read_text()
    assert "1.00x (within noise)" in md and "2.500x [2.400-2.600]" in md and "fused: attention 4, layer_norm 9" in md
    assert "no compiled unfused SDPA baseline" in md and "no unfused SDPA baseline" not in md


def test_comparison_and_wandb_report_the_kept_configurations_peak_and_steps(tmp_path):
    """The A/B's unfused arm sets a fused run's overall peak: comparison.md and the W&B summary show the kept
    configuration's steady-state peak (read after the A/B) as the run's, the A/B's beside it, and the kept
    steps' time against the A/B's verdict."""
    from lightning.pytorch.loggers import WandbLogger

    from lm_demo.summary import relabel_wandb

    fl = {"swapped": {"layer_norm": 9}, "swapped_total": 9, "ab_status": "A/B-measured (compiled, one graph per arm)",
          "peak_memory_gib": {"ab": 3.0, "kept": 2.0},
          "kept_steps": {"arm": "all", "median_ms": 42.4, "agrees": False, "speedup": 0.93}}
    for i, (fused, over) in enumerate([(False, "fused=false"), (True, "fused=true")]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "summary.json").write_text(json.dumps({
            "fused": fused, "overrides": [over], "fused_layers": fl if fused else None,
            "metrics": {"train/loss": 2.0, "peak_memory_gib": 3.0, "train/device/items_per_sec": 1000.0}}))
    rows = {r["label"]: r for r in compare(tmp_path, plot=False, echo=False)["rows"]}
    assert rows["fused=true"]["peak_memory_gib"] == 2.0 and rows["fused=true"]["ab_peak_memory_gib"] == 3.0
    assert rows["fused=false"]["peak_memory_gib"] == 3.0 and rows["fused=false"]["ab_peak_memory_gib"] is None
    assert rows["fused=true"]["kept_step_ms"] == 42.4 and rows["fused=true"]["kept_agrees"] is False
    md = (tmp_path / "comparison.md").read_text()
    assert "A/B peak GiB" in md and "| 2.00 | 3.00 |" in md and "42.400 (outside the A/B)" in md

    class Run:
        def __init__(self):
            self.summary, self.config, self.tags = {}, self, []

        def update(self, d, allow_val_change=False):
            self.summary.update(d)

    class FakeWandb(WandbLogger):
        def __init__(self):
            self.run = Run()

        @property
        def experiment(self):
            return self.run

    lg = FakeWandb()
    relabel_wandb([lg], {"tag": "fused", "fused_effective": True, "fused_layers": fl})
    assert lg.run.summary["fused/peak_memory_gib/kept"] == 2.0 and lg.run.summary["fused/peak_memory_gib/ab"] == 3.0
    assert lg.run.summary["fused/kept_step_ms"] == 42.4 and lg.run.summary["fused/kept_agrees_with_ab"] is False


def test_comparison_single_run_counts_a_stall(tmp_path):
    """One run: tokens/s is tokens / time over the second half's windows (their harmonic mean), so a window
    at half speed lowers it as much as it cost; a median of the windows would hide it."""
    d = tmp_path / "0"
    d.mkdir()
    windows = [400_000.0] * 4 + [200_000.0]  # steps 50..90; one window stalled
    hist = [[9, 100_000.0], [19, 390_000.0], [29, 395_000.0], [39, 398_000.0]]
    hist += [[49 + 10 * i, v] for i, v in enumerate(windows)]
    (d / "summary.json").write_text(json.dumps({"fused": False, "overrides": ["fused=false"],
                                                "metrics": {"train/loss": 2.0},
                                                "history": {"train/device/items_per_sec": hist}}))
    res = compare(tmp_path, plot=False, echo=False)
    (row,) = res["rows"]
    assert row["tokens_per_sec"] == pytest.approx(5 / (4 / 400_000 + 1 / 200_000))  # 333,333, not the median 400,000
    assert (row["tokens_lo"], row["tokens_hi"]) == (200_000.0, 400_000.0)
    assert row["tokens_spread_over"] == "5 windows"
    assert "a stall counts" in (tmp_path / "comparison.md").read_text()


def test_ckpt_path_last_is_the_newest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="ckpt_path: 'last': no checkpoints/last.ckpt"):
        resolve_ckpt_path("last")
    old, new = tmp_path / "outputs/d/t1/checkpoints/last.ckpt", tmp_path / "multirun/d/t2/0/checkpoints/last.ckpt"
    for i, p in enumerate((old, new)):
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
    assert Path(resolve_ckpt_path("last")).resolve() == new.resolve()


# ------------------------------------------------------------------------------------------------
# the demo's data and model
# ------------------------------------------------------------------------------------------------
def test_stdlib_data_is_deterministic_and_split(tmp_path):
    a, b = (ByteLMDataModule(seq_len=16, batch_size=4, max_bytes=200_000) for _ in range(2))
    a.setup(), b.setup()
    assert torch.equal(a.train_set.tokens, b.train_set.tokens) and torch.equal(a.val_set.tokens, b.val_set.tokens)
    assert len(a.train_set) > 4 * len(a.val_set) > 0
    x, y = next(iter(a.train_dataloader()))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < 256
    f = tmp_path / "text.txt"
    f.write_text("hello fused layers\n" * 50)
    c = ByteLMDataModule(seq_len=8, batch_size=2, path=str(f))
    c.setup()
    assert bytes(c.train_set.tokens[:5].tolist()) == b"hello"
    s = ByteLMDataModule(seq_len=8, batch_size=2, synthetic=True, synthetic_samples=16)
    s.setup()
    assert next(iter(s.train_dataloader()))[0].shape == (2, 8)
    with pytest.raises(FileNotFoundError, match="data.path"):
        ByteLMDataModule(path=str(tmp_path / "missing.txt")).setup()


def test_reference_attention_matches_sdpa_and_gpt2_size():
    ref = GPTLM(d_model=32, n_layer=2, n_head=4, seq_len=24, attn_impl="reference")
    sdpa = GPTLM(d_model=32, n_layer=2, n_head=4, seq_len=24, attn_impl="sdpa")
    sdpa.load_state_dict(ref.state_dict())  # same parameters, the core has none
    x = torch.randint(0, 256, (3, 17))
    torch.testing.assert_close(ref(x), sdpa(x), atol=1e-5, rtol=1e-5)
    assert ref.model.head.weight is ref.model.wte.weight  # tied
    with torch.device("meta"):
        big = GPTLM(vocab_size=50304, seq_len=1024, d_model=768, n_layer=12, n_head=12)
    assert 123e6 < sum(p.numel() for p in big.parameters()) < 126e6


# ------------------------------------------------------------------------------------------------
# the Llama family (HF LlamaForCausalLM) and the strategy group
# ------------------------------------------------------------------------------------------------
LLAMA = ["model=llama_tiny", "model.n_kv_head=1", "model.intermediate_size=64", "model.seq_len=16", "logger=none",
         "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1"]


def test_llama_1b_conf_size_and_synthetic_data(tmp_path):
    """conf/model/llama_1b.yaml is the ~1.2B its comment says (built on the meta device); synthetic data draws ids
    over the whole 128,256-token vocabulary at sequence 4,096."""
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["model=llama_1b", "data=synthetic", "data.synthetic_samples=8",
                                          f"output_dir={tmp_path}"])
    with torch.device("meta"):
        model = instantiate(cfg.model)
    assert sum(p.numel() for p in model.parameters()) == 1_246_824_448  # the number in the yaml's comment
    c = model.model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (16, 2048, 32, 8)
    assert (c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (5632, 128256, 4096)
    assert model.model.lm_head.weight is not model.model.model.embed_tokens.weight  # untied: the head shards alone
    data = instantiate(cfg.data)
    data.setup()
    x, y = data.train_set[0]
    assert x.shape == (4096,) and int(data.train_set.data.max()) > 128000  # the whole vocabulary, not bytes
    assert torch.equal(x[1:], y[:-1])


@pytest.mark.slow
def test_llama_tiny_trains_fused_as_unfused(tmp_path):
    """model=llama_tiny: HF LlamaForCausalLM trains unfused (with gradient checkpointing) and fused=true (norms,
    attention, the decoder layer's MLP, RoPE and residual + norm, and the LM head + loss swapped: the report names
    transformers' look-alikes) to the same losses."""
    base = train_script.train(compose_cfg(tmp_path / "u", *LLAMA, "model.gradient_checkpointing=true"))
    fused = train_script.train(compose_cfg(tmp_path / "f", *LLAMA, "fused=true", "callbacks.fused.ab_rounds=0",
                                           "callbacks.fused.measure=false"))
    assert base["global_step"] == fused["global_step"] == 2 and finite(base["metrics"]["val/loss"])
    assert base["metrics"]["train/device/items_per_sec"] > 0 and base["metrics"]["train/device/flops_per_sec"] > 0
    assert fused["fused_layers"]["swapped"] == {"layer_norm": 0, "rms_norm": 3, "softmax": 0,
                                                "multihead_attention": 0, "attention": 1, "cross_entropy": 1,
                                                "gated_mlp": 1, "rope": 1, "residual_norm": 1, "mlp": 0,
                                                "lora": 0}
    for key in ("train/loss", "val/loss"):
        assert fused["metrics"][key] == pytest.approx(base["metrics"][key], abs=2e-4), key


def test_llama_gqa_model_summary_counts_flops_under_torch_2_11(tmp_path, torch_2_11_sdpa_flops):
    """Lightning's model summary counts the FLOPs of the example input; torch 2.11's SDPA formula raised on the GQA
    Llama's K/V heads there, and the unfused bf16 Llama job crashed before its first step (H100). The job's model
    makes torch count them: the run trains, and its summary counts what the model with 4 K/V heads counts, less
    the K/V projections' outputs it does not have."""
    from lightning.pytorch.utilities.model_summary import summarize

    from lm_demo.model import LlamaLM

    out = train_script.train(compose_cfg(tmp_path, *LLAMA, "model.n_head=4", "model.n_kv_head=2",
                                         "trainer.enable_model_summary=true", "trainer.max_steps=1",
                                         "trainer.limit_val_batches=0"))
    assert out["global_step"] == 1 and finite(out["metrics"]["train/loss"])

    def summary_flops(n_kv_head: int) -> int:
        m = LlamaLM(vocab_size=256, seq_len=16, d_model=32, n_layer=2, n_head=4, n_kv_head=n_kv_head,
                    intermediate_size=64)
        return summarize(m).total_flops

    tokens = 2 * 16  # the example input
    fewer = 2 * 2 * 2 * tokens * 32 * (32 - 16)  # k_proj and v_proj of 2 layers, 2 FLOPs a multiply-add
    assert summary_flops(2) == summary_flops(4) - fewer


def test_llama_model_options_and_flops():
    from lm_demo.model import LlamaLM

    m = LlamaLM(vocab_size=256, seq_len=16, d_model=32, n_layer=2, n_head=4, n_kv_head=2, intermediate_size=64,
                rope_theta=1234.0, gradient_checkpointing=True)
    ckpt = getattr(m.model, "is_activation_checkpointing", None)
    assert (ckpt if ckpt is not None else m.model.is_gradient_checkpointing) and m.model.config.num_key_value_heads == 2
    rope = getattr(m.model.config, "rope_parameters", None) or {"rope_theta": m.model.config.rope_theta}
    assert rope["rope_theta"] == 1234.0
    x = torch.randint(0, 256, (2, 16))
    loss = m._loss((x[:, :-1], x[:, 1:]))  # every position a target: shift_labels, not the model's own shift
    logits = m(x[:, :-1]).float()
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    matrices = 2 * (32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 64) + 32 * 256
    assert m.flops_per_batch == 2 * 15 * (6 * matrices + 12 * 2 * 32 * 15)


def test_strategy_group_builds_lightning_strategies():
    """strategy=NAME -> the Lightning strategy; fsdp's auto-wrap policy makes units of the decoder layers and the
    LM head alone; fsdp2 is ModelParallelStrategy (every device data parallel) and configures the model's shards."""
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy
    from omegaconf import OmegaConf

    from lm_demo.config import StrategyConfig
    from lm_demo.model import LlamaLM
    from lm_demo.strategy import build_strategy

    m = LlamaLM(vocab_size=256, seq_len=16, d_model=32, n_layer=2, n_head=4, n_kv_head=2, intermediate_size=64)

    def conf(**kw):
        return OmegaConf.merge(OmegaConf.structured(StrategyConfig), kw)

    assert build_strategy(conf(name="auto"), m) is None  # trainer.strategy decides
    assert isinstance(build_strategy(conf(name="ddp"), m), DDPStrategy)
    fsdp = build_strategy(conf(name="fsdp"), m)
    assert isinstance(fsdp, FSDPStrategy) and fsdp.kwargs["use_orig_params"] is True
    policy = fsdp.kwargs["auto_wrap_policy"]
    units = {n for n, mod in m.named_modules() if policy(module=mod, recurse=False, nonwrapped_numel=0)}
    assert units == {"model.model.layers.0", "model.model.layers.1", "model.lm_head"}
    no_head = build_strategy(conf(name="fsdp", shard_head=False), m).kwargs["auto_wrap_policy"]
    assert not no_head(module=m.model.lm_head, recurse=False, nonwrapped_numel=0)
    fsdp2 = build_strategy(conf(name="fsdp2", reshard_after_forward=False), m)
    assert isinstance(fsdp2, ModelParallelStrategy) and fsdp2._tensor_parallel_size == 1
    assert m.__dict__["fsdp2_reshard_after_forward"] is False and m.__dict__["fsdp2_shard_head"] is True


@pytest.mark.slow
def test_fsdp2_shards_the_swapped_model(tmp_path):
    """strategy=fsdp2 on one CPU rank (gloo), in this process: the callback swaps in setup, configure_model then
    fully_shards the swapped layers, LM head and root; the fused run's losses equal the unfused sharded run's."""
    import torch.distributed as dist

    from lm_demo.model import LlamaLM

    seen = {}
    configure = LlamaLM.configure_model

    def spy(self):
        configure(self)
        seen["root"] = type(self.model).__mro__[:3]
        seen["head"] = type(self.model.lm_head).__name__
        seen["norm"] = type(self.model.model.norm).__name__

    LlamaLM.configure_model = spy
    env = dict(os.environ)  # Lightning sets MASTER_PORT, WORLD_SIZE, ... for its process group
    try:
        opts = [*LLAMA, "trainer.enable_checkpointing=false", "callbacks.fused.ab_rounds=0",
                "callbacks.fused.measure=false"]
        # both sharded: a distributed strategy draws the batches with its DistributedSampler
        base = train_script.train(compose_cfg(tmp_path / "u", *opts, "strategy=fsdp2"))
        sharded = train_script.train(compose_cfg(tmp_path / "f", *opts, "strategy=fsdp2", "fused=true"))
    finally:
        LlamaLM.configure_model = configure
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(env)
    names = [c.__name__ for c in seen["root"]]
    assert names == ["FSDPFusedLlamaForCausalLM", "FSDPModule", "FusedLlamaForCausalLM"], names  # swapped, then sharded
    assert seen["head"] == "FSDPLinear" and seen["norm"] == "FusedLlamaRMSNorm"
    assert sharded["fused_layers"]["swapped_total"] == 8  # 3 norms, attention, head, MLP, RoPE, residual + norm
    for key in ("train/loss", "val/loss"):
        assert sharded["metrics"][key] == pytest.approx(base["metrics"][key], abs=2e-4), key


def _two_cpu_ranks(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python train.py model=llama_tiny trainer.devices=2 ARGS`` on the CPU: Lightning starts the second rank."""
    cmd = [sys.executable, str(ROOT / "train.py"), *args, *LLAMA, "trainer.accelerator=cpu", "trainer.devices=2",
           "data.batch_size=2", "data.max_bytes=20000", "trainer.enable_progress_bar=false",
           "trainer.enable_model_summary=false", "trainer.enable_checkpointing=false", "callbacks.fused.ab_rounds=0",
           "callbacks.fused.measure=false"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))  # the second rank imports this checkout too
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_ddp_on_two_cpu_ranks(tmp_path):
    """strategy=ddp on 2 gloo ranks: both train 2 steps and validate together."""
    _two_cpu_ranks(tmp_path, "strategy=ddp", f"hydra.run.dir={tmp_path}")
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["global_step"] == 2 and finite(s["metrics"]["val/loss"]) and s["config"]["strategy"]["name"] == "ddp"


@pytest.mark.slow
def test_fsdp2_multirun_on_two_cpu_ranks(tmp_path):
    """`python train.py -m fused=false,true strategy=fsdp2 trainer.devices=2`: each job starts its own second rank
    (which runs that job alone), the model is sharded over both, the fused job's LM head runs fused on the gathered
    head, both jobs train to the same losses, and the sweep's comparison lists both."""
    r = _two_cpu_ranks(tmp_path, "-m", "fused=false,true", "strategy=fsdp2", "logger=csv",
                       f"hydra.sweep.dir={tmp_path}")
    unfused, fused = (json.loads((tmp_path / str(n) / "summary.json").read_text()) for n in (0, 1))
    assert unfused["global_step"] == fused["global_step"] == 2 and fused["config"]["strategy"]["name"] == "fsdp2"
    # 5 norms, 2 attention, the head, 2 MLPs, RoPE, 2 residual + norm
    assert unfused["fused_layers"] is None and fused["fused_layers"]["swapped_total"] == 13
    assert "are not fused" not in r.stderr + r.stdout
    for key in ("train/loss", "val/loss"):
        assert fused["metrics"][key] == pytest.approx(unfused["metrics"][key], abs=2e-4), key
    rows = json.loads((tmp_path / "comparison.json").read_text())["rows"]
    assert [row["label"] for row in rows] == ["fused=false", "fused=true"]


# ------------------------------------------------------------------------------------------------
# on GPUs
# ------------------------------------------------------------------------------------------------
#: a small Llama in bf16 on synthetic ids over a 32,000-token vocabulary: big enough for the GPU paths
LLAMA_GPU = ["model=llama_tiny", "model.d_model=256", "model.n_head=4", "model.n_kv_head=2",
             "model.intermediate_size=512", "model.vocab_size=32000", "model.seq_len=512", "model.warmup_steps=2",
             "data=synthetic", "data.batch_size=4", "data.synthetic_samples=64", "trainer=gpu", "trainer.max_steps=6",
             "trainer.val_check_interval=6", "trainer.limit_val_batches=2", "trainer.num_sanity_val_steps=0",
             "trainer.enable_progress_bar=false", "trainer.enable_checkpointing=false", "logger=none",
             "callbacks.fused.policy=always", "callbacks.fused.ab_rounds=0", "callbacks.fused.measure=false"]


@pytest.mark.gpu
@pytest.mark.slow
def test_llama_gpu_bf16_fused_trains_as_unfused(tmp_path):
    """One GPU, bf16-mixed: the fused Llama (norms, attention, LM head + loss) trains to the unfused losses."""
    def run_job(sub, *extra):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=[*LLAMA_GPU, f"output_dir={tmp_path / sub}", *extra])
        return train_script.train(cfg)

    base = run_job("u")
    fused = run_job("f", "fused=true")
    # 5 norms, 2 attention, the head, 2 MLPs, RoPE, 2 residual + norm (what the same job swaps on the CPU)
    assert fused["fused_layers"]["swapped_total"] == 13
    for key in ("train/loss", "val/loss"):
        assert fused["metrics"][key] == pytest.approx(base["metrics"][key], abs=3e-2), key
    assert fused["metrics"]["peak_memory_gib"] < base["metrics"]["peak_memory_gib"]  # no (tokens, vocab) logits


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2"])
def test_llama_two_gpus_fused(tmp_path, strategy):
    """`train.py trainer.devices=2 strategy=NAME fused=true` on 2 GPUs (NCCL): both ranks train and validate, and
    the LM head + loss runs fused under every strategy (no warning that it fell back)."""
    cmd = [sys.executable, str(ROOT / "train.py"), *LLAMA_GPU, "trainer.devices=2", f"strategy={strategy}",
           "fused=true", f"hydra.run.dir={tmp_path}"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["global_step"] == 6 and finite(s["metrics"]["val/loss"]) and s["fused_layers"]["swapped_total"] == 13
    assert "are not fused" not in r.stderr + r.stdout
