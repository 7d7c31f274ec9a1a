"""The one interface every parallel-training strategy implements.

`train_epoch` is written once, here. A strategy changes behaviour by overriding hooks
(`setup`, `backward`, `optimizer_step`, `sampler`, ...), never the loop, so every
strategy is timed by the same code and differences in the numbers come from the
strategy, not from its loop.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.utils.data import DistributedSampler, Sampler

from bench.config import CUDA_GRAPH_MODES, either
from bench.harness.env import oversubscribed
from bench.harness.probes import (
    PHASES,
    SPARSE_EVERY_S,
    HeldReads,
    PhaseClock,
    StepRecord,
    StepTimer,
    memory_snapshot,
    model_state_mib,
)
from bench.workload.models import cross_entropy, norm_layers
from strategies import precision as prec

#: the wrappers whose `module` is the model they wrap (a strategy that wraps it in another
#: overrides Strategy.unwrap); a model's own submodule named `module` (a backbone kept as
#: self.module) is part of the model: taken for it, evaluation ran the backbone alone and
#: the model state left out the rest
WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


#: what the communication ablation leaves running under --sync-bn (Strategy.kept_by_ablation)
SYNC_BN_KEPT = "SyncBatchNorm's batch-statistics collectives"
#: a --sync-bn cell's note where the model has no BatchNorm layer: SyncBatchNorm kept nothing
NO_BN_TO_SYNC = "no BatchNorm layers to sync"


@dataclass(frozen=True)
class Variant:
    """One registered name of a strategy class: how it is launched, with which options."""

    launcher: str  # "inprocess" | "spawn" | "torchrun" | "horovodrun"
    description: str
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Setting:
    """The run options applied around a strategy, each a matrix axis: the precision it trains
    in, torch.compile, gradient accumulation (micro-batches per optimizer step) and SyncBN.
    They are applied in one place (`Strategy.attach` and the loop), in a fixed order:
    SyncBN conversion, the strategy's own wrapping or sharding, then compile."""

    precision: str = "fp32"
    compile: bool = False
    #: torch.compile's mode where compile is on (`--compile-mode`): "default",
    #: "reduce-overhead" (CUDA graphs), "max-autotune", "max-autotune-no-cudagraphs"
    compile_mode: str = "default"
    accumulate: int = 1
    sync_bn: bool = False
    #: NHWC memory format for the model and its 4-D inputs (what tensor cores prefer)
    channels_last: bool = False

    @property
    def cuda_graphs(self) -> bool:
        """Compiled in a mode that captures CUDA graphs (on a CUDA device)."""
        return self.compile and self.compile_mode in CUDA_GRAPH_MODES

    @property
    def label(self) -> str:
        """Compact and unique, e.g. `bf16,compile,acc2,syncbn,cl` (`compile-reduce-overhead`
        in another mode); used in cell names and rows."""
        parts = [self.precision]
        if self.compile:
            default = self.compile_mode == "default"
            parts.append("compile" if default else f"compile-{self.compile_mode}")
        if self.accumulate > 1:
            parts.append(f"acc{self.accumulate}")
        if self.sync_bn:
            parts.append("syncbn")
        if self.channels_last:
            parts.append("cl")
        return ",".join(parts)


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """Where this process sits in the job; built by the worker from the launcher's env."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    seed: int
    #: more ranks than GPUs on this host (--oversubscribe): they share them, over gloo
    shares_device: bool = False


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
    #: bytes this rank holds of parameters, gradients and optimizer state (MiB), read after
    #: the epoch's steps, local shards only
    model_state: Mapping[str, float] = field(default_factory=dict)
    #: per step (warm-up included), milliseconds of forward, backward and optimizer
    phase_ms: tuple[Mapping[str, float], ...] = ()
    #: per step (warm-up included), MiB this rank held at its end (probes.HeldReads: on
    #: CUDA NaN at a step ended within 20 ms of the last read)
    held_mib: tuple[float, ...] = ()
    #: on a CPU, per step (warm-up included), MiB glibc's malloc held free at its end (in the
    #: resident set, no tensor's; probes.HeldReads.malloc_free: NaN between reads); none
    #: on CUDA
    malloc_free_mib: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What the communication of a step depends on: bytes of the parameters (fp32; the
    gradients are as many), how many tensors they are, how many units FSDP shards one by
    one (its blocks, without the root) and the root's own bytes."""

    param_bytes: int
    tensors: int
    units: int
    #: bytes of the parameters outside those units (FSDP's root keeps them gathered)
    root_bytes: int = 0
    #: the same in bf16/fp16 with a unit per BatchNorm layer (FSDP's `norm_units=layer`;
    #: 0: not recorded, as the fp32 layout), those layers' bytes, and how many of them FSDP
    #: shards as one unit by default (0: a unit each, as where `fsdp.ungroupable` says they
    #: cannot be one, and in a model.json written before FSDP grouped them)
    low_units: int = 0
    low_root_bytes: int = 0
    norm_bytes: int = 0
    norm_layers: int = 0
    #: every BatchNorm layer (--sync-bn makes each a SyncBatchNorm, which synchronises its
    #: statistics in every forward and backward) and their channels together; None: not
    #: recorded (a model.json written before predict modelled --sync-bn)
    batch_norms: int | None = None
    batch_norm_channels: int | None = None
    #: bytes of each parameter in the model's order (DDP buckets whole tensors, so its
    #: all-reduces follow these, not the total) and (dtype, bytes) of each buffer (DDP
    #: broadcasts them before a step's forward); None: not recorded (a model.json written
    #: before predict counted DDP's buckets and broadcasts)
    param_sizes: Sequence[int] | None = None
    buffer_sizes: Sequence[Sequence[Any]] | None = None


