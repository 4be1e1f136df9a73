"""FusedLayersCallback and ThroughputCallback in real (tiny) Lightning fits on the CPU (Triton interpreter).

GPU: ``test_speedup_table_gpu`` prints the speedup table with real numbers (marked ``gpu``).
"""

from __future__ import annotations

import copy
import csv
import math
import os
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fused_layers.ledger as ledger_mod
import fused_layers.lightning as fused_cb
from callbacks import ThroughputCallback
from callbacks.throughput import count_flops, peak_flops, stall_message
from fused_layers.lightning import FusedLayersCallback
from fused_layers.modules.attention import Attention
from fused_layers.swap import available_kinds, target_class

V, E, H, T, B = 11, 16, 2, 5, 2  # vocab, width, heads, tokens, batch


class Net(nn.Module):
    """Token model with every swappable kind on the path of the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.ln = nn.LayerNorm(E)
        self.rms = nn.RMSNorm(E)
        self.mha = nn.MultiheadAttention(E, H, batch_first=True)
        self.att = Attention()
        self.sm = nn.Softmax(dim=-1)
        self.head = nn.Linear(E, V)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.rms(self.ln(self.emb(idx)))
        h = h + self.mha(h, h, h, need_weights=False)[0]
        b = h.shape[0]
        q = h.view(b, T, H, E // H).transpose(1, 2)
        h = h + self.att(q, q, q, is_causal=True).transpose(1, 2).reshape(b, T, E)
        return self.head(h * self.sm(h))


class LM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()
        self.losses: list[float] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.net(idx)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x).reshape(-1, V), y.reshape(-1))
        self.losses.append(loss.item())
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, V, (8 * B, T), generator=g)
        return DataLoader(TensorDataset(x, x.roll(-1, 1)), batch_size=B)


class LateLM(LM):
    """Builds its layers in configure_model (the layers do not exist at callback setup)."""

    def __init__(self) -> None:
        L.LightningModule.__init__(self)
        self.net = None
        self.losses = []

    def configure_model(self) -> None:
        if self.net is None:
            self.net = Net()


def _trainer(tmp_path, callbacks, steps=4, logger=None, **kw) -> L.Trainer:
    return L.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, callbacks=callbacks,
        logger=logger if logger is not None else False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, log_every_n_steps=1,
        default_root_dir=tmp_path, num_sanity_val_steps=0, **kw,
    )


def _cb(**kw) -> FusedLayersCallback:
    kw = {"warmup_steps": 2, "record_steps": 1, "max_measure_seconds": 60.0, **kw}
    return FusedLayersCallback(**kw)


def _available() -> set[str]:
    return {k for k, why in available_kinds().items() if why is None}


def _fused_names(model: nn.Module) -> dict[str, str]:
    return {n: type(m).__name__ for n, m in model.named_modules() if type(m).__name__.startswith("Fused")}


def _metrics(logger: CSVLogger) -> list[dict[str, str]]:
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _assert_optimizer_holds_module_params(trainer: L.Trainer, model: nn.Module) -> None:
    held = [p for g in trainer.optimizers[0].param_groups for p in g["params"]]
    live = list(model.parameters())
    assert len(held) == len(live) and all(a is b for a, b in zip(held, live))


# --------------------------------------------------------------------------------------------------
def test_fit_swaps_measures_and_logs_csv(tmp_path, caplog):
    torch.manual_seed(0)
    ref = LM()
    model = copy.deepcopy(ref)
    cb = _cb()
    logger = CSVLogger(tmp_path, name="csv")
    trainer = _trainer(tmp_path, [cb], logger=logger)
    with caplog.at_level("INFO"):
        trainer.fit(model)
    # the console: the swap report, one line of per-kind module speedups (the per-module table is DEBUG detail)
    console = [r.getMessage() for r in caplog.records if r.levelno >= 20]
    assert any(m.startswith("fused_layers swap report: ") for m in console), console
    (timed,) = [m for m in console if m.startswith("fused_layers: fused modules timed alone")]
    assert "softmax" in timed and "says nothing about GPU speed" in timed
    assert not any("gbps_or_tflops" in m or "per-module timings" in m for m in console)

    avail = _available()
    swapped = {e.name: e.kind for e in cb.report.swapped}
    expected = {"net.ln": "layer_norm", "net.rms": "rms_norm", "net.mha": "multihead_attention", "net.att": "attention",
                "net.sm": "softmax"}
    for name, kind in expected.items():
        assert (swapped.get(name) == kind) == (kind in avail), (name, kind, cb.report)
    for kind in set(KIND for KIND in expected.values()) - avail:
        assert kind in cb.report.unavailable  # reported as "target not available"
    assert {k: type(m).__name__ for k, m in model.named_modules() if k in swapped} == {
        n: target_class(k).__name__ for n, k in swapped.items()
    }
    _assert_optimizer_holds_module_params(trainer, model)

    # measured once per distinct (kind, shape, dtype), logged per kind
    kinds_measured = {r.kind for r in cb.measurements}
    assert kinds_measured == set(swapped.values())
    assert all(not r.meaningful for r in cb.measurements)  # CPU interpreter
    keys = set().union(*(row.keys() for row in _metrics(logger)))
    for kind in kinds_measured:
        assert {f"fused/speedup/{kind}", f"fused/speedup_fwd/{kind}", f"fused/max_err/{kind}"} <= keys
    rows = [r for r in _metrics(logger) if r.get("fused/speedup/softmax")]
    soft = [r for r in cb.measurements if r.kind == "softmax"]
    assert all(r.speedup == pytest.approx(r.ref_ms / r.fused_ms) for r in soft)  # reference time / fused time
    gmean = math.exp(sum(math.log(r.speedup) for r in soft) / len(soft))
    assert len(rows) == 1 and float(rows[0]["fused/speedup/softmax"]) == pytest.approx(gmean)  # the logged summary
    assert all(r.max_err < 1e-4 for r in cb.measurements)
    hp = (Path(logger.log_dir) / "hparams.yaml").read_text()
    assert "fused/swapped/softmax" in hp

    # same losses as the unfused model (the measurement between steps changes nothing)
    trainer2 = _trainer(tmp_path, [])
    trainer2.fit(ref)
    assert len(model.losses) == len(ref.losses) == 4
    torch.testing.assert_close(torch.tensor(model.losses), torch.tensor(ref.losses), atol=1e-4, rtol=1e-4)


def test_configure_model_layers_are_swapped_before_optimizers(tmp_path):
    model = LateLM()
    cb = _cb(measure=False)
    trainer = _trainer(tmp_path, [cb], steps=2)
    trainer.fit(model)
    assert "net.sm" in cb.report.names() and type(model.net.sm).__name__ == "FusedSoftmax"
    assert "configure_model" not in model.__dict__  # the wrapper removed itself
    _assert_optimizer_holds_module_params(trainer, model)
    assert len(model.losses) == 2


def test_policy_faster_undoes_a_slower_swap(tmp_path, monkeypatch):
    real = ledger_mod.measure_pair

    def slower_softmax(*args, **kwargs):
        m = real(*args, **kwargs)
        m.meaningful = True  # as GPU timings are
        if m.kind == "softmax":  # simulate a kernel 2x slower than the reference
            m.fused_ms, m.speedup = m.ref_ms * 2, 0.5
        else:
            m.fused_ms, m.speedup = m.ref_ms / 2, 2.0
        return m

    monkeypatch.setattr(ledger_mod, "measure_pair", slower_softmax)
    model = LM()
    cb = _cb(policy="faster", kinds={"softmax": True, "layer_norm": True}, ab_rounds=0)  # no A/B: per-module fallback
    logger = CSVLogger(tmp_path, name="faster")
    trainer = _trainer(tmp_path, [cb], logger=logger)
    trainer.fit(model)
    assert type(model.net.sm) is nn.Softmax  # undone
    assert any(s.name == "net.sm" and "restored by policy=faster" in s.reason for s in cb.report.skipped)
    assert "net.sm" not in cb.report.names() and set(cb.restored) >= {"net.sm"}
    if "layer_norm" in _available():
        assert type(model.net.ln).__name__ == "FusedLayerNorm"  # faster: kept
    keys = set().union(*(row.keys() for row in _metrics(logger)))
    assert "fused/restored/softmax" in keys
    _assert_optimizer_holds_module_params(trainer, model)
    assert len(model.losses) == 4


def test_policy_faster_ignores_interpreter_timings(tmp_path):
    """Interpreter timings (meaningful=False) never undo a swap, however slow they look: neither the
    per-module ones nor the step-time A/B's."""
    model = LM()
    cb = _cb(policy="faster", kinds={"softmax": True}, warmup_steps=1, ab_rounds=1, ab_warmup_rounds=0)
    trainer = _trainer(tmp_path, [cb])
    trainer.fit(model)
    assert cb.measurements and not any(r.meaningful for r in cb.measurements)
    assert cb.ab is not None and cb.ab.results and not cb.ab.meaningful and "A/B-measured" in cb.ab_status
    assert type(model.net.sm).__name__ == "FusedSoftmax" and not cb.restored and cb.kept_arm is None


