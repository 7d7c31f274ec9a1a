"""Pipeline parallelism: the model cut into consecutive stages, one per rank (or two per
rank, interleaved), activations passed forward and their gradients backward between ranks
(`torch.distributed.pipelining`). Every rank sees the whole global batch: there is one
data-parallel replica, and the pipeline splits the batch into micro-batches.

- `model_split`: the naive model parallelism of the seed article: one part per rank, the
  whole batch passed on at once (one micro-batch), so only one rank works at a time.
- `pipeline_gpipe`: GPipe, every micro-batch's forward, then every backward.
- `pipeline_1f1b`: 1F1B, one forward and one backward alternating once the pipe is full
  (same bubble as GPipe, fewer activations held at once).
- `pipeline_interleaved`: interleaved 1F1B with two stages per rank (looped placement),
  which shrinks the bubble by the number of stages per rank.

`--set microbatches=M` sets the micro-batches per step. Gradients are those of the batch
mean (each micro-batch's mean loss, gradients scaled by 1/M), so the trained model is the
single baseline's up to float rounding, which `parabench verify` checks.

Measured per rank, for the rows: the pipeline's bubble, the share of each step's
forward-backward time this rank spends outside its stages' forward and backward chunks
(waiting for its neighbours, or sending), next to the textbook (p-1)/(v*m+p-1) for p
ranks, v stages per rank and m micro-batches (`results.textbook_bubble`: interleaved with
fewer micro-batches than ranks, the pipe cannot fill, 1 - v*m/(m+v*p-1)); and the bytes
of activations and activation gradients each rank sends per step.
"""

from __future__ import annotations

import bisect
import copy
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench import torch_before
from bench.config import ConfigError
from bench.harness import results
from bench.harness.probes import PhaseClock, Span
from bench.workload.models import meta_model, sequence
from strategies.base import Variant
from strategies.ddp import TorchDistributed
from strategies.fsdp import rebuild

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def balanced_cuts(sizes: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """Cut consecutive layers into `parts` non-empty runs with the smallest largest sum of
    `sizes` (parameter counts); ties go to the earliest cuts. Deterministic, so every rank
    computes the same cut without talking to the others. The least largest sum by a binary
    search over it, then each cut as early as leaves the rest cuttable under it: about
    n * parts * n steps, where trying every cut took C(n-1, parts-1) (minutes at 48 layers
    in 8 stages)."""
    n = len(sizes)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} layers into {parts} stages")
    if any(s < 0 for s in sizes):
        raise ValueError(f"layer sizes are counts, not negative: {list(sizes)}")
    prefix = list(itertools.accumulate(sizes, initial=0))

    def fewest(start: int, cap: int) -> int:
        """The fewest runs layers start.. cut into with no run over `cap` (each run as
        long as it can be); any count from there up to one run per layer works too."""
        runs, at = 0, start
        while at < n:
            end = bisect.bisect_right(prefix, prefix[at] + cap) - 1  # the furthest end
            runs, at = runs + 1, end
        return runs

    lo, hi = max(sizes), prefix[-1]
    while lo < hi:  # the least cap under which `parts` runs suffice
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fewest(0, mid) <= parts else (mid + 1, hi)
    bounds, at = [0], 0
    for left in range(parts - 1, 0, -1):  # the runs still to cut after this one
        end = at + 1
        # the earliest end that keeps this run under the cap and the rest cuttable into
        # `left` non-empty runs under it
        while not (prefix[end] - prefix[at] <= lo and fewest(end, lo) <= left <= n - end):
            end += 1
        bounds.append(end)
        at = end
    bounds.append(n)
    return list(itertools.pairwise(bounds))


