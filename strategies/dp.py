"""torch.nn.DataParallel: one process scatters each global batch over its devices."""

from __future__ import annotations

import torch
from torch import nn

from strategies.base import Strategy, Variant


class DataParallel(Strategy):
    variants = {"dp": Variant("inprocess", "nn.DataParallel, one process driving all devices")}
    no_compile = (
        "nn.DataParallel replicates the module in Python threads every step; "
        "torch.compile is not used with it (compile single or ddp instead)"
    )

    @classmethod
    def cannot_run(
        cls, world_size: int, device: str, n_devices: int, oversubscribe: bool = False
    ) -> str | None:
        if device != "cuda" and world_size != 1:
            return f"DataParallel parallelises over GPUs; on {device} it has one device, so world size {world_size} cannot run"
        if device == "cuda" and world_size > n_devices:
            return f"DataParallel over {world_size} GPUs needs {world_size} GPUs, found {n_devices}"
        return None

    def devices(self) -> list[torch.device]:
        if self.ctx.device.type == "cuda":
            return [torch.device(f"cuda:{i}") for i in range(self.ctx.world_size)]
        return [self.ctx.device]

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        if self.ctx.device.type == "cuda":
            ids = [d.index for d in self.devices()]
            self.notes.append(f"DataParallel over cuda:{','.join(map(str, ids))}")
            return nn.DataParallel(model, device_ids=ids), optimizer
        self.notes.append(
            f"DataParallel wraps a single {self.ctx.device.type} device: no parallelism"
        )
        return nn.DataParallel(model), optimizer
