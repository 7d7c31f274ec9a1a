"""Strategies that misbehave on purpose, registered through PARABENCH_STRATEGIES by the
failure-isolation tests. Each fails in a real way: an exception on one rank, a rank
that hangs while its peer waits in a collective, and a real allocation the allocator
refuses."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch

from strategies.amp_ddp import AmpDDP
from strategies.base import Strategy, Variant
from strategies.ddp import DistributedDataParallel
from strategies.ddp_hooks import DDPCommHook
from strategies.pipeline import Pipeline

#: the faulty pipelines' layout: GPipe over two micro-batches, the least that is a pipeline
GPIPE_2 = {"schedule": "gpipe", "microbatches": "2"}


class Crashes(DistributedDataParallel):
    """Rank 1 raises in its third backward; rank 0 is left waiting in all-reduce."""

    variants = {"test_crash": Variant("spawn", "raises on rank 1 at step 3")}
    _calls = 0

    def backward(self, loss):
        self._calls += 1
        if self.ctx.rank == 1 and self._calls == 3:
            raise RuntimeError("deliberate crash in backward at step 3")
        super().backward(loss)


class Hangs(DistributedDataParallel):
    """Rank 1 stops forever before its second step and ignores SIGTERM, so the
    harness must escalate to SIGKILL; its peers block in all-reduce."""

    variants = {"test_hang": Variant("torchrun", "hangs on rank 1 at step 2")}
    _calls = 0

    def optimizer_step(self, optimizer):
        self._calls += 1
        if self.ctx.rank == 1 and self._calls == 2:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            (open(os.environ["PARABENCH_CELL"] + "/hung", "w")).close()
            while True:
                time.sleep(1)
        super().optimizer_step(optimizer)


class CrashesThenStuck(DistributedDataParallel):
    """Rank 1 raises in its second backward, and its teardown then never ends (as destroying
    a process group can, with a collective its peers never joined), ignoring SIGTERM; rank
    0 is left waiting in all-reduce. The cell ends at its deadline."""

    variants = {"test_crash_stuck": Variant("spawn", "raises on rank 1, then never exits")}
    _calls = 0

    def backward(self, loss):
        self._calls += 1
        if self.ctx.rank == 1 and self._calls == 2:
            raise RuntimeError("deliberate crash in backward at step 2")
        super().backward(loss)

    def release(self):
        if self.ctx.rank == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
        super().release()


class Killed(DistributedDataParallel):
    """Rank 1 is killed by SIGKILL before its second step, as the kernel's OOM killer kills:
    no exception, no error file; only its launcher saw which rank died, and how."""

    variants = {
        "test_killed": Variant("torchrun", "rank 1 killed by SIGKILL at step 2"),
        "test_killed_spawn": Variant("spawn", "rank 1 killed by SIGKILL at step 2"),
    }
    _calls = 0

    def optimizer_step(self, optimizer):
        self._calls += 1
        if self.ctx.rank == 1 and self._calls == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        super().optimizer_step(optimizer)


class OutOfMemory(Strategy):
    """Asks the allocator for 64 PiB of activations in the first forward."""

    variants = {"test_oom": Variant("inprocess", "allocates far more than any machine has")}

    def forward_loss(self, x, y):
        torch.empty(2**56, dtype=torch.uint8, device=self.ctx.device).fill_(1)
        return super().forward_loss(x, y)


class FailsOnce(Strategy):
    """single whose first run in a run folder raises in its first forward (as a cell does
    that another process's memory or a lost node stops): it leaves a mark in the run's
    folder, and every later run of the cell there trains as single."""

    variants = {"test_fails_once": Variant("inprocess", "single that fails its first time")}

    def forward_loss(self, x, y):
        mark = Path(os.environ["PARABENCH_CELL"]).parents[1] / "failed-once"
        if not mark.exists():
            mark.touch()
            raise RuntimeError("deliberate failure, the first time only")
        return super().forward_loss(x, y)


class NoGradientSync(DistributedDataParallel):
    """Forgets to all-reduce gradients: each rank trains on its own half of the batch.
    Runs fine and fast, and trains a different model; parity must catch it."""

    variants = {"test_nosync": Variant("spawn", "DDP without the DDP wrapper (wrong on purpose)")}

    def setup(self, model, optimizer):
        return model, optimizer


class ExtraForward(DistributedDataParallel):
    """Runs each batch forward once more in train mode before its step (a metric, a
    recompute): weights and losses exact, BatchNorm's running statistics updated twice a
    step. Parity must catch it: evaluation normalises by them."""

    variants = {"test_extra_forward": Variant("spawn", "DDP with an extra train-mode forward")}

    def forward_loss(self, x, y):
        with torch.no_grad():
            self.unwrap(self.model)(x)
        return super().forward_loss(x, y)


class AmpNeverCasts(AmpDDP):
    """amp_ddp whose autocast never takes effect: it trains in fp32 under a bf16 row, the
    model right, its speed and memory not bf16's. Parity must say so."""

    variants = {"test_amp_fp32": Variant("spawn", "amp_ddp without autocast (wrong on purpose)")}

    def autocast(self):
        return contextlib.nullcontext()


class OtherModel(Strategy):
    """single that trains a model of its own: the harness's with one more layer on its
    output, as a plug-in that builds its own model might. Its weights are not the
    baseline's (other names, one more layer): parity must FAIL it and say why."""

    variants = {"test_other_model": Variant("inprocess", "single with one more layer")}

    def setup(self, model, optimizer):
        model = torch.nn.Sequential(model, torch.nn.Linear(10, 10))
        return model, type(optimizer)(model.parameters(), **optimizer.defaults)


class DoubleBatch(Strategy):
    """single that takes twice the global batch per step (a plug-in that counts its batch
    wrongly): a different model, and fewer steps where the data runs out. Parity must FAIL
    it and say why."""

    variants = {"test_double_batch": Variant("inprocess", "single on twice the global batch")}

    def per_rank_batch(self, global_batch):
        return 2 * global_batch


class HookNeverCompresses(DDPCommHook):
    """ddp_fp16_hook whose hook all-reduces in fp32: its model is right, its row's numerics
    say grad_fp16 and its speed is an uncompressed all-reduce's. Parity must say so."""

    variants = {
        "test_hook_fp32": Variant(
            "spawn", "fp16 hook that never compresses (wrong on purpose)", {"comm_hook": "fp16"}
        )
    }

    def setup(self, model, optimizer):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model, optimizer = DistributedDataParallel.setup(self, model, optimizer)
        model.register_comm_hook(None, default_hooks.allreduce_hook)
        return model, optimizer


class HookNeverReduces(DDPCommHook):
    """ddp_fp16_hook whose hook rounds each rank's gradient to fp16 and hands it back without
    an all-reduce: each rank trains on its own share. Its reference under Adam is amplified
    past its recipe; held to that, it must still fail."""

    variants = {
        "test_hook_local": Variant(
            "spawn", "fp16 hook that never all-reduces (wrong on purpose)", {"comm_hook": "fp16"}
        )
    }

    def setup(self, model, optimizer):
        model, optimizer = DistributedDataParallel.setup(self, model, optimizer)

        def rounded_here(state, bucket):
            grads = bucket.buffer()
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(grads.to(torch.float16).to(grads.dtype))
            return done

        model.register_comm_hook(None, rounded_here)
        return model, optimizer


class PipelineSkipsStep(Pipeline):
    """Rank 1's stage never takes its optimizer step: its layers keep their initial
    weights while the loss still falls through the other stage. Parity must catch it."""

    variants = {
        "test_pipeline_nostep": Variant(
            "torchrun",
            "pipeline whose second stage skips its optimizer step (wrong on purpose)",
            GPIPE_2,
        )
    }

    def optimizer_step(self, optimizer):
        if self.ctx.rank == 1:
            return
        super().optimizer_step(optimizer)


class PipelineUntiesWeights(Pipeline):
    """A pipeline that cuts a tied weight across its stages, which Pipeline.unsuitable
    refuses (strategies.pipeline.tied): the rank that drops the other's layer drops its
    name of the tensor with it, so each stage trains a copy of its own (the embedding's
    with the embedding's gradient alone, the head's with the head's). Parity must catch it."""

    variants = {
        "test_pipeline_untied": Variant(
            "torchrun",
            "pipeline whose stages train a tied weight as two copies (wrong on purpose)",
            GPIPE_2,
        )
    }

    @classmethod
    def unsuitable(cls, cfg, world_size, options):
        import strategies.pipeline as pipeline

        untied = pipeline.tied
        pipeline.tied = lambda *a: None  # the refusal left out
        try:
            return super().unsuitable(cfg, world_size, options)
        finally:
            pipeline.tied = untied


class ReplicaSkipsStep(DistributedDataParallel):
    """DDP whose rank 1 never takes its optimizer step: its replica keeps the initial weights
    while rank 0's, the ones compared with the baseline, train right. Over one step the loss
    (computed before the step) cannot show it; the replicas' weights must."""

    variants = {
        "test_replica_nostep": Variant("spawn", "DDP whose rank 1 skips its optimizer step")
    }

    def optimizer_step(self, optimizer):
        if self.ctx.rank == 1:
            return
        super().optimizer_step(optimizer)


class ProbeFails(DistributedDataParallel):
    """Trains like DDP, but its communication ablation raises (on every rank alike): the
    cell must still be an ok row, the probe's failure said in `comm_method`."""

    variants = {"test_probe_fails": Variant("spawn", "DDP whose sync_off raises")}

    def sync_off(self):
        raise RuntimeError("sync_off broke on purpose")


class TrafficFails(DistributedDataParallel):
    """Trains like DDP, but its class method `traffic` (what `parabench predict` and the
    report's scaling section model) raises: its predictions must say so, not stop the
    report of the run it ran in."""

    variants = {
        "test_traffic_fails": Variant("spawn", "DDP whose traffic() raises"),
        "test_traffic_fails_ws2": Variant("spawn", "the same, its rows at world size 2 only"),
    }

    @classmethod
    def traffic(cls, options, world_size, shape, precision):
        raise RuntimeError("traffic broke on purpose")


class TrafficUntimed(DistributedDataParallel):
    """Trains like DDP, but its `traffic` names a collective the ring model has no time for:
    its predictions must say so, not stop the others'."""

    variants = {"test_traffic_untimed": Variant("spawn", "DDP whose traffic() is all_to_all")}

    @classmethod
    def traffic(cls, options, world_size, shape, precision):
        return [("all_to_all", float(shape.param_bytes), 1)]


class NotesFail(Strategy):
    """Trains like single, but its run_notes (asked after the timed steps) raises: the
    row must keep what was measured, the notes saying what it raised."""

    variants = {"test_notes_fail": Variant("inprocess", "single whose run_notes raises")}

    def run_notes(self):
        return [f"{self.options['no such option']}"]


class MetricsFail(DistributedDataParallel):
    """Trains like DDP, but its own measurements (cell_metrics, asked after the timed steps)
    raise on rank 1: the row must keep what was measured, failed with what rank 1 raised."""

    variants = {"test_metrics_fail": Variant("spawn", "DDP whose cell_metrics raises on rank 1")}

    def cell_metrics(self, warmup_steps):
        if self.ctx.rank == 1:
            raise KeyError("bubble_pct")
        return super().cell_metrics(warmup_steps)


class GatheredMetricsFail(DistributedDataParallel):
    """Its own measurements gathered from every rank, as a pipeline's bubble is; rank 1
    raises before its gather, where rank 0 is already waiting in it: the ranks must not
    fall out of step (each next collective paired with another) and hang the cell."""

    variants = {
        "test_gathered_metrics_fail": Variant(
            "spawn", "DDP whose cell_metrics raises on rank 1 before its gather"
        )
    }

    #: how long rank 1 waits to hear its peer is past cell_metrics (the worker's
    #: PEERS_PAST_S, 20 s): rank 0 never is, so the test sat through all of it
    PEERS_PAST_S = 4.0

    def cell_metrics(self, warmup_steps):
        if self.ctx.rank == 1:
            # the rank's worker is __main__; in mp.spawn's children a copy of its names,
            # so set the one its function reads
            waits = sys.modules["__main__"]._peers_past_metrics
            waits.__globals__["PEERS_PAST_S"] = self.PEERS_PAST_S
            raise KeyError("bubble_pct")
        every = self.gather(float(self.ctx.rank))
        return {"collective_mib_per_step": sum(every)}


class Sleepy(Strategy):
    """One process, slowed on purpose. Each step ends in a fixed sleep of BASE_S, then a
    further sleep of a fraction of the step it just took (from the end of the previous
    sleep), the fraction its option `slowdown` (default 0; 1 halves samples/s or more). For
    A/B tests of compare, run as a sweep (`--set slowdown=0,off,1`) so the variants are
    interleaved round by round and see the same machine.

    The fixed sleep is most of a step so that the machine's noise is a small part of it: on
    a shared two-core box the same compute takes 15 ms in one process and 22 in the next,
    and an A/A pair whose four repeats fell apart that way read as a 1.4x slow-down."""

    variants = {"test_sleepy": Variant("inprocess", "single, slowed by its option slowdown")}
    #: "0" and "off" both mean none: two names of the same code, for an A/A pair
    accepts = {"slowdown": ("0", "off", "0.25", "1")}
    BASE_S = 0.03
    _last_end = 0.0  # after the last sleep: now - _last_end is one step's own work

    def optimizer_step(self, optimizer):
        super().optimizer_step(optimizer)
        value = self.options.get("slowdown", "0")
        fraction = 0.0 if value == "off" else float(value)
        time.sleep(self.BASE_S)
        now = time.perf_counter()
        if fraction > 0 and self._last_end:
            time.sleep(fraction * (now - self._last_end))
        self._last_end = time.perf_counter()


class Leaky(Strategy):
    """single that keeps 24 MiB more after every optimizer step (written, so resident):
    a leak, which the report's memory-growth check must name."""

    variants = {"test_leaky": Variant("inprocess", "single that keeps 24 MiB per step")}
    kept: list[torch.Tensor]

    def optimizer_step(self, optimizer):
        super().optimizer_step(optimizer)
        if not hasattr(self, "kept"):
            self.kept = []
        self.kept.append(torch.ones(6 * 2**20, device=self.ctx.device))  # 24 MiB of fp32


class LeakyRankOne(DistributedDataParallel):
    """DDP whose rank 1 alone keeps 24 MiB more after every optimizer step: a leak that
    rank 0's memory does not show, which the memory-growth check must name all the same."""

    variants = {"test_leaky_rank1": Variant("spawn", "ddp whose rank 1 keeps 24 MiB per step")}
    kept: list[torch.Tensor]

    def optimizer_step(self, optimizer):
        super().optimizer_step(optimizer)
        if self.ctx.rank != 1:
            return
        if not hasattr(self, "kept"):
            self.kept = []
        self.kept.append(torch.ones(6 * 2**20, device=self.ctx.device))  # 24 MiB of fp32


class SkipsFirstStep(Strategy):
    """single in fp16 whose first backward overflows, as a first step's scaled gradients
    often do on a GPU (the scaler starts at 65536): its GradScaler skips that optimizer
    step, so the optimizer holds no state until the second. The loss itself stays finite."""

    variants = {"test_skips_first": Variant("inprocess", "fp16 single, first step skipped")}
    _calls = 0

    @classmethod
    def default_precision(cls, device, options):
        return "fp16"

    def backward(self, loss):
        self._calls += 1
        if self._calls == 1:
            loss.register_hook(lambda g: g * math.inf)  # the gradients overflow, not the loss
        super().backward(loss)


class EvalFails(Strategy):
    """single whose evaluation raises after the timed steps (as a pipeline's does when its
    stages leave a parameter out): the row fails, and keeps what was measured."""

    variants = {"test_evalfails": Variant("inprocess", "single whose evaluation raises")}

    def eval_module(self):
        raise RuntimeError("Error(s) in loading state_dict: Missing key(s): head.weight")


class EvalOutOfMemory(Strategy):
    """single whose evaluation runs out of memory after the timed steps."""

    variants = {"test_evaloom": Variant("inprocess", "single whose evaluation runs out of memory")}

    def eval_module(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")


class PipelineEvalOutOfMemory(Pipeline):
    """A pipeline whose rank 0 runs out of memory building the whole model from the
    gathered weights (after the gather every rank took part in)."""

    variants = {
        "test_pipeline_evaloom": Variant(
            "torchrun",
            "pipeline whose rank 0 runs out of memory rebuilding the model for evaluation",
            GPIPE_2,
        )
    }

    def eval_module(self):
        model = super().eval_module()
        if model is not None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return model


class RaisesInForward(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("deliberate failure in the evaluation's forward")


class PipelineEvalForwardFails(Pipeline):
    """A pipeline whose whole model's forward raises at evaluation (on rank 0 alone, after
    the gather)."""

    variants = {
        "test_pipeline_evalfails": Variant(
            "torchrun",
            "pipeline whose evaluation forward raises on rank 0",
            GPIPE_2,
        )
    }

    def eval_module(self):
        model = super().eval_module()
        return None if model is None else RaisesInForward()


class PipelineGatherFails(Pipeline):
    """A pipeline whose rank 1 raises before its part of the evaluation's weight gather:
    rank 0 is left in the gather, and the cell must fail (not hang or keep a row)."""

    variants = {
        "test_pipeline_gatherfails": Variant(
            "torchrun",
            "pipeline whose rank 1 raises before the evaluation's gather",
            GPIPE_2,
        )
    }

    def gather_to_root(self, obj):
        if self.ctx.rank == 1:
            raise RuntimeError("deliberate failure before the weight gather")
        return super().gather_to_root(obj)