class Contiguous(nn.Module):
    """The end of every stage but the last: its output, the activation the next rank
    receives, in the default layout. Under --channels-last a CNN's convolutions leave it
    NHWC: gloo's send refuses that ("input tensor has to be contiguous"), and NCCL would
    send the NHWC bytes into the receiver's NCHW buffer. The next stage's convolutions run
    NHWC again. The gradient sent back needs nothing: the schedules send the received
    input's `.grad`, which autograd lays out as that input (contiguous) whatever the
    stage's layers return."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous()


def incomplete(name: str, model: nn.Module, layers: list) -> str | None:
    """Why `layers` (the model's `layers()`) is not the whole model, or None: every item a
    module, and their parameters exactly the model's (by identity). A module with
    parameters left out would be trained by no stage, the rest of the model trained
    without it, and the cell fail only at evaluation, its measured steps lost."""
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            return (
                f"model {name}'s layers() must list modules; item {i} is a {type(layer).__name__}"
            )
    listed = {id(p) for layer in layers for p in layer.parameters()}
    left_out = [n for n, p in model.named_parameters() if id(p) not in listed]
    if left_out:
        more = f" and {len(left_out) - 4} more" if len(left_out) > 4 else ""
        return (
            f"model {name}'s layers() leaves out parameters of its own "
            f"({', '.join(left_out[:4])}{more}): a pipeline would train the model without "
            "them; list every module of its forward in layers()"
        )
    owned = {id(p) for p in model.parameters()}
    if listed - owned:
        return (
            f"model {name}'s layers() lists modules that are not the model's own (made anew "
            "in layers()?): a pipeline would train them instead of the model"
        )
    return None


def tied(name: str, model: nn.Module, layers: list) -> str | None:
    """Why `layers` cannot be cut apart, or None: a parameter held by two of them (tied
    weights, as an embedding and an output layer that share one matrix). Stages on two
    ranks cannot share a tensor: the rank that drops the other's layer would drop the tied
    weight with it (to the meta device), and the cell fail at evaluation, its measured steps
    lost."""
    owner: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for p in layer.parameters():
            if owner.setdefault(id(p), i) != i:
                same = [n for n, q in model.named_parameters(remove_duplicate=False) if q is p]
                return (
                    f"model {name}'s layers() {owner[id(p)]} and {i} share a parameter "
                    f"({' is '.join(same)}): pipeline stages cannot share a tensor between "
                    "ranks; untie it, or list the layers that share it as one module"
                )
    return None


class Pipeline(TorchDistributed):
    variants = {
        "pipeline_gpipe": Variant(
            "torchrun",
            "pipeline, GPipe schedule (all forwards, then all backwards), 4 micro-batches",
            {"schedule": "gpipe", "microbatches": "4"},
        ),
        "pipeline_1f1b": Variant(
            "torchrun",
            "pipeline, 1F1B schedule (forwards and backwards alternate), 4 micro-batches",
            {"schedule": "1f1b", "microbatches": "4"},
        ),
        "pipeline_interleaved": Variant(
            "torchrun",
            "pipeline, interleaved 1F1B, 2 stages per rank, 4 micro-batches",
            {"schedule": "interleaved", "microbatches": "4"},
        ),
    }
    accepts = {"microbatches": int, "schedule": SCHEDULES}
    precisions = ("fp32", "bf16")
    precisions_why = "fp16 would need loss scaling inside the schedule's loss; bf16 needs none"
    no_compile = "pipeline stages are not compiled here (torch.compile per stage is not wired)"
    no_accumulate = (
        "a pipeline already accumulates over its micro-batches: use --set microbatches=M"
    )
    no_sync_bn = "pipeline ranks share one batch: there are no data-parallel ranks to sync"
    collective_eval = True  # the weights are gathered from every stage for evaluation

    # ---- planning ----
    @classmethod
    def stages_per_rank(cls, options: Mapping[str, str]) -> int:
        return 2 if options.get("schedule") == "interleaved" else 1

    @classmethod
    def unsuitable(cls, cfg: Any, world_size: int, options: Mapping[str, str]) -> str | None:
        m = int(options.get("microbatches", 1))  # --set checked it is a positive int
        if world_size < 2:
            return "a pipeline needs at least 2 ranks (at world size 1 it is `single`)"
        kind = options.get("schedule", "gpipe")
        if kind == "1f1b" and m < world_size:
            return f"1F1B needs at least as many micro-batches as stages ({world_size}), got {m}"
        if kind == "gpipe" and m < world_size and torch_before((2, 11), torch.__version__):
            return (
                f"torch {torch.__version__}'s GPipe schedule needs at least as many "
                f"micro-batches as stages ({world_size}), got {m}; torch 2.11 lifted that"
            )
        rounds = max(1, m // world_size)  # as torch's schedule counts them
        if kind == "interleaved" and m % rounds:
            return (
                f"interleaved 1F1B runs {m} micro-batches in {rounds} rounds ({m} // "
                f"{world_size} ranks), which must divide them: take a multiple of "
                f"{world_size}, or fewer than {2 * world_size}"
            )
        if cfg.global_batch % m:
            return f"global batch {cfg.global_batch} is not divisible into {m} micro-batches"
        model = meta_model(cfg)
        try:
            layers = sequence(model)
        except ConfigError as exc:
            return f"model {cfg.model}: {exc}"
        if layers is None:
            submodule = isinstance(getattr(model, "layers", None), nn.Module)
            return (
                f"model {cfg.model} does not list its forward as a sequence of layers, so it "
                "cannot be cut into stages: a `layers()` method returning its modules in "
                "forward order (as mnist_cnn, transformer and lm have) is what lets a "
                "pipeline cut a model of yours"
                + ("; its attribute `layers` is a submodule, not that method" if submodule else "")
            )
        stages = world_size * cls.stages_per_rank(options)
        if len(layers) < stages:
            return f"model {cfg.model} has {len(layers)} layers, too few for {stages} stages"
        return incomplete(cfg.model, model, layers) or tied(cfg.model, model, layers)

    # ---- data: every rank trains on the whole batch ----
    @classmethod
    def batch_shares(cls, world_size: int, options: Mapping[str, str]) -> int:
        return 1  # its micro-batches are checked by unsuitable()

    @property
    def microbatches(self) -> int:
        return int(self.options.get("microbatches", 1))

    def micro_batch(self, global_batch: int) -> int:
        return global_batch // self.microbatches

    # ---- building the stages ----
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        from torch.distributed.pipelining import PipelineStage

        layers = sequence(model)
        assert layers is not None, "checked by unsuitable()"
        ws, v = self.ctx.world_size, self.stages_per_rank(self.options)
        n_stages = ws * v
        sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
        cuts = balanced_cuts(sizes, n_stages)
        mine = [self.ctx.rank + k * ws for k in range(v)]  # looped placement
        # every name of each tensor: one tied within a layer is in the state dict under each
        names: dict[int, list[str]] = {}
        for n, t in model.state_dict(keep_vars=True).items():
            names.setdefault(id(t), []).append(n)
        # buffers registered persistent=False (a causal mask, a rotary table) are in no state
        # dict: evaluation's copy, made with empty tensors, must get them from their stages
        unsaved: dict[int, list[str]] = {}
        for n, t in model.named_buffers(remove_duplicate=False):
            if id(t) not in names:
                unsaved.setdefault(id(t), []).append(n)
        # buffers outside every layer (a model's own constant or count) are on no stage, and
        # a pipeline never runs the model's own forward, so they stay as built: rank 0 keeps
        # them for its whole copy (evaluation; the weights verify compares). Without them it
        # evaluated on whatever memory held, or failed to load the state dict
        in_layers = {id(t) for layer in layers for t in layer.buffers()}
        self.outside = {
            n: t.detach().cpu().clone()
            for n, t in model.named_buffers(remove_duplicate=False)
            if id(t) not in in_layers and self.ctx.rank == 0
        }
        #: of those, the ones the model's state dict holds (persistent)
        self.outside_saved = {n for ns in names.values() for n in ns} & set(self.outside)
        kept = {i for s in mine for i in range(*cuts[s])}
        for i, layer in enumerate(layers):
            if i not in kept:
                layer.to("meta")  # another rank's part: hold no memory for it
        self.original = model
        self.stage_modules = nn.ModuleList(
            nn.Sequential(*layers[slice(*cuts[s])], *([Contiguous()] if s < n_stages - 1 else []))
            for s in mine
        )
        self.names = {
            id(t): names[id(t)] for t in self.stage_modules.state_dict(keep_vars=True).values()
        }
        self.unsaved = {
            id(t): unsaved[id(t)] for t in self.stage_modules.buffers() if id(t) in unsaved
        }
        self.stages = [
            PipelineStage(mod, s, n_stages, self.ctx.device)
            for s, mod in zip(mine, self.stage_modules, strict=True)
        ]
        self.first = 0 in mine
        self.last = n_stages - 1 in mine
        self.n_stages, self.per_rank = n_stages, v
        self.sent_bytes = 0
        #: this step's compute chunks (on CUDA: events on the stream, read after the epoch)
        self.chunk_clock = PhaseClock(self.ctx.device)
        for stage in self.stages:
            self._instrument(stage)
        self.schedule = self._schedule()
        #: per step: its span, its chunks' clock and the bytes it sent; the clocks are read
        #: in cell_metrics, after the epoch (on CUDA a read waits for the device: in the loop
        #: it would synchronise every step, under --step-timing events too)
        self.spans: list[tuple[Span, PhaseClock, int]] = []
        layout = ", ".join(f"{b - a}" for a, b in cuts)
        self.notes.append(
            f"{type(self.schedule).__name__}: {n_stages} stages over {ws} ranks "
            f"(layers per stage {layout}), {self.microbatches} micro-batch(es)"
        )
        # a rank whose stages hold no parameters (a ReLU, a pooling layer: stages balance
        # parameters) steps an optimizer over none: torch refuses an empty list, not a group
        params = list(self.stage_modules.parameters()) or [{"params": []}]
        return self.stage_modules, rebuild(optimizer, params)

    def _schedule(self):
        from torch.distributed.pipelining import (
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        loss_fn = self.loss_fn
        m, kind = self.microbatches, self.options.get("schedule", "gpipe")
        if kind == "interleaved":
            return ScheduleInterleaved1F1B(self.stages, n_microbatches=m, loss_fn=loss_fn)
        cls = Schedule1F1B if kind == "1f1b" else ScheduleGPipe
        return cls(self.stages[0], n_microbatches=m, loss_fn=loss_fn)

    def _instrument(self, stage: Any) -> None:
        """Time this rank's own compute (forward and backward chunks) and count the bytes
        its stages send; the rest of a step is bubble (waiting, or sending). On a GPU the
        chunks are timed by events on the stream (a synchronisation around each would stall
        the sends and receives the schedule overlaps with them)."""

        def timed(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def run(*args, **kwargs):
                self.chunk_clock.begin()
                out = fn(*args, **kwargs)
                self.chunk_clock.lap("forward")  # (one phase: the chunks' compute)
                self.chunk_clock.end()
                return out

            return run

        def counted(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def ops(*args, **kwargs):
                out = fn(*args, **kwargs)
                self.sent_bytes += sum(op.tensor.numel() * op.tensor.element_size() for op in out)
                return out

            return ops

        stage.forward_one_chunk = timed(stage.forward_one_chunk)
        stage.backward_one_chunk = timed(stage.backward_one_chunk)
        stage.get_fwd_send_ops = counted(stage.get_fwd_send_ops)
        stage.get_bwd_send_ops = counted(stage.get_bwd_send_ops)

    # ---- the step ----
    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        kwargs: dict[str, Any] = {"target": y, "losses": losses} if self.last else {}
        self.sent_bytes = 0
        # (on CUDA an event's span, as the chunks' compute is: a host clock started here
        # would count the last step's optimizer still queued under --step-timing events)
        span = Span(self.ctx.device)
        span.start()
        with self.autocast():
            self.schedule.step(*args, return_outputs=False, **kwargs)
        span.stop()  # (marked, not read: the device is not waited for)
        self.spans.append((span, self.chunk_clock, self.sent_bytes))
        self.chunk_clock = PhaseClock(self.ctx.device)
        if self.last:  # the mean of equal micro-batches' means: the batch mean
            return torch.stack([loss.detach().float() for loss in losses]).mean()
        return torch.zeros((), device=self.ctx.device)

    def epoch_losses(self, local: torch.Tensor) -> torch.Tensor:
        t = local.clone()
        dist.broadcast(t, src=(self.n_stages - 1) % self.ctx.world_size)  # the last stage's
        return t

    def cell_metrics(self, warmup_steps: int) -> dict[str, Any]:
        # asked once per epoch: this epoch's steps, cleared for the next epoch's
        timed = self.spans[warmup_steps:] or self.spans
        self.spans = []
        span = sum(s.seconds() for s, _, _ in timed)
        busy = sum(sum(ms.values()) for _, clock, _ in timed for ms in clock.steps()) / 1e3
        idle = 1.0 - busy / span if span > 0 else float("nan")
        sent = sum(n for _, _, n in timed) / max(len(timed), 1)
        every = self.gather((idle, sent))
        p, v, m = self.ctx.world_size, self.per_rank, self.microbatches
        return {
            "pipeline_stages": self.n_stages,
            "microbatches": m,
            "bubble_pct": 100 * sum(i for i, _ in every) / len(every),
            "bubble_theory_pct": 100 * results.textbook_bubble(p, v, m),
            "p2p_mib_per_step": sum(b for _, b in every) / 2**20,
        }

    # ---- weights ----
    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every stage's tensors under the full model's names, merged on rank 0."""
        return self._merged(unsaved=False)

    def _merged(self, unsaved: bool) -> dict[str, torch.Tensor]:
        """The full state dict on rank 0 (collective); with `unsaved`, the buffers that are
        in no state dict (persistent=False) too, which evaluation's whole copy needs."""
        # each tensor once (state_dict lists a shared one under each of its names), then
        # under every name the full model gives it
        tensors = {id(t): t for t in self.stage_modules.state_dict(keep_vars=True).values()}
        local: dict[str, torch.Tensor] = {}
        for t in tensors.values():
            local.update(dict.fromkeys(self.names[id(t)], t.detach().cpu()))
        for t in self.stage_modules.buffers() if unsaved else ():
            local.update(dict.fromkeys(self.unsaved.get(id(t), ()), t.detach().cpu()))
        # to rank 0 alone: a model cut up because it is large is not copied whole to each rank
        parts = self.gather_to_root(local)
        if parts is None:
            return {}
        # (and those outside every stage, which rank 0 kept: see setup)
        kept = {k: v for k, v in self.outside.items() if unsaved or k in self.outside_saved}
        return kept | {k: v for part in parts for k, v in part.items()}

    def eval_module(self) -> nn.Module | None:
        """A whole copy of the model with the trained weights, on rank 0 (collective)."""
        self.evaluating_alone = False
        state = self._merged(unsaved=True)
        if self.ctx.rank != 0:
            return None
        # the gather done, the rest is rank 0's alone (its peers go on to the epoch's record):
        # running out of memory building the copy, or a forward that raises, waits no one
        self.evaluating_alone = True
        full = copy.deepcopy(self.original).to_empty(device=self.ctx.device)
        saved = full.state_dict().keys()
        full.load_state_dict({k: v for k, v in state.items() if k in saved})
        with torch.no_grad():  # to_empty left them uninitialised memory, not their values
            for k in state.keys() - saved:
                full.get_buffer(k).copy_(state[k])
        return full


class ModelSplit(Pipeline):
    """The seed article's model parallelism: the model cut into one part per rank and the
    whole batch passed along (the pipeline machinery with a single micro-batch, so at any
    moment one rank computes and the others wait). It takes no micro-batch option: with
    micro-batches it is `pipeline_gpipe`."""

    variants = {
        "model_split": Variant(
            "torchrun",
            "naive model parallelism: one part of the model per rank, whole batch passed on",
            {"schedule": "gpipe", "microbatches": "1"},
        )
    }
    accepts = {}
    no_accumulate = (
        "it passes the whole batch along at once; cut into micro-batches it is pipeline_gpipe "
        "(--strategies pipeline_gpipe --set microbatches=M)"
    )
