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
"""

from __future__ import annotations

import functools
from typing import Any

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
