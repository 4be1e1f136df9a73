"""Swapped models under data parallelism and sharding, in 2 CPU processes (gloo, the kernels in Triton's interpreter).

One spawn runs every scenario on both ranks, each against the same model unswapped and wrapped the same way, and
returns per step the losses, whether the fused LM head + loss ran (``outputs.logits`` is None), and the largest
gradient difference (full, unsharded gradients):

* FSDP2 (``fully_shard``) on every decoder layer, on the LM head by itself (as torchtitan's plans do) and on the root,
  every kind swapped, three SGD steps: fused, every swap undone, swapped again (what the step-time A/B does between
  its arms; the sharded classes keep their FSDP wrapper class through both);
* FSDP1 with the LM head auto-wrapped on its own (``ModuleWrapPolicy({nn.Linear, the decoder layer})``);
* DDP, every kind swapped.

* DeepSpeed ZeRO-3 (its CPU accelerator, gloo; where deepspeed is installed), every kind swapped, two steps of its
  engine: the losses of step 2 also check that the gradients reached the partitioned weights.

The fused head runs inside the head's own call, so the wrappers' unshard / reshard (ZeRO-3: gather / release) hooks
fire around it.
"""

import copy
import os
import socket
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

pytestmark = pytest.mark.slow
WORLD = 2


def _tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).train()


def _fsdp2(model):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model.lm_head)
    fully_shard(model)
    return model


def _fsdp1(model):
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = ModuleWrapPolicy({type(model.model.layers[0]), nn.Linear})
    return FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=True)


def _ddp(model):
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model)


def _grads(wrapped, how):
    if how == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(wrapped, with_grads=True):
            return {n.replace("_fsdp_wrapped_module.", ""): p.grad.clone() for n, p in wrapped.named_parameters()}
    out = {}
    for n, p in wrapped.named_parameters():
        g = p.grad
        out[n.replace("module.", "", 1) if how == "ddp" else n] = g.full_tensor() if hasattr(g, "full_tensor") else g
    return out


SCENARIOS = {  # name: (wrap, kinds to swap, the fused model's state at each step)
    "fsdp2": (_fsdp2, None, ("fused", "restored", "fused")),
    "fsdp1": (_fsdp1, ["cross_entropy"], ("fused",)),
    "ddp": (_ddp, None, ("fused",)),
}


def _run(rank, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRITON_INTERPRET="1")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from fused_layers import restore_modules, swap_modules

        results = {}
        for name, (wrap, kinds, steps) in SCENARIOS.items():
            torch.manual_seed(0)
            ref = _tiny_llama()
            fused = copy.deepcopy(ref)
            report = swap_modules(fused, kinds=kinds)
            runs = []
            for model in (ref, fused):
                wrapped = wrap(model)
                opt = torch.optim.SGD(wrapped.parameters(), lr=0.5)
                torch.manual_seed(1 + rank)  # each rank its own batch
                per_step = []
                for state in steps:
                    if model is fused and state == "restored":
                        restore_modules(model)
                    elif model is fused and state == "fused" and per_step:
                        swap_modules(model, kinds=kinds)
                    ids = torch.randint(0, 48, (2, 12))
                    opt.zero_grad(set_to_none=True)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        out = wrapped(input_ids=ids, labels=ids)
                    out.loss.backward()
                    classes_kept = all(type(m).__name__.startswith("FSDP") for m in (model, model.lm_head,
                                                                                     model.model.layers[0])) \
                        if name == "fsdp2" else True
                    per_step.append((out.loss.item(), out.logits is None, _grads(wrapped, name), classes_kept))
                    opt.step()
                runs.append(per_step)
            steps_out = []
            for state, (la, _, ga, _), (lb, head_fused, gb, kept) in zip(steps, *runs):
                err = max((ga[n] - gb[n]).abs().max().item() for n in ga)
                steps_out.append(dict(state=state, loss_ref=la, loss=lb, head_fused=head_fused, grad_err=err,
                                      same_names=ga.keys() == gb.keys(), wrapper_kept=kept))
            results[name] = dict(steps=steps_out, counts=report.counts())
        queue.put((rank, results))
    except BaseException as e:  # the parent reports it
        queue.put((rank, repr(e)))
        raise
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results():
    return _spawn(_run)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sharded_swap_trains_as_unswapped(scenario, results):
    """Every rank: the fused LM head + loss ran (no logits) where the model was swapped, and not where every swap was
    undone; each step's loss and every full gradient equal the unswapped model's under the same wrapper (float32)."""
    for rank in range(WORLD):
        res = results[rank][scenario]
        assert res["counts"].get("cross_entropy") == 1, res["counts"]
        if SCENARIOS[scenario][1] is None:
            assert res["counts"].get("attention") == 2 and res["counts"].get("rms_norm") == 5, res["counts"]
        for step in res["steps"]:
            assert step["head_fused"] == (step["state"] == "fused"), f"rank {rank}: {step}"
            assert step["same_names"] and step["wrapper_kept"]
            assert step["loss"] == pytest.approx(step["loss_ref"], abs=1e-5, rel=1e-5)
            assert step["grad_err"] < 1e-5, f"rank {rank}: gradient differs by {step['grad_err']}"


