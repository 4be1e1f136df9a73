"""scale: a ~1B Llama sharded over the GPUs of one host, unfused / fused / Liger, each at the largest micro-batch
that fits a per-GPU memory budget.

    python -m benchmarks scale                                          # FSDP2 and ZeRO-3 over every GPU, 80 GiB
    python -m benchmarks scale --strategies fsdp2 --arms unfused,fused --gpus 2 --budget-gib 80

Model: HF ``LlamaForCausalLM`` with Llama 3.2 1B's shape (16 x d2,048, 32 heads / 8 KV heads, FFN 8,192, vocab
128,256, tied embeddings: 1.24B parameters), random weights from one seed, bf16 parameters, sequences of ``--seq``
(4,096) random tokens; AdamW.

Strategies:

* ``fsdp2``: ``fully_shard`` on every decoder layer, on the LM head with the token embedding it is tied to (one
  group: FSDP2 shards a shared parameter once) and on the root; torch's AdamW (foreach) on the sharded parameters.
* ``zero3``: ``deepspeed.initialize`` with ZeRO stage 3 and bf16, torch's AdamW as the client optimizer.

Arms: ``unfused`` (as transformers builds it: SDPA), ``fused`` (``fused_layers.swap_modules`` before sharding),
``liger`` (``apply_liger_kernel_to_llama(model=...)`` when Liger-Kernel is installed).

Method.  Each arm needs the whole memory budget, so each (strategy, arm) runs in a fresh group of ``--gpus``
processes (NCCL), with ``torch.cuda.set_per_process_memory_fraction(budget / device memory)``:

1. probe: the peak memory of a step at 1 and at 2 sequences per GPU gives the fixed part (weights, gradients,
   optimizer state, buffers) and the cost of one more sequence; the largest micro-batch predicted to fit 95 % of the
   budget is chosen (at most ``--max-micro-batch``), the smallest over ranks;
2. measure: ``--rounds`` times, the arms in a rotated order, a fresh group runs ``--warmup`` steps and then ``--steps``
   steps between two barriers (CUDA events); a run that runs out of memory is repeated at 0.8 of its micro-batch.

Reported per (strategy, arm): the micro-batch, tokens/s over all GPUs (median over rounds with its min-max), the
speedup over ``unfused`` (median of the per-round ratios), the peak memory of a step (the largest over ranks), the
first step's loss, and whether the fused LM head + loss ran on every rank (``outputs.logits`` is None).

``--smoke`` checks the code on the CPU: 2 gloo processes, a tiny Llama, the kernels in Triton's interpreter, a fixed
micro-batch (no memory budget).
"""

from __future__ import annotations

import os
import socket
import time
import traceback

from . import utils

STRATEGIES = ["fsdp2", "zero3"]
ARMS = ["unfused", "fused", "liger"]
CONFIG = "Llama 3.2 1B shape: 16 x d2048, GQA 32/8, FFN 8192, vocab 128,256, tied, 1.24B parameters"


def add_arguments(p) -> None:
    p.add_argument("--strategies", default=",".join(STRATEGIES), help=f"comma-separated subset of {STRATEGIES}")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {ARMS}")
    p.add_argument("--gpus", type=int, default=0, help="processes (GPUs) per run; 0: every visible GPU")
    p.add_argument("--budget-gib", type=float, default=80.0, help="memory budget per GPU (an H100's 80 GiB)")
    p.add_argument("--seq", type=int, default=4096, help="tokens per sequence")
    p.add_argument("--max-micro-batch", type=int, default=32, help="largest micro-batch tried")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per run first")
    p.add_argument("--steps", type=int, default=5, help="timed steps per run")
    p.add_argument("--rounds", type=int, default=2, help="runs per arm, arms in a rotated order")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run (its process group)")


# --------------------------------------------------------------------------------------------------
# One rank of one run
# --------------------------------------------------------------------------------------------------
def _model(smoke: bool):
    import torch
    import transformers as T

    if smoke:
        cfg = T.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            tie_word_embeddings=True, attn_implementation="sdpa")
    else:
        cfg = T.LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                            rope_theta=500000.0, tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(cfg)
    model.config.use_cache = False
    return model.to(torch.float32 if smoke else torch.bfloat16).train(), cfg.vocab_size