class FakeStepTimer:
    """Step 'times' from the classes the model has at the step's start: fused LayerNorm saves 2 ms, fused
    softmax costs 5 ms, on a 10 ms step. Exercises the A/B's mechanism, not any speed."""

    meaningful = True

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self.seen: list[frozenset] = []

    def start(self):
        from fused_layers.swap import fused_kind

        kinds = frozenset(k for m in self.model.modules() if (k := fused_kind(m)) is not None)
        self.seen.append(kinds)
        return 10.0 + (5.0 if "softmax" in kinds else 0.0) - (2.0 if "layer_norm" in kinds else 0.0)

    def stop(self, token):
        return token

    def elapsed_ms(self, stopped):
        return stopped


def test_step_ab_interleaves_arms_logs_and_keeps_the_fastest(tmp_path):
    """The step-time A/B: real training steps, interleaved arms (unfused / all / each kind), paired
    per-round ratios, fused/step_speedup/<kind> and /all logged, policy=faster keeps the fastest arm."""
    torch.manual_seed(0)
    ref = LM()
    model = copy.deepcopy(ref)
    timer = FakeStepTimer()
    timer.model = model
    cb = _cb(policy="faster", kinds={"softmax": True, "layer_norm": True}, warmup_steps=1, measure=False,
             ab_rounds=2, ab_warmup_rounds=1, ab_max_steps=40, step_timer=timer)
    logger = CSVLogger(tmp_path, name="ab")
    steps = 1 + 3 * 4 + 1  # warm-up, (1 + 2 rounds) x 4 arms, one more after the A/B
    trainer = _trainer(tmp_path, [cb], steps=steps, logger=logger)
    trainer.fit(model)
    ab = cb.ab
    assert list(ab.arms) == ["unfused", "all", "layer_norm", "softmax"] and ab.steps == 12
    assert cb.ab_steps == list(range(2, 14))  # global steps of the A/B (a throughput monitor's stall check skips them)
    # every round runs each arm once, in an order rotated from round to round
    rounds = [[a for r, a in ab.schedule if r == i] for i in (-1, 0, 1)]
    assert all(sorted(r) == sorted(ab.arms) for r in rounds) and len({tuple(r) for r in rounds}) == 3
    assert timer.seen[:12] == [frozenset(ab.arms[a]) for _, a in ab.schedule]  # each step ran its arm's classes
    # the step after the A/B: the kept configuration's own, timed against the A/B's verdict for it
    assert timer.seen[12:] == [frozenset({"layer_norm"})]
    assert cb.kept.arm == "layer_norm" and cb.kept.step_ms == [8.0] and cb.kept.agrees and not cb.kept.loses
    res = ab.results
    assert res["unfused"].step_ms == [10.0, 10.0] and res["layer_norm"].step_ms == [8.0, 8.0]
    assert res["layer_norm"].speedup == pytest.approx(1.25) and res["softmax"].speedup == pytest.approx(10 / 15)
    assert res["all"].speedup == pytest.approx(10 / 13) and not res["layer_norm"].within_noise
    # policy=faster: arm "layer_norm" wins; the softmax is back to nn.Softmax, the LayerNorm stays fused
    assert cb.kept_arm == "layer_norm" and "A/B-measured (eager)" in cb.ab_status
    assert type(model.net.sm) is nn.Softmax and type(model.net.ln).__name__ == "FusedLayerNorm"
    assert cb.swapped_counts() == {"layer_norm": 1, "softmax": 0}
    assert any(s.name == "net.sm" and "step-time A/B kept arm 'layer_norm'" in s.reason for s in cb.report.skipped)
    _assert_optimizer_holds_module_params(trainer, model)
    rows = _metrics(logger)
    logged = {k: float(v) for r in rows for k, v in r.items() if v not in ("", None)}
    assert logged["fused/step_speedup/layer_norm"] == pytest.approx(1.25)
    assert logged["fused/step_speedup/softmax"] == pytest.approx(10 / 15)
    assert logged["fused/step_speedup/all"] == pytest.approx(10 / 13)
    assert logged["fused/kept/softmax"] == 0 and logged["fused/kept/layer_norm"] == 1
    assert logged["fused/ab_meaningful"] == 1
    summary = cb.summary()
    assert summary["swapped_total"] == 1 and summary["kept_arm"] == "layer_norm"
    assert summary["step_ab"]["all"]["step_ms"] == [13.0, 13.0]
    # the A/B's steps are training steps of the same function: same losses as the unfused model
    _trainer(tmp_path, [], steps=steps).fit(ref)
    torch.testing.assert_close(torch.tensor(model.losses), torch.tensor(ref.losses), atol=1e-4, rtol=1e-4)