def _run_zero3(rank, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD), TRITON_INTERPRET="1", DS_ACCELERATOR="cpu")
    try:
        import deepspeed

        from fused_layers import swap_modules

        deepspeed.init_distributed(dist_backend="gloo")
        torch.manual_seed(0)
        ref = _tiny_llama()
        fused = copy.deepcopy(ref)
        counts = swap_modules(fused).counts()
        config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
                  "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "zero_allow_untested_optimizer": True}
        runs = []
        for model in (ref, fused):
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            torch.manual_seed(1 + rank)
            per_step = []
            for _ in range(2):
                ids = torch.randint(0, 48, (2, 12))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = engine(input_ids=ids, labels=ids)
                engine.backward(out.loss)
                engine.step()
                per_step.append((out.loss.item(), out.logits is None))
            runs.append(per_step)
        queue.put((rank, dict(counts=counts, ref=runs[0], fused=runs[1])))
    except BaseException as e:  # the parent reports it
        queue.put((rank, repr(e)))
        raise


def _spawn(target):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(WORLD):
            rank, res = queue.get(timeout=600)
            out[rank] = res
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    bad = {r: v for r, v in out.items() if isinstance(v, str)}
    assert not bad, f"a rank failed: {bad}"
    return out


def test_zero3_swap_trains_as_unswapped():
    """DeepSpeed ZeRO-3, 2 ranks: the fused LM head + loss runs on each (no logits) inside ZeRO-3's gather / release
    hooks, and both steps' losses equal the unswapped engine's (step 2: after an update from the sharded gradients)."""
    pytest.importorskip("deepspeed")
    out = _spawn(_run_zero3)
    for rank in range(WORLD):
        res = out[rank]
        want = {"attention": 2, "rms_norm": 5, "cross_entropy": 1, "gated_mlp": 2, "rope": 1, "residual_norm": 2}
        assert res["counts"] == want, res["counts"]
        for (la, _), (lb, head_fused) in zip(res["ref"], res["fused"]):
            assert head_fused, f"rank {rank}: the fused LM head did not run"
            assert lb == pytest.approx(la, abs=1e-5, rel=1e-5)


def _run_dtensor(rank, port, queue):
    """Sequence-parallel DTensor inputs (what a tensor-parallel plan hands a norm): every fused op takes them and
    computes what PyTorch's own op computes on them (its reference, with DTensor's sharding rules)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRITON_INTERPRET="1")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch import nn
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        from fused_layers import FusedLayerNorm, FusedRMSNorm, FusedSoftmax, swap_modules

        mesh = init_device_mesh("cpu", (WORLD,))
        torch.manual_seed(0)
        hf_norm = transformers.models.llama.modeling_llama.LlamaRMSNorm(16)
        hf_fused = copy.deepcopy(hf_norm)
        swap_modules(hf_fused)
        pairs = [(nn.LayerNorm(16), FusedLayerNorm(16)), (nn.RMSNorm(16), FusedRMSNorm(16)),
                 (nn.Softmax(-1), FusedSoftmax(-1)), (hf_norm, hf_fused)]
        errs = []
        for ref, fused in pairs:
            fused.load_state_dict(ref.state_dict())
            for m in (ref, fused):
                for name, p in list(m.named_parameters()):
                    setattr(m, name, nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()])))
            x = torch.randn(2, 8, 16)
            outs = []
            for m in (ref, fused):
                xd = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    y = m(xd)
                (y.full_tensor() * torch.arange(16.0)).sum().backward()
                outs.append((y.full_tensor(), xd.grad.full_tensor(), type(y).__name__))
            (ya, ga, ta), (yb, gb, tb) = outs
            errs.append((type(fused).__name__, (ya - yb).abs().max().item(), (ga - gb).abs().max().item(), ta, tb))
        queue.put((rank, errs))
    except BaseException as e:  # the parent reports it
        queue.put((rank, repr(e)))
        raise
    finally:
        dist.destroy_process_group()


def test_dtensor_inputs_run_the_reference():
    """A tensor-parallel plan hands norms sequence-sharded DTensors: the fused modules (and the transformers RMSNorm
    look-alike) return DTensors equal to PyTorch's own modules' on them, gradients too (they used to reach the
    kernels and crash on the DTensor's storage)."""
    out = _spawn(_run_dtensor)
    for rank in range(WORLD):
        for name, y_err, g_err, t_ref, t_fused in out[rank]:
            assert t_fused == t_ref == "DTensor", (name, t_fused)
            assert y_err < 1e-6 and g_err < 1e-5, (name, y_err, g_err)
