"""FusedLayersTrainerCallback in a real Hugging Face Trainer run (CPU, the kernels in Triton's interpreter)."""

import copy
import sys
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from fused_layers.hf_trainer import FusedLayersTrainerCallback  # noqa: E402
from fused_layers.swap import fused_kind  # noqa: E402

pytestmark = pytest.mark.slow


def _tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg)


class _Data(torch.utils.data.Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 48, (n, 12), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class FakeStepTimer:
    """Step 'times' from the kinds fused at the step's start: fused RMSNorm saves 2 ms, fused attention costs 5 ms,
    the fused loss saves 1 ms, on a 10 ms step (the A/B's mechanism, not any speed)."""

    meaningful = True

    def __init__(self):
        self.model = None
        self.seen = []

    def start(self):
        kinds = frozenset(k for m in self.model.modules() if (k := fused_kind(m)) is not None)
        self.seen.append(kinds)
        return 10.0 - 2.0 * ("rms_norm" in kinds) + 5.0 * ("attention" in kinds) - 1.0 * ("cross_entropy" in kinds)

    def stop(self, token):
        return token

    def elapsed_ms(self, stopped):
        return stopped


def _trainer(model, cb, tmp_path, steps):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=2,
                                          learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
                                          save_strategy="no", disable_tqdm=True)
    return transformers.Trainer(model=model, args=args, train_dataset=_Data(), callbacks=[cb])


def test_swaps_at_init_times_arms_and_keeps_the_fastest(tmp_path, monkeypatch):
    """Swapped when the Trainer is built (before the optimizer), the A/B interleaves real optimizer steps (unfused,
    all, each kind), policy=faster keeps the fastest arm; metrics reach the log history and the active W&B run."""
    logged = []

    class Run:
        summary = {}

        def log(self, data, commit=True):
            logged.append(dict(data))

    fake_wandb = types.SimpleNamespace(run=Run(), Table=lambda columns, data: ("table", columns, data))
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    model = _tiny_llama()
    timer = FakeStepTimer()
    timer.model = model
    cb = FusedLayersTrainerCallback(kinds=["rms_norm", "attention", "cross_entropy"], policy="faster",
                                    warmup_steps=1, ab_rounds=1, ab_warmup_rounds=0, step_timer=timer)
    trainer = _trainer(model, cb, tmp_path, steps=1 + 5)
    assert cb.swapped_counts() == {"rms_norm": 3, "attention": 1, "cross_entropy": 1}  # swapped in __init__
    assert trainer.optimizer is None  # ... before the optimizer exists
    trainer.train()
    arms = {frozenset(), frozenset({"rms_norm", "attention", "cross_entropy"}), frozenset({"rms_norm"}),
            frozenset({"attention"}), frozenset({"cross_entropy"})}
    assert set(timer.seen) == arms and len(timer.seen) == 5
    s = cb.summary()
    assert s["kept_arm"] == "rms_norm" and s["step_ab"]["rms_norm"]["speedup"] == pytest.approx(10 / 8)
    assert s["swapped"]["rms_norm"] == 3 and s["swapped"]["attention"] == 0 and s["swapped"]["cross_entropy"] == 0
    kinds = {fused_kind(m) for m in model.modules()} - {None}
    assert kinds == {"rms_norm"}  # the model trains on with what was kept
    assert s["metrics"]["fused/step_speedup/attention"] == pytest.approx(10 / 15)
    hist = [h for h in trainer.state.log_history if "fused/kept/rms_norm" in h]
    assert hist and hist[0]["fused/kept/attention"] == 0
    flat = {k: v for d in logged for k, v in d.items()}
    assert flat["fused/swapped/attention"] == 1 and flat["fused/kept/rms_norm"] == 3
    assert flat["fused/step_ab"][0] == "table" and flat["fused/swap_report"][0] == "table"


def test_trains_as_unfused_and_reports_without_an_ab(tmp_path):
    """policy=always with no A/B rounds left: every swap kept, the loss curve that of the unswapped model."""
    torch.manual_seed(0)
    ref = _tiny_llama()
    model = copy.deepcopy(ref)
    cb = FusedLayersTrainerCallback(ab_rounds=0)
    losses = []
    for m, callbacks in ((ref, []), (model, [cb])):
        torch.manual_seed(1)
        args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                                              learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True,
                                              save_strategy="no", disable_tqdm=True, seed=1)
        tr = transformers.Trainer(model=m, args=args, train_dataset=_Data(), callbacks=callbacks)
        tr.train()
        losses.append([h["loss"] for h in tr.state.log_history if "loss" in h])
    assert len(losses[1]) == 2
    assert losses[1] == pytest.approx(losses[0], abs=1e-4, rel=1e-4)
    assert cb.summary()["ab_status"] == "not run: ab_rounds=0" and cb.summary()["swapped"]["attention"] == 1
    assert cb.summary()["fallbacks"] == {}  # every call of the training ran the kernels


def test_swapped_forward_keeps_its_signature():
    """The Trainer keeps the batch columns the model's forward names: the swapped class must show the same ones."""
    import inspect

    from fused_layers import swap_modules

    model = _tiny_llama()
    before = inspect.signature(model.forward)
    swap_modules(model)
    assert type(model).__name__.startswith("Fused") and inspect.signature(model.forward) == before


def test_argument_errors():
    for kw, arg in (({"policy": "fastest"}, "policy"), ({"ab_rounds": -1}, "ab_rounds"),
                    ({"warmup_steps": 1.5}, "warmup_steps")):
        with pytest.raises(ValueError, match=f"argument '{arg}'"):
            FusedLayersTrainerCallback(**kw)
    with pytest.raises(ValueError, match="unknown kind"):
        FusedLayersTrainerCallback(kinds=["layernorm"])
