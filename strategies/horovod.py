"""Horovod data parallelism: hvd.DistributedOptimizer all-reduces gradients, horovodrun starts ranks.

Gloo on CPU, NCCL on GPU where Horovod was built with it. Horovod 0.28.1 (its last
release) must be built against the installed torch: `make horovod`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from bench.config import one_line
from strategies.base import Strategy, Variant

INSTALL = "build it against this torch with `make horovod`"


class Horovod(Strategy):
    multiprocess = True
    replicated = True
    accepts = {"compression": ("none", "fp16")}
    no_sync_bn = (
        "torch's SyncBatchNorm needs a torch.distributed process group, which horovodrun "
        "does not create (horovod.torch.SyncBatchNorm is not wired here)"
    )
    contiguous_params = "Horovod's collectives refuse non-contiguous tensors"
    comm_unseen = (
        "Horovod runs its collectives in its own C++ background thread, which torch.profiler "
        "does not record (Horovod's own timeline does: HOROVOD_TIMELINE)"
    )
    variants = {
        "horovod": Variant("horovodrun", "Horovod DistributedOptimizer, horovodrun"),
        "horovod_fp16": Variant(
            "horovodrun",
            "Horovod with fp16 gradient compression, horovodrun",
            {"compression": "fp16"},
        ),
    }

    @classmethod
    def traffic(cls, options, world_size, shape, precision):
        # Horovod fuses gradients into all-reduces of up to 128 MiB (HOROVOD_FUSION_THRESHOLD
        # in 0.28.1, as horovodrun --help says: its timeline shows three 40 MiB gradients in
        # one all-reduce; its docs page still says 64), counted in the compressed dtype
        wire = cls.gradient_wire_bytes(options, shape)
        return [("all_reduce", wire, max(1, math.ceil(wire / (128 * 2**20))))]

    @classmethod
    def unavailable(cls, device: str) -> str | None:
        try:
            import horovod.torch as hvd
        except Exception as exc:  # ImportError, or a build that does not match this torch
            # the first line of the message only (an extension not built says what to set on
            # a second line), inside its parentheses
            detail = "" if isinstance(exc, ModuleNotFoundError) else f" ({one_line(exc)})"
            return f"Horovod is not installed{detail}; {INSTALL}"
        from bench.harness.launchers import horovodrun_path

        if horovodrun_path() is None:
            return f"horovodrun is not on PATH; {INSTALL}"
        if device == "cuda" and not hvd.nccl_built():
            return "this Horovod was built without NCCL; rebuild on the GPU machine with `make horovod`"
        return None

    @property
    def backend(self) -> str:
        return "nccl" if self.ctx.device.type == "cuda" else "gloo"

    def setup_distributed(self) -> None:
        import horovod.torch as hvd

        hvd.init()
        if self.ctx.device.type == "cuda":
            torch.cuda.set_device(self.ctx.device)

    @classmethod
    def compresses(cls, options) -> str:
        return "fp16" if options.get("compression", "none") == "fp16" else ""

    @classmethod
    def compressed_divide(cls, options) -> str:
        # op=Average: the ranks' fp16 gradients summed, then scaled by 1/size (postscale)
        return "after_sum"

    def numerics(self) -> tuple[str, ...]:
        extra = ("grad_fp16",) if self.compresses(self.options) else ()
        return (*super().numerics(), *extra)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        import horovod.torch as hvd

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # No hvd.broadcast_optimizer_state: the optimizer is new on every rank, with no state
        # to share, and Horovod fills an empty state by one optimizer step on zero gradients,
        # which AdamW's weight decay makes a real update (every weight shrunk by lr x decay
        # before the first batch, as no other strategy's was); DistributedOptimizer below
        # builds an optimizer of its own, which drops that state anyway.
        compression = (
            hvd.Compression.fp16 if self.compresses(self.options) else hvd.Compression.none
        )
        # Accumulation: Horovod counts backward passes and all-reduces after the last one.
        with _hooks_at_any_size():
            optimizer = hvd.DistributedOptimizer(
                optimizer,
                named_parameters=model.named_parameters(),
                compression=compression,
                backward_passes_per_step=self.setting.accumulate,
            )
        return model, optimizer

    local = False  # inside sync_off: no all-reduce in backward or step

    @contextlib.contextmanager
    def sync_off(self) -> Iterator[None]:
        """hvd.DistributedOptimizer all-reduces a gradient once `backward_passes_per_step`
        backward passes have reached it: a count no step reaches switches the hooks off, and
        the step skips its synchronize. Leaving, the hooks' empty handles are dropped, so the
        next ordinary zero_grad is accepted: synchronize() would all-reduce the local
        gradients of the step just taken (a whole step's traffic, for nothing) and make the
        next step warn of a synchronize without skip_synchronize()."""
        optimizer = self.optimizer
        assert optimizer is not None
        optimizer.set_backward_passes_per_step(1 << 30)
        self.local = True
        try:
            yield
        finally:
            self.local = False
            optimizer.set_backward_passes_per_step(self.setting.accumulate)
            # (None, None) for each gradient the held-back hooks saw (Horovod 0.28.1, its last
            # release, has no public call that forgets them); a Horovod without them is
            # settled as before, by a synchronize (the gradients all-reduced for nothing)
            handles = getattr(optimizer, "_handles", None)
            if isinstance(handles, dict):
                handles.clear()
            else:
                optimizer.synchronize()

    def zero_grad(self, optimizer) -> None:
        if self.local:  # the wrapper refuses zero_grad while its hooks hold (empty) handles
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
            return
        # Horovod's wrapper takes no arguments; torch's default (set_to_none=True) applies.
        optimizer.zero_grad()

    def optimizer_step(self, optimizer) -> None:
        if self.local:
            with optimizer.skip_synchronize():
                return self.precision_plugin.step(optimizer)
        if not self.precision_plugin.scaling:
            return super().optimizer_step(optimizer)
        # The scaler reads gradients (to unscale and look for inf) before step(): they must
        # be all-reduced by then, and step() must not synchronise a second time.
        optimizer.synchronize()
        self.precision_plugin.unscale(optimizer)
        with optimizer.skip_synchronize():
            self.precision_plugin.step(optimizer)

    def all_mean(self, t: torch.Tensor) -> torch.Tensor:
        import horovod.torch as hvd

        return hvd.allreduce(t, op=hvd.Average, name="parabench.epoch_mean")

    def gather(self, obj: Any) -> list[Any]:
        import horovod.torch as hvd

        return hvd.allgather_object(obj)

    def barrier(self) -> None:
        import horovod.torch as hvd

        hvd.barrier()

    def teardown(self) -> None:
        import horovod.torch as hvd

        hvd.shutdown()


@contextlib.contextmanager
def _hooks_at_any_size() -> Iterator[None]:
    """hvd.DistributedOptimizer registers its all-reduce hooks only past one rank, or where
    HOROVOD_ELASTIC=1 (horovod/torch/optimizer.py): a one-rank cell would be `single` with no
    all-reduce and no compression, as DDP's one-rank cell is not. The variable is set while
    the optimizer is built only (elsewhere it switches Horovod to its elastic mode)."""
    old = os.environ.get("HOROVOD_ELASTIC")
    os.environ["HOROVOD_ELASTIC"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["HOROVOD_ELASTIC"]
        else:
            os.environ["HOROVOD_ELASTIC"] = old
