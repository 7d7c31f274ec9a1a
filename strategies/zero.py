"""ZeRO stage 1: DDP, with the optimizer state partitioned over ranks.

`torch.distributed.optim.ZeroRedundancyOptimizer` gives each rank the state of a subset of
the parameters; after its local step, each rank broadcasts the parameters it owns.
Gradients are still all-reduced in full by DDP and parameters are still replicated: only
optimizer state shrinks. It partitions by whole tensors (greedily, by size), so on a model
where one tensor holds most parameters the ranks are uneven: ranks.csv shows each rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from strategies.base import Variant
from strategies.ddp import DistributedDataParallel


class ZeRO1(DistributedDataParallel):
    variants = {
        "zero1": Variant(
            "torchrun", "DDP + ZeroRedundancyOptimizer: optimizer state sharded (ZeRO-1)"
        ),
    }

    ablation_keeps = "ZeRO-1's parameter broadcast after the optimizer step"

    @classmethod
    def traffic(cls, options, world_size, shape, precision):
        # DDP's all-reduce, then each rank broadcasts the parameters it owns, one tensor at
        # a time: in bytes an all-gather of the parameters
        return [
            *super().traffic(options, world_size, shape, precision),
            ("all_gather", float(shape.param_bytes), shape.tensors),
        ]

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        model, _ = super().setup(model, optimizer)
        # imported here: torch.distributed.optim pulls in FSDP and DTensor, half a second
        # of every command that lists the strategies (a bad option's exit 2 among them)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        zero = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=type(optimizer), **optimizer.defaults
        )
        return model, zero

    def optimizer_states(self) -> Iterable[Mapping[str, Any]]:
        assert self.optimizer is not None
        return self.optimizer.optim.state.values()  # this rank's partition only