def test_step_ab_bounded_ended_early_and_compiled(tmp_path, monkeypatch):
    """The A/B's cost is bounded by ab_max_steps; a run that ends during it says so; under torch.compile
    with ab_compiled=skip the run is logged as not A/B-measured and nothing is undone."""
    timer = FakeStepTimer()
    model = LM()
    timer.model = model
    cb = _cb(policy="faster", kinds={"softmax": True, "layer_norm": True}, warmup_steps=1, measure=False,
             ab_rounds=5, ab_warmup_rounds=1, ab_max_steps=12, step_timer=timer)
    _trainer(tmp_path, [cb], steps=4).fit(model)
    assert cb.ab.rounds == 2 and cb.ab.steps == 12  # 5 rounds did not fit in 12 steps
    assert "not A/B-measured: training ended during the A/B's warm-up" in cb.ab_status
    assert cb.swapped_counts() == {"layer_norm": 1, "softmax": 2} and cb.kept_arm is None  # all swaps back in place
    assert type(model.net.sm).__name__ == "FusedSoftmax"

    graphs = iter([0] + [1] * 100)
    monkeypatch.setattr(fused_cb, "compiled_graphs", lambda: next(graphs))
    model = LM()
    timer.model = model
    cb = _cb(policy="faster", kinds={"softmax": True}, warmup_steps=1, measure=False, ab_compiled="skip",
             step_timer=timer)
    _trainer(tmp_path, [cb], steps=3).fit(model)
    assert cb.ab is None and cb.ab_status.startswith("not A/B-measured: the model runs under torch.compile")
    assert type(model.net.sm).__name__ == "FusedSoftmax"


