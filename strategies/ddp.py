"""torch DistributedDataParallel: one process per rank, gradients all-reduced in buckets.

One class, two registered names that differ only in how the processes are started
(torchrun vs torch.multiprocessing.spawn), as Lightning's `ddp` / `ddp_spawn`.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from strategies.base import Strategy, Variant


class TorchDistributed(Strategy):
    """Process-group plumbing shared by every torch.distributed strategy."""

    multiprocess = True

    @property
    def backend(self) -> str:
        return "nccl" if self.ctx.device.type == "cuda" else "gloo"

    def setup_distributed(self) -> None:
        if self.ctx.device.type == "cuda":
            torch.cuda.set_device(self.ctx.device)
        # The launcher has put MASTER_ADDR/PORT, RANK and WORLD_SIZE in the environment.
        timeout = datetime.timedelta(seconds=float(os.environ.get("PARABENCH_PG_TIMEOUT_S", 300)))
        dist.init_process_group(
            self.backend,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            timeout=timeout,
            **({"device_id": self.ctx.device} if self.ctx.device.type == "cuda" else {}),
        )

    def all_mean(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.ctx.world_size

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        dist.barrier()

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class DistributedDataParallel(TorchDistributed):
    variants = {
        "ddp_torchrun": Variant(
            "torchrun", "DistributedDataParallel, processes started by torchrun"
        ),
        "ddp_spawn": Variant("spawn", "DistributedDataParallel, processes started by mp.spawn"),
    }

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        return DDP(model, device_ids=ids), optimizer
