"""Tensor parallelism (`torch.distributed.tensor.parallel`): each attention's q, k, v split
column-wise (whole heads per rank) and its output projection row-wise; each MLP's first
layer column-wise and its second row-wise (Megatron's plan). Every tensor-parallel rank
sees the same batch; a block's forward all-reduces once after its attention and once
after its MLP, its backward four times (the input gradients of q, k and v, each a layer of
its own, and of the MLP's first layer): a block of an MLP alone, once each way. Embedding, norms and head are replicated.

- `tp`: tensor parallel over every rank (one data-parallel replica).
- `fsdp_tp`: 2-D, tensor parallel within groups of `--set tp=2` ranks and FSDP2 across
  the groups (torchtitan's layout): at world size 4, two data-parallel replicas of a
  model split in two.

The rows carry the bytes handed to collectives per optimizer step (summed over ranks),
counted on the first step by a dispatch mode that sees every functional and c10d
collective op (not under --compile: dynamo compiles nothing while a dispatch mode is on).
The mode slows the step it watches: a run with --warmup-steps 0, which would time it,
skips these cells with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from bench.workload.models import MLP, Attention, meta_model
from strategies.base import Variant
from strategies.ddp import TorchDistributed
from strategies.fsdp import FSDP2, rebuild


def tp_plan(model: nn.Module) -> dict[str, Any]:
    """Megatron's plan for every attention and MLP of `model`, by module path."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            for part in ("q", "k", "v"):
                plan[f"{name}.{part}"] = ColwiseParallel()
            plan[f"{name}.proj"] = RowwiseParallel()
        elif isinstance(module, MLP):
            plan[f"{name}.fc1"] = ColwiseParallel()
            plan[f"{name}.fc2"] = RowwiseParallel()
    return plan


def tp_problem(cfg: Any, tp: int) -> str | None:
    """Why the run's model cannot be split over `tp` ranks, or None (checked on meta)."""
    model = meta_model(cfg)
    attn = [m for m in model.modules() if isinstance(m, Attention)]
    # MLP blocks alone split too (tp_plan): a model of yours made of them was refused as
    # having none
    if not attn and not any(isinstance(m, MLP) for m in model.modules()):
        return (
            f"model {cfg.model} has no attention or MLP blocks with separate projections to "
            "split (use --model transformer or lm, or build yours of "
            "bench.workload.models.Attention / MLP)"
        )
    # each attention's own heads (a model of yours built from Attention need not say them)
    for heads in (a.q.out_features // a.head_dim for a in attn):
        if heads % tp:
            heads_ = f"{heads} attention head{'s' if heads != 1 else ''}"
            return f"{heads_} cannot be split over {tp} tensor-parallel ranks"
    # each MLP's hidden units, split with fc1's outputs (a model of yours may size them
    # apart from the heads): uneven, fc2's rows and the shares fc1 gives it disagree
    for hidden in (m.fc1.out_features for m in model.modules() if isinstance(m, MLP)):
        if hidden % tp:
            return (
                f"an MLP of {hidden} hidden units cannot be split over {tp} tensor-parallel "
                "ranks (they must divide it)"
            )
    return None


def counted_untimed(cfg: Any) -> str | None:
    """Why the step the bytes are counted in would be timed, or None. The counting mode adds
    Python work to every op of the first step: with no warm-up step to hold it, that step is
    timed (verify times nothing and has no warm-up: its steps are compared, not timed)."""
    if not cfg.save_params and cfg.warmup_steps == 0:
        return (
            "the bytes of its collectives are counted in its first step, under a mode that "
            "adds Python work to every op: --warmup-steps 0 would time that step; give "
            "--warmup-steps 1 or more"
        )
    return None


class CollectiveBytes(TorchDispatchMode):
    """Counts the bytes of the tensors handed to collectives while it is active."""

    NAMESPACES = ("_c10d_functional", "c10d")
    #: collectives by name (not the waits and autograd wrappers around them)
    KINDS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "all_to_all")
    KINDS += ("alltoall", "broadcast")

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        space, _, name = func._schema.name.partition("::")
        if space in self.NAMESPACES and any(k in name for k in self.KINDS):
            first = args[0] if args else None
            tensors = first if isinstance(first, list | tuple) else [first]
            self.bytes += sum(
                t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)
            )
            self.calls += 1
        return func(*args, **(kwargs or {}))


