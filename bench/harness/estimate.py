"""A plan before it starts: the matrix a run would execute and how long it should take.

`parabench run --dry-run` prints every cell (what runs, what is skipped and why), the data
and how the batch is split, and an estimate of the wall time; a real run prints the same
one-line estimate first and warns when it is long. The estimate is a model, stated as
such: per cell, the launcher's start-up and teardown (measured with benchmarks/startup.py)
plus the steps times a training step's time, measured here on the run's own model and
data for a few steps of a small batch and scaled to the global batch, plus evaluation
(a forward without gradients of held-out samples, timed at up to its own batch) and
torch.compile's first step.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import default_collate

import strategies
from bench.config import ConfigError, RunConfig
from bench.harness import proc
from bench.harness.env import BUSY_PCT, CpuShare, cpu_cores, device_count, resolve_device
from bench.harness.worker import EVAL_BATCH
from bench.workload import data, flops, models
from strategies import precision as prec

#: start-up to the first step plus teardown, seconds per cell, by launcher: medians over
#: the cells of `make bench` on the 2-core CPU machine (2026-11-23; the report's start-up
#: table of a run gives them for yours)
LAUNCH_S = {"inprocess": 3.8, "spawn": 6.0, "torchrun": 6.7, "horovodrun": 6.6}
#: torch.compile's first step on a CPU (20-67 s cold, measured): counted once per cell
COMPILE_S = 40.0
#: the batch the evaluation's forward is timed at (it runs at EVAL_BATCH): a CPU's time per
#: sample hardly falls past a few tens of samples, and a forward of 256 samples of a large
#: model would take the estimate far longer than its training steps
EVAL_TIMED_BATCH = min(64, EVAL_BATCH)
#: the dtype of each value of the precision axis
DTYPES = {"fp32": torch.float32, **prec.DTYPES}
#: a run estimated past this says so when it starts
LONG_S = 30 * 60
#: the batch of the training steps timed (or the global batch, where smaller)
TIMED_BATCH = 8
#: timing the steps for longer than this says so, on stderr; and a busy CPU's steps are timed
#: again on one thread only where that cannot take longer (_on_one_thread)
SLOW_S = 15.0
#: a CPU core's fp32 matrix-product speed no CPU core reaches (FLOP/s): AVX-512's two FMA
#: units at 3.5 GHz give 224 G
CPU_CORE_CEILING = 250e9
#: steps that would take longer than this to time on a CPU, even at CPU_CORE_CEILING, are
#: not timed
TIMING_BOUND_S = 60.0


@dataclass(frozen=True)
class Estimate:
    total_s: float
    startup_s: float
    per_sample_ms: float | None  # a training step's time per sample, here (None: untimed)
    steps: int  # per epoch
    train_samples: int
    data: str
    untimed: str = ""  # why the steps could not be timed here (the total leaves them out)
    #: the share of the CPUs' time other processes used while the steps were timed
    other_cpu_pct: float = math.nan

    def line(self, dry_run: bool = False) -> str:
        """The estimate in one line; `dry_run`: printed by --dry-run, under its plan (so
        no pointer to --dry-run for the plan)."""
        if self.per_sample_ms is None:
            return (
                f"estimated wall time: {minutes(self.startup_s)} of start-up and the steps, "
                f"which could not be timed here: {self.untimed}"
            )
        long = ""
        if self.total_s > LONG_S:
            long = (
                "; that is long on this machine: --max-steps, --limit or fewer "
                "--strategies/--world-sizes shorten it"
            ) + ("" if dry_run else ", --dry-run shows the plan")
        busy = ""
        if self.other_cpu_pct >= BUSY_PCT:
            busy = (
                f"; other processes used {self.other_cpu_pct:.0f} % of the CPUs while the "
                "steps were timed (the estimate holds while they go on)"
            )
        return (
            f"estimated wall time {minutes(self.total_s)} ({minutes(self.startup_s)} of it "
            f"start-up), from {self.per_sample_ms:.2f} ms per sample (fp32; other precisions "
            f"timed too) measured here and the launchers' start-up{busy}{long}"
        )


def minutes(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def per_sample_ms(
    cfg: RunConfig,
    bundle: data.DataBundle,
    precision: str = "fp32",
    batch: int = TIMED_BATCH,
    forward: bool = False,
) -> float:
    """A training step's time per sample (forward, backward, SGD step) of the run's model in
    this process, on the run's device, in `precision` (autocast: bf16 on a CPU is several
    times slower than fp32), or (`forward`) the evaluation's: a forward without gradients in
    eval mode, on held-out samples: one warm-up step, then the fastest of 2 to 5 timed ones
    (as many as fit in a second): on a machine busy with other work, one step in several runs
    at its own speed (a dry run on a loaded 2-core machine once timed 20x too slow). A timed
    step of a second or more is the only one: a model that slow (a long --seq-len) held the
    dry run for minutes, and a step that long is less at the mercy of a moment's load."""
    device = torch.device("cuda" if resolve_device(cfg.device) == "cuda" else "cpu")
    fed = bundle.spec or models.spec(cfg)
    model = models.build(cfg, bundle.num_classes, fed).to(device)
    loss_fn = models.loss_of(model)
    samples = bundle.held_out if forward else bundle.train
    if not forward:
        batch = min(batch, cfg.global_batch)
    batch = max(1, min(batch, len(samples)))  # type: ignore[arg-type]
    x, y = default_collate([_sample(cfg, samples, i, forward) for i in range(batch)])
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    autocast = torch.autocast(device.type, dtype=DTYPES[precision], enabled=precision != "fp32")
    if forward:
        model.eval()
    times: list[float] = []
    while len(times) < 2 or (len(times) < 6 and sum(times[1:]) < 1.0):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if forward:
            with torch.no_grad(), autocast:
                model(x)
        else:
            opt.zero_grad()
            with autocast:
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times[1:])[0] / batch