class FakeCompiledTimer(FakeStepTimer):
    """FakeStepTimer under a fake torch.compile: the first step of each set of classes compiles a graph (its
    'time' holds a 1000 ms compile), ``recompile_at`` (steps counted from the A/B's first) compiles once more,
    and after the A/B the kept fused arm's own steps cost ``kept_ms``."""

    def __init__(self, recompile_at: int, kept_ms: float | None = None) -> None:
        super().__init__()
        self.graphs = 0
        self.compiled: set[frozenset] = set()
        self.recompile_at, self.kept_ms, self.ab_steps = recompile_at, kept_ms, None

    def start(self):
        ms = super().start()
        kinds = self.seen[-1]
        n = len(self.seen) - 1
        if kinds not in self.compiled or n == self.recompile_at:
            self.compiled.add(kinds)
            self.graphs += 1
            ms += 1000.0
        elif self.kept_ms is not None and self.ab_steps is not None and n >= self.ab_steps and kinds:
            ms = self.kept_ms
        return ms


def _compiled_run(tmp_path, monkeypatch, kept_ms=None, peaks=None):
    timer = FakeCompiledTimer(recompile_at=4 + 4 + 1, kept_ms=kept_ms)  # in measured round 1
    model = LM()
    timer.model = model
    setup = [True]

    def graphs():  # 0 at setup, then the run's compiled graphs (the model compiled before the A/B)
        if setup[0]:
            setup[0] = False
            return 0
        return 1 + timer.graphs

    monkeypatch.setattr(fused_cb, "compiled_graphs", graphs)
    monkeypatch.setattr(ledger_mod, "compiled_graphs", lambda: 1 + timer.graphs)
    mem = {"peak": 3.0, "resets": 0}  # the A/B's unfused arm sets a 3 GiB peak; the fused steps after it 2 GiB
    monkeypatch.setattr(fused_cb, "peak_memory_gib", lambda device: mem["peak"])

    def reset(device):
        mem["peak"], mem["resets"] = 2.0, mem["resets"] + 1

    monkeypatch.setattr(fused_cb, "reset_peak_memory", reset)
    cb = _cb(policy="faster", kinds={"softmax": True, "layer_norm": True}, warmup_steps=1, measure=False,
             ab_rounds=3, ab_warmup_rounds=0, ab_max_steps=40, ab_check_steps=3, step_timer=timer)
    timer.ab_steps = 16  # (1 forced warm-up + 3 rounds) x 4 arms
    logger = CSVLogger(tmp_path, name="compiled")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _trainer(tmp_path, [cb], steps=1 + 16 + 3, logger=logger).fit(model)
    return cb, model, mem, w, logger


def test_step_ab_under_compile_excludes_compiles_and_checks_the_kept_steps(tmp_path, monkeypatch):
    """Under torch.compile: a warm-up round even when 0 is asked (each arm compiles on its first step), a
    measured round that holds a compile left out, compile time per arm and the A/B's steps reported; the kept
    arm's own steps after the A/B timed against its A/B spread; peak memory of the A/B and of the kept steps
    (reset in between) reported apart."""
    cb, model, mem, w, logger = _compiled_run(tmp_path, monkeypatch)
    ab = cb.ab
    assert ab.warmup_rounds == 1 and ab.rounds == 3 and ab.steps_run == 16
    assert ab.compile_rounds == [1]  # the recompile in round 1: that round is not a steady-state comparison
    res = ab.results
    assert res["unfused"].step_ms == [10.0, 10.0] and res["layer_norm"].step_ms == [8.0, 8.0]  # no 1000 ms compile
    assert set(ab.compile_seconds) == {"unfused", "all", "layer_norm", "softmax"}  # one compile per arm
    assert cb.kept_arm == "layer_norm" and "A/B-measured (compiled" in cb.ab_status
    kept = cb.kept
    assert kept.arm == "layer_norm" and kept.step_ms == [8.0, 8.0, 8.0] and kept.agrees and not kept.loses
    assert kept.speedup == pytest.approx(1.25)
    summary = cb.summary()
    assert summary["ab_cost"]["steps"] == 16 and summary["ab_cost"]["rounds_left_out_for_compiling"] == [1]
    assert summary["kept_steps"]["median_ms"] == 8.0 and summary["kept_steps"]["agrees"] is True
    assert summary["peak_memory_gib"] == {"ab": 3.0, "kept": 2.0} and mem["resets"] == 1
    assert not [x for x in w if "outside the A/B's spread" in str(x.message)]
    logged = {k: float(v) for r in _metrics(logger) for k, v in r.items() if v not in ("", None)}
    assert logged["fused/kept_step_ms"] == 8.0 and logged["fused/kept_agrees_with_ab"] == 1
    assert logged["fused/ab_steps"] == 16 and logged["fused/peak_memory_gib/kept"] == 2.0
    assert type(model.net.ln).__name__ == "FusedLayerNorm"