def _prepare(strategy: str, arm: str, smoke: bool, device, micro_batch: int):
    """(step(ids) -> (loss, head_fused), what was swapped) for this rank."""
    import torch

    model, vocab = _model(smoke)
    swapped = ""
    if arm == "fused":
        from fused_layers import swap_modules

        swapped = ", ".join(f"{k} {n}" for k, n in sorted(swap_modules(model).counts().items()) if n)
    elif arm == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(model=model)
        swapped = "apply_liger_kernel_to_llama"
    model = model.to(device)
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        # the head by itself, or with the embedding it is tied to (FSDP2 shards a shared parameter in one group)
        fully_shard([model.model.embed_tokens, model.lm_head] if model.config.tie_word_embeddings else model.lm_head)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)

        def step(ids):
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return out.loss.detach(), out.logits is None
    else:
        import deepspeed

        config = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}
        if not smoke:
            config["bf16"] = {"enabled": True}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)

        def step(ids):
            out = engine(input_ids=ids, labels=ids)
            engine.backward(out.loss)
            engine.step()
            return out.loss.detach(), out.logits is None
    return step, vocab, swapped


def _worker(rank: int, world: int, port: int, job: dict, queue) -> None:
    smoke = job["smoke"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    if smoke:
        os.environ.update(TRITON_INTERPRET="1", DS_ACCELERATOR="cpu")
    try:
        import torch
        import torch.distributed as dist

        if smoke:
            device = torch.device("cpu")
        else:
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, job["budget_gib"] * 2**30 / total), device)
            torch.backends.cuda.matmul.allow_tf32 = True
        if job["strategy"] == "zero3":
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo" if smoke else "nccl")
        else:
            dist.init_process_group("gloo" if smoke else "nccl", rank=rank, world_size=world)
        out = _run_job(job, device, rank)
        queue.put((rank, out))
    except BaseException as e:  # noqa: BLE001 - the parent records it (OOM: a smaller micro-batch next)
        oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e)
        queue.put((rank, {"error": "oom" if oom else f"{type(e).__name__}: {str(e)[:300]}",
                          "trace": traceback.format_exc()[-1500:]}))


def _run_job(job: dict, device, rank: int) -> dict:
    import torch

    smoke = job["smoke"]
    g = torch.Generator().manual_seed(1 + rank)
    step, vocab, swapped = _prepare(job["strategy"], job["arm"], smoke, device, max(job["micro_batches"]))
    sync = torch.cuda.synchronize if not smoke else (lambda: None)
    peaks, losses, fused = [], [], []
    for mb in job["micro_batches"]:  # the probe: 1 and 2 sequences; the measurement: one micro-batch
        ids = torch.randint(0, vocab, (mb, job["seq"]), generator=g).to(device)
        for i in range(job["warmup"]):
            loss, head = step(ids)
            if i == 0:
                losses.append(float(loss))
                fused.append(head)
        if not smoke:
            sync()
            torch.cuda.reset_peak_memory_stats(device)
        torch.distributed.barrier()
        t0 = time.perf_counter()
        for _ in range(job["steps"]):
            loss, head = step(ids)
            fused.append(head)
        sync()
        torch.distributed.barrier()
        seconds = time.perf_counter() - t0
        peaks.append(torch.cuda.max_memory_allocated(device) / 2**30 if not smoke else float("nan"))
    world = torch.distributed.get_world_size()
    mb = job["micro_batches"][-1]
    return dict(peaks=peaks, loss=losses[0], head_fused=all(fused), swapped=swapped,
                tokens_per_s=world * mb * job["seq"] * job["steps"] / seconds)


# --------------------------------------------------------------------------------------------------
# The parent: one process group per run
# --------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(job: dict, world: int, timeout: float) -> dict:
    """Run ``job`` on ``world`` fresh processes; the ranks' results merged (or ``{"error": ...}``)."""
    import queue as queue_mod

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, job, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            try:
                rank, res = q.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue_mod.Empty:
                return {"error": f"timed out after {timeout:.0f} s"}
            results[rank] = res
            if "error" in res:  # the other ranks may wait in a collective forever: stop them
                return res
    finally:
        for p in procs:
            p.join(timeout=5 if len(results) < world else 60)
            if p.is_alive():
                p.kill()
    first = results[0]
    return dict(first, peak_gib=max(max(r["peaks"]) for r in results.values()),
                peaks=[max(r["peaks"][i] for r in results.values()) for i in range(len(first["peaks"]))],
                head_fused=all(r["head_fused"] for r in results.values()))