def _sample(cfg: RunConfig, samples: Any, i: int, held_out: bool = False) -> Any:
    """The `i`th of the training (or held-out) samples, as a DataLoader reads it, or a
    ConfigError that says the data is what failed (an image file that cannot be decoded, a
    data set whose __getitem__ raises): every cell reads it, and the model and its step are
    not to blame."""
    try:
        return samples[i]
    except Exception as exc:
        if proc.is_oom(exc):
            raise
        raise data.unreadable(cfg.dataset, i, exc, held_out) from None


def timed(
    cfg: RunConfig, bundle: data.DataBundle, precisions: list[str], isolate: bool
) -> dict[str, tuple[float, float]]:
    """per_sample_ms in each precision, of a training step and of the evaluation's forward
    (0 where the run evaluates nothing): here (on a busy CPU, never slower than on one
    thread), or (`isolate`, as on a GPU) in a child process that loads the data itself. A
    CUDA context made here would stay for the whole run: some hundred MiB held on GPU 0
    beside its cells' ranks, and on a GPU in EXCLUSIVE_PROCESS compute mode (common on
    clusters) no rank could open GPU 0 at all. Its exceptions (an out-of-memory one too)
    are raised here."""
    if not isolate:
        share = CpuShare()
        ms = _each_precision(cfg, bundle, precisions)
        threads = torch.get_num_threads()
        if threads == 1 or resolve_device(cfg.device) != "cpu":
            return ms
        if not share.stop()["other_cpu_pct"] >= BUSY_PCT:
            return ms
        # Beside other work, a step on several threads waits at each op for its slowest
        # thread, whose core another process holds: on a loaded 2-core machine a step of
        # the MNIST CNN took 112 ms a sample on 2 threads and 2.6 on one, moments apart,
        # and an estimate of 28 minutes was a run of 50 s. On a quiet machine no step is
        # slower on more threads than on one (and the ranks of a cell of several have a
        # thread or a few each): a figure slower than one thread's is the load's, so one
        # thread's is taken
        return _on_one_thread(cfg, bundle, ms, threads)
    spawn = multiprocessing.get_context("spawn")
    # a harness SIGKILLed meanwhile takes the child with it (it would time on, holding the GPU)
    pool = ProcessPoolExecutor(1, mp_context=spawn, initializer=proc.dies_with_this())
    try:
        return pool.submit(_timed_alone, cfg, precisions).result()
    except BaseException:
        # Ctrl-C or SIGTERM (which the child does not hear) stops the timing now: leaving
        # the pool waits for its task, minutes for the slow model the user gave up on.
        # (The executor has no public way to stop a running task.)
        for child in list((pool._processes or {}).values()):
            child.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _each_precision(
    cfg: RunConfig, bundle: data.DataBundle, precisions: list[str]
) -> dict[str, tuple[float, float]]:
    """per_sample_ms in each precision, of a training step and of the evaluation's forward
    (0 where the run evaluates nothing), on the threads this process has now."""
    evaluates = cfg.eval_samples and len(bundle.held_out)  # type: ignore[arg-type]
    return {
        p: (
            per_sample_ms(cfg, bundle, p),
            per_sample_ms(cfg, bundle, p, EVAL_TIMED_BATCH, forward=True) if evaluates else 0.0,
        )
        for p in precisions
    }