def test_policy_faster_undoes_a_kept_arm_its_own_compiled_steps_show_slower(tmp_path, monkeypatch):
    """The A/B says the fused LayerNorm wins (8 ms against 10); the run's own steps after it take 12 ms,
    slower than every unfused step of the A/B: flagged, and policy=faster undoes it."""
    cb, model, _, w, _ = _compiled_run(tmp_path, monkeypatch, kept_ms=12.0)
    kept = cb.kept
    assert kept.median_ms == 12.0 and not kept.agrees and kept.loses
    assert any("outside the A/B's spread" in str(x.message) for x in w)
    assert cb.kept_arm == "unfused" and type(model.net.ln) is nn.LayerNorm
    assert cb.swapped_counts() == {"layer_norm": 0, "softmax": 0}
    assert any(s.name == "net.ln" and "run's own steps ran 12.000 ms" in s.reason for s in cb.report.skipped)


class CompiledLM(LM):
    """LM whose net runs under a real torch.compile (the eager backend: Dynamo's graphs, guards and caches,
    without Inductor's code generation), compiled at the first step like the demo's ``model.compile=true``."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if "_compiled" not in self.__dict__:
            self.__dict__["_compiled"] = torch.compile(self.net, backend="eager")
        return self.__dict__["_compiled"](idx)


@pytest.mark.slow
@pytest.mark.parametrize("measure", [False, True], ids=["no-ledger", "ledger"])
def test_step_ab_under_real_compile_reports_every_arms_compile(tmp_path, measure):
    """Real torch.compile: the steps before the A/B compile the 'all' graph (every swap in place), which the A/B's
    'all' arm reuses from Dynamo's cache, so that arm compiles nothing in the A/B; its compile seconds are those
    earlier steps' and every arm's are reported. With the ledger's recording hooks (dropped with the code caches
    after the first step) and no step between them and the A/B, the 'all' arm compiles in the A/B itself."""
    torch._dynamo.reset()
    model = CompiledLM()
    cb = _cb(policy="always", kinds={"softmax": True, "layer_norm": True}, measure=measure, record_steps=1,
             warmup_steps=1 if measure else 2, max_measure_seconds=5.0, ab_rounds=1, ab_warmup_rounds=1,
             ab_max_steps=40, ab_check_steps=1)
    steps = cb.measure_at + 2 * 4 + 1  # (1 warm-up + 1 measured round) x 4 arms, one kept step
    _trainer(tmp_path, [cb], steps=steps).fit(model)
    ab = cb.ab
    assert ab.compiled and ab.steps_run == 8 and "A/B-measured (compiled" in cb.ab_status
    assert set(ab.compile_seconds) == set(ab.arms) and all(t > 0 for t in ab.compile_seconds.values())
    assert ab.compiled_before_ab == ([] if measure else ["all"])
    assert cb.summary()["ab_cost"]["compiled_before_ab"] == ab.compiled_before_ab
    in_ab = {arm for _, arm, _, compiled in ab._stopped if compiled}  # arms whose A/B steps compiled a graph
    assert in_ab == set(ab.arms) - set(ab.compiled_before_ab)
    with pytest.raises(ValueError, match="compiled_before names arms"):
        ledger_mod.StepAB(model, {"net.ln": "layer_norm"}, compiled_before={"softmax": 1.0})


class _FallbackLM(L.LightningModule):
    """A LayerNorm for the callback to swap, then attention whose value head dim differs from the query's: SDPA runs
    it (a fallback, warned once) at every step."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.v = nn.Linear(16, 24)

    def training_step(self, batch, batch_idx):
        from fused_layers import fused_attention

        x = self.ln(batch[0])[:, None]  # (B, 1, S, 16)
        return fused_attention(x, x, self.v(x)).float().square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 5, 16)), batch_size=4)


def test_summary_and_logs_name_what_fell_back_during_the_run(tmp_path, caplog):
    """What ran something else than the kernels during the run is in the summary (message -> calls since setup, not
    before) and in the log at the end of training, beside the swap report."""
    import logging

    from fused_layers.ops._common import warn_once

    cb = _cb(measure=False, ab_rounds=0)
    with warnings.catch_warnings(), caplog.at_level(logging.INFO):
        warnings.simplefilter("ignore")
        warn_once("test:before-the-run", "fused_layers test: given before the run")
        _trainer(tmp_path, [cb], steps=3).fit(_FallbackLM())
    found = cb.summary()["fallbacks"]
    assert [n for m, n in found.items() if "value head dim" in m] == [3], found
    assert not any("before the run" in m for m in found), found
    assert cb.report.counts().get("layer_norm") == 1
    assert "fused_layers fell back during the run" in caplog.text and "value head dim" in caplog.text


def test_no_kernels_warns_and_swaps_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(fused_cb, "kernels_runnable", lambda device: False)
    model = LM()
    cb = _cb()
    logger = CSVLogger(tmp_path, name="none")
    with pytest.warns(UserWarning, match="cannot run.*swapping nothing") as w:
        _trainer(tmp_path, [cb], steps=2, logger=logger).fit(model)
    assert not _fused_names(model) and not cb.report.swapped and len(model.losses) == 2
    # the hint says what the interpreter is for and what it costs
    assert any("tests and debugging only" in str(x.message) and "90 s per training step" in str(x.message) for x in w)
    # what happened is recorded: 0 swapped per kind, in the hyper-parameters and the summary
    assert cb.summary()["swapped_total"] == 0 and set(cb.swapped_counts().values()) == {0}
    assert "fused/swapped/layer_norm: 0" in (Path(logger.log_dir) / "hparams.yaml").read_text()


