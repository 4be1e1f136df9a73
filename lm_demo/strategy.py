"""``strategy=NAME`` (``conf/strategy/``) as a Lightning strategy object, built for the job's model.

* ``auto``: nothing built; ``trainer.strategy`` (a Lightning name, ``auto`` by default) decides, so
  ``trainer.strategy=ddp`` keeps working. `check_strategy` (``lm_demo/config.py``) refuses a config that sets both.
* ``ddp``: ``DDPStrategy``.
* ``fsdp``: ``FSDPStrategy`` (FSDP1) whose auto-wrap policy makes each decoder layer (the model's
  ``shard_units``) and, with ``shard_head``, the LM head units of their own (``use_orig_params``: the optimizer's
  decay / no-decay groups are built from the original parameters).
* ``fsdp2``: ``ModelParallelStrategy`` (data parallel over every device); the model's ``configure_model``
  calls ``fully_shard`` (``lm_demo/model.py``), reading ``shard_head`` and ``reshard_after_forward`` from it.
* ``deepspeed``: ``DeepSpeedStrategy(stage=...)``.

The fused callback swaps in ``setup``, before any of these wraps or shards: the wrapped model is the swapped one.

`distributed_job` makes ``python train.py -m ... trainer.devices=2`` work: Lightning starts the other ranks by
running the command line again, which under ``-m`` would be the whole sweep in each child (job 0 of the child beside
job 1 of the parent); inside it a child runs this job alone, in this job's run dir, and the next job starts afresh.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Iterator

from torch import nn


def build_strategy(cfg: Any, model: nn.Module) -> Any:
    """The Lightning strategy for ``cfg`` (the ``strategy`` node), or None for ``auto``."""
    name = str(getattr(cfg, "name", "auto")) if cfg is not None else "auto"
    if name == "auto":
        return None
    if name == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(find_unused_parameters=bool(cfg.find_unused_parameters))
    if name == "fsdp":
        from lightning.pytorch.strategies import FSDPStrategy

        return FSDPStrategy(auto_wrap_policy=fsdp_wrap_policy(model, shard_head=bool(cfg.shard_head)),
                            sharding_strategy=str(cfg.sharding_strategy), use_orig_params=True)
    if name == "fsdp2":
        model.__dict__["fsdp2_shard_head"] = bool(cfg.shard_head)
        model.__dict__["fsdp2_reshard_after_forward"] = bool(cfg.reshard_after_forward)
        return _fsdp2_strategy()
    if name == "deepspeed":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(stage=int(cfg.stage))
    raise ValueError(f"strategy: unknown name {name!r}")


def fsdp_wrap_policy(model: nn.Module, shard_head: bool = True) -> Any:
    """FSDP1's auto-wrap policy: the model's layer classes (``shard_units``), and its LM head by itself."""
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    _, head, layer_classes = model.shard_units()
    classes = tuple(layer_classes)
    heads = [head] if (shard_head and head is not None) else []

    def unit(module: nn.Module) -> bool:
        return isinstance(module, classes) or any(module is h for h in heads)

    return functools.partial(lambda_auto_wrap_policy, lambda_fn=unit)


def _fsdp2_strategy() -> Any:
    """``ModelParallelStrategy`` with every device data parallel (FSDP2 over all ranks, no tensor parallelism).

    Its own ``"auto"`` sizes are the number of nodes (data parallel) by the devices of a node (tensor parallel);
    here the data-parallel size is the world size, known once the devices are."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    class FSDP2Strategy(ModelParallelStrategy):
        def setup_environment(self) -> None:
            if self._data_parallel_size == "auto":
                self._data_parallel_size = self.num_processes * self.num_nodes
            super().setup_environment()

    return FSDP2Strategy(data_parallel_size="auto", tensor_parallel_size=1)


@contextlib.contextmanager
def distributed_job() -> Iterator[None]:
    """One job of train.py, distributed or not, as a unit a multirun can repeat in the same process.

    * The ranks Lightning starts for a job of a Hydra multirun run that job only (its task overrides, in its run
      dir), as they do for a single run (outside a multirun: Lightning's own command).
    * At the end the job's process group is destroyed and the variables Lightning set for it (``MASTER_PORT``,
      ``LOCAL_RANK``, ``WORLD_SIZE``, ...) are taken back: the next job starts its own ranks and group."""
    import os

    from lightning.pytorch.strategies.launchers import subprocess_script as launcher

    original = launcher._hydra_subprocess_cmd
    env = dict(os.environ)

    def job_command(local_rank: int) -> tuple[list[str], str]:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from hydra.utils import get_original_cwd, to_absolute_path

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return original(local_rank)
        import __main__

        spec = getattr(__main__, "__spec__", None)
        command = ([sys.executable, "-m", spec.name] if spec is not None
                   else [sys.executable, to_absolute_path(sys.argv[0])])
        command += [*hc.overrides.task, f'hydra.run.dir="{hc.runtime.output_dir}"',
                    f"hydra.job.name=train_ddp_process_{local_rank}", "hydra.output_subdir=null"]
        return command, get_original_cwd()

    launcher._hydra_subprocess_cmd = job_command
    try:
        yield
    finally:
        launcher._hydra_subprocess_cmd = original
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(env)
