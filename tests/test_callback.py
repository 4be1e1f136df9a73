"""FusedLayersCallback and ThroughputCallback in real (tiny) Lightning fits on the CPU (Triton interpreter).

GPU: ``test_speedup_table_gpu`` prints the speedup table with real numbers (marked ``gpu``).
"""

from __future__ import annotations

import copy
import csv
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

import callbacks.fused as fused_cb
import fused_layers.ledger as ledger_mod
from callbacks import FusedLayersCallback, ThroughputCallback
from callbacks.throughput import count_flops, peak_flops
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
        max_steps=steps, accelerator="cpu", devices=1, callbacks=callbacks, logger=logger if logger is not None else False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, log_every_n_steps=1,
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
def test_fit_swaps_measures_and_logs_csv(tmp_path):
    torch.manual_seed(0)
    ref = LM()
    model = copy.deepcopy(ref)
    cb = _cb()
    logger = CSVLogger(tmp_path, name="csv")
    trainer = _trainer(tmp_path, [cb], logger=logger)
    trainer.fit(model)

    avail = _available()
    swapped = {e.name: e.kind for e in cb.report.swapped}
    expected = {"net.ln": "layer_norm", "net.rms": "rms_norm", "net.mha": "multihead_attention", "net.att": "attention", "net.sm": "softmax"}
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
    assert len(rows) == 1 and float(rows[0]["fused/speedup/softmax"]) > 0
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
    cb = _cb(policy="faster", kinds={"softmax": True, "layer_norm": True})
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
    """Interpreter timings (meaningful=False) never undo a swap, however slow they look."""
    model = LM()
    cb = _cb(policy="faster", kinds={"softmax": True})
    trainer = _trainer(tmp_path, [cb])
    trainer.fit(model)
    assert cb.measurements and not any(r.meaningful for r in cb.measurements)
    assert type(model.net.sm).__name__ == "FusedSoftmax" and not cb.restored


def test_no_kernels_warns_and_swaps_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(fused_cb, "kernels_runnable", lambda device: False)
    model = LM()
    cb = _cb()
    with pytest.warns(UserWarning, match="cannot run.*swapping nothing"):
        _trainer(tmp_path, [cb], steps=2).fit(model)
    assert not _fused_names(model) and not cb.report.swapped and len(model.losses) == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="policy"):
        FusedLayersCallback(policy="sometimes")
    with pytest.raises(ValueError, match="unknown kind"):
        FusedLayersCallback(kinds={"layernorm": True})
    with pytest.raises(ValueError, match="flops_from"):
        ThroughputCallback(flops_from="guess")


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
    assert "fused/speedup/softmax" in summary and summary["fused/speedup/softmax"] > 0
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
    _trainer(tmp_path, [_cb(measure=False), tp], steps=4, logger=logger).fit(model)
    assert _fused_names(model)  # counted while fused...
    assert tp.flops_per_batch == model.flops_per_batch == flops_unfused > 0  # ...equal to the unfused count
    assert count_flops(model, x) == flops_unfused and _fused_names(model)  # classes are put back
    keys = set().union(*(row.keys() for row in _metrics(logger)))
    assert {"train/device/samples_per_sec", "train/device/items_per_sec", "train/device/flops_per_sec"} <= keys
    assert peak_flops("NVIDIA H200", torch.bfloat16) == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "tfloat32") == 494.7e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", torch.bfloat16) is None


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
        assert r.speedup > 0 and r.achieved > 0
        assert r.max_err < (0.1 if r.kind in ("attention", "multihead_attention") else 0.05), r
    warnings.warn(f"speedups: { {r.kind + ' ' + r.shape: round(r.speedup, 3) for r in rows} }")