class TensorParallelMixin:
    """The tensor-parallel half: the plan, the batch it shares, the bytes it moves."""

    ctx: Any
    options: dict[str, str]
    notes: list[str]
    setting: Any

    @classmethod
    def tp_of(cls, world_size: int, options: Mapping[str, str]) -> int:
        """Ranks in one tensor-parallel group: all of them, unless a 2-D mesh says fewer."""
        return world_size

    @classmethod
    def batch_shares(cls, world_size: int, options: Mapping[str, str]) -> int:
        # one per TP group; the mesh is (dp, tp), row-major: consecutive ranks share one
        return max(1, world_size // cls.tp_of(world_size, options))

    def tp_size(self) -> int:
        return self.tp_of(self.ctx.world_size, self.options)

    def parallelize(self, model: nn.Module, mesh) -> nn.Module:
        from torch.distributed.tensor.parallel import parallelize_module

        plan = tp_plan(model)
        parallelize_module(model, mesh, plan)
        self.notes.append(
            f"tensor parallel over {mesh.size()} ranks: {len(plan)} linear layers split "
            "(q/k/v, fc1 column-wise; proj, fc2 row-wise)"
        )
        if self.setting.compile:
            self.notes.append(
                "bytes of collectives not counted under torch.compile (dynamo compiles "
                "nothing while the counting mode is on: the compile would fall in a timed step)"
            )
        return model

    comm: CollectiveBytes | None = None
    steps_seen = 0

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.steps_seen += 1
        if self.steps_seen > 1 or self.setting.compile:
            return super().forward_backward(x, y)  # type: ignore[misc]
        # The first step (a warm-up step) is counted; the mode costs Python per op.
        self.comm = CollectiveBytes()
        with self.comm:
            return super().forward_backward(x, y)  # type: ignore[misc]

    def cell_metrics(self, warmup_steps: int) -> dict[str, Any]:
        sent = self.comm.bytes if self.comm else float("nan")  # (not counted: compiled)
        every = self.gather(sent)  # type: ignore[attr-defined]
        return {"collective_mib_per_step": sum(every) / 2**20}


class TensorParallel(TensorParallelMixin, TorchDistributed):
    variants = {
        "tp": Variant(
            "torchrun",
            "tensor parallel over all ranks (heads and MLP split); every rank sees the batch",
        )
    }
    precisions = ("fp32", "bf16")
    # checked: GradScaler's overflow check got the sharded weights' gradients (DTensors)
    # beside the unsplit ones' plain tensors, which DTensor refuses (fsdp_tp's are all DTensors)
    precisions_why = (
        "fp16's loss scaling cannot check its split and unsplit weights' gradients together"
    )
    no_sync_bn = "tensor-parallel ranks share one batch: there are no data-parallel ranks"
    collective_eval = True  # every rank's shard takes part in each forward

    @classmethod
    def unsuitable(cls, cfg: Any, world_size: int, options: Mapping[str, str]) -> str | None:
        if world_size < 2:
            return "tensor parallelism needs at least 2 ranks (at world size 1 it is `single`)"
        return tp_problem(cfg, world_size) or counted_untimed(cfg)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        model = self.parallelize(model, mesh)
        return model, rebuild(optimizer, model.parameters())

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.unwrap(self.model), options=opts)


class FSDPTensorParallel(TensorParallelMixin, FSDP2):
    variants = {
        "fsdp_tp": Variant(
            "torchrun",
            "2-D: tensor parallel within groups of --set tp ranks, FSDP2 across the groups",
            {"tp": "2"},
        )
    }
    accepts = {"tp": int, "reshard_after_forward": bool}
    # SyncBatchNorm converts over the default group: every rank, each tensor-parallel peer's
    # copy of its share counted again (its running variance's count doubled, its traffic
    # over all ranks, not the data-parallel groups alone)
    no_sync_bn = (
        "SyncBatchNorm would synchronise over every rank, and tensor-parallel ranks share "
        "one batch (each share counted tp times); syncing over the data-parallel groups "
        "alone is not wired"
    )
    #: FSDP's ablation stops the gradients' reduce-scatter only: the all-gathers and the
    #: tensor-parallel all-reduces of every block run in both halves
    ablation_keeps = "FSDP's parameter all-gathers and tensor parallelism's all-reduces"

    @classmethod
    def tp_of(cls, world_size: int, options: Mapping[str, str]) -> int:
        return int(options.get("tp", 2))

    @classmethod
    def traffic(cls, options, world_size, shape, precision):
        return "tensor parallel's activations and the 2-D mesh are not modelled"

    @classmethod
    def unsuitable(cls, cfg: Any, world_size: int, options: Mapping[str, str]) -> str | None:
        tp = cls.tp_of(world_size, options)
        if tp < 2:
            # tp=1 splits nothing: the world-size rule below would name sizes that all fail
            return f"tp={tp} splits nothing (that is `fsdp`): fsdp_tp takes tp=2 or more"
        if world_size % tp or world_size // tp < 2:
            return (
                f"2-D needs at least 2 data-parallel groups of tp={tp} ranks: world size "
                f"must be a multiple of tp={tp} and at least {2 * tp}, got {world_size}"
            )
        return tp_problem(cfg, tp) or counted_untimed(cfg)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        from torch.distributed.device_mesh import init_device_mesh

        tp = self.tp_size()
        mesh = init_device_mesh(
            self.ctx.device.type, (self.ctx.world_size // tp, tp), mesh_dim_names=("dp", "tp")
        )
        model = self.parallelize(model, mesh["tp"])
        return self.shard(model, optimizer, mesh["dp"])
