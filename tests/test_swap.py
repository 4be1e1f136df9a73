"""swap_modules / restore_modules / the ledger, without Lightning (CPU: Triton interpreter, tiny shapes).

Kinds whose fused module does not exist yet are skipped with the reason, and start running as they land.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fused_layers.ledger import TABLE_COLUMNS, Ledger, measure_pair
from fused_layers.modules.attention import Attention
from fused_layers.swap import (
    KINDS,
    SOURCE_ATTR,
    available_kinds,
    resolve_kinds,
    restore_modules,
    source_class,
    swap_modules,
    target_class,
)

E, H, T = 16, 2, 5  # width, heads, tokens: tiny, the interpreter runs one program at a time


def require(kind: str) -> None:
    why = available_kinds()[kind]
    if why is not None:
        pytest.skip(f"{kind}: {why}")


class AllKinds(nn.Module):
    """One module of every swappable kind, each on the path of the output."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(E, E)
        self.ln = nn.LayerNorm(E)
        self.rms = nn.RMSNorm(E)
        self.mha = nn.MultiheadAttention(E, H, batch_first=True)
        self.att = Attention()
        self.sm = nn.Softmax(dim=-1)
        self.out = nn.Linear(E, E)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.rms(self.ln(self.inp(x)))
        h = h + self.mha(h, h, h, need_weights=False)[0]
        B = h.shape[0]
        q = h.view(B, T, H, E // H).transpose(1, 2)
        h = h + self.att(q, q, q, is_causal=True).transpose(1, 2).reshape(B, T, E)
        return self.out(self.sm(h))


def _inputs(requires_grad: bool = True) -> torch.Tensor:
    return torch.randn(2, T, E, requires_grad=requires_grad)


def _kinds_available() -> list[str]:
    return [k for k, why in available_kinds().items() if why is None]


# --------------------------------------------------------------------------------------------------
def test_registry_is_the_single_list_of_kinds():
    assert set(KINDS) == {"layer_norm", "rms_norm", "softmax", "multihead_attention", "attention", "cross_entropy",
                          "gated_mlp", "rope", "residual_norm", "mlp", "mlp_recompute", "lora"}
    # transformers' decoder-layer kinds, the plain MLPs and PEFT's LoRA layer swap known look-alikes only: no torch
    # class, always available
    assert {k for k in KINDS if KINDS[k].known_only} == {"gated_mlp", "rope", "residual_norm", "mlp", "mlp_recompute",
                                                         "lora"}
    # a kind off by default says why, and None swaps every other kind
    assert {k for k in KINDS if not KINDS[k].default} == {"mlp_recompute"}
    assert all(KINDS[k].why_off for k in KINDS if not KINDS[k].default)
    assert resolve_kinds(None) == [k for k in KINDS if k != "mlp_recompute"]
    for k in KINDS:
        if KINDS[k].known_only:
            assert source_class(k) is None and target_class(k) is None and available_kinds()[k] is None
            continue
        src = source_class(k)
        assert src is not None, k
        tgt = target_class(k)
        if tgt is not None:  # every target is a drop-in subclass of its source
            assert issubclass(tgt, src), (k, tgt, src)
    assert available_kinds()["softmax"] is None  # FusedSoftmax exists


def test_report_keeps_parameters_hooks_mode_and_state_dict():
    model = AllKinds().train()
    model.mha.eval()
    params_before = list(model.parameters())
    names_before = [n for n, _ in model.named_parameters()]
    keys_before = list(model.state_dict().keys())
    calls = []
    model.ln.register_forward_hook(lambda m, a, o: calls.append("ln"))
    model.sm.register_forward_pre_hook(lambda m, a: calls.append("sm"))

    report = swap_modules(model)

    avail = set(_kinds_available())
    by_name = {e.name: e.kind for e in report.swapped}
    expected = {"ln": "layer_norm", "rms": "rms_norm", "mha": "multihead_attention", "att": "attention",
                "sm": "softmax"}
    for name, kind in expected.items():
        if kind in avail:
            assert by_name[name] == kind
            assert type(model.get_submodule(name)) is target_class(kind)
        else:
            assert any(s.name == name and "not available" in s.reason for s in report.skipped), report
    # the softmax inside a fused Attention is unused and left alone; otherwise it is swapped
    if "attention" in avail:
        assert type(model.att.softmax) is nn.Softmax
        assert any(s.name == "att.softmax" and "inside a fused attention" in s.reason for s in report.skipped)
    else:
        assert by_name["att.softmax"] == "softmax"
    assert all(p is q for p, q in zip(model.parameters(), params_before))
    assert len(params_before) == len(list(model.parameters()))
    assert [n for n, _ in model.named_parameters()] == names_before
    assert list(model.state_dict().keys()) == keys_before
    assert model.training and not model.mha.training
    model(_inputs())
    assert calls == ["ln", "sm"]
    assert report.counts()["softmax"] >= 1
    assert "swapped" in str(report) and report.as_dict()["swapped"]
    # attention modules say which kernel their calls may run (the route depends on each call's shape)
    notes = {e.name: e.note for e in report.swapped}
    for name in ("mha", "att"):
        if name in notes:
            assert "cuDNN" in notes[name] and "head dim 64/128" in notes[name], notes[name]
    assert not notes.get("ln")


def test_report_text_groups_modules_per_class_change():
    """``print(report)``: one line per kind and class change (short class names, a few module names), one per
    skip reason; every module is in ``rows()``."""
    model = nn.Sequential(*[nn.LayerNorm(4) for _ in range(5)], nn.Softmax(-1))
    report = swap_modules(model, include=["0", "1", "2", "3", "5"])
    text = str(report).splitlines()
    assert text[0] == "fused_layers swap report: 5 swapped, 1 skipped"
    assert text[1].split() == ["layer_norm", "swapped", "4", "LayerNorm", "->", "FusedLayerNorm:", "0,", "1,", "2",
                               "and", "1", "more"]
    assert text[2].split() == ["softmax", "swapped", "1", "Softmax", "->", "FusedSoftmax:", "5"]
    assert text[3].split()[:4] == ["layer_norm", "skipped", "1", "4:"] and "not matched by 'include'" in text[3]
    assert len(text) == 4 and len(report.rows()) == 6


def test_outputs_and_grads_match_unswapped():
    ref = AllKinds()
    fused = copy.deepcopy(ref)
    report = swap_modules(fused)
    assert report.swapped
    x = _inputs()
    x2 = x.detach().clone().requires_grad_()
    y_ref, y = ref(x), fused(x2)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(y)
    y_ref.backward(g)
    y.backward(g)
    torch.testing.assert_close(x2.grad, x.grad, atol=1e-5, rtol=1e-5)
    for (n, p), q in zip(ref.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-5, msg=n)


def test_idempotent_and_restore():
    model = AllKinds()
    first = swap_modules(model)
    second = swap_modules(model)
    assert first.swapped and not second.swapped
    assert {s.name for s in second.skipped if s.reason == "already fused"} == {e.name for e in first.swapped}
    x = _inputs(False)
    y_fused = model(x)
    restored = restore_modules(model)
    assert {e.name for e in restored.swapped} == {e.name for e in first.swapped}
    for name, m in model.named_modules():
        assert not hasattr(m, SOURCE_ATTR)
        assert not type(m).__name__.startswith("Fused"), name
    torch.testing.assert_close(model(x), y_fused, atol=1e-5, rtol=1e-5)
    assert restore_modules(model).swapped == []


def test_kinds_include_exclude_and_errors():
    model = nn.ModuleDict({"a": nn.Softmax(-1), "b": nn.ModuleDict({"c": nn.Softmax(-1), "d": nn.Softmax(1)}),
                           "ln": nn.LayerNorm(4)})
    r = swap_modules(copy.deepcopy(model), kinds={"softmax": False, "layer_norm": True})
    assert not any(e.kind == "softmax" for e in r.swapped)
    assert {s.name for s in r.skipped if "disabled" in s.reason} == {"a", "b.c", "b.d"}
    r = swap_modules(copy.deepcopy(model), kinds=["softmax"], include=["b.*"], exclude=[r"b\.d"])
    assert r.names() == ["b.c"]
    assert {s.name: s.reason for s in r.skipped if s.kind == "softmax"} == {"a": "not matched by 'include'",
                                                                            "b.d": "matched by 'exclude'"}
    with pytest.raises(ValueError, match="unknown kind.*'nope'.*allowed"):
        swap_modules(model, kinds=["nope"])
    with pytest.raises(ValueError, match="mapping.*unknown kind"):
        swap_modules(model, mapping={nn.Softmax: "softmaxx"})
    with pytest.raises(ValueError, match="cannot be imported"):
        swap_modules(model, mapping={"no.such.Class": "softmax"})
    with pytest.raises(TypeError, match="'model' must be an nn.Module"):
        swap_modules("model")


class MySoftmax(nn.Softmax):
    """A subclass of a source class: swapped only when the mapping names it."""


class LookAlikeSoftmax(nn.Module):
    """A model's own softmax class with the attribute the fused forward reads (``dim``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, self.dim)


class LookAlikeLayerNorm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))
        self.bias = nn.Parameter(torch.randn(n))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


def test_subclasses_only_with_mapping_and_look_alikes():
    model = nn.ModuleDict({"sub": MySoftmax(-1), "look": LookAlikeSoftmax(-1)})
    r = swap_modules(model)
    assert not r.swapped
    assert any(s.name == "sub" and "add it to 'mapping'" in s.reason for s in r.skipped)
    x = torch.randn(3, 7)
    ref = {n: m(x) for n, m in model.items()}
    r = swap_modules(model, mapping={MySoftmax: "softmax", f"{__name__}.LookAlikeSoftmax": "softmax"})
    assert sorted(r.names()) == ["look", "sub"]
    assert all(type(m) is target_class("softmax") for m in model.values())
    for n, m in model.items():
        torch.testing.assert_close(m(x), ref[n])
    restore_modules(model)
    assert type(model["sub"]) is MySoftmax and type(model["look"]) is LookAlikeSoftmax


def test_look_alike_layer_norm():
    require("layer_norm")
    m = nn.ModuleDict({"n": LookAlikeLayerNorm(11)})
    x = torch.randn(3, 11)
    ref = m["n"](x)
    r = swap_modules(m, mapping={LookAlikeLayerNorm: "layer_norm"})
    assert r.names() == ["n"]
    torch.testing.assert_close(m["n"](x), ref, atol=1e-5, rtol=1e-5)


def test_optimizer_built_before_and_after_sees_the_same_params():
    model = AllKinds()
    opt_before = torch.optim.AdamW(model.parameters(), lr=1e-3)
    swap_modules(model)
    opt_after = torch.optim.AdamW(model.parameters(), lr=1e-3)
    live = list(model.parameters())
    for opt in (opt_before, opt_after):
        held = opt.param_groups[0]["params"]
        assert len(held) == len(live) and all(a is b for a, b in zip(held, live))
    model(_inputs(False)).square().mean().backward()
    w = model.inp.weight.detach().clone()
    opt_before.step()
    assert not torch.equal(model.inp.weight, w)


def test_state_dict_round_trips_both_ways():
    unfused = AllKinds()
    fused = AllKinds()
    swap_modules(fused)
    assert fused.state_dict().keys() == unfused.state_dict().keys()
    fused.load_state_dict(unfused.state_dict(), strict=True)
    x = _inputs(False)
    torch.testing.assert_close(fused(x), unfused(x), atol=1e-5, rtol=1e-5)
    other = AllKinds()
    other.load_state_dict(fused.state_dict(), strict=True)
    torch.testing.assert_close(other(x), unfused(x), atol=1e-5, rtol=1e-5)


def test_ledger_records_and_measures_each_distinct_call():
    model = nn.ModuleDict({"a": nn.Softmax(-1), "b": nn.Softmax(-1), "c": nn.Linear(8, 8)})
    swap_modules(model)
    ledger = Ledger(model)
    ledger.start_recording()
    x = torch.randn(3, 8, requires_grad=True)
    model["a"](x)
    model["b"](x)  # same (kind, shape, dtype): one measurement, both names
    model["b"](torch.randn(1, 2, 5, 13)[..., 1:])  # another shape, non-contiguous
    model["a"](torch.randn(7, 8, device="meta"))  # a FLOP count / shape propagation: not recorded
    ledger.stop_recording()
    model["a"](x)  # not recorded any more
    assert len(ledger.calls) == 2
    rows = ledger.measure(max_seconds=60)
    assert [r.modules for r in rows] == [["a", "b"], ["b"]]
    assert rows[1].shape == "[1,2,5,12]" and rows[0].dtype == "float32"
    for r in rows:
        assert r.kind == "softmax" and r.metric == "GB/s" and not r.meaningful
        assert r.max_err < 1e-5 and r.achieved > 0 and len(r.row()) == len(TABLE_COLUMNS)
        assert r.ref_ms > 0 and r.fused_ms > 0 and r.ref_fwd_ms > 0 and r.fused_fwd_ms > 0  # each arm was timed
        assert r.speedup == pytest.approx(r.ref_ms / r.fused_ms) and r.speedup_fwd == pytest.approx(
            r.ref_fwd_ms / r.fused_fwd_ms)  # reference time over fused time, forward + backward and forward alone
    s = Ledger.summary(rows)
    assert {"fused/speedup/softmax", "fused/speedup_fwd/softmax", "fused/max_err/softmax"} <= set(s)
    assert set(ledger.module_speedups()) == {"a", "b"}
    table = Ledger.format(rows).splitlines()
    assert table[0].split() == TABLE_COLUMNS and len(table) == 4 and "say nothing about GPU speed" in table[-1]
    assert x.grad is None  # the ledger never touches .grad


def test_ledger_budget_leaves_calls_unmeasured():
    model = nn.ModuleDict({"a": nn.Softmax(-1)})
    swap_modules(model)
    ledger = Ledger(model)
    ledger.start_recording()
    model["a"](torch.randn(2, 5))
    model["a"](torch.randn(2, 6))
    ledger.stop_recording()
    assert ledger.measure(max_seconds=0.0) == [] and len(ledger.not_measured) == 2


def test_measure_pair_attention_metric_is_tflops():
    require("attention")
    m = nn.ModuleDict({"att": Attention()})
    swap_modules(m, kinds=["attention"])
    q = torch.randn(1, H, T, 8, requires_grad=True)
    r = measure_pair(lambda *a, **k: Attention.forward(m["att"], *a, **k), m["att"], (q, q, q), {"is_causal": True},
                     kind="attention")
    assert r.metric == "TFLOP/s" and r.max_err < 1e-4 and r.achieved > 0


def test_wrapper_made_classes_keep_their_wrapper():
    """A class a wrapper made by subclassing (FSDP2's ``FSDP<Cls>(FSDPModule, Cls)``) is swapped and restored on its
    base, and keeps the wrapper: FSDPLayerNorm -> FSDPFusedLayerNorm -> FSDPLayerNorm, the wrapper's methods there."""
    from fused_layers import FusedLayerNorm

    FSDPModule = type("FSDPModule", (), {"__module__": "torch.distributed.fsdp.test", "unshard": lambda self: "ok"})
    wrapped = type("FSDPLayerNorm", (FSDPModule, nn.LayerNorm), {"__deepcopy__": None})
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
    model[1].__class__ = wrapped
    rep = swap_modules(model)
    cls = type(model[1])
    assert rep.counts()["layer_norm"] == 1 and cls.__bases__ == (FSDPModule, FusedLayerNorm)
    assert cls.__name__ == "FSDPFusedLayerNorm" and "__deepcopy__" in cls.__dict__ and model[1].unshard() == "ok"
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x), nn.functional.layer_norm(model[0](x), (8,), model[1].weight, model[1].bias))
    restore_modules(model)
    assert type(model[1]) is wrapped  # the wrapper's own class again (its class cache)
    assert swap_modules(model).counts()["layer_norm"] == 1 and type(model[1]) is cls