def _on_one_thread(
    cfg: RunConfig, bundle: data.DataBundle, ms: dict[str, tuple[float, float]], threads: int
) -> dict[str, tuple[float, float]]:
    """`ms` (timed on `threads` threads), each figure timed again on one thread where that is
    faster: each only where its timing fits in what is left of SLOW_S even if one thread
    were `threads` times as slow as its fastest step on all of them (a warm-up step, then
    timed ones to a second: per_sample_ms). Such a step is one torch op after another that
    no Ctrl-C stops, so that worst case bounds it; the time the timing on all the cores took
    does not, as the load that slowed those steps is what one thread escapes: on a loaded
    2-core machine it took 20 s for the MNIST CNN (fp32 and bf16), so the one thread's 4 s
    never ran, and `make bench` was estimated at 84 min (140 ms a sample; 10 on one thread)."""
    train, held = len(bundle.train), len(bundle.held_out)  # type: ignore[arg-type]
    # the batches per_sample_ms times a training step and a forward at
    batches = (max(1, min(timed_batch(cfg), train)), max(1, min(EVAL_TIMED_BATCH, held)))
    out, spent = {}, 0.0
    torch.set_num_threads(1)
    try:
        for p in sorted(ms, key=lambda p: p != "fp32"):  # fp32 first: the line's figure
            got = []
            for forward, per, batch in zip((False, True), ms[p], batches, strict=True):
                worst_step = threads * per * batch / 1e3
                if not per or spent + 2 * worst_step + 1.0 > SLOW_S:
                    got.append(per)
                    continue
                t0 = time.perf_counter()
                alone = per_sample_ms(cfg, bundle, p, batch, forward=forward)
                spent += time.perf_counter() - t0
                got.append(min(per, alone))
            out[p] = (got[0], got[1])
    finally:
        torch.set_num_threads(threads)
    return {p: out[p] for p in ms}


def _timed_alone(cfg: RunConfig, precisions: list[str]) -> dict[str, tuple[float, float]]:
    torch.set_num_threads(cpu_cores())  # single's: the cores this process may use
    return timed(cfg, data.load(cfg), precisions, isolate=False)


#: the scaling model's fixed cost per run: the collectives between fresh ranks, the FLOP
#: count (its first use imports torch._dynamo) and the CPU's matmul peaks (measured here)
SCALING_MODEL_S = 8.0


def probe_steps(cfg: RunConfig, cls: Any, world_size: int) -> float:
    """Steps' worth of time the probes after a cell's timed steps take (bench.harness.breakdown):
    the ablation's pairs and the profiled steps where ranks synchronise (plus about a step
    for the profiler to start), the compute curve of a one-process cell (4 steps at each
    halved batch: about 8 full steps)."""
    if cls is None or not cls.multiprocess:
        return cfg.profile_steps + 1 if cfg.profile else 0.0
    if world_size > 1:
        return 2 * cfg.probe_pairs + cfg.profile_steps + 1
    return 8.0 if cfg.scaling_model else 0.0