def test_bad_arguments():
    with pytest.raises(ValueError, match="policy"):
        FusedLayersCallback(policy="sometimes")
    with pytest.raises(ValueError, match="ab_compiled"):
        FusedLayersCallback(ab_compiled="maybe")
    with pytest.raises(ValueError, match="ab_rounds"):
        FusedLayersCallback(ab_rounds=-1)
    with pytest.raises(ValueError, match="unknown kind"):
        FusedLayersCallback(kinds={"layernorm": True})
    with pytest.raises(ValueError, match="'compiled_routes' is invalid: compiled routes: no op 'mlps'"):
        FusedLayersCallback(compiled_routes={"mlps": "kernels"})
    with pytest.raises(ValueError, match="flops_from"):
        ThroughputCallback(flops_from="guess")


def test_compiled_routes_hold_for_the_run_and_are_reported(tmp_path):
    """``compiled_routes`` is the route table while the run trains (read when the model compiles), the library's
    defaults come back at teardown, and the run's summary names the routes it used."""
    from fused_layers.ops import compile_config

    default, seen = compile_config.COMPILED, []

    class Probe(L.Callback):
        def on_train_batch_start(self, *args):
            seen.append(compile_config.COMPILED)

    cb = _cb(measure=False, ab_rounds=0, compiled_routes={"mlp": "kernels", "layer_norm": "kernels"})
    _trainer(tmp_path, [cb, Probe()]).fit(LM())
    assert seen and all((t.mlp, t.layer_norm, t.softmax) == ("kernels", "kernels", default.softmax) for t in seen)
    assert compile_config.COMPILED is default
    assert cb.summary()["compiled_routes"] == {"mlp": "kernels", "layer_norm": "kernels"}


@pytest.mark.parametrize("direction", ["fused->unfused", "unfused->fused"])
def test_checkpoint_resumes_across_fused_and_unfused(tmp_path, direction):
    first_fused = direction.startswith("fused")
    model = LM()
    t1 = _trainer(tmp_path, [_cb(measure=False)] if first_fused else [], steps=2)
    t1.fit(model)
    assert bool(_fused_names(model)) == first_fused
    ckpt = tmp_path / "a.ckpt"
    t1.save_checkpoint(ckpt)

    resumed = LM()
    t2 = _trainer(tmp_path, [] if first_fused else [_cb(measure=False)], steps=3)
    t2.fit(resumed, ckpt_path=ckpt)  # strict load of the model, optimizer state restored
    assert bool(_fused_names(resumed)) != first_fused
    assert t2.global_step == 3 and len(resumed.losses) == 1
    state = torch.load(ckpt, weights_only=False)["state_dict"]
    assert state.keys() == resumed.state_dict().keys()


def test_wandb_offline_logs_scalars_and_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged: dict[str, list] = {"metrics": [], "table": [], "text": []}
    logger = WandbLogger(save_dir=str(tmp_path), project="fused-layers-test", offline=True)
    for name, key in (("log_metrics", "metrics"), ("log_table", "table"), ("log_text", "text")):
        orig = getattr(logger, name)

        def spy(*a, _orig=orig, _key=key, **k):
            logged[_key].append((a, k))
            return _orig(*a, **k)

        monkeypatch.setattr(logger, name, spy)
    model = LM()
    cb = _cb(kinds={"softmax": True}, max_measure_seconds=30.0)
    trainer = _trainer(tmp_path, [cb], steps=3, logger=logger)
    trainer.fit(model)
    summary = dict(logger.experiment.summary)
    soft = [r.speedup for r in cb.measurements if r.kind == "softmax"]
    gmean = math.exp(sum(math.log(s) for s in soft) / len(soft))
    assert soft and summary["fused/speedup/softmax"] == pytest.approx(gmean)  # the measurements' geometric mean
    (table,) = [k for _, k in logged["table"] if k.get("key") == "fused/speedups"]
    assert table["key"] == "fused/speedups" and table["columns"][0] == "kind" and table["data"][0][0] == "softmax"
    assert any(k.get("key") == "fused/swap_report" for _, k in logged["text"])
    assert logger.experiment.config["fused/swapped/softmax"] == 2
    logger.experiment.finish()


def test_throughput_callback_counts_unfused_flops(tmp_path):
    model = LM()
    x = torch.randint(0, V, (B, T))
    flops_unfused = count_flops(model, x)
    tp = ThroughputCallback(window_size=2)
    logger = CSVLogger(tmp_path, name="tp")
    _trainer(tmp_path, [_cb(measure=False, ab_rounds=0), tp], steps=4, logger=logger).fit(model)
    assert _fused_names(model)  # counted while fused...
    assert tp.flops_per_batch == model.flops_per_batch == flops_unfused > 0  # ...equal to the unfused count
    assert count_flops(model, x) == flops_unfused and _fused_names(model)  # classes are put back
    keys = set().union(*(row.keys() for row in _metrics(logger)))
    assert {"train/device/samples_per_sec", "train/device/items_per_sec", "train/device/flops_per_sec"} <= keys
    assert peak_flops("NVIDIA H200", torch.bfloat16) == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "tfloat32") == 494.7e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", torch.bfloat16) is None
    # the stall report: per-step times of this run, logged as stall/* at the end of training
    report = tp.stall_report()
    assert report["median_step_ms"] > 0 and report["max_step_ms"] >= report["median_step_ms"]
    assert len(report["slowest_steps"]) == min(3, len(tp._step_ms)) and report["gc_ms"] >= 0
    assert {"stall/median_step_ms", "stall/max_step_ms", "stall/gc_ms"} <= keys
    assert tp._gc_callback not in __import__("gc").callbacks  # unregistered at the end of training


