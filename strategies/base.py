"""The one interface every parallel-training strategy implements.

`train_epoch` is written once, here. A strategy changes behaviour by overriding hooks
(`setup`, `backward`, `optimizer_step`, `sampler`, ...), never the loop, so every
strategy is timed by the same code and differences in the numbers come from the
strategy, not from its loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler, Sampler

from bench.probes import StepRecord, StepTimer, memory_snapshot


@dataclass(frozen=True)
class Variant:
    """One registered name of a strategy class: how it is launched, with which options."""

    launcher: str  # "inprocess" | "spawn" | "torchrun" | "horovodrun"
    description: str
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """Where this process sits in the job; built by the worker from the launcher's env."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    seed: int


@dataclass(frozen=True, kw_only=True)
class EpochStats:
    """What one rank measured in one epoch. Rank 0 merges these into CSV rows."""

    epoch: int
    steps: int
    warmup_steps: int
    samples: int  # samples this rank processed in timed (post-warm-up) steps
    timed_s: float  # wall time of the timed steps
    step_times_ms: tuple[float, ...]  # every step, warm-up included (flagged by index)
    data_wait_ms: tuple[float, ...]
    losses: tuple[float, ...]  # per step, averaged over ranks once at epoch end
    memory: Mapping[str, float]


class Strategy:
    """Base class: a single process on one device, with hooks that do nothing extra."""

    variants: ClassVar[dict[str, Variant]] = {}
    #: one OS process per rank (DDP, Horovod) vs one process for all devices (DP)
    multiprocess: ClassVar[bool] = False
    #: numeric precision the strategy trains in; rows and parity tolerances use it
    precision: ClassVar[str] = "fp32"
    #: options this strategy takes through `--set key=value`, with their allowed values
    accepts: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, ctx: RankContext, options: Mapping[str, str] | None = None) -> None:
        self.ctx = ctx
        self.options = dict(options or {})
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.notes: list[str] = []

    @classmethod
    def processes(cls, world_size: int) -> int:
        """OS processes a cell of this strategy runs: one per rank, or one for all devices.
        Batch split, sampler replicas, threads and loader workers all follow from it."""
        return world_size if cls.multiprocess else 1

    # ---- capability checks (class level: called before any process starts) ----
    @classmethod
    def unavailable(cls, device: str) -> str | None:
        """Why this strategy cannot run on this machine at all, or None."""
        return None

    @classmethod
    def cannot_run(cls, world_size: int, device: str, n_devices: int) -> str | None:
        """Why this strategy cannot run at `world_size` here, or None."""
        if not cls.multiprocess and world_size != 1:
            return f"{cls.__name__} runs one process on one device: world size is always 1"
        if cls.multiprocess and device == "cuda" and world_size > n_devices:
            return f"one rank per GPU: world size {world_size} needs {world_size} GPUs, found {n_devices}"
        if cls.multiprocess and device == "cpu" and world_size > n_devices:
            return f"one CPU core per rank at least: world size {world_size} needs {world_size} cores, found {n_devices}"
        return None

    # ---- hooks ----
    def devices(self) -> list[torch.device]:
        """The devices this process drives (memory is read on each)."""
        return [self.ctx.device]

    def setup_distributed(self) -> None:
        """Join the process group (multi-process strategies)."""

    def per_rank_batch(self, global_batch: int) -> int:
        # A process that drives several devices (DataParallel) takes the whole global batch
        # and splits it across them itself.
        return global_batch // self.processes(self.ctx.world_size)

    def sampler(self, dataset: Any, *, shuffle: bool = True) -> Sampler:
        # One replica per process; the single baseline and DataParallel use the same sampler
        # with one replica, so every strategy sees the same sample order for a given seed.
        return DistributedSampler(
            dataset,
            num_replicas=self.processes(self.ctx.world_size),
            rank=self.ctx.rank,
            shuffle=shuffle,
            seed=self.ctx.seed,
            drop_last=True,
        )

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        return model, optimizer

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert self.model is not None
        with self.autocast():
            return F.cross_entropy(self.model(x), y)

    def zero_grad(self, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self, optimizer: Any) -> None:
        optimizer.step()

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module under any wrapper, for evaluation and parity checks."""
        return getattr(model, "module", model)

    def all_mean(self, t: torch.Tensor) -> torch.Tensor:
        """Mean over ranks; called once per epoch, never per step."""
        return t

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        return [obj]

    def barrier(self) -> None:
        """Wait for every rank (outside timed regions only)."""

    def teardown(self) -> None:
        """Leave the process group."""

    # ---- the loop, written once ----
    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = self.setup(model, optimizer)

    def train_epoch(
        self, loader: Iterable, epoch: int, *, max_steps: int | None = None, warmup_steps: int = 0
    ) -> EpochStats:
        assert self.model is not None and self.optimizer is not None, "call attach() first"
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        self.model.train()
        timer = StepTimer(self.ctx.device)
        losses: list[torch.Tensor] = []
        records: list[StepRecord] = []
        batches: Iterator = iter(loader)
        while max_steps is None or len(records) < max_steps:
            timer.start()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            x = x.to(self.ctx.device, non_blocking=True)
            y = y.to(self.ctx.device, non_blocking=True)
            timer.data_ready()
            self.zero_grad(self.optimizer)
            loss = self.forward_loss(x, y)
            self.backward(loss)
            self.optimizer_step(self.optimizer)
            records.append(timer.stop(len(y)))
            losses.append(loss.detach())
        return self._epoch_stats(epoch, records, losses, warmup_steps)

    def _epoch_stats(
        self, epoch: int, records: list[StepRecord], losses: list[torch.Tensor], warmup: int
    ) -> EpochStats:
        warmup = min(warmup, max(len(records) - 1, 0))
        timed = records[warmup:]
        local = torch.stack(losses).float() if losses else torch.zeros(0, device=self.ctx.device)
        mean_losses = self.all_mean(local).cpu().tolist()
        return EpochStats(
            epoch=epoch,
            steps=len(records),
            warmup_steps=warmup,
            samples=sum(r.samples for r in timed),
            timed_s=sum(r.total_ms for r in timed) / 1e3,
            step_times_ms=tuple(r.total_ms for r in records),
            data_wait_ms=tuple(r.data_ms for r in records),
            losses=tuple(mean_losses),
            memory=memory_snapshot(self.devices()),
        )
