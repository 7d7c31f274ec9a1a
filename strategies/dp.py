"""torch.nn.DataParallel: one process scatters each global batch over its devices."""

from __future__ import annotations

from typing import Any

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
        if self.precision_plugin.dtype is not None:
            model = InAutocast(model, self.ctx.device.type, self.precision_plugin.dtype)
        if self.ctx.device.type == "cuda":
            ids = [d.index for d in self.devices()]
            self.notes.append(f"DataParallel over cuda:{','.join(map(str, ids))}")
            return nn.DataParallel(model, device_ids=ids), optimizer
        self.notes.append(
            f"DataParallel wraps a single {self.ctx.device.type} device: no parallelism"
        )
        return nn.DataParallel(model), optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        inner = super().unwrap(model)
        return inner.module if isinstance(inner, InAutocast) else inner


class InAutocast(nn.Module):
    """The model's forward in autocast at the precision's dtype, inside each replica.
    DataParallel runs its replicas in threads of their own, and autocast's dtype is
    per-thread: torch's parallel_apply enters autocast there with the thread's default
    dtype (fp16 on CUDA), so without this a bf16 cell computed in fp16, with no loss
    scaling. (unwrap() gives the model under it, with its own parameter names.)"""

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module
        self.device_type = device_type
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)
