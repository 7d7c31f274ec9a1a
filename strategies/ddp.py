"""torch DistributedDataParallel: one process per rank, gradients all-reduced in buckets.

One class, two registered names that differ only in how the processes are started
(torchrun vs torch.multiprocessing.spawn), as Lightning's `ddp` / `ddp_spawn`. DDP's own
knobs are options (`--set bucket_cap_mb=1,25,100` sweeps the bucket size, as PyTorch's
DDP benchmark does); accumulation uses `no_sync()`.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from strategies.base import Strategy, Variant


class TorchDistributed(Strategy):
    """Process-group plumbing shared by every torch.distributed strategy."""

    multiprocess = True
    no_sync_bn = ""  # SyncBatchNorm synchronises over the default process group

    @property
    def backend(self) -> str:
        return "nccl" if self.ctx.device.type == "cuda" and not self.ctx.shares_device else "gloo"

    def setup_distributed(self) -> None:
        if self.ctx.device.type == "cuda":
            torch.cuda.set_device(self.ctx.device)
        # The launcher has put RANK and WORLD_SIZE in the environment, and where the ranks
        # meet: MASTER_ADDR/PORT, or (mp.spawn's, on one host) a file, PARABENCH_STORE
        timeout = datetime.timedelta(seconds=float(os.environ.get("PARABENCH_PG_TIMEOUT_S", 300)))
        store = os.environ.get("PARABENCH_STORE")
        dist.init_process_group(
            self.backend,
            init_method=f"file://{store}" if store else None,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            timeout=timeout,
            **({"device_id": self.ctx.device} if self.backend == "nccl" else {}),
        )

    def all_mean(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.ctx.world_size

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather_to_root(self, obj: Any) -> list[Any] | None:
        out: list[Any] | None = [None] * self.ctx.world_size if self.ctx.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def barrier(self) -> None:
        dist.barrier()

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


#: DDP's broadcast_bucket_size: the buffers it broadcasts go out in buckets of this size
BROADCAST_BYTES = 250 * 2**20


def buckets(sizes: Iterable[int], first: float, cap: float) -> list[int]:
    """The bytes of each bucket torch's bucket assignment (compute_bucket_assignment_by_size,
    for one dtype) packs tensors of `sizes` into, in that order: whole tensors, a bucket
    closed once it holds `first` bytes (the first) or `cap` (the rest) or more."""
    out, held, limit = [], None, first
    for size in sizes:
        held = (held or 0) + size
        if held >= limit:
            out.append(held)
            held, limit = None, cap
    return out if held is None else [*out, held]


def flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


class DistributedDataParallel(TorchDistributed):
    variants = {
        "ddp_torchrun": Variant(
            "torchrun", "DistributedDataParallel, processes started by torchrun"
        ),
        "ddp_spawn": Variant("spawn", "DistributedDataParallel, processes started by mp.spawn"),
    }
    #: DDP's constructor knobs
    accepts = {"bucket_cap_mb": float, "gradient_as_bucket_view": bool, "static_graph": bool}
    #: gloo all-reduces and broadcasts CUDA tensors, all DDP (and ZeRO-1's broadcasts) needs;
    #: FSDP's reduce-scatter and the pipelines' send/recv it does not take on CUDA
    shares_gpu = True
    replicated = True

    @classmethod
    def traffic(cls, options, world_size, shape, precision):
        # DDP all-reduces the gradients in buckets of bucket_cap_mb (25 by default); left at
        # its default, the first bucket (the last layers') closes at 1 MiB
        cap = float(options.get("bucket_cap_mb", 25)) * 2**20
        # (torch's private constant, 1 MiB since DDP had it; the figure where a torch drops it)
        default_first = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20)
        first = cap if "bucket_cap_mb" in options else float(default_first)
        wire = cls.gradient_wire_bytes(options, shape)
        if shape.param_sizes is None:  # an older model.json: the total cut into caps
            calls = 1 + max(0, math.ceil((shape.param_bytes - first) / cap))
            return [("all_reduce", wire, calls)]
        # DDP never splits a tensor: at bucket_cap_mb=1, 4.8 MB of MNIST CNN went out as
        # two buckets (4.51 + 0.07 MiB), not five; its gradients come ready last layer first
        traffic = [("all_reduce", wire, len(buckets(reversed(shape.param_sizes), first, cap)))]
        # and with broadcast_buffers (its default) rank 0's buffers reach the others before
        # a forward, one broadcast per dtype (BatchNorm's float statistics and int64 counts:
        # two) up to 250 MiB each (DDP's broadcast_bucket_size); once an optimizer step
        # under --accumulate too, as a forward under no_sync() turns the next one's off
        by_dtype: dict[str, list[int]] = {}
        for dtype, nbytes in shape.buffer_sizes or ():
            by_dtype.setdefault(dtype, []).append(int(nbytes))
        calls = sum(
            len(buckets(sizes, BROADCAST_BYTES, BROADCAST_BYTES)) for sizes in by_dtype.values()
        )
        if calls:
            total = sum(map(sum, by_dtype.values()))
            traffic.append(("broadcast", float(total), calls))
        return traffic

    @classmethod
    def unsuitable(cls, cfg: Any, world_size: int, options: Mapping[str, str]) -> str | None:
        # torch's DDP with static_graph=True fails its first backward under no_sync() (an
        # INTERNAL ASSERT in the reducer), and the fix proposed upstream found that past it
        # the gradients were no longer all-reduced: accumulation cannot be measured with it
        if flag(options.get("static_graph", "false")) and max(cfg.accumulate) > 1:
            return (
                "static_graph=true with --accumulate: torch's DDP fails under no_sync() on "
                "the first micro-batch (pytorch/pytorch#143580)"
            )
        return super().unsuitable(cfg, world_size, options)

    def ddp_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if "bucket_cap_mb" in self.options:
            kw["bucket_cap_mb"] = float(self.options["bucket_cap_mb"])
        for key in ("gradient_as_bucket_view", "static_graph"):
            if key in self.options:
                kw[key] = flag(self.options[key])
        return kw

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        return DDP(model, device_ids=ids, **self.ddp_kwargs()), optimizer

    def no_sync(self) -> contextlib.AbstractContextManager:
        assert self.model is not None
        return self.unwrap_ddp().no_sync()

    def sync_off(self) -> contextlib.AbstractContextManager | None:
        if not isinstance(self.unwrap_ddp(), DDP):  # a subclass that does its own thing
            return None
        return self.no_sync()  # the optimizer step is local (ZeRO's broadcast stays)

    def run_notes(self) -> list[str]:
        # The buckets DDP settled on after its first step (what --set bucket_cap_mb changes).
        ddp = self.unwrap_ddp()
        if not isinstance(ddp, DDP):  # a subclass that does its own thing
            return super().run_notes()
        logged = ddp._get_ddp_logging_data()
        # (DDP rebuilds its buckets after the first step only across ranks: on one rank the
        # buckets it started with are those it kept)
        sizes = str(logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes", ""))
        mib = [int(x) / 2**20 for x in sizes.split(",") if x.strip().isdigit()]
        if not mib:
            return super().run_notes()
        listed = " + ".join(f"{m:.2f}" for m in mib)
        # Unless the gradients are views into the buckets, DDP copies each into its bucket
        # to all-reduce it: a second copy of the gradients the model-state columns leave out
        held = (
            "the gradients' own storage (gradient_as_bucket_view)"
            if flag(self.options.get("gradient_as_bucket_view", "false"))
            else "a copy of the gradients beside the model state"
        )
        return [*super().run_notes(), f"{len(mib)} gradient bucket(s): {listed} MiB, {held}"]

    def unwrap_ddp(self) -> DDP:
        """The DDP wrapper, under torch.compile's if any."""
        return getattr(self.model, "_orig_mod", self.model)