#: one step's collectives per rank: (op, bytes of the whole buffer, calls it is split into)
Traffic = list[tuple[str, float, int]]

#: bytes of one of SyncBatchNorm's statistics: torch computes them in float32 (the
#: accumulation type) under bf16 and fp16 too
SYNC_BN_STAT_BYTES = 4


def sync_bn_traffic(world_size: int, shape: ModelShape) -> Traffic | str:
    """The collectives SyncBatchNorm issues on each rank for one micro-batch, besides the
    strategy's own (torch/nn/modules/_functions.py): each BatchNorm layer's forward
    all-gathers every rank's mean, inverse deviation and count (2C + 1 numbers of C
    channels; the gathered buffer is world_size times that) and its backward all-reduces
    two sums per channel (2C). Both are blocking and small (latency-bound). Or why they are
    not modelled: a model.json that does not count the BatchNorm layers."""
    if shape.batch_norms is None or shape.batch_norm_channels is None:
        return (
            "--sync-bn's statistics collectives are not modelled: model.json does not count "
            "the model's BatchNorm layers (written before predict modelled them; a new run "
            "records them)"
        )
    layers, channels = shape.batch_norms, shape.batch_norm_channels
    if not layers:  # no BatchNorm: SyncBatchNorm converted nothing
        return []
    size = SYNC_BN_STAT_BYTES
    return [
        ("all_gather", world_size * (2 * channels + layers) * size, layers),
        ("all_reduce", 2 * channels * size, layers),
    ]