def test_gqa_sdpa_flops_counted_where_torch_rejects_them(torch_2_11_sdpa_flops):
    """torch 2.11's SDPA FLOP formula raises on GQA (fewer K/V heads, enable_gqa) inside any FlopCounterMode;
    gqa_flop_formulas wraps it to count the K/V heads broadcast to the query's: the count of the same call with K/V
    repeated, forward and backward, and idempotent."""
    from torch.utils.flop_counter import FlopCounterMode

    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(2))

    def flops(k, v, **kw):
        with FlopCounterMode(display=False) as counter:
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw).sum().backward()
        return counter.get_total_flops()

    with pytest.raises(AssertionError, match="shapes are incompatible"):
        flops(k, v, enable_gqa=True)
    repeated = flops(k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    assert repeated == 7 * 2 * (2 * 4) * 16 * 16 * 8  # 2 matmuls forward, 5 backward; causal counted dense
    assert ledger_mod.gqa_flop_formulas() and ledger_mod.gqa_flop_formulas()
    assert flops(k, v, enable_gqa=True) == repeated
    mqa = flops(k[:, :1], v[:, :1], enable_gqa=True)  # one K/V head
    assert mqa == repeated


def test_stall_report_finds_a_slow_step_and_gc_pauses():
    """The report's arithmetic on a synthetic run: one 10x step stands out with its index; garbage-collector
    pauses are summed from gc.callbacks' start / stop pairs."""
    tp = ThroughputCallback()
    tp._step_ms = [(i, 10.0) for i in range(1, 20)] + [(20, 100.0)]
    tp._compiled_after = [1, 20]
    tp._gc_callback("start", {"generation": 2})
    tp._gc_callback("stop", {"generation": 2})
    r = tp.stall_report()
    assert r["median_step_ms"] == 10.0 and r["max_step_ms"] == 100.0
    assert r["slowest_steps"][0] == 20 and r["excess_ms"] == 90.0 and r["stalled_steps"] == 1
    assert r["gc_full_collections"] == 1 and r["gc_ms"] >= 0 and r["compiled_after_steps"] == [1, 20]
    # the console: one plain sentence, only when the stall is a noticeable share of the training time
    msg = stall_message(r)  # 90 ms of 290 ms
    assert msg.startswith("Training stalled: 1 of 20 steps took more than twice the usual 10 ms") and "31%" in msg
    assert "step 20" in msg and "compiled new code after step 1, 20" in msg and "\n" not in msg
    assert "excess" not in msg and "_ms" not in msg
    tp._step_ms = [(i, 10.0) for i in range(1, 40)] + [(40, 30.0)]  # 20 ms of 410 ms: 5%, logged only
    assert tp.stall_report()["excess_ms"] == 20.0 and stall_message(tp.stall_report()) is None
    # the steps of a step-time A/B are left out (its arms differ in speed on purpose)
    tp._step_ms = [(i, 10.0) for i in range(1, 20)] + [(20, 100.0)]
    r = tp.stall_report(skip={20})
    assert r["steps"] == 19 and r["stalled_steps"] == 0 and r["compiled_after_steps"] == [1]


# --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_speedup_table_gpu(tmp_path):
    """Real numbers on a GPU: the ledger's table for LM-like shapes in bf16 (prints it; writes it to
    $FUSED_RESULTS_DIR/speedups.md when set)."""
    from fused_layers.ledger import Ledger
    from fused_layers.swap import swap_modules

    d, heads, seq, batch = 768, 12, 1024, 8
    net = nn.ModuleDict({
        "ln": nn.LayerNorm(d), "rms": nn.RMSNorm(d), "sm": nn.Softmax(-1), "att": Attention(),
        "mha": nn.MultiheadAttention(d, heads, batch_first=True),
    }).cuda().to(torch.bfloat16)
    report = swap_modules(net)
    ledger = Ledger(net)
    ledger.start_recording()
    x = torch.randn(batch, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q = torch.randn(batch, heads, seq, d // heads, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for name in report.names():
        m = net[name] if name in net else None
        if name == "ln" or name == "rms":
            m(x)
        elif name == "sm":
            m(torch.randn(batch * heads, seq, seq, device="cuda", dtype=torch.bfloat16, requires_grad=True))
            m(torch.randn(4096, 50257, device="cuda", dtype=torch.bfloat16, requires_grad=True))
        elif name == "att":
            m(q, q, q, is_causal=True)
        elif name == "mha":
            m(x, x, x, need_weights=False)
    ledger.stop_recording()
    rows = ledger.measure(max_seconds=20.0)
    table = Ledger.format(rows)
    print(report)
    print(table)
    if os.environ.get("FUSED_RESULTS_DIR"):
        Path(os.environ["FUSED_RESULTS_DIR"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["FUSED_RESULTS_DIR"]) / "speedups.md").write_text(
            f"{torch.cuda.get_device_name()}\n\n```\n{report}\n\n{table}\n```\n"
        )
    assert rows and all(r.meaningful for r in rows)
    for r in rows:
        assert r.achieved > 0 and r.ref_ms > 0 and r.fused_ms > 0
        assert r.speedup == pytest.approx(r.ref_ms / r.fused_ms)
        assert r.max_err < (0.1 if r.kind in ("attention", "multihead_attention") else 0.05), r
    warnings.warn(f"speedups: { {r.kind + ' ' + r.shape: round(r.speedup, 3) for r in rows} }")


def test_faster_arm_keeps_only_an_arm_faster_in_every_round():
    """policy=faster's rule: the fastest arm whose paired speedup beat 1 in every round; an arm whose
    range touches 1 (within noise), an arm slower everywhere and an unmeasured arm are never kept."""
    A = ledger_mod.ArmResult

    def arm(name, lo, med, hi, measured=True):
        return A(name, [name], [10.0, 11.0] if measured else [], speedup=med, speedup_lo=lo, speedup_hi=hi)

    unfused = A("unfused", [], [10.0, 11.0], speedup=1.0, speedup_lo=1.0, speedup_hi=1.0)
    f = ledger_mod.faster_arm
    assert f({"unfused": unfused, "all": arm("all", 0.646, 1.002, 1.011)}) == "unfused"  # the 0.989x run
    assert f({"unfused": unfused, "all": arm("all", 0.90, 0.95, 0.99)}) == "unfused"
    assert f({"unfused": unfused, "all": arm("all", 1.01, 1.13, 1.26),
              "layer_norm": arm("layer_norm", 1.02, 1.05, 1.08),
              "cross_entropy": arm("cross_entropy", 1.11, 1.19, 1.21)}) == "cross_entropy"
    assert f({"unfused": unfused, "all": arm("all", 1.2, 1.3, 1.4, measured=False),
              "layer_norm": arm("layer_norm", 1.02, 1.05, 1.08)}) == "layer_norm"
    assert f({"unfused": unfused}) == "unfused"


def test_recording_hooks_leave_no_graph_break_under_torch_compile():
    """The ledger's recording hooks break a compiled graph at every hooked module, and Dynamo does not
    recompile when a hook is removed: stop_recording must drop the cached code, so the steps after the
    recording run one graph again (on the H200 the leftover breaks cost a compiled GPT-2 step 0.875x)."""
    from fused_layers import FusedLayerNorm

    runs = [0]

    def backend(gm, example_inputs):
        def run(*args):
            runs[0] += 1
            return gm.forward(*args)

        return run

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 8), FusedLayerNorm(8), nn.GELU(), FusedLayerNorm(8), nn.Linear(8, 8))
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)

    def graphs_per_call():
        runs[0] = 0
        compiled(x)
        compiled(x)
        return runs[0] / 2

    led = ledger_mod.Ledger(model)
    led.start_recording()  # as the callback: before the first (compiling) step
    assert graphs_per_call() > 1  # recording: the hooks run eagerly, between graphs
    assert len(led.calls) == 1 and led.calls[next(iter(led.calls))].modules == ["1", "3"]
    led.stop_recording()
    assert led.recompiled
    assert graphs_per_call() == 1
    torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.gpu