def _micro_batch(peaks: list[float], budget: float, cap: int) -> int:
    """The largest micro-batch whose predicted peak (from the peaks at 1 and 2 sequences) fits 95 % of ``budget``."""
    one, two = peaks
    per_seq = max(two - one, 1e-3)
    return max(1, min(cap, int((0.95 * budget - (one - per_seq)) // per_seq)))


def run(args) -> int:
    utils.require_cuda("scale", args.smoke)
    strategies = [s for s in args.strategies.split(",") if s]
    arms = [a for a in args.arms.split(",") if a]
    bad = sorted(set(strategies) - set(STRATEGIES)) + sorted(set(arms) - set(ARMS))
    if bad:
        print(f"python -m benchmarks scale: unknown {bad}; strategies {STRATEGIES}, arms {ARMS}")
        return 2
    if args.smoke:
        world, seq = 2, 16
    else:
        import torch

        world, seq = (args.gpus or torch.cuda.device_count()), args.seq
        if world < 2:
            print("python -m benchmarks scale: needs 2 or more GPUs (or --gpus 2 on a host that has them)")
            return 2
    env = utils.environment()
    env.update(transformers=utils.version_of("transformers"), liger=utils.version_of("liger-kernel"),
               deepspeed=utils.version_of("deepspeed"))
    if "liger" in arms and (not env["liger"] or args.smoke):
        arms.remove("liger")
    if "zero3" in strategies and not env["deepspeed"]:
        print("[scale/zero3] skipped: deepspeed is not installed (pip install deepspeed)")
        strategies.remove("zero3")
    rows = []
    for strategy in strategies:
        base = dict(strategy=strategy, seq=seq, smoke=args.smoke, budget_gib=args.budget_gib)
        chosen: dict[str, int] = {}
        info: dict[str, dict] = {}
        for arm in arms:  # probe
            if args.smoke:
                chosen[arm] = 2
                continue
            res = launch(dict(base, arm=arm, micro_batches=[1, 2], warmup=2, steps=1), world, args.timeout)
            if "error" in res:
                print(f"[scale/{strategy}/{arm}] probe failed: {res['error']}\n{res.get('trace', '')}", flush=True)
                continue
            chosen[arm] = _micro_batch(res["peaks"], args.budget_gib, args.max_micro_batch)
            print(f"[scale/{strategy}/{arm}] peaks {res['peaks'][0]:.1f} / {res['peaks'][1]:.1f} GiB at 1 / 2 "
                  f"sequences: micro-batch {chosen[arm]}", flush=True)
        per_round: list[dict[str, float]] = []
        order = [a for a in arms if a in chosen]
        for r in range(args.rounds if not args.smoke else 1):
            shift = r % max(len(order), 1)
            got: dict[str, float] = {}
            for arm in order[shift:] + order[:shift]:
                while True:
                    job = dict(base, arm=arm, micro_batches=[chosen[arm]], warmup=args.warmup if not args.smoke else 1,
                               steps=args.steps if not args.smoke else 1)
                    res = launch(job, world, args.timeout)
                    if res.get("error") == "oom" and chosen[arm] > 1:
                        chosen[arm] = max(1, int(chosen[arm] * 0.8))
                        print(f"[scale/{strategy}/{arm}] out of memory: micro-batch {chosen[arm]} next", flush=True)
                        continue
                    break
                if "error" in res:
                    print(f"[scale/{strategy}/{arm}] failed: {res['error']}\n{res.get('trace', '')}", flush=True)
                    continue
                got[arm] = res["tokens_per_s"]
                info.setdefault(arm, res)
                info[arm]["peak_gib"] = max(info[arm].get("peak_gib", 0.0), res["peak_gib"]) \
                    if not args.smoke else float("nan")
                info[arm]["head_fused"] = info[arm]["head_fused"] and res["head_fused"]
                print(f"[scale/{strategy}/{arm}] round {r}: micro-batch {chosen[arm]}, "
                      f"{res['tokens_per_s']:,.0f} tokens/s, peak {res['peak_gib']:.1f} GiB, "
                      f"fused head {res['head_fused']}", flush=True)
            per_round.append(got)
        for arm in order:
            tps = [d[arm] for d in per_round if arm in d]
            if not tps:
                continue
            med, lo, hi = utils.median_lo_hi(tps)
            ratios = [d[arm] / d["unfused"] for d in per_round if arm in d and "unfused" in d]
            sp = utils.median_lo_hi(ratios) if ratios else (None, None, None)
            rows.append(dict(env, strategy=strategy, config=CONFIG if not args.smoke else "tiny Llama (smoke)",
                             arm=arm, gpus=world, budget_gib=args.budget_gib, seq=seq, micro_batch=chosen[arm],
                             tokens_per_s=med, tokens_per_s_lo=lo, tokens_per_s_hi=hi, speedup=sp[0],
                             speedup_lo=sp[1], speedup_hi=sp[2], peak_gib=info[arm]["peak_gib"],
                             loss=info[arm]["loss"], head_fused=info[arm]["head_fused"],
                             swapped=info[arm]["swapped"], rounds=len(tps), steps=args.steps,
                             note="smoke (CPU)" if args.smoke else ""))
    utils.write_results(args, "scale", rows)
    if rows:
        print(utils.markdown(rows, ["strategy", "arm", "gpus", "micro_batch", "tokens_per_s", "speedup", "speedup_lo",
                                    "speedup_hi", "peak_gib", "head_fused", "swapped"]))
    return 0


__all__ = ["run", "add_arguments", "launch", "STRATEGIES", "ARMS"]
