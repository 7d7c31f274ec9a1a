"""Result records and tidy CSVs.

runs.csv has one row per (run, strategy, world size, repeat, epoch): identity, then
parameters, then status, then measurements, then provenance (pytest-benchmark's
order). steps.csv has every step of rank 0; ranks.csv every rank's memory and
throughput. Files are rewritten whole through a temporary file and `os.replace`, so a
killed harness leaves either the old or the new file, never half a row.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import shlex
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from bench import program
from bench.harness import stats
from bench.harness.breakdown import PARTS, PHASES, hidden, stacked

#: measurements a strategy may report through Strategy.cell_metrics, model parallelism's:
#: pipeline stages and micro-batches, the measured bubble (share of the pipeline's step a
#: rank is idle, mean over ranks) beside the textbook's least (textbook_bubble),
#: bytes sent stage to stage and bytes handed to collectives by tensor parallelism, per
#: step, summed over ranks
EXTRA = (
    "pipeline_stages",
    "microbatches",
    "bubble_pct",
    "bubble_theory_pct",
    "p2p_mib_per_step",
    "collective_mib_per_step",
)


def textbook_bubble(p: int, v: int, m: int) -> float:
    """The least share of a step a rank can idle with p ranks, v stages per rank and m
    micro-batches, for equal stages and free sends: each rank's v*m chunk times of the
    forwards (and as much of the backwards) against their span, which is v*m + p-1 once
    the pipe fills ((p-1)/(v*m+p-1), the textbook's), or with v > 1 and fewer micro-batches
    than ranks, the last micro-batch's v*p chunks one after another behind the m-1 before
    it (m+v*p-1: one micro-batch through 2 ranks' 4 stages idles each rank half the time)."""
    return 1 - v * m / max(v * m + p - 1, m + v * p - 1)


#: where a step's time goes (bench.harness.breakdown): the phases' means over timed steps, the
#: communication probe's figures, the stacked parts that add up to the mean step, the
#: slowest and fastest rank's median step (a straggler shows), and model FLOPs / MFU
BREAKDOWN = (
    "data_wait_ms_mean",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "comm_method",
    "comm_exposed_ms",
    "comm_exposed_forward_ms",
    "comm_exposed_backward_ms",
    "comm_exposed_optimizer_ms",
    "comm_total_ms",
    "comm_hidden_ms",
    "comm_ops_per_step",
    "probe_step_ms",
    "probe_nosync_ms",
    "profiled_step_ms",
    *(f"part_{p}_ms" for p in PARTS),
    "rank_step_ms_min",
    "rank_step_ms_max",
    "rank_skew_pct",
    "trace",
    "flops_per_sample",
    "model_tflops_per_device",
    "peak_tflops",
    "peak_source",
    "mfu_pct",
)
#: a cell's start-up (to its first step), split into its phases, and its teardown
STARTUP = (
    "startup_s",
    "startup_launch_s",
    "startup_rendezvous_s",
    "startup_setup_s",
    "teardown_s",
)
#: `setting`: the cell's run options (precision, compile, accumulation, SyncBN, swept --set
#: options), e.g. "bf16,acc2"; a strategy at a world size may run under several
ID = ["run_id", "strategy", "world_size", "setting", "repeat", "epoch"]
PARAMS = [
    "launcher",
    "backend",
    "precision",
    "numerics",
    "compile",
    "compile_mode",
    "accumulate",
    "sync_bn",
    "channels_last",
    "optimizer",
    "device",
    "dataset",
    "data",
    "data_path",
    "step_timing",
    "model",
    # --model-arg and --dataset-arg as given (JSON): what the model's name alone does not say,
    # as the lm's size (tiny and base are both `lm`); the run's every row says them
    "model_args",
    "dataset_args",
    # what the cell built: the model's parameters (all of it, before any strategy shards or
    # splits it) and a token model's tokens per sample (--seq-len; empty for images)
    "model_params",
    "seq_len",
    "global_batch",
    "per_rank_batch",
    "micro_batch",
    "data_ranks",
    "epochs",
    "max_steps",
    "warmup_steps",
    "loader_workers",
    "threads_per_rank",
    "oversubscribed",
    "seed",
    "lr",
    "options",
    "target_precision_pct",  # --target-precision: timed steps chosen by it (empty: all)
    "nodes",  # --nodes: the hosts the ranks ran on (1: this machine)
    "procs_per_node",
    "hosts",  # every rank's host, in rank order, once each
    "round",  # the round of the interleaved matrix (the repeat's index; resumed, after those run)
    "run_order",  # the cell's place in the run, 1-based
]
STATUS = ["status", "reason", "notes"]
MEASUREMENTS = [
    "steps",
    "timed_steps",
    "samples",
    "timed_s",
    "samples_per_s",
    "samples_per_s_per_device",
    "tokens_per_s",
    "step_time_ms_p50",
    "step_time_ms_p90",
    "step_time_ms_iqr",
    "step_time_ms_mean",
    # the mean step time's 95 % half-width over blocks of 10 timed steps, % (bench.harness.stats)
    "step_precision_pct",
    "first_step_ms",
    "data_wait_ms_p50",
    "compute_ms_p50",
    "data_wait_pct",
    "train_loss_first",
    "train_loss_final",
    "train_loss_mean",
    "eval_loss",
    "eval_accuracy",
    "peak_mem_mib",
    "mem_source",
    "peak_alloc_mib",
    "peak_reserved_mib",
    "peak_rss_mib",
    # on a CPU, what glibc's malloc held free at the end of the steps (in the resident set,
    # no tensor's), on the rank whose peak_rss_mib is the row's
    "malloc_free_mib",
    "held_growth_mib",
    "malloc_free_growth_mib",
    "param_mib",
    "grad_mib",
    "optim_mib",
    "model_state_mib",
    "model_state_mib_lightest",
    *EXTRA,
    *BREAKDOWN,
    "cell_wall_s",
    *(
        STARTUP := (
            "startup_s",
            "startup_launch_s",
            "startup_rendezvous_s",
            "startup_setup_s",
            "teardown_s",
        )
    ),
]
PROVENANCE = [
    "timestamp",
    "load_avg_1m",  # the machine as the cell started (bench.harness.runner.machine_state)
    "cpu_mhz",
    "other_cpu_pct",  # while the cell ran: CPU time of anything else (bench.harness.runner.CpuShare)
    "cpu_steal_pct",  # ... and what a hypervisor gave to other guests
    "host",
    "cpu_model",
    "cpu_cores",
    "device_type",
    "device_names",
    "gpu_count",
    "python_version",
    "torch_version",
    "torchvision_version",
    "cuda_version",
    "cudnn_version",
    "nccl_version",
    "horovod_version",
    "apex_version",
    "parabench_version",
    "git_commit",
    "platform",
]
RUN_COLUMNS = ID + PARAMS + STATUS + MEASUREMENTS + PROVENANCE
#: columns of runs.csv under the names an older parabench wrote them, read as their new ones:
#: the lightest rank's model state was `model_state_mib_min`, which in summary.csv (spreads
#: over repeats: `<metric>_min`) names the least repeat of model_state_mib
RENAMED = {"model_state_mib_min": "model_state_mib_lightest"}


def renamed(columns: Iterable[str]) -> dict[str, str]:
    """The older names among `columns` -> their new ones, where the new one is not there too."""
    columns = list(columns)
    return {old: new for old, new in RENAMED.items() if old in columns and new not in columns}


def held_by(path: Path) -> str | None:
    """The pid of the parabench running the run at `path` now ("?" where its lock file names
    none), or None where no process holds the run: it ended, or was killed (the kernel lets
    go of a dead process's lock), or it ran elsewhere, or the file system has no locks. The
    harness holds the run's .lock while it runs (bench.harness.runner.RunDir.lock)."""
    import fcntl

    try:
        f = open(path / ".lock")  # noqa: SIM115 - closed below
    except OSError:  # none: no harness has it (one killed outright leaves it unheld)
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "?"
        except OSError:  # no locks on this file system: unknown, as if none held it
            return None
    return None


def cell_dirname(strategy: str, world_size: int, label: str, repeat: int) -> str:
    """A cell's folder under cells/ (`single-ws1-fp32-r0`): its setting's commas as +."""
    return f"{strategy}-ws{world_size}-{label.replace(',', '+')}-r{repeat}"


def row_key(r: Mapping[str, Any]) -> tuple[str, int, str, int] | None:
    """The cell a row of runs, steps, ranks or plan.csv is of (strategy, world size,
    setting, repeat), or None where it names none."""
    try:
        return (r["strategy"], int(r["world_size"]), r["setting"], int(r["repeat"]))
    except (KeyError, TypeError, ValueError):
        return None


#: what a verify's run is told in place of a resume command: its --resume would finish the
#: run alone, with no verdict, which takes the cells, baselines and comparison of one verify
VERIFY_AGAIN = "verify has no --resume; for its verdict, run the same verify again"


def of_verify(config: Any) -> bool:
    """Whether a run's config.json (as read) is a verify's: a verify keeps its weights."""
    return isinstance(config, Mapping) and config.get("save_params") is True


#: the --timeout the last resume that ran cells gave them, where it was not the run's first
#: (config.json keeps that one: its first cells ran with it); none: the run's own
RESUMED = "resumed.json"


def resumed_timeout(path: Path) -> float | None:
    """The deadline the run's cells last ran with where a resume's --timeout set it
    (RESUMED), else None: config.json's."""
    try:
        return float(json.loads((path / RESUMED).read_text())["timeout_s"])
    except (OSError, ValueError, KeyError, TypeError):  # none, or not one this wrote
        return None


def keep_resumed_timeout(path: Path, timeout_s: float | None) -> None:
    """As a resume begins to run cells: the --timeout it gives them, where it is not the
    run's first (None: the run's own again)."""
    if timeout_s is None:
        (path / RESUMED).unlink(missing_ok=True)
    else:
        write_whole(path / RESUMED, json.dumps({"timeout_s": timeout_s}))


def resume_command(
    launcher: str,
    path: Path,
    command: str = "",
    retry: bool = False,
    timeout_s: float | None = None,
) -> str:
    """The command that finishes the run at `path`: under SLURM, inside an allocation, or a
    submitted run's own job script, whose first branch resumes it. `command`: parabench as
    named there (default: as this process was called, bench.program()). `retry`: the one
    that runs its failed cells again too (--retry-failed). `timeout_s`: with the deadline a
    resume was given (--timeout; config.json keeps the run's first); none given, the one
    the last resume that ran cells gave them (resumed_timeout), as a plain --resume would
    run the cells left with the first again."""
    if timeout_s is None:
        timeout_s = resumed_timeout(path)
    # quoted, so that it runs as printed where the path holds a space
    flag = " --retry-failed" if retry else ""
    flag += f" --timeout {timeout_s:g}" if timeout_s is not None else ""
    how = f"{command or program()} run --resume {shlex.quote(str(path))}{flag}"
    if launcher != "slurm":
        return how
    job = path / "job.sbatch"
    # a job script from before it passed its arguments on would drop them
    if job.exists() and (not flag or '"$@"' in job.read_text(errors="replace")):
        script = shlex.quote(str(job))
        return f"sbatch {script}{flag} (it resumes the run), or {how} inside salloc"
    return f"{how} inside an allocation (salloc)"


#: plan.csv: every cell the run set out to run, written as it starts; one with no row in
#: runs.csv has not run yet (the run stopped), and the report says so
PLAN_COLUMNS = ["strategy", "world_size", "setting", "repeat"]
STEP_COLUMNS = ID + [
    "step",
    "warmup",
    "step_time_ms",
    "data_wait_ms",
    "compute_ms",
    "loss",
    # what rank 0 held at the step's end: allocated on a GPU (read at most every 20 ms there,
    # empty between), RSS on a CPU
    "held_mib",
]
RANK_COLUMNS = ID + [
    "rank",
    "host",  # the node the rank ran on: its --hosts address, else the machine's name
    "samples",
    "timed_s",
    "samples_per_s",
    "peak_rss_mib",
    "peak_alloc_mib",
    "peak_reserved_mib",
    "held_growth_mib",  # how much more it held at the end of its timed steps (held_growth)
    # on a CPU, what glibc's malloc held free at the end of the last step (in the resident
    # set, no tensor's), and how much more than at the end of the first timed step
    "malloc_free_mib",
    "malloc_free_growth_mib",
    "param_mib",
    "grad_mib",
    "optim_mib",
]
#: what each rank holds of the model's training state (bench.harness.probes.model_state_mib)
MODEL_STATE = ("param_mib", "grad_mib", "optim_mib")

#: statuses a cell can end with
OK, FAILED, OOM, TIMEOUT, SKIPPED, UNAVAILABLE, DIVERGED = (
    "ok",
    "failed",
    "oom",
    "timeout",
    "skipped",
    "unavailable",
    "diverged",  # it ran, but its loss became non-finite or exploded: not a result to rank
)
STATUSES = (OK, FAILED, OOM, TIMEOUT, SKIPPED, UNAVAILABLE, DIVERGED)
#: statuses of a cell that was asked to run here and gave no result to rank (skipped and
#: unavailable are this machine's limits, said before anything ran)
BROKEN = (FAILED, OOM, TIMEOUT, DIVERGED)
#: statuses `run --resume RUN --retry-failed` runs again: what went wrong around the training
#: (a crash, memory another process held, a hang). A diverged cell is left: its loss is a
#: result of the seeded training, and the same cell diverges again
RETRYABLE = (FAILED, OOM, TIMEOUT)
#: retried/: a retried cell's earlier attempt, moved out of runs.csv (and steps.csv,
#: ranks.csv) whole, each row with its attempt's number (1: the first); its cell folder
#: moved to retried/<cell>-attempt<N>/, which `attempt_dir` names, relative to the run
RETRIED = "retried"
ATTEMPT = ["attempt", "attempt_dir"]


def divergence(losses: Sequence[float], factor: float, first: float | None = None) -> str | None:
    """Why a run's per-step losses say it diverged, or None: the first non-finite loss, or
    the first loss above `factor` x the first step's (`first`: the run's, where `losses`
    are a later epoch's; default losses[0])."""
    for i, v in enumerate(losses):
        if not math.isfinite(v):
            return f"loss is {v} at step {i}"
    first = losses[0] if first is None and losses else first
    if first is not None and first > 0:
        for i, v in enumerate(losses):
            if v > factor * first:
                return (
                    f"loss {v:.4g} at step {i} is over {factor:g} x the first step's ({first:.4g})"
                )
    return None


def divergences(epochs: Sequence[Sequence[float]], factor: float) -> list[str | None]:
    """divergence() of each epoch's losses, all against the run's first step: a later
    epoch's own first loss is that of a trained model (0.1 where the first was 2.3), and ten
    times it is a noisy batch, not a run blowing up."""
    first = next((float(e[0]) for e in epochs if len(e)), None)
    return [divergence(e, factor, first) for e in epochs]


def startup(marks: Mapping[str, float], last: Mapping[str, Any], ended: float) -> dict[str, float]:
    """A cell's start-up and teardown from rank 0's wall-clock marks (bench.harness.worker): launch
    (launcher, interpreter, imports: harness start to the worker's entry), rendezvous
    (joining the process group), setup (data, model, wrapping), their sum to the first
    step, and teardown (the last record written to the cell's end: saving, leaving the
    group, processes exiting)."""
    nan = float("nan")
    t0, worker = marks.get("t0", nan), marks.get("worker", nan)
    rendezvous, ready = marks.get("rendezvous", nan), marks.get("ready", nan)
    return {
        "startup_s": ready - t0,
        "startup_launch_s": worker - t0,
        "startup_rendezvous_s": rendezvous - worker,
        "startup_setup_s": ready - rendezvous,
        "teardown_s": ended - last.get("written", nan),
    }


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def measure(record: Mapping[str, Any], world_size: int, device: str) -> dict[str, Any]:
    """Measurement columns from one epoch record written by rank 0."""
    warm = record["warmup_steps"]
    step = np.asarray(record["step_times_ms"][warm:], dtype=float)
    wait = np.asarray(record["data_wait_ms"][warm:], dtype=float)
    compute = step - wait
    ranks = record["ranks"]
    # Ranks that share a batch (tensor-parallel, pipeline stages) train it once between
    # them: count each data-parallel replica's samples once.
    replicas = int(record.get("data_ranks") or len(ranks))
    samples = sum(r["samples"] for r in ranks) * replicas // len(ranks)
    timed_s = max(r["timed_s"] for r in ranks)
    losses = record["losses"]
    cuda = device == "cuda"
    peak = {
        k: max((r.get(k, float("nan")) for r in ranks), default=float("nan"))
        for k in ("peak_alloc_mib", "peak_reserved_mib", "peak_rss_mib")
    }
    # what malloc held free on the rank the CPU peak is, which the report weighs it against
    rss = [r for r in ranks if r.get("peak_rss_mib", math.nan) == r.get("peak_rss_mib")]
    top = max(rss, key=lambda r: r["peak_rss_mib"]) if rss and not cuda else {}
    sps = samples / timed_s if timed_s > 0 else float("nan")
    # GPUs: the devices the ranks ran on (ranks sharing one under --oversubscribe count it
    # once); a CPU rank's share of the cores is its device
    used = {(r.get("host"), d) for r in ranks for d in r.get("devices", ())}
    devices = len(used) if cuda and used else world_size
    # Model state: the rank holding the most (the one that would run out of memory first),
    # its three parts, and the least any rank holds (ZeRO-1's partitions are uneven).
    totals = [sum(r.get(k, 0.0) for k in MODEL_STATE) for r in ranks]
    lightest = "model_state_mib_lightest"
    state = {k: float("nan") for k in (*MODEL_STATE, "model_state_mib", lightest)}
    if all(k in ranks[0] for k in MODEL_STATE):
        heaviest = ranks[int(np.argmax(totals))]
        state = {k: heaviest[k] for k in MODEL_STATE}
        state |= {"model_state_mib": max(totals), lightest: min(totals)}
    first = record["step_times_ms"][0] if record["step_times_ms"] else float("nan")
    return {
        **_breakdown(record, step, wait),
        "steps": record["steps"],
        "timed_steps": len(step),
        "samples": samples,
        "timed_s": timed_s,
        "samples_per_s": sps,
        "samples_per_s_per_device": sps / devices,
        # a token model's samples are sequences: what language-model work is counted in
        "tokens_per_s": sps * record["tokens_per_sample"]
        if record.get("tokens_per_sample")
        else float("nan"),
        "step_time_ms_p50": _pct(step, 50),
        "step_time_ms_p90": _pct(step, 90),
        "step_time_ms_iqr": _pct(step, 75) - _pct(step, 25),
        "step_time_ms_mean": float(step.mean()) if step.size else float("nan"),
        "step_precision_pct": stats.step_precision_pct(step),
        "first_step_ms": first,  # warm-up: epoch 0's includes torch.compile's compilation
        "data_wait_ms_p50": _pct(wait, 50),
        "compute_ms_p50": _pct(compute, 50),
        "data_wait_pct": 100 * float(wait.sum() / step.sum())
        if step.size and step.sum() > 0
        else float("nan"),
        "train_loss_first": losses[0] if losses else float("nan"),
        "train_loss_final": losses[-1] if losses else float("nan"),
        "train_loss_mean": float(np.mean(losses)) if losses else float("nan"),
        "eval_loss": record.get("eval_loss", float("nan")),
        "eval_accuracy": record.get("eval_accuracy", float("nan")),
        "peak_mem_mib": peak["peak_alloc_mib"] if cuda else peak["peak_rss_mib"],
        "mem_source": "cuda_allocator" if cuda else "host_rss",
        "malloc_free_mib": top.get("malloc_free_mib", float("nan")),
        **_most_growth(record, warm),
        **peak,
        **state,
    }


#: a cell whose memory grew by more than this over its timed steps (MiB, and a share of
#: its peak) is named in the report: steady training holds the same
#: memory at every step's end, so growth is a leak (tensors kept across steps), or work a
#: collective has not released; a CPU's RSS wanders by some tens of MiB
GROWTH_MIB, GROWTH_SHARE = 64.0, 0.10


def held_growth(held: Sequence[float], warmup: int) -> float:
    """How much more a rank held at the end of its last timed steps than of its first: the
    median of the readings in the last quarter of them less the first quarter's (so one
    step's wobble is not growth; on CUDA a step is read at most every 20 ms, NaN between,
    probes.HeldReads); NaN with fewer than 4 timed steps or a quarter with no reading (a
    run before them)."""
    timed = np.asarray(held[warmup:], dtype=float)
    if timed.size < 4:
        return float("nan")
    q = timed.size // 4
    first, last = timed[:q], timed[-q:]
    if np.isnan(first).all() or np.isnan(last).all():
        return float("nan")
    return float(np.nanmedian(last) - np.nanmedian(first))


def _most_growth(record: Mapping[str, Any], warmup: int) -> dict[str, float]:
    """The most any rank's held memory grew (held_growth, each rank's from its own
    readings): a leak on another rank than 0 went unseen where rank 0's alone was read;
    and what of that rank's growth malloc held free (its malloc_free_growth_mib). A record
    from before the ranks said theirs: rank 0's readings."""
    nan = float("nan")
    each = [r for r in record["ranks"] if r.get("held_growth_mib", nan) == r.get("held_growth_mib")]
    if not each:  # none grew by a number: NaN, or rank 0's readings where no rank said
        said = any("held_growth_mib" in r for r in record["ranks"])
        grown = nan if said else held_growth(record.get("held_mib") or (), warmup)
        return {"held_growth_mib": grown, "malloc_free_growth_mib": nan}
    most = max(each, key=lambda r: r["held_growth_mib"])
    return {
        "held_growth_mib": most["held_growth_mib"],
        "malloc_free_growth_mib": most.get("malloc_free_growth_mib", float("nan")),
    }


def grew(growth: float, peak: float) -> bool:
    """Whether a cell's growth (held_growth) is past the report's mark: GROWTH_MIB, and
    GROWTH_SHARE of its peak memory (NaN peak: the MiB alone)."""
    share = GROWTH_SHARE * peak if peak == peak else 0.0
    return growth > max(GROWTH_MIB, share)


def _breakdown(record: Mapping[str, Any], step: np.ndarray, wait: np.ndarray) -> dict[str, Any]:
    """The breakdown columns (BREAKDOWN) of one epoch record."""
    nan = float("nan")
    warm = record["warmup_steps"]
    # the timed steps that were lapped (on CUDA, steps at least 20 ms apart: {} between)
    timed = list(record.get("phase_ms") or ())[warm:]
    at = [i for i, s in enumerate(timed) if s and i < step.size]
    # a phase no lapped step has is not measured (a pipeline's forward, inside its backward's
    # lap): empty, not 0 ms, which a reader of runs.csv would average in as none
    phases = {
        p: float(np.mean([timed[i].get(p, 0.0) for i in at]))
        if any(p in timed[i] for i in at)
        else nan
        for p in PHASES
    }
    probe = dict(record.get("probe") or {})
    mean_wait = float(wait.mean()) if wait.size else nan
    # the parts split the mean of the lapped steps (all of them but on CUDA), which carry
    # their laps' cost: `other` stays what the laps miss
    parts = (
        stacked(float(step[at].mean()), float(wait[at].mean()), phases, probe)
        if at
        else dict.fromkeys(PARTS, nan)
    )
    exposed = probe.get("comm_exposed_ms", nan)
    total = probe.get("comm_total_ms", nan)
    per_rank = [r.get("step_ms_p50", nan) for r in record["ranks"]]
    per_rank = [v for v in per_rank if v == v]
    fast, slow = (min(per_rank), max(per_rank)) if per_rank else (nan, nan)
    return {
        "data_wait_ms_mean": mean_wait,
        **{f"{p}_ms": v for p, v in phases.items()},
        "comm_method": comm_method(probe),
        **{
            k: probe.get(k, nan)
            for k in (
                "comm_exposed_ms",
                "comm_exposed_forward_ms",
                "comm_exposed_backward_ms",
                "comm_exposed_optimizer_ms",
                "comm_total_ms",
                "comm_ops_per_step",
                "probe_step_ms",
                "probe_nosync_ms",
                "profiled_step_ms",
            )
        },
        # total less exposed is no hidden part where the ablation left collectives running:
        # zero1's 72 ms of broadcast read as hidden under compute, which nothing overlaps
        "comm_hidden_ms": nan if probe.get("ablation_keeps") else hidden(total, exposed),
        **{f"part_{k}_ms": v for k, v in parts.items()},
        "rank_step_ms_min": fast,
        "rank_step_ms_max": slow,
        "rank_skew_pct": 100 * (slow / fast - 1) if fast and fast > 0 else nan,
        "trace": probe.get("trace", ""),
    }


def comm_method(probe: Mapping[str, Any]) -> str:
    """How a row's communication was measured (the probe's `comm_method`), or why the probe
    failed; and why the ablation did not run where it was skipped (fp16 loss scaling,
    nothing to switch off): without it, such a row's empty exposed communication beside
    another precision's figure reads as none exposed; and what collectives it left running
    (`Strategy.ablation_keeps`), where the row has no hidden part."""
    method = probe.get("comm_method") or (
        f"none: the probe failed ({probe['error']})" if probe.get("error") else ""
    )
    why = probe.get("ablation_skipped")
    keeps = probe.get("ablation_keeps")
    keeps = keeps and no_hidden_part(keeps)
    unseen = probe.get("comm_unseen")
    unseen = unseen and no_total(unseen)
    return "; ".join(m for m in (method, why and f"no ablation ({why})", keeps, unseen) if m)


def no_total(unseen: str) -> str:
    """What a row's method says where torch.profiler cannot see the strategy's collectives
    (Strategy.comm_unseen): its comm total is empty for that reason, not for want of one."""
    return f"no comm total (nor hidden): {unseen}"


def no_hidden_part(keeps: str) -> str:
    """What a row's method says where the ablation left collectives running
    (Strategy.ablation_keeps): its total less exposed is not what compute hid."""
    return f"the ablation leaves {keeps} on: no hidden part"


def step_rows(ident: Mapping[str, Any], record: Mapping[str, Any]) -> list[dict[str, Any]]:
    warm = record["warmup_steps"]
    held = record.get("held_mib") or ()
    rows = []
    for i, (t, w) in enumerate(zip(record["step_times_ms"], record["data_wait_ms"], strict=True)):
        loss = record["losses"][i] if i < len(record["losses"]) else float("nan")
        rows.append(
            {
                **ident,
                "step": i,
                "warmup": int(i < warm),
                "step_time_ms": t,
                "data_wait_ms": w,
                "compute_ms": t - w,
                "loss": loss,
                "held_mib": held[i] if i < len(held) else float("nan"),
            }
        )
    return rows


def rank_rows(ident: Mapping[str, Any], record: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in record["ranks"]:
        sps = r["samples"] / r["timed_s"] if r["timed_s"] > 0 else float("nan")
        rows.append(
            {
                **ident,
                "rank": r["rank"],
                "host": r.get("host", ""),
                "samples": r["samples"],
                "timed_s": r["timed_s"],
                "samples_per_s": sps,
                "peak_rss_mib": r.get("peak_rss_mib"),
                "peak_alloc_mib": r.get("peak_alloc_mib"),
                "peak_reserved_mib": r.get("peak_reserved_mib"),
                "held_growth_mib": r.get("held_growth_mib"),
                "malloc_free_mib": r.get("malloc_free_mib"),
                "malloc_free_growth_mib": r.get("malloc_free_growth_mib"),
                **{k: r.get(k) for k in MODEL_STATE},
            }
        )
    return rows


def _fmt(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if np.isnan(v) else f"{v:.10g}"
    return v


class CsvTable:
    """A CSV file that only grows, rewritten atomically on every append."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns

    def read(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            rows = csv.DictReader(f)
            names = renamed(rows.fieldnames or ())  # an older file's: kept on --resume
            return [{names.get(k, k): v for k, v in r.items()} for r in rows]

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        rows = list(rows)
        if not rows:
            # its header all the same: a run whose every cell was skipped or failed has a
            # steps.csv and ranks.csv to read, with no rows, not a missing file
            if not self.path.exists():
                self._rewrite([])
            return
        self._rewrite([*self.read(), *({k: _fmt(v) for k, v in r.items()} for r in rows)])

    def write(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """The file as `rows` alone, replaced whole as `append` rewrites it."""
        self._rewrite([{k: _fmt(v) for k, v in r.items()} for r in rows])

    def keep(self, wanted: Callable[[dict[str, str]], bool]) -> None:
        """Drop the rows `wanted` refuses, rewriting the file whole as `append` does."""
        existing = self.read()
        kept = [r for r in existing if wanted(r)]
        if len(kept) < len(existing):
            self._rewrite(kept)

    def _rewrite(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """The file as these rows, in its columns, written whole (`written_whole`)."""
        with written_whole(self.path, newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)


@contextlib.contextmanager
def written_whole(
    path: Path, newline: str | None = None, binary: bool = False
) -> Iterator[IO[Any]]:
    """A text file (`binary`: a bytes one, a plot's) to write `path` through: it replaces
    `path` once written whole, and is gone if the writing stops (a full disk, Ctrl-C), which
    leaves `path` as it was. A file written plainly would be left cut short or empty, and
    read as damaged ever after."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        # mkstemp's file is the owner's alone (0600): the file gets the mode a file
        # written plainly would, as config.json has, readable where the umask allows
        mask = os.umask(0o022)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_whole(path: Path, text: str) -> None:
    """`path.write_text(text)`, through `written_whole`."""
    with written_whole(path) as f:
        f.write(text)


def oversubscribed_rows(rows: Any) -> Any:
    """Per row of a runs or summary table (a DataFrame), whether it ran more ranks than
    cores (or GPUs): its `oversubscribed` column, False where a run older than that column
    has none. Their speed is not comparable: reports, plots and predict leave them out."""
    import pandas as pd

    if "oversubscribed" not in rows:
        return pd.Series(False, index=rows.index)
    return pd.to_numeric(rows["oversubscribed"], errors="coerce").fillna(0) > 0


def lapped_rows(rows: Any) -> Any:
    """Per row of a runs table (a DataFrame), whether its steps were lapped into parts: a
    phase's part is measured (a run from before the laps has none). Any phase: a pipeline's
    forward part is empty, lapped inside its backward."""
    import pandas as pd

    cols = [f"part_{p}_ms" for p in PHASES if f"part_{p}_ms" in rows]
    if not cols:
        return pd.Series(False, index=rows.index)
    return rows[cols].apply(pd.to_numeric, errors="coerce").notna().any(axis=1)


# ---------------------------------------------------------------- labels


def _setting_parts(setting: str) -> dict[str, str]:
    """A `setting` label (e.g. "bf16,compile,acc2,bucket_cap_mb=25") as axis -> value, with
    the defaults written out, so that two settings can be told apart axis by axis."""
    tokens = [t for t in (setting or "").split(",") if t]
    parts = {"precision": tokens[0] if tokens else "fp32"}
    parts |= {"compile": "eager", "accumulate": "acc1", "sync_bn": "bn", "channels_last": "nchw"}
    for t in tokens[1:]:
        if t == "compile" or t.startswith("compile-"):  # compile-<mode>: --compile-mode
            parts["compile"] = t
        elif t == "syncbn":
            parts["sync_bn"] = t
        elif t == "cl":
            parts["channels_last"] = t
        elif t.startswith("acc") and t[3:].isdigit():
            parts["accumulate"] = t
        elif "=" in t:
            parts[t.split("=", 1)[0]] = t
    return parts


def setting_key(setting: str, **axes: str) -> str:
    """A setting with its defaults written out, axis by axis: two settings that say the
    same in other words ("" and "fp32") have one key. `axes` replaces axis values
    (compile="eager": the key of the same setting uncompiled)."""
    return ",".join(f"{k}={v}" for k, v in sorted((_setting_parts(setting) | axes).items()))


def compiled(setting: str) -> bool:
    """Whether a setting label has torch.compile on (`compile`, or `compile-<mode>`)."""
    return _setting_parts(setting)["compile"] != "eager"


def setting_change(a: str, b: str) -> str:
    """Where setting `b` differs from `a`, axis by axis: `fp32 -> bf16`, `bucket_cap_mb=25,
    acc1 -> bucket_cap_mb=100, acc2` ("–": an option one of them does not set)."""
    pa, pb = _setting_parts(a), _setting_parts(b)
    axes = [k for k in dict.fromkeys([*pa, *pb]) if pa.get(k) != pb.get(k)]
    return " -> ".join(", ".join(p.get(k, "–") for k in axes) for p in (pa, pb))


_NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


#: each axis's plain value (see _setting_parts), listed first among a case's options
_PLAIN = {"fp32", "eager", "acc1", "bn", "nchw"}


def plainness(setting: str) -> tuple[int, tuple[bool, ...]]:
    """A setting's sort key from plainest on: how many axes (and strategy options) it sets
    away from plain, then which, the earlier axes (precision, compile, ...) first: `fp32,acc2`
    before `fp32,compile,acc2` and before `bf16,acc2`."""
    away = tuple(v not in _PLAIN for v in _setting_parts(setting).values())
    return sum(away), away


def natural_key(label: str) -> tuple:
    """A case label's sort key (see case_labels): the strategy's name, then its options with
    each axis's plain value first (`single [fp32, acc1]` before `[fp32, acc2]` before
    `[bf16, acc1]`; `[eager]` before `[compile]`) and numbers as numbers: `[bucket_cap_mb=1]`
    before `=25` before `=100` (text order puts 100 first), 0.05 before 0.25 before 0.5."""

    def numbers(text: str) -> tuple:
        return tuple(
            (0, float(part), "") if _NUMBER.fullmatch(part) else (1, 0.0, part)
            for part in _NUMBER.split(text)
            if part
        )

    name, _, options = label.partition(" [")
    values = options.removesuffix("]").split(", ") if options else []
    return numbers(name), tuple((v not in _PLAIN, numbers(v)) for v in values)


def case_key(case: Any, world_size: Any) -> tuple:
    """A cell's place in every table and plot: its case by natural_key, then world size."""
    return natural_key(str(case)), int(world_size)


def case_labels(
    pairs: Iterable[tuple[str, str]], *, per_strategy: bool = False
) -> dict[tuple[str, str], str]:
    """A display name for every (strategy, setting): the strategy's name, plus in brackets
    the axes on which some strategy of the run has more than one value (`ddp_torchrun
    [bf16]`, `ddp_torchrun [bucket_cap_mb=25]`). A run that varies nothing shows bare names,
    and amp_ddp's own bf16 beside everyone's fp32 is not an axis. `per_strategy`: only the
    axes on which that strategy varies (two runs compared, where one strategy's setting
    changed between them and the others' did not)."""
    pairs = sorted(set(pairs))
    seen: dict[tuple[str, str], set[str]] = {}
    for strategy, setting in pairs:
        for axis, value in _setting_parts(setting).items():
            seen.setdefault((strategy, axis), set()).add(value)
    varying = {axis for (_, axis), values in seen.items() if len(values) > 1}
    labels = {}
    for strategy, setting in pairs:
        parts = _setting_parts(setting)
        if per_strategy:
            varying = {axis for axis in parts if len(seen[(strategy, axis)]) > 1}
        shown = [v for axis, v in parts.items() if axis in varying]
        labels[(strategy, setting)] = f"{strategy} [{', '.join(shown)}]" if shown else strategy
    return labels