@pytest.mark.slow
def test_compiled_run_keeps_the_ab_graph_and_reports_it_gpu(tmp_path):
    """The demo GPT compiled (model.compile=true) on the GPU: every arm's compile is outside the timed rounds
    and reported, the kept configuration's own steps run the graph its arm compiled (no step after the A/B
    compiles another), they are set against the A/B's spread (whether they agree is the callback's measurement,
    not this test's: step times of a shared GPU are not a verdict), and the kept configuration's peak (read
    after the A/B) is no higher than the A/B's, whose unfused arm holds the LM head's logits."""
    from lm_demo.model import GPTLM

    torch.manual_seed(0)
    model = GPTLM(vocab_size=8192, seq_len=512, d_model=512, n_layer=4, n_head=8, compile=True)
    data = torch.randint(0, 8192, (64 * 8, 513))
    loader = DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=8)
    cb = FusedLayersCallback(policy="always", measure=False, warmup_steps=3, ab_rounds=3, ab_warmup_rounds=1,
                             ab_max_steps=40, ab_check_steps=8)
    trainer = L.Trainer(max_steps=60, accelerator="gpu", devices=1, precision="bf16-mixed", callbacks=[cb],
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(model, loader)
    ab, kept = cb.ab, cb.kept
    assert ab.compiled and ab.meaningful and set(ab.compile_seconds) == set(ab.arms)
    assert kept is not None and kept.agrees is not None, cb.ab_status
    assert len(kept.step_ms) == kept.steps == 8, kept.summary()  # a step that compiled would be left out
    summary = cb.summary()
    assert summary["kept_steps"]["median_ms"] == kept.median_ms and summary["ab_cost"]["steps"] > 0, summary
    peaks = summary["peak_memory_gib"]
    assert peaks["kept"] is not None and peaks["kept"] <= peaks["ab"] + 1e-3, peaks
