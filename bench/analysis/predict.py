"""`parabench predict RUN_DIR --world-sizes 4,8,64 [--busbw GB/s | --link NAME]`: step time,
samples/s and scaling efficiency at world sizes not run, from what the run measured.

The model, per strategy and run option, from its one-process (world size 1) cell:

    step(N) = data(N) + compute(N) + f * comm(N),   band [data + max(fastest, comm), data + slowest + comm]

- compute(N): the cell's own step time at the per-rank batch of N ranks (the global batch
  split N ways), measured after its timed steps (`Strategy.compute_curve`), the median over
  the cell's repeats, pooled with those of every case that differs from it only by its
  launcher (`_same_steps`); fastest and slowest: the repeats' extremes, which the band spans
  (on a busy machine they differ up to twofold at small batches, far more than overlap moves
  the step, and a strategy's median of three is no steadier). On a CPU, a rank of N shares
  the cores (cores / N threads each) while N fits the machine; past it each rank is assumed
  a device like this run's one-process cell (all its threads), and beyond the measured
  batches the time is a straight line fitted through them (below the smallest, never under
  its time per sample).
- data(N): the one-process cell's data wait (pooled likewise), split N ways.
- comm(N): the collectives the strategy issues per step (`Strategy.traffic`: DDP's bucketed
  all-reduce, ZeRO-1's parameter broadcast, FSDP's all-gathers, once a micro-batch under
  --accumulate, and reduce-scatter, Horovod's fused all-reduce; under --sync-bn, plus
  SyncBatchNorm's statistics collectives, `strategies.base.sync_bn_traffic`), each timed
  with the run's measured latency-bandwidth fit (bench.harness.collectives, ring model
  extrapolated to N), or with a named link's stated bandwidth and latency.
- efficiency: over N times the one-process samples/s from the same source as compute(N):
  the timed steps where ranks share the cores, else the curves at the whole batch (the timed
  steps ran moments apart from the curve, and on a busy machine the two differed fivefold).
- f: the exposed share of communication, exposed / total as the probe measured it at another
  world size of the same strategy, pooled likewise (never the one predicted); without one, or
  where the ablation leaves some collectives running (`report.ablation_keeps`), 1 (no
  overlap, the band's top), as on a CPU, where gloo's threads and the compute share the
  same cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import program
from bench.config import ConfigError, comma_items, not_a_run, run_dir_named
from bench.harness.collectives import ROUGH_R2

#: what-if links: (all-reduce bus bandwidth GB/s, latency per hop in µs), stated assumptions.
#: NVLink 4 on H100 SXM: 900 GB/s both ways per GPU, 450 one way, the ceiling of busbw;
#: InfiniBand NDR 400 Gb/s = 50 GB/s, HDR 200 Gb/s = 25 GB/s; Ethernet line rates / 8.
#: Latencies are typical orders of magnitude, not measurements.
LINKS: dict[str, tuple[float, float]] = {
    "nvlink-h100": (450.0, 3.0),
    "ib-400g": (50.0, 5.0),
    "ib-200g": (25.0, 5.0),
    "eth-100g": (12.5, 20.0),
    "eth-25g": (3.125, 30.0),
}
#: the --busbw a what-if may ask about, GB/s: from 1 MB/s (slower than any network a cluster
#: runs on; below it a step takes hours and the table's figures overflow their columns) to
#: 100 TB/s (over a hundred times NVLink 4's, past any GPU's own memory; above it the
#: collectives' time is their latency alone, as at 100 TB/s)
BUSBW_RANGE_GBPS = (1e-3, 1e5)
WHAT_IF_SIZES = (8, 64)
WHAT_IF_LINKS = ("nvlink-h100", "ib-400g", "eth-25g")
#: a check (predicted against measured at a world size run) off by more than this, in %,
#: makes the strategy's predictions doubtful: well past the ±12 % that make bench's other
#: checks reach (the repeats' noise), the model misses part of what the strategy's steps do
DOUBTFUL_PCT = 25.0
#: what the tables' `exposed` column means, in one sentence
EXPOSED_KEY = (
    "exposed: the share of the step's communication that the step waits for (not hidden "
    "behind compute), the probes' exposed over total at the strategy's other world sizes "
    "(and those of a case that differs only by its launcher); 1.00 where none was measured "
    "or the ablation cannot switch all of it off (ZeRO-1's broadcast, FSDP's all-gathers): "
    "none hidden assumed."
)

#: what the table's `eff` column is over, in one sentence: not the summary's base (single)
EFFICIENCY_KEY = (
    "eff: predicted samples/s over N times the case's own one-process samples/s (not the "
    "report's scaling efficiency, which is over `single`): as measured where ranks share its "
    "cores, from its compute curve's whole batch where each rank is a device of its own, "
    "as the prediction's compute is."
)


def strong_scaling_line(global_batch: int, sizes: Iterable[int], lead: str = "batch: the") -> str:
    """What batch a rank computes at the predicted world sizes: the run's global batch is
    kept at every one (strong scaling), so at 64 ranks of make bench's 64 each computes one
    sample, and an efficiency of 0.06 there read as the cost of communication alone.
    `lead`: its first words (predict's key "batch: the"; the report's sentence, "The")."""
    each = ", ".join(
        f"{global_batch // n} at {n} ranks"
        for n in sorted(set(sizes))
        if n > 1 and global_batch % n == 0
    )
    return (
        f"{lead} run's global batch of {global_batch} samples a step at every world size "
        "(strong scaling, as the run measured it), so each of N data-parallel ranks computes "
        f"1/N of it{f' (samples a rank: {each})' if each else ''}; a rank that computes a few samples a "
        "step uses its device less well, which lowers efficiency as communication does."
    )


@dataclass(frozen=True)
class Prediction:
    step_ms: float
    low_ms: float
    high_ms: float
    compute_ms: float
    data_ms: float
    comm_ms: float

    def samples_per_s(self, global_batch: int, ms: float | None = None) -> float:
        ms = self.step_ms if ms is None else ms
        return global_batch / ms * 1e3 if ms > 0 else float("nan")


def comm_ms(
    traffic: Sequence[tuple[str, float, int]],
    fits: Mapping[str, Mapping[str, Any]],
    world_size: int,
    *,
    busbw_GBps: float | None = None,
    alpha_us: float | None = None,
) -> float:
    """Time of one step's collectives at `world_size`: each op's calls, each of bytes / calls,
    with the op's fit, or where the run has none with a bandwidth and a latency for it (not
    measured, or either hidden by a noisy machine's times), another op's: all-reduce's
    first, then any. Bus bandwidth is defined so that it is one figure of the link across
    ops (nccl-tests)."""
    from bench.harness import collectives

    total = 0.0
    for op, nbytes, calls in traffic:
        fit = _fit_for(op, fits, busbw_GBps, alpha_us)
        total += calls * collectives.predict_seconds(fit, op, nbytes / calls, world_size) * 1e3
    return total


def _fit_for(
    op: str,
    fits: Mapping[str, Mapping[str, Any]],
    busbw_GBps: float | None = None,
    alpha_us: float | None = None,
) -> Mapping[str, Any]:
    """The fit `op` is timed with: its own, else all-reduce's, else any (see comm_ms), with
    a what-if's link in place of the measured one: its bus bandwidth (--busbw or --link)
    and its latency per hop (--link; --busbw keeps the fit's). The one place a what-if is
    applied: comm_ms times the collectives with it and `bandwidths` says it."""
    from bench.harness import collectives

    fit = fits.get(op) or fits.get("all_reduce") or next(iter(fits.values()), None)
    if fit is None:
        raise ConfigError(f"no collective fit for {op}: the run measured none")
    if busbw_GBps is not None:
        fit = {**fit, "busbw_GBps": busbw_GBps}
    if alpha_us is not None:  # a named link: its latency per hop, at any world size
        fit = {**fit, "alpha_us": alpha_us * collectives.hops(fit["op"], fit["world_size"])}
    return fit


def bandwidths(
    traffic: Sequence[tuple[str, float, int]],
    fits: Mapping[str, Mapping[str, Any]],
    busbw_GBps: float | None = None,
) -> tuple[float, str]:
    """The bus bandwidth (GB/s) comm_ms times `traffic` at, where its collectives share one
    (else nan), and each collective with its own, in words: FSDP's all-gathers and
    reduce-scatters each at their own fit's, not at all-reduce's, which they never issue."""
    said, values = [], set()
    for op in dict.fromkeys(op for op, _, _ in traffic):
        fit = _fit_for(op, fits, busbw_GBps)
        value = float(fit["busbw_GBps"])
        whose = "" if busbw_GBps is not None or fit["op"] == op else f" ({fit['op']}'s fit)"
        said.append(f"{op} {value:.3g} GB/s{whose}")
        values.add(value)
    return (values.pop() if len(values) == 1 else math.nan), "; ".join(said)


def predict_step(
    compute: float,
    data: float,
    comm: float,
    exposed_fraction: float | None = None,
    compute_range: tuple[float, float] | None = None,
    blocking: float = 0.0,
) -> Prediction:
    """One step from its parts (ms): comm exposed by `exposed_fraction` (1 when unknown),
    between full overlap and none. `compute_range`: the fastest and slowest compute over the
    repeats, which the band spans too (the repeats of one cell vary more than overlap does).
    `blocking`: communication the step waits for whole, overlap or none (SyncBatchNorm's
    statistics, which the next layer needs): never taken as hidden, by any share."""
    f = 1.0 if exposed_fraction is None or math.isnan(exposed_fraction) else exposed_fraction
    f = min(max(f, 0.0), 1.0)
    fast, slow = compute_range or (compute, compute)
    fast, slow = min(fast, compute), max(slow, compute)
    # overlap cannot make a step shorter than its longer part
    return Prediction(
        step_ms=max(data + compute + f * comm, data + max(compute, comm)) + blocking,
        low_ms=data + max(fast, comm) + blocking,
        high_ms=data + slow + comm + blocking,
        compute_ms=compute,
        data_ms=data,
        comm_ms=comm + blocking,
    )


def compute_at(curve: Sequence[Mapping[str, float]], batch: int) -> tuple[float, str]:
    """Step time at `batch` samples from the measured curve (batch -> ms): the point itself,
    else the straight line through the two measured batches nearest to it (between them:
    interpolated; below the smallest: that line's fixed cost and slope carried down, but
    never under the smallest batch's time per sample: a line steepened by a noisy repeat
    would put a negative fixed cost there, and a step of no time)."""
    points = sorted({int(p["batch"]): float(p["ms"]) for p in curve}.items())
    exact = dict(points).get(batch)
    if exact is not None:
        return exact, f"measured at batch {batch}"
    if len(points) < 2:
        return float("nan"), "too few measured batch sizes to extrapolate"
    near = sorted(points, key=lambda p: (abs(p[0] - batch), p[0]))[:2]
    (b0, t0), (b1, t1) = sorted(near)
    t = t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
    smallest, at_smallest = points[0]
    if batch < smallest and t < at_smallest * batch / smallest:
        # fewer samples cost at least their share of the smallest batch's time
        return at_smallest * batch / smallest, f"batch {smallest}'s time per sample"
    return max(t, 0.0), f"line through batches {b0} and {b1}"


# ------------------------------------------------------------------ from a run directory


def _records(run_dir: Path, row: Mapping[str, Any]) -> dict[str, Any]:
    from bench.harness.results import cell_dirname

    path = (
        run_dir
        / "cells"
        / cell_dirname(row["strategy"], int(row["world_size"]), row["setting"], int(row["repeat"]))
        / "epochs.jsonl"
    )
    if not path.exists():
        return {}
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    return json.loads(lines[-1]) if lines else {}


def _shape(run_dir: Path):
    """The model's shape as the run saved it (model.json)."""
    from strategies.base import ModelShape

    path = run_dir / "model.json"
    try:
        return ModelShape(**json.loads(path.read_text())["shape"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if path.is_file():  # there, but damaged or not parabench's: not the run's options
            raise ConfigError(
                f"{path} is unreadable ({type(exc).__name__}: {exc}); it holds no model shape "
                "to predict from"
            ) from None
        raise ConfigError(
            f"{path}: no model shape to predict from ({type(exc).__name__}); the run was made "
            "with --no-scaling-model or before parabench predict existed"
        ) from None


def _fits(
    run_dir: Path, cfg: Any, run: Any, busbw_GBps: float | None = None, link: str | None = None
) -> dict[str, dict]:
    """The collectives' fit per op at the largest world size measured (collectives.json,
    as `run` read it); where there is none, the run's config and rows say why. A what-if
    supplies a bandwidth (--busbw) or a bandwidth and a latency (--link): a fit that lacks
    what it supplies (a noisy machine's, whose latency was not resolved) serves it too."""
    if not (run_dir / "collectives.json").exists():
        raise ConfigError(
            f"{run_dir} has no collectives.json: the run measured no collectives "
            f"({_why_no_collectives(run_dir, cfg, run.runs)})"
        )
    if busbw_GBps is None and link is None:
        return run.fits
    return run.fits_for(busbw=False, latency=link is None)


def read_collectives(path: Path) -> dict[str, Any]:
    """collectives.json at `path`; ConfigError where it is unreadable."""
    from bench.harness import collectives

    try:
        return collectives.load(path)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is unreadable ({type(exc).__name__}: {exc})") from None


def best_fits(
    path: Path, busbw: bool = True, latency: bool = True, loaded: Mapping[str, Any] | None = None
) -> dict[str, dict]:
    """Each op's fit at the largest world size in collectives.json `path` with a bandwidth
    and a latency; `busbw` or `latency` False: with or without it (a what-if link's
    supplies it). `loaded`: the file as already read (report.Run.collectives)."""
    data = read_collectives(path) if loaded is None else loaded
    try:
        fits = data.get("fits", {})
        best: dict[str, dict] = {}
        pairs = False  # any fit of two ranks or more, with or without its figures
        for fit in fits.values():
            with contextlib.suppress(KeyError, TypeError, ValueError):  # (said below)
                pairs = pairs or int(fit["world_size"]) >= 2
            if busbw and not math.isfinite(float(fit.get("busbw_GBps", float("nan")))):
                continue  # latency-bound or undetermined: no bandwidth to carry over
            if latency and not math.isfinite(float(fit.get("alpha_us", float("nan")))):
                continue  # latency not resolved (fitted below 0): none to carry over
            if int(fit["world_size"]) < 2:
                continue
            if fit["op"] not in best or fit["world_size"] > best[fit["op"]]["world_size"]:
                best[fit["op"]] = fit
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is unreadable ({type(exc).__name__}: {exc})") from None
    if not best and not pairs:  # no what-if supplies the ranks a fit is of
        raise ConfigError(f"{path} holds no fit of two ranks or more to predict from")
    if not best and busbw and latency:
        raise ConfigError(
            f"{path} holds no fit with both a bandwidth and a latency to predict from (each "
            "fit's note in it says why); a what-if link (--link) supplies both"
        )
    if not best and latency:
        raise ConfigError(
            f"{path} holds no fit with a latency to predict from (each fit's note in it says "
            "why); --busbw supplies a bandwidth only, a what-if link (--link) both"
        )
    if not best:
        raise ConfigError(f"{path} holds no fit of two ranks or more to predict from")
    return best


def _why_no_collectives(run_dir: Path, cfg: Any, runs: Any) -> str:
    """Why a run has no collectives.json, from its config and rows (as
    bench.harness.runner.measure_collectives decides): a run that asked for the measurement
    and had multi-process cells is not one that had none; its measurement failed."""
    import pandas as pd

    import strategies
    from bench.harness import results

    # a parabench from before the measurement wrote no scaling_model into config.json, and
    # reading it fills in today's default (on): its run did not fail to measure, it never tried
    with contextlib.suppress(OSError, ValueError):
        if "scaling_model" not in json.loads((run_dir / "config.json").read_text()):
            return "it was made by a parabench from before these measurements"
    if not cfg.scaling_model:
        return "it was run with --no-scaling-model"
    if cfg.multi_host:
        return (
            "it ran across nodes, where they are not measured: on the driver they would time "
            "its loopback, not the network between nodes"
        )
    registry = strategies.registry()
    names = runs["strategy_name" if "strategy_name" in runs else "strategy"]
    sizes = pd.to_numeric(runs["world_size"], errors="coerce")
    for name, size, status in zip(names, sizes, runs["status"], strict=True):
        spec = registry.get(str(name))
        planned = status not in (results.SKIPPED, results.UNAVAILABLE)  # cells that never ran
        if size > 1 and planned and spec and spec.cls and spec.cls.multiprocess:
            return (
                "it has multi-process cells, but the measurement at the start of the run "
                "failed (the run's output said why) or could not run (more ranks than GPUs)"
            )
    return "it had no multi-process cell at a world size above 1"


def _config(run_dir: Path, link: str | None = None) -> Any:
    """The run's RunConfig, or a ConfigError where `run_dir` holds no run to predict from
    or `link` is not one of LINKS."""
    from bench.harness.runner import RunDir

    run_dir = run_dir_named(run_dir)  # as report and compare say it
    rd = RunDir(run_dir)
    if not rd.config_path.exists():
        raise not_a_run(run_dir, "config.json")
    if not rd.runs.path.exists():
        raise ConfigError(
            f"{run_dir}: no cell has finished yet (no runs.csv); `{program()} run --resume "
            f"{run_dir}` continues the run"
        )
    if link is not None and link not in LINKS:
        raise ConfigError(f"unknown link {link!r}; choose one of {', '.join(LINKS)}")
    try:
        return rd.config()
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{run_dir}: unreadable run ({type(exc).__name__}: {exc})") from None


def predict_run(
    run_dir: Path,
    world_sizes: Sequence[int],
    *,
    busbw_GBps: float | None = None,
    link: str | None = None,
    holdout: bool = True,
    why: list[str] | None = None,
    run: Any = None,
) -> list[dict[str, Any]]:
    """Predictions for every modelled strategy of the run at `world_sizes` (rows). World
    sizes that do not divide the global batch are left out. `holdout` (the default): the
    exposed share at world size N is never taken from the cell measured at N, so the
    measured figure checks the prediction. Efficiency: predicted samples/s over N times the
    same strategy's one-process samples/s. `why`, if given, gets a line for each case or
    world size left out and the reason. `run`: the run as `report.load_run` read it, so a
    caller that has it (the report) does not have it read again."""
    import pandas as pd

    import strategies
    from bench.analysis import report
    from bench.harness import results
    from bench.harness.breakdown import PHASES
    from bench.harness.env import oversubscribed
    from strategies.ddp import DistributedDataParallel

    cfg = _config(run_dir, link)
    # read as the report reads it: numbers as numbers, columns an older run lacks empty
    if run is None:
        run = report.load_run(run_dir)
    runs = run.runs
    fits = _fits(run_dir, cfg, run, busbw_GBps, link)
    shape = _shape(run_dir)
    alpha = None
    if link is not None:
        busbw_GBps, alpha = LINKS[link]
    what_if = busbw_GBps is not None
    counted = report.counted_rows(runs)  # by case: strategy and setting
    counted["label"] = counted["strategy"]  # as the report names the case
    counted["strategy"] = counted["strategy_name"]  # the registry's name from here on
    num = ["world_size", "samples_per_s", "comm_exposed_ms", "comm_total_ms", "data_wait_ms_mean"]
    num += [f"{p}_ms" for p in PHASES]
    for col in num:
        counted[col] = pd.to_numeric(counted[col], errors="coerce")
    out = []
    groups = counted.groupby(["strategy", "setting"])  # in the report's order of cases
    for (name, setting), group in sorted(
        groups, key=lambda g: results.natural_key(g[1]["label"].iloc[0])
    ):
        spec = strategies.registry().get(name)
        one = group[group["world_size"] == 1]
        case = group["label"].iloc[0]
        if spec is None or spec.cls is None:
            _say(why, f"{case}: not a strategy this parabench has")
            continue
        if one.empty:  # where the strategy is not modelled at all (pipelines), that first
            row = group.iloc[0]
            options = json.loads(_text(row["options"]) or "{}")
            traffic = _traffic(
                spec.cls, options, int(row["world_size"]), shape, row["precision"], 1, _sync_bn(row)
            )
            missing = "no world-size-1 cell finished ok to predict from"
            _say(why, f"{case}: {traffic if isinstance(traffic, str) else missing}")
            continue
        first = one.iloc[0]
        cpu = first["device"] != "cuda"  # where the run ran, not where this runs
        options = json.loads(_text(first["options"]) or "{}")
        # its micro-batches per optimizer step (--accumulate); 1 for a run older than that column
        k = _count(first.get("accumulate"))
        # SyncBatchNorm's statistics collectives, besides the strategy's own (its one-process
        # cell synced nothing: one rank has no peers)
        sync_bn = _sync_bn(first)
        # every case whose steps are this one's, launched differently: their cells measure
        # the same data wait, compute and share of communication exposed
        pool = _same_steps(counted, spec.cls, options, setting)
        ones = pool[pool["world_size"] == 1]
        curves = [
            _records(run_dir, r).get("probe", {}).get("compute_curve") for _, r in ones.iterrows()
        ]
        curves = [c for c in curves if c]
        # the cases whose one-process cells the compute and data wait stand on
        pooled = sorted(set(ones["label"]) - {case}, key=results.natural_key)
        measured1 = one["samples_per_s"].median()
        cores = _cores(first["threads_per_rank"], run.environment)
        compute1 = float(np.nansum([ones[f"{p}_ms"].median() for p in PHASES]))
        data1 = float(ones["data_wait_ms_mean"].median())
        for n in world_sizes:
            both = _traffic(spec.cls, options, n, shape, first["precision"], k, sync_bn)
            if isinstance(both, str):
                _say(why, f"{case}: {both}")
                continue
            own_traffic, synced = both
            traffic = own_traffic + synced
            if not curves:
                _say(why, f"{case}: {_no_curve(run_dir, one)}")
                continue
            if cfg.global_batch % n:
                _say(why, f"world size {n} does not divide the global batch {cfg.global_batch}")
                continue
            if cfg.global_batch % (n * k):
                # as the run skips such a cell (runner._check_shares): no rank of N could
                # cut its share into the case's micro-batches, so there is no step to predict
                _say(
                    why,
                    f"{case}: at world size {n} each rank's share of the global batch "
                    f"({cfg.global_batch // n} of {cfg.global_batch}) does not cut into its "
                    f"{k} micro-batches (--accumulate): a cell the run would skip",
                )
                continue
            own1 = measured1  # what the efficiency is over: the one process as measured
            shares_cores = cpu and not oversubscribed(n, cores)
            if shares_cores:
                # N ranks on cores/N threads each share this machine's cores, as the runner
                # shares them: together they do the one-process cell's work on the same
                # cores, in about its time
                compute, basis = compute1, "the one-process cell's compute: ranks share its cores"
                times = tuple(ones[[f"{p}_ms" for p in PHASES]].sum(axis=1, min_count=1))
            else:
                batch = cfg.global_batch // n
                at = [compute_at(c, batch) for c in curves]
                times = tuple(t for t, _ in at if t == t)
                if not times:
                    # a curve of one batch size (a global batch of 2 or 3, or micro-batches
                    # of at least 2 samples at a large --accumulate) gives no line: say so,
                    # not a row of nan figures whose reason only predict.csv's basis held
                    measured = sorted({int(p["batch"]) for c in curves for p in c})
                    _say(
                        why,
                        f"{case}: at world size {n} (a rank's batch of {batch}): {at[0][1]} "
                        f"(its compute curve measured batch {', '.join(map(str, measured))})",
                    )
                    continue
                compute, basis = float(np.median(times)), next(b for t, b in at if t == t)
                basis += "; each rank a device like the one-process cell's"
                # the efficiency's one process from the same curves, at the whole batch: the
                # timed steps ran moments apart from them, and on a busy CPU they were 143 ms
                # against the curve's 30, which read as fsdp scaling 1.91 at 8 ranks
                whole = [t for t, _ in (compute_at(c, cfg.global_batch) for c in curves) if t == t]
                own1 = cfg.global_batch / (data1 + float(np.median(whole))) * 1e3 if whole else own1
            if sync_bn and shape.batch_norms:
                basis += (
                    f"; its communication holds SyncBatchNorm's: an all-gather and an "
                    f"all-reduce of statistics for each of {shape.batch_norms} BatchNorm "
                    "layers a micro-batch"
                )
            if shape.param_sizes is None and issubclass(spec.cls, DistributedDataParallel):
                basis += (
                    "; DDP's all-reduces counted from the total bytes (its buckets hold whole "
                    "tensors) and its buffer broadcast left out: model.json records no tensor "
                    "sizes (written before predict counted them; a new run records them)"
                )
            if pooled:
                basis += f"; pooled with {', '.join(pooled)}'s (the same steps, launched apart)"
            # the repeats' spread: their compute differs more than a strategy's does
            spread = [float(t) for t in times if t == t] or [compute]
            compute_range = (min(spread), max(spread))
            data_ms = data1 / n
            comm, blocking = (
                (comm_ms(t, fits, n, busbw_GBps=busbw_GBps, alpha_us=alpha) if n > 1 else 0.0)
                for t in (own_traffic, synced)
            )
            others = pool[(pool["world_size"] > 1) & ~((pool["world_size"] == n) & holdout)]
            shares = (others["comm_exposed_ms"] / others["comm_total_ms"]).replace(
                [np.inf, -np.inf], np.nan
            )
            f = float(shares.clip(0, 1).median()) if shares.notna().any() else None
            keeps = report.ablation_keeps(group)
            if keeps and n > 1:
                # exposed over total is no share of all its communication: the ablation left
                # some of it running (zero1 read 0 exposed of a 72 ms total, its broadcast
                # taken as hidden, where nothing overlaps it), so none hidden is assumed
                f = None
                basis += (
                    f"; none of its communication taken as hidden: the probes' ablation leaves "
                    f"{keeps} running, so their exposed share is not its"
                )
            pred = predict_step(compute, data_ms, comm, f, compute_range, blocking)
            busbw, collectives = bandwidths(traffic, fits, busbw_GBps)
            # an oversubscribed cell's ranks share cores (or GPUs) that the model gives each
            # rank its own of: not a measurement of what it predicts, so no check of it
            at_n = group[(group["world_size"] == n) & ~results.oversubscribed_rows(group)]
            measured = float("nan") if what_if else at_n["samples_per_s"].median()
            sps = pred.samples_per_s(cfg.global_batch)
            sps_low = pred.samples_per_s(cfg.global_batch, pred.high_ms)
            sps_high = pred.samples_per_s(cfg.global_batch, pred.low_ms)
            # over N times the strategy's own one-process samples/s
            eff, eff_low, eff_high = (
                x / (n * own1) if own1 > 0 else float("nan") for x in (sps, sps_low, sps_high)
            )
            out.append(
                {
                    "strategy": name,
                    "setting": setting,
                    "case": case,  # the report's name: the strategy and the axes it varies
                    "world_size": n,
                    "link": link or ("custom" if what_if else "measured"),
                    # the one its collectives were timed at (nan where they differ), and
                    # each collective's: FSDP's are all-gathers and reduce-scatters
                    "busbw_GBps": busbw,
                    "collectives": collectives,
                    "compute_ms": compute,
                    "compute_ms_low": compute_range[0],
                    "compute_ms_high": compute_range[1],
                    "data_ms": data_ms,
                    "comm_ms": pred.comm_ms,
                    # no communication (one process): no share of it to expose; SyncBN's
                    # (blocking) exposed whole beside the share of the strategy's own
                    "exposed_fraction": (
                        math.nan
                        if pred.comm_ms == 0
                        else 1.0
                        if f is None
                        else (f * comm + blocking) / pred.comm_ms
                    ),
                    "step_ms": pred.step_ms,
                    "step_ms_low": pred.low_ms,
                    "step_ms_high": pred.high_ms,
                    "samples_per_s": sps,
                    "samples_per_s_low": sps_low,
                    "samples_per_s_high": sps_high,
                    "efficiency": eff,
                    "efficiency_low": eff_low,
                    "efficiency_high": eff_high,
                    "measured_samples_per_s": measured,
                    # at one process the prediction is built from the measured cells (the
                    # case's own, pooled with its launcher twin's): no check of it
                    "error_pct": 100 * (sps / measured - 1)
                    if measured == measured and n > 1
                    else float("nan"),
                    "basis": basis,
                    # N ranks on this machine's cores, given the one-process cell's compute
                    # (busy_line reads it)
                    "shares_cores": shares_cores,
                }
            )
    return out


def check_run(run_dir: Path, *, why: list[str] | None = None, run: Any = None) -> list[dict]:
    """The predictions at the world sizes above one the run measured, each without its own
    measurement, that have a measurement to check them against."""
    import pandas as pd

    from bench.analysis import report

    if run is None:
        run = report.load_run(run_dir)
    sizes = sorted(
        {int(w) for w in pd.to_numeric(run.runs["world_size"], errors="coerce").dropna()} - {1}
    )
    rows = predict_run(run_dir, sizes, holdout=True, run=run, why=why)
    return [r for r in rows if r["measured_samples_per_s"] == r["measured_samples_per_s"]]


def above_linear(rows: Sequence[Mapping[str, Any]]) -> str:
    """A line naming the predictions of efficiency above 1, and what it rests on, or "":
    the compute curve's time at a rank's batch under 1/N of its time at the whole batch,
    since both sides of the efficiency come from that curve (ranks sharing the cores cannot
    reach 1). The curve's points are timed moments apart: a busy machine between them
    reads as a smaller batch being faster per sample, as can caches."""
    over = [
        f"{r['case']} at {r['world_size']}"
        + (f" on {r['link']}" if r["link"] != "measured" else "")
        for r in rows
        if r["efficiency"] > 1
    ]
    if not over:
        return ""
    return (
        f"Efficiency above 1: {', '.join(dict.fromkeys(over))}: its compute curve timed a "
        "rank's batch in less than its share of the whole batch's time; real where a smaller "
        "batch runs faster per sample (caches), noise where the machine was busier for one "
        "point of the curve than another (cells/*/epochs.jsonl holds it)."
    )


def is_doubtful(error_pct: float) -> bool:
    """Whether a check's error (%, predicted against measured) is past DOUBTFUL_PCT."""
    return abs(error_pct) > DOUBTFUL_PCT  # (nan: not past)


def doubtful(checked: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The cases whose check is off by more than DOUBTFUL_PCT, each with where and by how
    much ("+45.7% at world size 2")."""
    out: dict[str, list[str]] = {}
    for r in checked:
        err = r["error_pct"]
        if is_doubtful(err):
            out.setdefault(r["case"], []).append(f"{err:+.1f}% at world size {r['world_size']}")
    return {case: ", ".join(where) for case, where in out.items()}


def doubtful_line(case: str, where: str, busy: Collection[str] = ()) -> str:
    """`busy`: the cases busy_line blames on the machine, whose miss is said to be its."""
    cause = (
        "its one-process cell's threads were slowed by a busy machine (below)"
        if case in busy
        else "the model misses part of what its steps do"
    )
    return (
        f"{case}: the prediction is off what was measured by {where} (more than "
        f"±{DOUBTFUL_PCT:g}%): {cause}, so its predictions are doubtful"
    )


#: what model.json's peak sources said of a busy machine before it listed them in
#: `busy_peaks` (runner.measure_flops): read only in a model.json without that list
BUSY_PEAK_BEFORE = "measured less: a busy machine"


def busy_line(run_dir: Path, checked: Sequence[Mapping[str, Any]]) -> tuple[str, list[str]]:
    """A line where checks at world sizes whose ranks share the cores came out doubtful and
    faster than predicted on a CPU whose several-thread matrix product timed under one
    thread's at the run's start (model.json's `busy_peaks`): the one-process cells' threads
    waited on each other there, and their steps, which such a prediction stands on, are no
    measure of the cores (2-core runs beside other work: ranks of one thread each 3 to 7
    times faster). Also the cases it names; ("", []) where it has nothing to say."""
    slow = [
        r
        for r in checked
        if is_doubtful(r["error_pct"]) and r["error_pct"] < 0 and r["shares_cores"]
    ]
    if not slow:  # nothing to explain: model.json unread
        return "", []
    try:
        info = json.loads((run_dir / "model.json").read_text())
        if "busy_peaks" in info:
            busy = sorted(str(k) for k in info["busy_peaks"])
        else:  # written before the list: its peaks' sources said it
            peaks = info.get("peaks", {})
            busy = sorted(k for k, v in peaks.items() if BUSY_PEAK_BEFORE in str(v[1]))
    except (OSError, ValueError, AttributeError, TypeError, IndexError, KeyError):
        return "", []
    if not busy:
        return "", []
    cases = ", ".join(dict.fromkeys(f"{r['case']} at {r['world_size']}" for r in slow))
    return (
        f"Busy machine: {cases} ran faster than predicted, where ranks sharing the cores are "
        "given the one-process cell's time; at the run's start a matrix product on several "
        f"threads timed under one thread's ({', '.join(busy)} in model.json), so the "
        "one-process cells' threads waited on each other, and their steps understate what the "
        "cores do: these misses are the machine's, not the model's (an idle machine checks it)."
    ), list(dict.fromkeys(r["case"] for r in slow))


def _traffic(
    cls: type,
    options: Mapping[str, Any],
    n: int,
    shape: Any,
    precision: Any,
    accumulate: int = 1,
    sync_bn: bool = False,
) -> Any:
    """The class's `traffic` at world size `n` for an optimizer step of `accumulate`
    micro-batches (its `per_micro_batch` ops once each: FSDP's all-gathers at --accumulate 4
    are four times one micro-batch's), with SyncBatchNorm's under `sync_bn` (every forward
    and backward's, so once a micro-batch too) apart: (its own, SyncBatchNorm's); or what it
    raised as the reason it is not modelled: a plug-in's bug costs its own predictions, not
    the report of its run."""
    import strategies
    from strategies.base import sync_bn_traffic

    traffic = strategies.answer(cls.traffic, options, n, shape, _text(precision))
    if isinstance(traffic, str):
        return traffic
    untimed = _untimed(cls, traffic)
    if untimed:
        return untimed
    k, again = accumulate, cls.per_micro_batch
    traffic = [(op, b * k, c * k) if op in again else (op, b, c) for op, b, c in traffic]
    if not sync_bn:
        return traffic, []
    synced = sync_bn_traffic(n, shape)
    if isinstance(synced, str):
        return synced
    return traffic, [(op, b * k, c * k) for op, b, c in synced]


def _untimed(cls: type, traffic: Any) -> str:
    """Why `traffic` (a plug-in's) cannot be timed, or "": each entry (op, bytes, calls) of
    an op the ring model knows. Found here, it costs that strategy's predictions; found as
    they were timed, it stopped predict in a traceback and left the report's scaling section
    with no prediction of any strategy."""
    from bench.harness import collectives

    entries = traffic if isinstance(traffic, list | tuple) else [traffic]
    for entry in entries:
        try:
            op, nbytes, calls = entry
            ok = op in collectives.RING_HOPS and 0 <= float(nbytes) < math.inf
            ok = ok and int(calls) == calls >= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return (
                f"{cls.__name__}.traffic() gave {entry!r}, which predict cannot time: an "
                f"entry is (op, bytes, calls), op one of {', '.join(collectives.RING_HOPS)}"
            )
    return ""


def _sync_bn(row: Mapping[str, Any]) -> bool:
    """Whether the case's row ran under --sync-bn: its sync_bn column, else (a run older
    than that column) its setting's label."""
    try:
        value = float(row["sync_bn"])
    except (KeyError, TypeError, ValueError):
        value = math.nan
    if value == value:
        return value == 1
    return "syncbn" in _text(row.get("setting")).split(",")


def _same_steps(counted: Any, cls: type, options: Mapping[str, Any], setting: str) -> Any:
    """The rows of every case that runs the same steps as the case of `cls`, `options` and
    `setting` (itself included): the same strategy class, options and setting, whatever
    launcher started it (make bench's ddp_spawn and ddp_torchrun). The launcher starts the
    processes and nothing else, so their cells are repeats of one measurement: pooled, the
    median stands on all of them (apart, two medians of three noisy repeats each put the
    two twofold apart at 64 ranks on a busy CPU)."""
    import strategies

    registry = strategies.registry()

    def same(row: Any) -> bool:
        spec = registry.get(row["strategy"])
        return (
            spec is not None
            and spec.cls is cls
            and row["setting"] == setting
            and json.loads(_text(row["options"]) or "{}") == options
        )

    return counted[counted.apply(same, axis=1).astype(bool)] if len(counted) else counted


def _count(*values: Any) -> int:
    """The first of `values` that reads as a count of at least 1 (a row's cell may be text,
    nan, or missing); 1 where none does."""
    for value in values:
        try:
            n = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(n) and n >= 1:
            return int(n)
    return 1


def _cores(threads: Any, environment: Mapping[str, Any]) -> int:
    """The cores the one-process cell had: its row's threads_per_rank (it had them all);
    where the row does not say (a run older than that column, or edited), the cores the
    run's host had (environment.json); 1 where neither says."""
    return _count(threads, environment.get("cpu_cores"))


def _no_curve(run_dir: Path, one: Any) -> str:
    """Why the world-size-1 rows `one` give no compute curve: no cells/ at all, no folder
    of theirs in it (a runs.csv that names no setting cannot be matched to one), or a
    folder without the curve."""
    import pandas as pd

    from bench.harness.results import cell_dirname

    cells = run_dir / "cells"
    if not cells.is_dir():
        return (
            "no cells/ folder here to read its compute curve from (the CPU references leave it out)"
        )
    first = one.iloc[0]
    name, repeat = first["strategy"], int(first["repeat"])
    folders = [
        cell_dirname(r.strategy, int(r.world_size), r.setting, int(r.repeat))
        for r in one.itertuples()
    ]
    if not any((cells / f).is_dir() for f in folders):
        if (one["setting"] == "").all():
            head, tail = f"{name}-ws1-", f"-r{repeat}"
            found = sorted(p.name for p in cells.glob(f"{head}*{tail}"))
            like = ""
            if found:  # the folder's name holds the setting, its commas as +
                setting = found[0].removeprefix(head).removesuffix(tail).replace("+", ",")
                like = f" (cells/{found[0]} is setting {setting})"
            return (
                "runs.csv gives its world-size-1 cell no setting (no `setting` column: a run "
                "from before it, or a CSV made by hand), so its cells/ folder, where the "
                "compute curve is, cannot be found; fill the `setting` column as the folders "
                f"name it{like}"
            )
        return f"no folder cells/{folders[0]} to read its compute curve from"
    if "compile" in one and (pd.to_numeric(one["compile"], errors="coerce") > 0).all():
        return (
            "compiled under --compile, which times no compute curve (every batch size would "
            "compile anew): a compiled case is not predicted"
        )
    return "its world-size-1 cell kept no compute curve (cells/*/epochs.jsonl)"


def rough_fits(run_dir: Path, run: Any = None, busbw: bool = True) -> str:
    """A line naming the run's collectives' fits that predictions use (`_fits`) whose times
    scatter about their latency-bandwidth line (r² under ROUGH_R2), or "": the communication
    predicted from them is no better than that line (on a busy CPU gloo's times at one size
    vary more than between sizes). `run`: the run the predictions read (report.load_run),
    whose fits they read already. `busbw` False: those of a --busbw what-if, which supplies
    their bandwidth (a fit with none, latency-bound, serves it)."""
    path = run_dir / "collectives.json"
    if not path.exists():
        return ""
    fits = best_fits(path, busbw) if run is None else run.fits_for(busbw=busbw)
    rough = [
        f"{f['op']} ({f['backend']}, {f['world_size']} ranks) r² {float(f['r2']):.2f}"
        for f in fits.values()
        if float(f.get("r2", math.nan)) < ROUGH_R2
    ]
    if not rough:
        return ""
    return (
        f"Rough fits: {', '.join(rough)}: their measured times scatter about the latency-"
        "bandwidth line the communication is predicted from, so that part of each prediction "
        "is rough (collectives.json holds the points)."
    )


def _say(why: list[str] | None, line: str) -> None:
    if why is not None and line not in why:
        why.append(line)


def _text(value: Any) -> str:
    """A text cell of runs.csv: "" where it was left empty (pandas reads that as NaN)."""
    return "" if value is None or value != value else str(value)


COLUMNS = [
    "strategy",
    "setting",
    "case",
    "world_size",
    "link",
    "busbw_GBps",
    "collectives",
    "compute_ms",
    "compute_ms_low",
    "compute_ms_high",
    "data_ms",
    "comm_ms",
    "exposed_fraction",
    "step_ms",
    "step_ms_low",
    "step_ms_high",
    "samples_per_s",
    "samples_per_s_low",
    "samples_per_s_high",
    "efficiency",
    "efficiency_low",
    "efficiency_high",
    "measured_samples_per_s",
    "error_pct",
    "basis",
]


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    wide = max([18, *(len(str(r["case"])) + 1 for r in rows)])
    head = (
        f"{'strategy':<{wide}}{'ws':>4}{'link':>13}{'compute ms':>11}{'comm ms':>9}{'exposed':>8}"
        f"{'step ms':>9}{'samples/s':>11}{'band':>19}{'eff':>6}{'measured':>10}{'error':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        band = f"{r['samples_per_s_low']:.0f}-{r['samples_per_s_high']:.0f}"
        meas = r["measured_samples_per_s"]
        err = r["error_pct"]
        exposed = r["exposed_fraction"]  # nan at one process: no communication to expose
        lines.append(
            f"{r['case']:<{wide}}{r['world_size']:>4}{r['link']:>13}{r['compute_ms']:>11.2f}"
            f"{r['comm_ms']:>9.2f}"
            + (f"{exposed:>8.2f}" if exposed == exposed else f"{'–':>8}")
            + f"{r['step_ms']:>9.2f}"
            f"{r['samples_per_s']:>11.1f}"
            f"{band:>19}"
            + (f"{r['efficiency']:>6.2f}" if r["efficiency"] == r["efficiency"] else f"{'–':>6}")
            + (f"{meas:>10.1f}" if meas == meas else f"{'–':>10}")
            + (f"{err:>+7.1f}%" if err == err else f"{'–' if meas == meas else '':>8}")
        )
    return "\n".join(lines)


#: predict's world sizes when none are given
DEFAULT_SIZES = (2, 4, 8, 64)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in comma_items(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected world sizes like 4,8,64, got {text!r}") from exc
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"world sizes are positive integers, got {text!r}")
    return tuple(sorted(set(sizes)))  # each once: a size given twice is one prediction


def _is_reference(run_dir: Path) -> bool:
    """A run under results/reference/: a committed reference, which a prediction (one per
    link asked about) must not add an untracked file to."""
    return any(
        p.name == "reference" and p.parent.name == "results" for p in run_dir.resolve().parents
    )


def _csv_path(a: argparse.Namespace, run_dir: Path) -> Path | None:
    """Where predict.csv goes: --csv, else the run directory, none for a committed reference.
    A --csv that cannot be written is said before anything is predicted."""
    if a.csv is None:
        return None if _is_reference(run_dir) else run_dir / "predict.csv"
    path = Path(a.csv).expanduser()
    if path.is_dir():
        raise ConfigError(f"--csv {a.csv} is a directory; name a file, e.g. {path / 'predict.csv'}")
    if not path.parent.is_dir():
        raise ConfigError(f"--csv {a.csv}: no such directory {path.parent}")
    return path


def cmd_predict(a: argparse.Namespace) -> int:
    import csv

    from bench.analysis import report
    from bench.harness import results

    run_dir = run_dir_named(a.run_dir)
    low, high = BUSBW_RANGE_GBPS
    if a.busbw is not None and not low <= a.busbw <= high:  # nan fails both comparisons
        raise ConfigError(
            f"--busbw is a link's bus bandwidth in GB/s, from {low:g} (1 MB/s) to {high:g} "
            f"(100 TB/s); got {a.busbw:g}"
        )
    path = _csv_path(a, run_dir)
    why: list[str] = []
    sizes = a.world_sizes or DEFAULT_SIZES
    batch = _config(run_dir, a.link).global_batch
    run = report.load_run(run_dir)  # once, for the predictions and their checks
    rows = predict_run(run_dir, sizes, busbw_GBps=a.busbw, link=a.link, why=why, run=run)
    uneven = [str(n) for n in a.world_sizes or () if batch % n]
    if uneven:  # asked for: no rank count that cannot split the batch has a prediction
        raise ConfigError(
            f"--world-sizes: {', '.join(uneven)} cannot split the run's global batch "
            f"{batch} evenly; predict at sizes that divide it"
        )
    if not rows:
        print("nothing to predict:")
        for line in why or ["the run has no cell that finished ok"]:
            print(f"  {line}")
        return 1
    print(table(rows))
    print(EXPOSED_KEY)
    print(EFFICIENCY_KEY)
    print(strong_scaling_line(batch, (r["world_size"] for r in rows)))
    above = above_linear(rows)
    if above:
        print(above)
    # a named link's figures replace the fits' (--busbw keeps their latencies)
    rough = rough_fits(run_dir, run, busbw=a.busbw is None) if a.link is None else ""
    if rough:
        print(rough)
    # a strategy whose check at a world size run is far off: its every prediction is doubtful
    try:
        checked = check_run(run_dir, run=run)
    except ConfigError:  # the measured fits predict nothing: a what-if's rows stand
        if a.link is None and a.busbw is None:
            raise
        print(
            "no check of the predictions against the world sizes run: the run's own fits "
            "lack a latency or a bandwidth to predict them with (collectives.json's notes say why)"
        )
        checked = []
    busy, busy_cases = busy_line(run_dir, checked)
    for case, where in doubtful(checked).items():
        if any(r["case"] == case for r in rows):
            print(f"doubtful: {doubtful_line(case, where, busy_cases)}")
    if busy:
        print(busy)
    for line in why:  # the cases and sizes left out of the table, each with its reason
        print(f"parabench: not predicted: {line}", file=sys.stderr)
    if path is None:
        print(
            f"predictions not written: {run_dir} is a committed reference; --csv PATH writes them"
        )
        return 0
    try:  # whole or not at all: a stop mid-write leaves the file of the call before
        with results.written_whole(path, newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    except OSError as exc:  # a run copied read-only from another machine, say
        raise ConfigError(
            f"cannot write {path} ({exc.strerror or exc}); --csv PATH writes it elsewhere"
        ) from exc
    print(f"predictions: {path}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "predict",
        help="step time, samples/s and efficiency at world sizes not run, from a run's "
        "compute, its collectives' fit and each strategy's traffic",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory; each strategy from its world-size-1 cell",
    )
    p.add_argument(
        "--world-sizes",
        type=_sizes,
        default=None,
        help=f"default {','.join(map(str, DEFAULT_SIZES))} (those that divide the global batch)",
    )
    p.add_argument(
        "--csv",
        default=None,
        metavar="PATH",
        help="where the predictions' CSV goes (default RUN_DIR/predict.csv; for a committed "
        "reference under results/reference/, none)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--busbw", type=float, default=None, help="what-if bus bandwidth, GB/s")
    where.add_argument(
        "--link",
        default=None,
        choices=list(LINKS),
        help="what-if link (its bandwidth and latency are stated assumptions: bench/analysis/predict.py)",
    )
    p.set_defaults(func=cmd_predict)