def estimate(cfg: RunConfig, cells: list) -> Estimate:
    """The run's wall time, from a few steps of its model timed here. ConfigError where the
    data does not fit in this machine's memory. A step of the whole model that does not fit
    on one device (a model that only sharding or model parallelism can train) leaves the
    steps out of the estimate, which says so; the cells themselves decide whether they run."""
    try:
        bundle = data.load(cfg)
    except Exception as exc:
        if not proc.is_oom(exc):
            raise
        raise ConfigError(
            f"the run's data does not fit in this machine's memory ({proc.one_line(exc)}); "
            "lower --image-size, --seq-len or --limit"
        ) from None
    runnable = [c for c in cells if not c.status]
    threads = torch.get_num_threads()
    torch.set_num_threads(cpu_cores())  # single's: the cores this process may use
    precisions = [
        p for p in sorted({c.setting.precision for c in runnable} | {"fp32"}) if p in DTYPES
    ]
    share = CpuShare()
    # a model whose steps take minutes here (a long --seq-len) says why nothing is printed
    slow = threading.Timer(SLOW_S, _still_timing, (cfg, precisions))
    slow.daemon = True
    slow.start()
    isolate = resolve_device(cfg.device) == "cuda"
    try:
        beyond = "" if isolate else beyond_timing(cfg, bundle)
        if beyond:
            return _estimate(cfg, cells, bundle, None, beyond)
        ms = timed(cfg, bundle, precisions, isolate=isolate)
    except ConfigError:
        raise
    except BrokenProcessPool as exc:  # the child ended abruptly: killed, or crashed
        why = (
            f"the process timing a step of {cfg.model} ended abruptly "
            f"({proc.one_line(exc)}); the cells will say what happens to them"
        )
        return _estimate(cfg, cells, bundle, None, why)
    except Exception as exc:  # here, or raised again here from the child process
        if not proc.is_oom(exc):
            raise cannot_train(cfg, exc) from None
        where = "GPU" if resolve_device(cfg.device) == "cuda" else "machine"
        return _estimate(
            cfg,
            cells,
            bundle,
            None,
            f"a step of the whole {cfg.model} at batch {timed_batch(cfg)} "
            f"does not fit in one {where}'s memory ({proc.one_line(exc)}); cells that shard "
            "it may still run",
        )
    finally:
        slow.cancel()
        torch.set_num_threads(threads)
    return dataclasses.replace(
        _estimate(cfg, cells, bundle, ms), other_cpu_pct=share.stop()["other_cpu_pct"]
    )


def timed_batch(cfg: RunConfig) -> int:
    """The batch of the training steps the estimate times: TIMED_BATCH, or the global batch
    where smaller (per_sample_ms's own cap)."""
    return min(TIMED_BATCH, cfg.global_batch)


def beyond_timing(cfg: RunConfig, bundle: data.DataBundle) -> str:
    """Why the steps are not timed on this CPU: by their FLOPs (a training step at the batch
    timed, the evaluation's forward at its own) a timed step would take longer than
    TIMING_BOUND_S even at CPU_CORE_CEILING on every core. Such a step is one torch op after
    another that no Ctrl-C stops before it ends: an lm at --seq-len 500000 held the harness
    for hours with nothing said, filling tens of GiB. '' where the steps are timed (or their
    FLOPs cannot be counted on the meta device)."""
    fed = bundle.spec or models.spec(cfg)
    try:  # on the meta device alone: counted on the CPU, the model runs for real, at size
        per = flops.step_flops(cfg, bundle.num_classes, fed, "meta") / flops.COUNT_BATCH
    except Exception:
        return ""
    if not per:
        return ""
    batch = max(1, min(timed_batch(cfg), len(bundle.train)))  # type: ignore[arg-type]
    work, evaluated = per * batch, ""
    if cfg.eval_samples and len(bundle.held_out):  # type: ignore[arg-type]
        # a forward is about a third of a training step's FLOPs (the backward twice it)
        work += per / 3 * min(EVAL_TIMED_BATCH, len(bundle.held_out))  # type: ignore[arg-type]
        evaluated = " and the evaluation's forward are"
    cores = cpu_cores()
    least_s = work / (cores * CPU_CORE_CEILING)
    if least_s <= TIMING_BOUND_S:
        return ""
    return (
        f"a step of {cfg.model} at batch {batch}{evaluated or ' is'} "
        f"{work:.3g} FLOPs, at least {minutes(least_s)} on this machine's {cores} core(s) "
        f"even at {CPU_CORE_CEILING / 1e9:g} GFLOP/s each (a cell's steps are as slow)"
    )


def _still_timing(cfg: RunConfig, precisions: list[str]) -> None:
    print(
        f"the estimate is still timing a few steps of {cfg.model} at batch "
        f"{timed_batch(cfg)} ({', '.join(precisions)}), {SLOW_S:g} s so far",
        file=sys.stderr,
        flush=True,
    )