class Strategy:
    """Base class: a single process on one device, with hooks that do nothing extra."""

    variants: ClassVar[dict[str, Variant]] = {}
    #: one OS process per rank (DDP, Horovod) vs one process for all devices (DP)
    multiprocess: ClassVar[bool] = False
    #: its ranks can share a GPU (with --oversubscribe, more ranks than GPUs) over gloo, which
    #: takes CUDA tensors for all-reduce and broadcast only; nccl refuses two ranks on one GPU
    shares_gpu: ClassVar[bool] = False
    #: options this strategy takes through `--set key=value`: allowed values, or a type
    #: (int, float, bool) whose values it takes
    accepts: ClassVar[dict[str, tuple[str, ...] | type]] = {}
    #: values of the precision axis it can train in
    precisions: ClassVar[tuple[str, ...]] = prec.PRECISIONS
    #: why it trains in those alone (said after them when another is asked for); empty: nothing
    precisions_why: ClassVar[str] = ""
    #: why it cannot run with --compile / --accumulate K / --sync-bn; empty: it can
    no_compile: ClassVar[str] = ""
    no_accumulate: ClassVar[str] = ""
    no_sync_bn: ClassVar[str] = "one process: SyncBatchNorm needs ranks to synchronise with"
    #: every rank must take part in evaluation and in reading the full weights (sharded models)
    collective_eval: ClassVar[bool] = False
    #: every rank holds the whole model and, after each step, the same weights (data
    #: parallelism): `parabench verify`, which compares rank 0's weights with the baseline,
    #: checks the other ranks' against rank 0's (a rank that fell out of step is a FAIL)
    replicated: ClassVar[bool] = False
    #: why torch.profiler cannot see this strategy's collectives (then the probe's
    #: communication total is unknown, not 0); empty: it sees them (c10d's gloo and NCCL)
    comm_unseen: ClassVar[str] = ""
    #: whether a step under sync_off() has local gradients for its optimizer step; FSDP's
    #: stay on the unsharded parameters, so its ablation compares forward and backward only
    sync_off_steps_optimizer: ClassVar[bool] = True
    #: the collectives sync_off() leaves running, in words (empty: none): the ablation's
    #: exposed time then leaves them out while the profiler's total holds them, so their
    #: ratio is no share of all the communication, and predict assumes none of it hidden
    ablation_keeps: ClassVar[str] = ""
    #: the ops of `traffic` issued for every micro-batch, not once an optimizer step: under
    #: --accumulate K the gradients are reduced at the last micro-batch alone, but what each
    #: forward and backward needs runs K times (FSDP gathers its parameters again for each)
    per_micro_batch: ClassVar[tuple[str, ...]] = ()
    #: under --channels-last, why the parameters stay contiguous (NCHW) and only the inputs
    #: are NHWC (a convolution runs NHWC when either is); empty: both are converted
    contiguous_params: ClassVar[str] = ""

    def __init__(
        self,
        ctx: RankContext,
        options: Mapping[str, str] | None = None,
        setting: Setting | None = None,
    ) -> None:
        self.ctx = ctx
        self.options = dict(options or {})
        self.setting = setting or Setting(
            precision=self.default_precision(ctx.device.type, self.options)
        )
        self.precision_plugin = self.make_precision(self.setting.precision)
        #: what the precision column says (e.g. bf16, apex_O2)
        self.precision = self.setting.precision
        self.model: nn.Module | None = None
        #: (output, target) -> loss; the worker sets the model's (bench.workload.models.loss_of)
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy
        self.optimizer: torch.optim.Optimizer | None = None
        self.notes: list[str] = []
        self.model_state: dict[str, float] = {}
        #: laps of the current epoch's steps (forward, backward, optimizer)
        self.clock = PhaseClock(ctx.device)
        #: the last batch trained on, kept for the probes after the timed steps
        self.last_batch: tuple[torch.Tensor, torch.Tensor] | None = None
        #: whether this rank's evaluation is past the last collective it takes part in (a
        #: pipeline's rank 0 once the weights are gathered): where `collective_eval`, a
        #: failure after it, on this rank alone, leaves no peer waiting, so the row fails
        #: with its reason and keeps the measured steps, where the cell failed
        self.evaluating_alone = False

    @classmethod
    def processes(cls, world_size: int) -> int:
        """OS processes a cell of this strategy runs: one per rank, or one for all devices.
        Batch split, sampler replicas, threads and loader workers all follow from it."""
        return world_size if cls.multiprocess else 1

    @classmethod
    def batch_shares(cls, world_size: int, options: Mapping[str, str]) -> int:
        """How many different, equal parts of each global batch a cell trains at once: one
        per device by default (DataParallel's one process cuts its batch across its
        devices); fewer under model parallelism, whose ranks share a batch. plan() refuses a
        global batch that these do not divide, before anything starts, and skips a cell
        whose shares do not cut into its --accumulate's equal micro-batches."""
        return world_size

    @classmethod
    def traffic(
        cls, options: Mapping[str, str], world_size: int, shape: ModelShape, precision: str
    ) -> Traffic | str:
        """The collectives one optimizer step of one micro-batch issues on each rank at
        `world_size`, for the scaling predictor (bench.analysis.predict), which repeats the
        `per_micro_batch` ops under --accumulate; or why they are not modelled."""
        if not cls.multiprocess:
            return "one process: no collectives between ranks"
        return f"{cls.__name__}'s communication is not modelled"

    # ---- capability checks (class level: called before any process starts) ----
    @classmethod
    def unavailable(cls, device: str) -> str | None:
        """Why this strategy cannot run on this machine at all, or None."""
        return None

    @classmethod
    def default_precision(cls, device: str, options: Mapping[str, str]) -> str:
        """The precision a cell runs in when `--precision` is not given."""
        return "fp32"

    @classmethod
    def unsupported(cls, setting: Setting, device: str) -> str | None:
        """Why this strategy cannot run with these run options, or None."""
        if setting.precision not in cls.precisions:
            why = f": {cls.precisions_why}" if cls.precisions_why else ""
            return f"trains in {' | '.join(cls.precisions)} only, not {setting.precision}{why}"
        if setting.compile and cls.no_compile:
            return cls.no_compile
        if setting.accumulate > 1 and cls.no_accumulate:
            return cls.no_accumulate
        if setting.sync_bn:
            if cls.no_sync_bn:
                return cls.no_sync_bn
            if device != "cuda":
                return (
                    "SyncBatchNorm needs GPU modules in torch (on CPU it raises "
                    "'SyncBatchNorm layers only work with GPU modules')"
                )
        return None

    @classmethod
    def cannot_run(
        cls, world_size: int, device: str, n_devices: int, oversubscribe: bool = False
    ) -> str | None:
        """Why this strategy cannot run at `world_size` here, or None. `oversubscribe`: more
        CPU ranks than cores are allowed (for correctness; such rows are not ranked by speed)."""
        if not cls.multiprocess and world_size != 1:
            return f"{cls.__name__} runs one process on one device: world size is always 1"
        if cls.multiprocess and device == "cuda" and world_size > n_devices:
            if oversubscribe and cls.shares_gpu:
                return None
            return (
                f"one rank per GPU: world size {world_size} needs {world_size} GPUs, found "
                f"{n_devices}; nccl refuses two ranks on one GPU"
                + (
                    either(
                        "--oversubscribe runs its ranks on the shared GPU over gloo, for correctness",
                        form=" ({})",
                    )
                    if cls.shares_gpu
                    else ""
                )
            )
        # on a CPU, n_devices is its cores: env.oversubscribed's rule, one rank a core at most
        cpu = cls.multiprocess and device == "cpu"
        if cpu and oversubscribed(world_size, n_devices) and not oversubscribe:
            return (
                f"one CPU core per rank at least: world size {world_size} needs {world_size} "
                f"cores, found {n_devices}"
                + either("--oversubscribe runs it anyway, for correctness", form=" ({})")
            )
        return None

    @classmethod
    def accepted(cls, variant_options: Mapping[str, str]) -> dict[str, tuple[str, ...] | type]:
        """The --set options one of its variants takes, given that variant's own options:
        `accepts`, less any a variant makes meaningless (a hook that is not PowerSGD takes
        no PowerSGD options), so a sweep never records a value that changed nothing."""
        return dict(cls.accepts)

    @classmethod
    def idle_options(cls, cfg: Any, setting: Setting, options: Mapping[str, str]) -> dict[str, str]:
        """The --set options among `options` that change nothing in a cell of this run's
        model in `setting` (FSDP's norm_units in fp32), each with why: plan() runs those
        cells once without them, so no row records a value that changed nothing."""
        return {}

    @classmethod
    def unsuitable(cls, cfg: Any, world_size: int, options: Mapping[str, str]) -> str | None:
        """Why this strategy cannot train this run's model or batch at `world_size` with
        these options (a model it cannot split, a batch its micro-batches do not divide), or
        None. `cfg` is the run's RunConfig as the cell sees it (its `accumulate` the cell's
        alone); called before any process starts."""
        return None

    # ---- hooks ----
    def devices(self) -> list[torch.device]:
        """The devices this process drives (memory is read on each)."""
        return [self.ctx.device]

    def setup_distributed(self) -> None:
        """Join the process group (multi-process strategies)."""

    def data_ranks(self) -> tuple[int, int]:
        """(data-parallel replicas, this process's index among them): how many different
        shares of each global batch are trained at once, from `batch_shares` (so the two
        never disagree): one per process by default (DataParallel's one process cuts its
        share over its devices itself); fewer under model parallelism, whose consecutive
        ranks share one (tensor-parallel groups, pipeline stages)."""
        ws = self.ctx.world_size
        per_process = max(1, ws // self.processes(ws))  # devices one process drives
        replicas = max(1, self.batch_shares(ws, self.options) // per_process)
        return replicas, self.ctx.rank * replicas // ws

    def per_rank_batch(self, global_batch: int) -> int:
        # A process that drives several devices (DataParallel) takes the whole global batch
        # and splits it across them itself.
        return global_batch // self.data_ranks()[0]

    def sampler(self, dataset: Any, *, shuffle: bool = True) -> Sampler:
        # One replica per data-parallel share; the single baseline and DataParallel use the
        # same sampler with one replica, so every strategy sees the same sample order.
        replicas, index = self.data_ranks()
        return DistributedSampler(
            dataset,
            num_replicas=replicas,
            rank=index,
            shuffle=shuffle,
            seed=self.ctx.seed,
            drop_last=True,
        )

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        return model, optimizer

    def make_precision(self, name: str) -> prec.Precision:
        """The precision plugin for the precision axis value `name`."""
        return prec.make(name, self.ctx.device.type)

    @classmethod
    def compresses(cls, options: Mapping[str, str]) -> str:
        """The dtype ("fp16", "bf16") these options compress the gradients to for their
        all-reduce, or "" (verify runs a reference of that rounding alone, and says so in
        its --dry-run before any cell has run)."""
        return ""

    @classmethod
    def compressed_divide(cls, options: Mapping[str, str]) -> str:
        """Where the compressed all-reduce of these options divides by the ranks:
        "before_sum", each rank's rounded gradient divided, then summed in the 16-bit dtype
        (torch's fp16/bf16 comm hooks), or "after_sum", the sum divided (Horovod's Average).
        In fp16 the two differ where a gradient is subnormal (under 6.1e-5), and under Adam
        such components move weights by whole steps; verify's reference follows the cell's."""
        return "before_sum"

    @classmethod
    def gradient_wire_bytes(cls, options: Mapping[str, str], shape: ModelShape) -> float:
        """Bytes of gradients one step all-reduces in full: half where these options compress
        them to a 16-bit dtype (`compresses`), as DDP's fp16/bf16 hooks and Horovod's fp16
        compression do."""
        return shape.param_bytes / (2 if cls.compresses(options) else 1)

    def numerics(self) -> tuple[str, ...]:
        """The numeric recipe, as parts that each carry a parity tolerance (bench.analysis.verify):
        `autocast_bf16`, `grad_fp16` (compressed gradients), `powersgd`, ...; () is exact fp32."""
        p = self.precision_plugin
        return () if p.dtype is None else (f"autocast_{p.name}",)

    def autocast(self) -> contextlib.AbstractContextManager:
        return self.precision_plugin.autocast()

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert self.model is not None
        with self.autocast():
            return self.loss_fn(self.model(x), y)

    def zero_grad(self, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        self.precision_plugin.backward(loss)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Around every micro-batch but the last of an optimizer step: keep gradients local.
        Nothing to do for one process; DDP uses `no_sync()`, FSDP2 `set_requires_gradient_sync`."""
        return contextlib.nullcontext()

    def optimizer_step(self, optimizer: Any) -> None:
        self.precision_plugin.step(optimizer)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module under any wrapper (compile, DDP, DP), for evaluation and parity."""
        model = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
        return model.module if isinstance(model, WRAPPERS) else model

    def eval_module(self) -> nn.Module | None:
        """The module evaluation runs forward on (on rank 0, or on every rank when
        `collective_eval`, where the forward itself needs every rank, or gathering the
        weights does); None: this rank takes no part in the forward."""
        assert self.model is not None
        return self.unwrap(self.model)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights on the CPU, on rank 0 (others may get {}). Called on every rank,
        since a sharded strategy must gather them."""
        assert self.model is not None
        if self.ctx.rank != 0:
            return {}
        return {k: v.detach().cpu() for k, v in self.unwrap(self.model).state_dict().items()}

    def run_notes(self) -> list[str]:
        """What the rows' `notes` say about this cell (called after training)."""
        notes = [*self.notes, *self.precision_plugin.notes()]
        if self.setting.cuda_graphs:
            notes.append(cuda_graph_note())
        return notes

    def optimizer_states(self) -> Iterable[Mapping[str, Any]]:
        """The optimizer state this rank holds, per parameter (ZeRO overrides: its shard)."""
        assert self.optimizer is not None
        return self.optimizer.state.values()

    def all_mean(self, t: torch.Tensor) -> torch.Tensor:
        """Mean over ranks; called once per epoch, never per step."""
        return t

    def epoch_losses(self, local: torch.Tensor) -> torch.Tensor:
        """Every step's loss of the whole global batch, from each rank's own (called once
        per epoch on every rank). Data parallelism: the mean over ranks; a pipeline: the
        last stage's, the only one that computes it."""
        return self.all_mean(local)

    def cell_metrics(self, warmup_steps: int) -> dict[str, Any]:
        """Measurements only this strategy has (pipeline bubble, bytes it sends), for the
        rows; called on every rank after training (it may gather), used from rank 0."""
        return {}

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        return [obj]

    def gather_to_root(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0 alone (None elsewhere): for what only
        rank 0 uses, such as the whole model's weights, which every rank would otherwise
        hold a copy of. A backend without a gather to one rank gathers to all."""
        every = self.gather(obj)
        return every if self.ctx.rank == 0 else None

    def sync_off(self) -> contextlib.AbstractContextManager | None:
        """A context in which one whole step (zero_grad, forward, backward, optimizer step)
        runs without synchronising gradients between ranks: the ablation that measures how
        much longer communication makes a step. None: nothing to switch off (one process,
        or communication that is the computation itself, as a pipeline's activations)."""
        return None

    def barrier(self) -> None:
        """Wait for every rank (outside timed regions only)."""

    def teardown(self) -> None:
        """Leave the process group (the worker calls `release` first)."""

    def release(self) -> None:
        """Drop the model, the optimizer, the last batch and the loss (a model's own `loss`
        is bound to it), and collect them, so that what of them holds the process group
        (DDP's reducer, FSDP's mesh, ZeRO's optimizer) is freed before the group is. A
        group whose last reference is DDP's reducer is destroyed with the GIL held, joining
        gloo's threads, while one of them may be waiting for that GIL to free a finished
        collective's tensors: a rank that never exits (seen with torch 2.8; the group's own
        binding lets the GIL go). A strategy that keeps more (a pipeline's stages, which
        hold the group but no reducer) may drop it here too."""
        self.model = self.optimizer = None
        self.last_batch = None
        self.loss_fn = cross_entropy
        gc.collect()

    # ---- the probe after the timed steps ----
    def probe(self, pairs: int, profile_steps: int, trace: Path | None) -> dict[str, Any]:
        """Where communication goes, measured after the timed steps on the last batch trained
        (called on every rank: its steps hold collectives). `pairs` steps with gradient
        synchronisation and as many without (alternating, so drift hits both alike), then
        `profile_steps` steps under torch.profiler, whose Chrome trace goes to `trace` (a
        temporary file when None). The weights and buffers are left as the timed steps left
        them (`_frozen`); the optimizer's own state (momentum, step counts) is not, and
        nothing reads it after the last epoch."""
        from bench.harness import breakdown

        assert self.model is not None and self.optimizer is not None and self.last_batch
        x, y = self.last_batch
        out: dict[str, Any] = {}
        with self._frozen():
            why = self.no_ablation()
            if pairs and why is None:
                on, off = self._ablation(x, y, pairs)
                phases = PHASES if self.sync_off_steps_optimizer else ("forward", "backward")
                out |= breakdown.ablation(on, off, phases)
                out["comm_method"] = "ablation"
                keeps = self.kept_by_ablation()
                if keeps:  # in the profiler's total, not in the exposed part
                    out["ablation_keeps"] = keeps
            elif pairs:
                out["ablation_skipped"] = why
            if profile_steps:
                out |= self._profiled(x, y, profile_steps, trace)
                out["comm_method"] = "+".join(m for m in (out.get("comm_method"), "profiler") if m)
        return out

    def kept_by_ablation(self) -> str:
        """The collectives this cell's sync_off() leaves running, in words ("": none): the
        strategy's own (`ablation_keeps`), and under --sync-bn SyncBatchNorm's exchange of
        each layer's batch statistics, in the forward and backward of every step, synced or
        not: left out, the profiler's total less the exposed part read them as hidden."""
        assert self.model is not None
        keeps = [self.ablation_keeps] if self.ablation_keeps else []
        if any(isinstance(m, nn.SyncBatchNorm) for m in self.model.modules()):
            keeps.append(SYNC_BN_KEPT)
        return " and ".join(keeps)

    def no_ablation(self) -> str | None:
        """Why the communication ablation cannot run here, or None."""
        if self.sync_off() is None:
            return "no gradient synchronisation to switch off"
        if self.precision_plugin.scaling:
            # rank-local gradients may overflow on one rank only: its GradScaler would skip
            # a step (and the step's collectives) that the others take
            return "loss scaling: a rank-local overflow would skip one rank's step"
        return None

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[None]:
        """Steps that leave the weights and buffers as they were: a learning rate of 0
        (bit-exact for SGD, Adam and AdamW: the update is multiplied by 0), the buffers
        (BatchNorm statistics) restored, torch's thread count restored."""
        assert self.optimizer is not None
        rates = [g.get("lr") for g in self.optimizer.param_groups]
        threads = torch.get_num_threads()
        try:
            for g in self.optimizer.param_groups:
                g["lr"] = 0.0
            with buffers_kept(self.unwrap(self.model)):
                yield
        finally:
            torch.set_num_threads(threads)
            for g, lr in zip(self.optimizer.param_groups, rates, strict=True):
                g["lr"] = lr

    def compute_curve(self, max_ranks: int = 64, steps: int = 3) -> list[dict[str, float]]:
        """A one-process cell's step time at the per-rank batch of N ranks (the global batch
        split N ways, N = 1, 2, 4, ... up to `max_ranks`, at least 2 samples per
        micro-batch), with this process's threads: what the scaling predictor
        (bench.analysis.predict) builds a rank's compute from where each rank has a device like this
        one. Median of `steps` steps after one warm-up step per batch size, frozen."""
        assert self.optimizer is not None and self.last_batch is not None
        x, y = self.last_batch
        k = self.setting.accumulate
        batches = []
        n = 1
        while n <= max_ranks and len(x) // n >= 2 * k and (len(x) // n) % k == 0:
            batches.append(len(x) // n)
            n *= 2
        out = []
        threads = torch.get_num_threads()
        with self._frozen():
            for batch in batches:
                self.clock = PhaseClock(self.ctx.device)
                for _ in range(steps + 1):
                    self._step(x[:batch], y[:batch])
                ms = [sum(s.values()) for s in self.clock.steps()[1:]]
                out.append({"batch": batch, "threads": threads, "ms": float(np.median(ms))})
        return out

    def _step(self, x: torch.Tensor, y: torch.Tensor, *, step: bool = True) -> torch.Tensor:
        """One step, lapped: zero_grad (counted with the optimizer step), forward and
        backward, the optimizer step (`step=False`: none); the loss of the batch. The loop
        and the probes run the same code."""
        assert self.optimizer is not None
        if self.setting.cuda_graphs:
            # a new iteration: the graphs may reuse the memory of the last one's outputs
            torch.compiler.cudagraph_mark_step_begin()
        self.clock.begin()
        self.zero_grad(self.optimizer)
        self.clock.lap("optimizer")
        loss = self.forward_backward(x, y)
        # up to here is backward: all of a one-schedule forward_backward (the pipelines), the
        # backward of one micro-batch (forward_backward leaves that lap to this one)
        self.clock.lap("backward")
        if step:
            self.optimizer_step(self.optimizer)
        self.clock.lap("optimizer")
        self.clock.end()
        return loss

    def _ablation(self, x: torch.Tensor, y: torch.Tensor, pairs: int) -> tuple[list, list]:
        self.clock = PhaseClock(self.ctx.device)
        synced: list[bool] = []
        for i in range(pairs):
            for sync in (True, False) if i % 2 == 0 else (False, True):
                with contextlib.nullcontext() if sync else self.sync_off():
                    self._step(x, y, step=sync or self.sync_off_steps_optimizer)
                synced.append(sync)
        steps = self.clock.steps()
        on = [s for s, sync in zip(steps, synced, strict=True) if sync]
        off = [s for s, sync in zip(steps, synced, strict=True) if not sync]
        return on, off

    def _profiled(
        self, x: torch.Tensor, y: torch.Tensor, steps: int, trace: Path | None
    ) -> dict[str, Any]:
        import tempfile

        from torch.profiler import ProfilerActivity, profile

        from bench.harness import breakdown

        activities = [ProfilerActivity.CPU]
        if self.ctx.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.clock = PhaseClock(self.ctx.device)
        with profile(activities=activities) as prof:
            for _ in range(steps):
                self._step(x, y)
            if self.ctx.device.type == "cuda":
                torch.cuda.synchronize(self.ctx.device)
        # the steps the trace's communication is per: slower than the timed ones (the
        # profiler's own cost), so a total read beside a timed step can exceed it
        laps = [sum(s.values()) for s in self.clock.steps() if s]
        step_ms = sum(laps) / len(laps) if laps else float("nan")
        with tempfile.TemporaryDirectory() as tmp:
            path = trace or Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            seen = breakdown.trace_comm(path, steps, self.processes(self.ctx.world_size))
        if self.comm_unseen:  # its row's method says why (results.comm_method)
            seen = dict.fromkeys(seen, float("nan")) | {"comm_unseen": self.comm_unseen}
        return {**seen, "profiled_steps": steps, "profiled_step_ms": step_ms}

    # ---- the loop, written once ----
    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Apply the run options around the strategy, in a fixed order: SyncBN, the strategy's
        own wrapping or sharding, compile."""
        if self.setting.channels_last and self.contiguous_params:
            self.notes.append(
                f"channels-last (NHWC) inputs, NCHW parameters: {self.contiguous_params}"
            )
        elif self.setting.channels_last:
            model = model.to(memory_format=torch.channels_last)
            self.notes.append("channels-last (NHWC) model and inputs")
        if self.setting.sync_bn:
            n = len(norm_layers(model))
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            self.notes.append(f"SyncBatchNorm: {n} layers" if n else NO_BN_TO_SYNC)
        model, optimizer = self.setup(model, optimizer)
        if self.setting.compile:
            mode = self.setting.compile_mode
            model = self.compiled(model, None if mode == "default" else mode)
            how = "" if mode == "default" else f", mode={mode}"
            if self.setting.cuda_graphs and self.ctx.device.type != "cuda":
                how += " (its CUDA graphs need a CUDA device: none here)"
            self.notes.append(f"torch.compile{how} (its time is in the first, warm-up steps)")
        self.model, self.optimizer = model, optimizer

    def compiled(self, model: nn.Module, mode: str | None) -> nn.Module:
        """The model after setup, under torch.compile (`mode`: None for the default): whole,
        unless the strategy's wrapping keeps dynamo out (FSDP2 compiles its units)."""
        return torch.compile(model, mode=mode)

    def micro_batch(self, global_batch: int) -> int:
        return self.per_rank_batch(global_batch) // self.setting.accumulate

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step's forward and backward passes over `accumulate` micro-batches;
        returns the loss of the whole batch (the mean of the micro-batches')."""
        k = self.setting.accumulate
        if k == 1:  # the common step: its backward lap is _step's, one mark fewer a step
            loss = self.forward_loss(x, y)
            self.clock.lap("forward")
            self.backward(loss)
            return loss.detach()
        total = torch.zeros((), device=x.device)
        for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k), strict=True)):
            with self.no_sync() if i < k - 1 else contextlib.nullcontext():
                loss = self.forward_loss(xm, ym)
                self.clock.lap("forward")
                self.backward(loss / k)  # gradients of the batch mean, as without accumulation
                self.clock.lap("backward")
            total += loss.detach().float()
        return total / k

    def train_epoch(
        self,
        loader: Iterable,
        epoch: int,
        *,
        max_steps: int | None = None,
        warmup_steps: int = 0,
        on_step: Callable[[float], None] | None = None,
        precision: float | None = None,
        step_timing: str = "sync",
    ) -> EpochStats:
        """One epoch of the loop every strategy shares. `on_step(step_ms)` is called after
        each step, outside its timing (rank 0's progress report). With `precision` (a %),
        the epoch ends early once every rank's mean step time is known to within it
        (`precise_enough`). `step_timing`: how steps are timed (bench.harness.probes.StepTimer)."""
        assert self.model is not None and self.optimizer is not None, "call attach() first"
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        self.model.train()
        timer = StepTimer(self.ctx.device, step_timing)
        # on CUDA, steps at least SPARSE_EVERY_S apart are lapped and their memory read, and
        # always the first and the first timed (of an epoch no longer than its warm-up, the
        # last, which _epoch_stats then times, whether --max-steps or the loader ends it): a
        # lap's event costs host time
        ends = [max_steps, len(loader) if isinstance(loader, Sized) else None]
        first_timed = min([warmup_steps, *(n - 1 for n in ends if n)])
        every = SPARSE_EVERY_S.get(self.ctx.device.type, 0.0)
        self.clock = PhaseClock(self.ctx.device, every, always=(0, first_timed))
        losses: list[torch.Tensor] = []
        held = HeldReads(self.ctx.device, every, always=(0, first_timed))  # MiB at step ends
        batches: Iterator = iter(loader)
        while max_steps is None or timer.steps < max_steps:
            timer.start()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            x = x.to(self.ctx.device, non_blocking=True)
            if self.setting.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            y = y.to(self.ctx.device, non_blocking=True)
            timer.data_ready()
            loss = self._step(x, y)
            step_ms = timer.stop(len(y))
            self.last_batch = (x, y)
            held.step_end()
            losses.append(loss)
            if on_step is not None:
                on_step(step_ms)
            if precision is not None and self.precise_enough(timer, warmup_steps, precision):
                break
        free = held.malloc_free()  # (before anything after the steps allocates)
        # after the epoch's steps, not its first: fp16's loss scaling skips a first step whose
        # gradients overflow (often on a GPU, where the scale starts at 65536), and the
        # optimizer then holds no state yet
        self.model_state = model_state_mib(
            self.unwrap(self.model).parameters(), self.optimizer_states()
        )
        stats = self._epoch_stats(
            epoch, timer.records(), losses, warmup_steps, self.clock.steps(), held.readings()
        )
        return replace(stats, malloc_free_mib=tuple(free))

    def precise_enough(self, timer: StepTimer, warmup: int, target: float) -> bool:
        """Whether the timed steps so far fix the mean step time to within `target` % on every
        rank (bench.harness.stats.step_precision_pct over blocks of STEP_BLOCK steps). Asked only
        where a block ends, the same step on every rank, outside the steps' timing: the
        ranks agree through one small collective (all_mean), so all stop at the same step."""
        from bench.harness.stats import PRECISION_MIN_STEPS, STEP_BLOCK, step_precision_pct

        timed = timer.steps - warmup
        if timed < PRECISION_MIN_STEPS or timed % STEP_BLOCK:
            return False
        # (under --step-timing events, reading the steps' times synchronises once a block)
        reached = step_precision_pct([r.total_ms for r in timer.records()[warmup:]]) <= target
        agreed = self.all_mean(torch.tensor([float(reached)], device=self.ctx.device))
        return bool(agreed.item() > 1 - 1e-6)

    def _epoch_stats(
        self,
        epoch: int,
        records: list[StepRecord],
        losses: list[torch.Tensor],
        warmup: int,
        phases: list[dict[str, float]] | None = None,
        held: list[float] | None = None,
    ) -> EpochStats:
        warmup = min(warmup, max(len(records) - 1, 0))
        timed = records[warmup:]
        local = torch.stack(losses).float() if losses else torch.zeros(0, device=self.ctx.device)
        mean_losses = self.epoch_losses(local).cpu().tolist()
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
            model_state=dict(self.model_state),
            phase_ms=tuple(phases or ()),
            held_mib=tuple(held or ()),
        )


def cuda_graph_note() -> str:
    """Whether a CUDA-graph compile mode got its graphs, from torch's counters in this
    process (the cell's own: each cell is a process): the graphs dynamo compiled, and the
    times inductor had to run one without CUDA graphs (a CPU tensor, dynamic shapes, mutated
    inputs, ...). They cover the training steps and whatever ran the compiled model after
    them on this rank (the communication probe, with the same shapes)."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    skips = counters["inductor"]["cudagraph_skips"]
    if not graphs:
        return "CUDA graphs: none (torch.compile compiled no graph)"
    if not skips:
        return f"CUDA graphs: captured ({graphs} compiled graph(s), no skip counted)"
    return (
        f"CUDA graphs: {skips} skip(s) over {graphs} compiled graph(s), run without them "
        "(on a GPU, TORCH_LOGS=cudagraphs prints inductor's reason)"
    )


@contextlib.contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """Leave the model's buffers (BatchNorm's running statistics and counts) as they were."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)