def cannot_train(cfg: RunConfig, exc: BaseException) -> ConfigError:
    """A training step of the run's model on its data that fails other than out of memory:
    the model or the data cannot train (no parameter that takes a gradient, an output that
    is not a float, labels out of range, samples the DataLoader cannot batch, inputs of
    another dtype than the model's), in every cell alike, so one line before anything
    starts rather than a traceback or a matrix of failed cells."""
    return ConfigError(
        f"model {cfg.model} on data {cfg.dataset}: a training step (forward, loss, backward, "
        f"optimizer step on a batch of its samples) fails: {proc.one_line(exc)}"
    )


def _estimate(
    cfg: RunConfig,
    cells: list,
    bundle: data.DataBundle,
    ms: dict[str, tuple[float, float]] | None,
    why="",
) -> Estimate:
    """The estimate from the time per sample of a training step and of the evaluation's
    forward by precision (`ms`), or without the steps (`ms` None, `why` says why)."""
    n = len(bundle.train)  # type: ignore[arg-type]
    steps = n // cfg.global_batch
    if cfg.max_steps:
        steps = min(steps, cfg.max_steps)
    runnable = [c for c in cells if not c.status]
    cuda = resolve_device(cfg.device) == "cuda"
    gpus = max(1, device_count("cuda") * cfg.nodes) if cuda else 1
    total = startup = 0.0
    for cell in runnable:
        launcher = strategies.get(cell.strategy).launcher
        startup += LAUNCH_S.get(launcher, 7.0)
        if ms is None:
            continue
        # CPU ranks share the cores (the same work either way); GPUs add devices, as many
        # as there are (ranks sharing a GPU under --oversubscribe take turns on it)
        devices = min(cell.world_size, gpus) if cuda else 1
        per, forward = ms.get(cell.setting.precision, ms["fp32"])  # apex's own: as fp32
        step_s = per * cfg.global_batch / devices / 1e3
        # one device evaluates every held-out sample (or all of them take part in each
        # forward), at its own batch whatever the training's
        eval_s = forward * len(bundle.held_out) / 1e3  # type: ignore[arg-type]
        total += cfg.epochs * (steps * step_s + eval_s)
        if cell.setting.compile:
            total += COMPILE_S
        total += probe_steps(cfg, strategies.get(cell.strategy).cls, cell.world_size) * step_s
    if ms is None:
        return Estimate(startup, startup, None, steps, n, bundle.description, why)
    if cfg.scaling_model and any(c.world_size > 1 for c in runnable):
        total += SCALING_MODEL_S
    return Estimate(total + startup, startup, ms["fp32"][0], steps, n, bundle.description)


def plan_text(cfg: RunConfig, cells: list, est: Estimate) -> str:
    """The matrix as `--dry-run` prints it."""
    run = [c for c in cells if not c.status]
    sw = max([24, *(len(c.label) + 2 for c in cells)])  # the setting column's width
    lines = [
        f"plan: {len(run)} cell(s) to run, {len(cells) - len(run)} skipped or unavailable; "
        f"device {resolve_device(cfg.device)}",
        f"data: {est.data}",
        f"model: {cfg.model}; global batch {cfg.global_batch}, {est.steps} step(s) per epoch "
        f"x {cfg.epochs} epoch(s) ({cfg.warmup_steps} warm-up), {cfg.repeats} repeat(s)",
        "",
        f"{'strategy':<22}{'ws':>3}  {'setting':<{sw}}{'launcher':<12}{'processes':>9}",
    ]
    for c in cells:
        if c.repeat:  # one line per cell of the matrix, not per repeat
            continue
        if c.status:
            lines.append(
                f"{c.strategy:<22}{c.world_size:>3}  {c.label:<{sw}}{c.status}: {c.reason}"
            )
            continue
        spec = strategies.get(c.strategy)
        procs = spec.cls.processes(c.world_size)
        lines.append(
            f"{c.strategy:<22}{c.world_size:>3}  {c.label:<{sw}}{spec.launcher:<12}{procs:>9}"
        )
    lines += ["", est.line(dry_run=True)]
    return "\n".join(lines)
