"""The matrix: plan every (strategy, world size, repeat) cell, run each isolated, keep rows.

Planning happens before anything starts, so bad input costs nothing. Each cell runs in
its own process tree with a deadline; whatever it does (crash, OOM, hang), it becomes
rows with a status and a reason, its processes are gone afterwards, and the matrix
goes on. Rows are written as each cell ends; `--resume` skips finished cells.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import strategies
from bench import ROOT, program
from bench.config import ConfigError, RunConfig, RunStopped
from bench.harness import nodes, proc, results, slurm
from bench.harness.env import (
    CpuShare,
    cpu_cores,
    device_count,
    machine_state,
    oversubscribed,
    provenance,
    resolve_device,
    threads_per_process,
)
from bench.harness.launchers import LAUNCHERS
from bench.harness.progress import Display, LastStep
from bench.harness.progress import read as read_progress
from bench.harness.results import cell_dirname, row_key
from bench.workload import data, models
from bench.workload.models import check_model, check_model_args
from strategies.base import Setting

Echo = Callable[[str], None]
#: rank/rendezvous variables of an enclosing launcher; each cell's launcher sets its own
LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PARABENCH_STORE",
    "TORCHELASTIC_RUN_ID",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR",
    "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "HOROVOD_CONTROLLER",
)


def launcher_free(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without an enclosing launcher's rank and rendezvous variables: a harness started
    under torchrun or horovodrun, or a shell with a cluster's MASTER_ADDR, must not leak
    them into a cell's launcher (its ranks would meet there)."""
    return {k: v for k, v in env.items() if k not in LAUNCHER_VARS}


def on_loopback(env: dict[str, str]) -> dict[str, str]:
    """`env` with gloo's and Horovod's interface the loopback, where the user named none:
    the ranks of one machine talk to each other and to no other address."""
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("HOROVOD_GLOO_IFACE", "lo")
    return env


@dataclass(frozen=True)
class Cell:
    strategy: str
    world_size: int
    repeat: int
    setting: Setting = field(default_factory=Setting)
    #: the strategy options given with --set that this strategy takes (one point of a sweep)
    options: tuple[tuple[str, str], ...] = ()
    status: str = ""  # pre-decided: skipped / unavailable
    reason: str = ""
    #: skipped for this machine's cores or GPUs alone: with more, it would run
    short: bool = False

    @property
    def label(self) -> str:
        """The run options of this cell, e.g. `bf16,acc2,bucket_cap_mb=25` (runs.csv: setting)."""
        return ",".join([self.setting.label, *(f"{k}={v}" for k, v in self.options)])

    @property
    def key(self) -> tuple[str, int, str, int]:
        return (self.strategy, self.world_size, self.label, self.repeat)

    @property
    def dirname(self) -> str:
        return cell_dirname(self.strategy, self.world_size, self.label, self.repeat)


def default_world_sizes(n_devices: int) -> tuple[int, ...]:
    sizes, ws = [], 1
    while ws <= n_devices:
        sizes.append(ws)
        ws *= 2
    return tuple(sizes)


def plan(cfg: RunConfig, gpus_per_node: int = 0, resuming: bool = False) -> list[Cell]:
    """Every cell of the matrix, or a ConfigError that says what is wrong with the request.

    The matrix is strategy x world size x run options (precision, compile, accumulation,
    SyncBN, and any `--set key=a,b` sweep) x repeat. A cell a strategy cannot run here is a
    skipped row with the reason; a strategy named with --strategies that can run none of its
    cells is an error, since that is what was asked for directly. `gpus_per_node`: checked
    for the machines a job will run on, not this one (`parabench submit` on a login node
    without a GPU): CUDA, with that many GPUs on each node. `resuming`: a cell skipped for
    this machine's cores or GPUs alone is one the run will run where it fits, not one a
    strategy named cannot run (open_run leaves it for such a resume).
    """
    device = "cuda" if gpus_per_node else usable_device(cfg.device)
    n_dev = gpus_per_node or device_count(device)
    sizes = cfg.world_sizes or default_world_sizes(n_dev)
    explicit = bool(cfg.strategies)
    for name in cfg.exclude:
        strategies.get(name)  # an unknown name is an error, not silently nothing
    specs = (
        [strategies.get(n) for n in cfg.strategies]
        if explicit
        else [s for s in strategies.registry().values() if s.name not in cfg.exclude]
    )
    if not specs:
        raise ConfigError("--exclude leaves no strategy to run")
    check_model(cfg.model)
    check_model_args(cfg)
    data.check(cfg)
    sweeps = _option_sweeps(cfg.options, specs)
    renamed: list[str] = []  # every variant the options turn into a sibling, at once
    for spec in specs:
        for point in _option_points(spec, sweeps):
            sibling = _runs_as_sibling(spec, point)
            if sibling:
                out = f"--exclude {spec.name}" if not explicit else "of --strategies"
                renamed.append(f"{sibling}, or leave {spec.name} out ({out})")
    if len(renamed) > 1:  # numbered, as the strategies that cannot run are below
        raise ConfigError(" ".join(f"({i}) {r}" for i, r in enumerate(renamed, 1)))
    if renamed:
        raise ConfigError(renamed[0])
    cells: list[Cell] = []
    impossible: list[str] = []  # every named strategy that can run none of its cells, at once

    def never(c: Cell) -> bool:  # a cell that runs in none of this run's resumes
        return bool(c.status) and not (resuming and c.short)

    for spec in specs:
        why_not = spec.unavailable(device)
        if why_not and explicit:
            impossible.append(f"strategy {spec.name} is unavailable: {why_not}")
            continue
        try:
            mine = _cells(cfg, spec, device, n_dev, sizes, sweeps, why_not)
        except ConfigError as exc:  # a batch its ranks cannot share
            impossible.append(str(exc))
            continue
        if explicit and all(never(c) for c in mine):
            impossible.append(_cannot_run(spec.name, mine))
        cells += mine
    if not impossible and cells and all(never(c) for c in cells):
        # every strategy's cells skipped (--world-sizes 64 on 2 cores): a run of skipped rows
        # only, that timed steps for its estimate and exited 0 with nothing measured. Where
        # some are skipped as the batch does not cut into equal micro-batches, --accumulate
        # is what to change; else the reasons the cells were skipped (not the strategies
        # that are unavailable here, unless all are)
        why = [c.reason for c in cells if isinstance(c.reason, UnevenCut)]
        why = why or [c.reason for c in cells if c.status == results.SKIPPED]
        why = why or [c.reason for c in cells]
        impossible.append(f"no cell can run: {'; '.join(dict.fromkeys(why))}")
    impossible = list(dict.fromkeys(impossible))  # a batch every strategy fails alike: once
    if len(impossible) > 1:  # numbered: a reason may hold a ';' of its own
        raise ConfigError(" ".join(f"({i}) {r}" for i, r in enumerate(impossible, 1)))
    if impossible:
        raise ConfigError(impossible[0])
    if cfg.dataset == "synthetic":  # each process of a cell makes its own: the most on a machine
        of = {s.name: s for s in specs}
        ran = [of[c.strategy].cls.processes(c.world_size) for c in cells if not c.status]
        data.check_fits(cfg, models.spec(cfg), -(-max(ran, default=1) // max(1, cfg.nodes)))
    return interleaved(cells, cfg.seed)


def _cells(
    cfg: RunConfig,
    spec: strategies.StrategySpec,
    device: str,
    n_dev: int,
    sizes: Sequence[int],
    sweeps: Any,
    why_not: str | None,
) -> list[Cell]:
    """One strategy's cells of the matrix, each with the reason it cannot run here, if
    any; a ConfigError where a cell that could run cannot share the batch."""
    points = _option_points(spec, sweeps)
    settings = _settings(cfg, spec, device, points)
    mine: list[Cell] = []
    for ws, (setting, opts) in itertools.product(sizes, settings):
        # what unsuitable sees: the run's config with this cell's --accumulate
        as_cell = (
            cfg
            if tuple(cfg.accumulate) == (setting.accumulate,)
            else cfg.replace(accumulate=(setting.accumulate,))
        )
        # a node's GPUs (as many as this machine's on every node), or its cores
        room = (
            n_dev * cfg.nodes
            if device == "cuda" or not spec.cls
            else cpu_capacity(cfg, Cell(spec.name, ws, 0, setting, opts, "", ""))
        )
        cannot = _across_nodes(cfg, spec) or spec.cannot_run(ws, device, room, cfg.oversubscribe)
        reason = why_not or (
            cannot
            or spec.unsupported(setting, device)
            or spec.unsuitable(as_cell, ws, merged_options(spec, opts))
        )
        short = bool(cannot and not why_not) and not (
            _across_nodes(cfg, spec) or spec.cannot_run(ws, device, 2**31, cfg.oversubscribe)
        )
        if not reason:
            shares = spec.batch_shares(ws, merged_options(spec, opts))
            if isinstance(shares, str):
                reason = shares
            else:
                reason = _check_shares(cfg, spec.name, ws, setting.accumulate, shares)
        for r in range(cfg.repeats):
            status = (results.UNAVAILABLE if why_not else results.SKIPPED) if reason else ""
            mine.append(Cell(spec.name, ws, r, setting, opts, status, reason or "", short))
    return mine


def _check_shares(cfg: RunConfig, name: str, ws: int, k: int, shares: int) -> str | None:
    """A ConfigError where a cell that would run cannot give each of its data-parallel
    shares (each rank's, or each model-parallel group's) the same part of every batch; the
    reason its cell is skipped where the shares can be given but not cut into the cell's k
    micro-batches (another world size's, or another --accumulate's, may be: a run of
    `--world-sizes 1,2 --accumulate 8` at global batch 24 can run at world size 1)."""
    if cfg.global_batch % (shares * k) == 0:
        return None
    whose = (
        f"world size {ws}"
        if shares == ws
        else f"{name}'s {shares} data-parallel group(s) at world size {ws}"
    )
    said = f"global batch {cfg.global_batch} is not divisible by {whose}"
    if cfg.global_batch % shares:
        raise ConfigError(f"{said}; every rank must get the same share")
    return UnevenCut(f"{said} x {k} micro-batches")


class UnevenCut(str):
    """The reason a cell is skipped where its shares of the batch do not cut into its
    --accumulate's micro-batches (plan() names these first where no cell can run)."""


def _across_nodes(cfg: RunConfig, spec: Any) -> str | None:
    """Why a strategy's cells cannot run on several nodes, if they cannot."""
    from bench.harness.nodes import MULTI_NODE_LAUNCHERS

    if cfg.launcher == "slurm" and spec.launcher != "torchrun":
        mpi = " (Horovod under SLURM: srun --mpi with an MPI build, README)"
        return (
            f"cannot run as srun's ranks: {spec.name} starts its own processes "
            f"({spec.launcher}); under --launcher slurm, torch.distributed strategies run"
            + (mpi if spec.launcher == "horovodrun" else "")
        )
    if cfg.nodes == 1 or spec.launcher in MULTI_NODE_LAUNCHERS:
        return None
    how = {
        "inprocess": "runs in one process on one host",
        "spawn": "starts its ranks with mp.spawn on one host",
    }.get(spec.launcher, f"its launcher {spec.launcher} starts every rank on one host")
    return f"cannot run across {cfg.nodes} nodes: {spec.name} {how}"


def per_host(cfg: RunConfig, cell: Cell) -> int:
    """A cell's processes on one host: all of them, or one node's share (every node's,
    where all the agents run on this machine: no --host-exec)."""
    if cfg.multi_host:
        here = not (cfg.host_exec or cfg.launcher)
        return cfg.procs_per_node * (cfg.nodes if here else 1)
    spec = strategies.get(cell.strategy)
    return spec.cls.processes(cell.world_size) if spec.cls else 1


def launched_on(cfg: RunConfig) -> str:
    """The hosts a cell's ranks are started on, as a row's `hosts` names them (each rank
    says its own, bench.harness.worker._host): --hosts (or the SLURM allocation's nodes)
    across nodes, else this machine."""
    if cfg.multi_host and cfg.hosts:
        return ",".join(cfg.hosts[: cfg.nodes])
    return socket.gethostname()


def cpu_share(cfg: RunConfig, cell: Cell) -> tuple[int, int]:
    """(ranks, cores) that share one node's CPU: a node's M ranks and its --cores-per-node C
    across nodes, else the cell's processes on this machine and this machine's cores."""
    if cfg.multi_host and cfg.cores_per_node:
        return cfg.procs_per_node, cfg.cores_per_node
    return per_host(cfg, cell), cpu_cores()


def rank_threads(cfg: RunConfig, cell: Cell) -> int:
    """Threads per rank: its node's cores shared by the node's ranks (or as the run says)."""
    return cfg.threads_per_rank or threads_per_process(*cpu_share(cfg, cell))


def cpu_capacity(cfg: RunConfig, cell: Cell) -> int:
    """The largest world size whose ranks each get a core, at this cell's ranks per node."""
    ranks, cores = cpu_share(cfg, cell)
    return cores * cell.world_size // max(1, ranks)


def interleaved(cells: list[Cell], seed: int) -> list[Cell]:
    """The cells round by round (round r: every cell's repeat r), each round in its own
    order, shuffled with the run's seed: a machine that slows down over minutes hits every
    strategy alike, and no strategy always runs first after another. The same seed gives
    the same order (a resumed run follows it)."""
    import random

    rounds: dict[int, list[Cell]] = {}
    for c in cells:
        rounds.setdefault(c.repeat, []).append(c)
    ordered: list[Cell] = []
    for r in sorted(rounds):
        todo = list(rounds[r])
        random.Random(f"parabench/{seed}/{r}").shuffle(todo)
        ordered += todo
    return ordered


def merged_options(spec: strategies.StrategySpec, opts: Iterable[tuple[str, str]]) -> dict:
    """A cell's strategy options: its variant's, overridden by the --set values it takes."""
    return {**(spec.variant.options if spec.variant else {}), **dict(opts)}


def _cannot_run(name: str, cells: list[Cell]) -> str:
    """Why a strategy named on the command line has no cell to run: each reason with the
    world sizes it stops, and the settings only where it stops some of a size's, so the
    fix for each shows in one short line however many settings the matrix sweeps."""
    labels = list(dict.fromkeys(c.label for c in cells))
    where: dict[str, dict[int, list[str]]] = {}
    for c in cells:
        at = where.setdefault(c.reason, {}).setdefault(c.world_size, [])
        if c.label not in at:
            at.append(c.label)

    def said(by_size: dict[int, list[str]]) -> str:
        # the sizes it stops whole, then those it stops in some settings, grouped by them
        groups: dict[tuple[str, ...], list[int]] = {}
        for ws, at in by_size.items():
            groups.setdefault(() if len(at) == len(labels) else tuple(at), []).append(ws)
        # a one-setting matrix names its setting (fp32 goes unsaid): what was asked for
        one = labels[0] if len(labels) == 1 and labels[0] != "fp32" else ""
        return " and at ".join(
            f"world size {','.join(map(str, sizes))}"
            + (f" with {' | '.join(at)}" if at else f" with {one}" if one else "")
            for at, sizes in sorted(groups.items(), key=lambda g: (bool(g[0]), g[1]))
        )

    if len(where) == 1:
        ((reason, by_size),) = where.items()
        return f"{name} cannot run at {said(by_size)}: {reason}"
    return f"{name} cannot run: " + "; ".join(
        f"at {said(by_size)}: {reason}" for reason, by_size in where.items()
    )


def _settings(
    cfg: RunConfig, spec: strategies.StrategySpec, device: str, points: list[tuple]
) -> list[tuple[Setting, tuple[tuple[str, str], ...]]]:
    """Every (run options, strategy options) combination of the matrix for one strategy;
    the options that change nothing in a setting (`idle_options`) left out of its cells,
    which then run once (sweep_notes says so)."""
    out: list[tuple[Setting, tuple[tuple[str, str], ...]]] = []
    for opts in points:
        default = spec.default_precision(device, merged_options(spec, opts))
        for p, c, k, bn, cl in itertools.product(
            cfg.precisions or (default,),
            cfg.compile,
            cfg.accumulate,
            cfg.sync_bn,
            cfg.channels_last,
        ):
            mode = cfg.compile_mode if c else "default"
            setting = Setting(
                precision=p,
                compile=c,
                compile_mode=mode,
                accumulate=k,
                sync_bn=bn,
                channels_last=cl,
            )
            idle = spec.idle_options(cfg, setting, merged_options(spec, opts))
            kept = tuple((k, v) for k, v in opts if k not in idle)
            if (setting, kept) not in out:
                out.append((setting, kept))
    return out


def _option_sweeps(options: dict[str, str], specs: list[strategies.StrategySpec]) -> dict:
    """--set key=a,b,c: each key's values, checked against every selected strategy taking it."""
    sweeps: dict[str, list[str]] = {}
    for key, value in options.items():
        values = [v.strip() for v in value.split(",")]
        if any(not v for v in values) or len(set(values)) != len(values):
            raise ConfigError(f"--set {key}={value}: give distinct, non-empty values")
        takers = [s for s in specs if key in s.accepts]
        if not takers:
            known = sorted({k for s in specs for k in s.accepts})
            raise ConfigError(
                f"--set {key}: no selected strategy takes this option; "
                f"options: {', '.join(known) or 'none'}"
            )
        for s in takers:
            for v in values:
                problem = option_problem(s.accepts[key], v)
                if problem:
                    raise ConfigError(f"--set {key}={v}: {s.name} takes {key} = {problem}")
            # 1 and 01, 25 and 25.0, or true and on (a flag's), are one value: two cells
            # of the same run
            parsed = [_parsed(v, s.accepts[key]) for v in values]
            if len(set(parsed)) != len(parsed):
                raise ConfigError(f"--set {key}={value}: a value is given twice")
        sweeps[key] = values
    return sweeps


def sweep_notes(cfg: RunConfig, cells: Sequence[Cell]) -> list[str]:
    """A line for each --set option that only some of the planned strategies take: which
    take it (in each of its values) and which run once without it (not an error: --set is
    for the strategies that take it), single aside."""
    specs = [strategies.get(n) for n in dict.fromkeys(c.strategy for c in cells)]
    lines = []
    for key in cfg.options:
        # single, the baseline every cell is compared with, runs plain: that goes unsaid
        without = [s.name for s in specs if s.name != "single" and key not in s.accepts]
        if without:
            takers = ", ".join(s.name for s in specs if key in s.accepts)
            lines.append(
                f"--set {key}: taken by {takers}; not by {', '.join(without)}, run without it"
            )
        lines += _idle_notes(cfg, key, [s for s in specs if key in s.accepts], cells)
    return lines


def _idle_notes(
    cfg: RunConfig, key: str, specs: list[strategies.StrategySpec], cells: Sequence[Cell]
) -> list[str]:
    """A line for each strategy taking --set `key` whose cells in some settings run without
    it, since it changes nothing there (`idle_options`): which settings, and why."""
    value = cfg.options[key].split(",")[0].strip()
    said: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # (why, settings): strategies
    for spec in specs:
        why: dict[str, list[str]] = {}
        for c in cells:
            if c.strategy != spec.name or key in dict(c.options):
                continue
            opts = {**merged_options(spec, c.options), key: value}
            idle = spec.idle_options(cfg, c.setting, opts).get(key)
            if idle and c.setting.label not in why.setdefault(idle, []):
                why[idle].append(c.setting.label)
        for idle, labels in why.items():
            said.setdefault((idle, tuple(labels)), []).append(spec.name)
    lines = []
    for (idle, labels), names in said.items():
        whose = f"{names[0]} runs its" if len(names) == 1 else f"{', '.join(names)} run their"
        lines.append(f"--set {key}: {whose} {' | '.join(labels)} cells once without it: {idle}")
    return lines


def _parsed(value: str, allowed: tuple[str, ...] | type = str) -> Any:
    """A --set value as the option reads it: a flag's as true or false (true, 1, yes and on
    are one value), else a number where it reads as one (1, 01 and 1.0 are one value)."""
    if allowed is bool:
        from strategies.ddp import flag  # how the strategies read one

        return flag(value)
    try:
        return float(value)
    except ValueError:
        return value.lower()


def usable_device(device: str) -> str:
    """`--device` resolved (auto: cuda where torch sees one); ConfigError for cuda without."""
    device = resolve_device(device)
    if device == "cuda" and not _cuda_available():
        raise ConfigError(
            "--device cuda asked for, but torch sees no CUDA device; use --device cpu"
        )
    return device


def option_problem(allowed: tuple[str, ...] | type, value: str) -> str | None:
    """None if `value` is allowed, else what is (for the error message)."""
    if isinstance(allowed, tuple):
        return None if value in allowed else " | ".join(allowed)
    if allowed is bool:
        ok = value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off")
        return None if ok else "true | false"
    try:
        number = allowed(value)
    except ValueError:
        return f"{'an' if allowed is int else 'a'} {allowed.__name__}"
    return None if 0 < number < math.inf else f"a positive, finite {allowed.__name__}"


def _runs_as_sibling(spec: strategies.StrategySpec, point: Sequence[tuple[str, str]]) -> str:
    """Where --set changes an option that tells the strategy's variants apart so that its
    cells are a sibling variant's (fsdp_zero2 with reshard_after_forward=true is fsdp, and
    fsdp with false is fsdp_zero2; pipeline_1f1b with schedule=gpipe is pipeline_gpipe): a
    line saying so, else "". Its rows would carry a
    name that says what they did not run. Another value (microbatches=8) stays a sweep, and
    so does one beside the change (pipeline_1f1b with schedule=gpipe,microbatches=8 is still
    GPipe's): the variants are told apart by the options on which they differ alone."""
    if spec.cls is None or spec.variant is None:
        return ""
    fixed, takes = spec.variant.options, spec.accepts
    siblings = vars(spec.cls).get("variants", {})
    # the options that name a variant: those its siblings fix otherwise (schedule, not the
    # microbatches=4 every pipeline fixes alike)
    naming = {
        k
        for v in siblings.values()
        for k in v.options
        if len({w.options.get(k) for w in siblings.values()}) > 1
    }

    def same(key: str, a: str, b: str) -> bool:  # true and on, 4 and 04: one value
        return _parsed(a, takes.get(key, str)) == _parsed(b, takes.get(key, str))

    # an option the variant leaves at the strategy's default counts too: horovod with
    # compression=fp16 is horovod_fp16, as horovod_fp16 with compression=none is horovod
    changed = [
        (k, v) for k, v in point if k in naming and (k not in fixed or not same(k, v, fixed[k]))
    ]
    if not changed:
        return ""
    cell = merged_options(spec, point)
    for name, variant in siblings.items():
        if name == spec.name or variant.launcher != spec.variant.launcher:
            continue
        if not all(
            k in cell and same(k, cell[k], v) for k, v in variant.options.items() if k in naming
        ):
            continue
        asked = ",".join(f"{k}={v}" for k, v in changed)
        if all(k in fixed for k, _ in changed):  # set back to what the sibling leaves
            own = ",".join(f"{k}={fixed[k]}" for k, _ in changed)
            return (
                f"--set {asked} makes {spec.name} ({name} with {own}) run as {name}: "
                f"set it on {name}"
            )
        # a value the sibling fixes (where the variant leaves it unset, its default is
        # not known here: it must be the sibling's own value to be its cell)
        if all(k in fixed or k in variant.options for k, _ in changed):
            return (
                f"--set {asked} makes {spec.name} run as {name} (which is {spec.name} with "
                f"{asked}): run {name} for it"
            )
    return ""


def _option_points(spec: strategies.StrategySpec, sweeps: dict[str, list[str]]) -> list[tuple]:
    """The points of the option sweep this strategy takes part in (one, empty, if none)."""
    if spec.cls is None:
        return [()]
    keys = sorted(k for k in sweeps if k in spec.accepts)
    return [
        tuple(zip(keys, vals, strict=True))
        for vals in itertools.product(*(sweeps[k] for k in keys))
    ]


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


#: a run's lock taken by another process is tried again this many times, this far apart:
#: `parabench report` in a second terminal holds it a moment to read whether the run is
#: held (results.held_by), and a --resume begun then was refused as if the run were going
LOCK_TRIES, LOCK_RETRY_S = 5, 0.05


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs = results.CsvTable(path / "runs.csv", results.RUN_COLUMNS)
        self.steps = results.CsvTable(path / "steps.csv", results.STEP_COLUMNS)
        self.ranks = results.CsvTable(path / "ranks.csv", results.RANK_COLUMNS)
        self.plan = results.CsvTable(path / "plan.csv", results.PLAN_COLUMNS)
        #: the earlier attempts of the cells --retry-failed ran again (retry_failed)
        self.retried = results.CsvTable(
            path / results.RETRIED / "runs.csv", results.ATTEMPT + results.RUN_COLUMNS
        )
        self._lock: Any = None

    def lock(self, new_run: bool = False) -> None:
        """Hold the run for this process until `unlock` (or its exit, however it ends): a
        second harness on the same run, a `--resume` of a run still going, would run its
        cells again into the same cell folders and lose rows of both. ConfigError if another
        process holds it (`new_run`: as check_free says it); OSError where the folder cannot
        be written (open_run says so); a file system without locks runs unguarded."""
        import fcntl

        path = self.path / ".lock"
        tries = LOCK_TRIES
        while True:
            f = open(path, "a+")  # noqa: SIM115 - held open while the run lasts
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                pid = f.read().strip() or "?"
                f.close()
                tries -= 1
                if tries > 0:  # a report reading whether the run is held holds it a moment
                    time.sleep(LOCK_RETRY_S)
                    continue
                raise ConfigError(self._being_run(pid, new_run)) from None
            except OSError:  # no locks here (some network file systems): as before
                f.close()
                return
            try:  # the file the run's harness removed as it ended holds nothing: anew
                if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                    break
            except FileNotFoundError:
                pass
            f.close()
        try:
            f.truncate(0)
            f.write(f"{os.getpid()}\n")
            f.flush()
        except OSError:  # a full disk
            f.close()
            raise
        self._lock = f

    def _being_run(self, pid: str, new_run: bool = False) -> str:
        """The run is held by another process: a `new_run` (not resuming this one) is told
        to take another --run-id, as resuming a run it did not mean to join is not its way
        on; a --resume, to wait or stop that one first."""
        held = f"{self.path} is being run by another parabench (pid {pid})"
        if new_run:
            return f"{held}; choose another --run-id"
        again = f"`{program()} run --resume {self.path}`"
        return f"{held}; wait for it to end, or stop it and then {again}"

    def check_free(self, new_run: bool = False) -> None:
        """ConfigError if another process holds the run (`lock`), without taking it."""
        pid = results.held_by(self.path)
        if pid is not None:
            raise ConfigError(self._being_run(pid, new_run))

    def unlock(self) -> None:
        if self._lock is not None:  # removed while held: no run folder keeps one
            with contextlib.suppress(OSError):  # a folder gone read-only: left, unheld
                Path(self._lock.name).unlink(missing_ok=True)
            self._lock.close()  # closing the file releases its lock
            self._lock = None

    def write_plan(self, cells: Sequence[Cell]) -> None:
        """plan.csv: the cells the run sets out to run, and any it has a row for that this
        plan lacks (resumed where the default world sizes differ: each row's cell stays
        planned, and one no longer planned is not reported missing for ever)."""
        keys = [c.key for c in cells]
        keys += sorted(self.done() - set(keys))
        names = ("strategy", "world_size", "setting", "repeat")
        # in place, whole: removed first, a resume refused a full disk left the run no plan
        # (the cells it set out to run, which the report and the next resume go by)
        self.plan.write(dict(zip(names, k, strict=True)) for k in keys)

    def planned_sizes(self) -> tuple[int, ...]:
        """The world sizes plan.csv lists (none where it has none, or no row says one)."""
        sizes = set()
        for r in self.plan.read():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                sizes.add(int(r["world_size"]))
        return tuple(sorted(s for s in sizes if s > 0))

    def unplanned(self, cells: Sequence[Cell]) -> list[tuple[str, int, str, int]]:
        """The cells plan.csv lists, with no row in runs.csv, that `cells` (the run planned
        again) lacks."""
        now, done = {c.key for c in cells}, self.done()
        out: dict[tuple[str, int, str, int], None] = {}
        for r in self.plan.read():
            key = row_key(r)
            if key is not None and key not in now and key not in done:
                out[key] = None
        return list(out)

    def began_on(self) -> str | None:
        """The device the run began on (cpu or cuda, as its environment.json says), or None."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            device = json.loads((self.path / "environment.json").read_text()).get("device_type")
            return device if device in ("cpu", "cuda") else None
        return None

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def config(self) -> RunConfig:
        """The run's config as it was saved when the run started."""
        return RunConfig.from_dict(json.loads(self.config_path.read_text()))

    def done(self) -> set[tuple[str, int, str, int]]:
        """The cells runs.csv has a row for; ConfigError for a row cut short or damaged
        (a file copied while it was written, or edited), which no cell can be told from."""
        keys = set()
        for i, r in enumerate(self.runs.read(), 2):
            if "setting" not in r:  # its rows name no cell of a plan made now
                raise ConfigError(
                    f"{self.runs.path} was written by a parabench from before run options (no "
                    "setting column): this one cannot tell which of its cells have run; "
                    f"`{program()} report` reads it, a new run measures again"
                )
            key = row_key(r)
            # fewer or more fields than the header: None among its values, or as a column
            if key is None or None in r or None in r.values():
                raise ConfigError(
                    f"{self.runs.path}: row {i} is cut short or damaged; remove it (its cell "
                    "runs again) and resume"
                )
            keys.add(key)
        return keys

    def drop_unfinished(self) -> None:
        """Drop the steps.csv and ranks.csv rows of cells runs.csv has no row for: those a
        harness wrote before it was killed, or the disk filled up, ahead of the cell's row
        (`write`), and those of a row removed to run its cell again. The cell's run now
        writes its own; kept, they would stand beside them as the same steps twice."""
        done = self.done()

        def finished(r: dict[str, str]) -> bool:
            key = row_key(r)
            return key is None or key in done  # not a cell's: as it was

        self.steps.keep(finished)
        self.ranks.keep(finished)

    def retry_failed(self, cells: Sequence[Cell]) -> tuple[list[str], str]:
        """Make the run's cells that failed, ran out of memory or timed out (RETRYABLE) and
        can run here (`cells`, as planned now) cells to run again: each one's rows move from
        runs.csv, steps.csv and ranks.csv to retried/, numbered with its attempt, and its
        folder to retried/<cell>-attempt<N>/ (log, epochs, traces), so that nothing of the
        attempt is lost and the resume runs the cell anew. A line per cell retried, and one
        on those that cannot run here, left as they are ("" where none)."""
        runnable = {c.key for c in cells if not c.status}
        failed: dict[tuple[str, int, str, int], dict[str, str]] = {}
        for r in self.runs.read():
            key = row_key(r)
            if key is not None and r.get("status") in results.RETRYABLE:
                failed.setdefault(key, r)
        stay = [k for k in failed if k not in runnable]
        keys = {k: None for k in failed if k in runnable}
        lines = [
            f"{_key_text(k)}: {failed[k]['status']} ({failed[k]['reason'] or 'no reason'})"
            for k in keys
        ]
        left = (
            f"{len(stay)} failed cell(s) cannot run here and keep their rows: "
            + "; ".join(_key_text(k) for k in stay)
            if stay
            else ""
        )
        if not keys:
            return lines, left
        into = self.retried.path.parent
        # runs.csv's rows last: until they move, the cell counts as done, so a move cut
        # short (a full disk, a kill) leaves its steps and ranks rows where drop_unfinished
        # keeps them, and the next --retry-failed finishes it under the same number
        tables = [
            (
                self.steps,
                results.CsvTable(into / "steps.csv", results.ATTEMPT + self.steps.columns),
            ),
            (
                self.ranks,
                results.CsvTable(into / "ranks.csv", results.ATTEMPT + self.ranks.columns),
            ),
            (self.runs, self.retried),
        ]
        numbers = self._attempt_numbers(keys)
        folders = {}
        for key in keys:
            n, cell = numbers[key], self.path / "cells" / cell_dirname(*key)
            # past a folder in the way that is no part of this move (its cell's folder still
            # to move): a folder this move put there before a cut is its own
            while (into / f"{cell_dirname(*key)}-attempt{n}").exists() and cell.exists():
                n += 1
            folders[key] = (n, into / f"{cell_dirname(*key)}-attempt{n}")
        with proc.stops_held():  # Ctrl-C waits until every table is moved
            into.mkdir(exist_ok=True)
            for key, (_, folder) in folders.items():
                with contextlib.suppress(FileNotFoundError):  # a row written before its folder
                    os.replace(self.path / "cells" / cell_dirname(*key), folder)
            for table, out in tables:
                rows = [(r, k) for r in table.read() if (k := row_key(r)) in keys]
                there = {k for _, k in rows}
                # copied there before a cut, and still here: once, as copied anew
                out.keep(
                    lambda r, there=there: (
                        (k := row_key(r)) not in there or not _is_attempt(r, folders[k][0])
                    )
                )
                out.append(self._attempt(r, k, *folders[k]) for r, k in rows)
                table.keep(lambda r: row_key(r) not in keys)
        return lines, left

    def _attempt(
        self, row: dict[str, str], key: tuple[str, int, str, int], n: int, folder: Path
    ) -> dict[str, Any]:
        """An earlier attempt's row as retried/ keeps it: its number and folder, and its
        trace (a path in the cell's folder) where that folder now is."""
        out = {**row, "attempt": n, "attempt_dir": str(folder.relative_to(self.path))}
        cell = f"cells/{cell_dirname(*key)}/"
        if str(row.get("trace") or "").startswith(cell):
            out["trace"] = out["attempt_dir"] + "/" + row["trace"].removeprefix(cell)
        return out

    def _attempt_numbers(
        self, keys: Iterable[tuple[str, int, str, int]]
    ) -> dict[tuple[str, int, str, int], int]:
        """Each cell's attempt number for its rows in runs.csv now: one past its last in
        retried/runs.csv, or that last where it holds these very rows (a move cut short
        after it copied them, before it removed them from runs.csv)."""
        now: dict[tuple[str, int, str, int], list[dict[str, str]]] = {}
        for r in self.runs.read():
            if (key := row_key(r)) is not None:
                now.setdefault(key, []).append(_as_moved(r))
        by: dict[tuple[str, int, str, int], dict[int, list[dict[str, str]]]] = {}
        for r in self.retried.read():
            key = row_key(r)
            with contextlib.suppress(TypeError, ValueError):
                if key is not None:
                    by.setdefault(key, {}).setdefault(int(r["attempt"]), []).append(_as_moved(r))
        out = {}
        for key in keys:
            last = max(by.get(key, {0: []}))
            copied = last and by[key][last] == now.get(key)
            out[key] = last if copied else last + 1
        return out

    def write(self, runs: list[dict], steps: list[dict], ranks: list[dict]) -> None:
        with proc.stops_held():
            # steps and ranks first: a row in runs.csv means the cell is complete.
            self.steps.append(steps)
            self.ranks.append(ranks)
            self.runs.append(runs)


def _as_moved(r: Mapping[str, str]) -> dict[str, str]:
    """A runs.csv row as retried/ compares it with its copy there: its own columns but its
    trace (a path in the folder that moved)."""
    return {c: r.get(c) or "" for c in results.RUN_COLUMNS if c != "trace"}


def _is_attempt(r: Mapping[str, str], n: int) -> bool:
    """Whether a row of retried/ is of attempt `n`."""
    try:
        return int(r["attempt"]) == n
    except (KeyError, TypeError, ValueError):
        return False


def _key_text(key: tuple[str, int, str, int]) -> str:
    """A cell as a line names it: `ddp ws=2 bf16 repeat=0` (its setting but plain fp32)."""
    name, ws, setting, repeat = key
    return f"{name} ws={ws}{'' if setting in ('', 'fp32') else ' ' + setting} repeat={repeat}"


def _new_run_id() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


class Runner:
    def __init__(self, cfg: RunConfig, run_dir: RunDir, echo: Echo = print) -> None:
        self.cfg = cfg
        self.dir = run_dir
        self.echo = echo
        self.device = resolve_device(cfg.device)
        # the id the run began under (its config.json's), which its earlier rows carry: a
        # run resumed in a folder renamed or copied under another name is still one run
        self.run_id = cfg.run_id or run_dir.path.name
        self.workers = (
            cfg.workers if cfg.workers is not None else (4 if self.device == "cuda" else 0)
        )
        self.current: proc.CellProcess | None = None
        self.progress: Display | None = None
        #: the cell's place in the run (1-based) and the machine's state as it started
        self.order: dict[tuple, int] = {}
        #: the port a cell's rendezvous listened on, where the harness chose it (across
        #: nodes, or by SLURM): its failed row names it when the log says it was in use
        self.ports: dict[tuple, int] = {}
        self.state: dict[tuple, dict[str, float]] = {}
        #: added to a cell's repeat for its row's round: past the rounds already run (resumed)
        self.round_offset = 0
        model = run_dir.path / "model.json"
        #: model FLOPs and device peaks (measure_flops), for the rows' MFU
        self.model_info: dict[str, Any] = json.loads(model.read_text()) if model.exists() else {}

    # ---- rows ----
    def _ident(self, cell: Cell, epoch: int | str) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "strategy": cell.strategy,
            "world_size": cell.world_size,
            "setting": cell.label,
            "repeat": cell.repeat,
            "epoch": epoch,
        }

    def _base_row(self, cell: Cell, epoch: int | str = "") -> dict[str, Any]:
        cfg = self.cfg
        spec = strategies.get(cell.strategy)
        return {
            **self._ident(cell, epoch),
            "launcher": spec.launcher,
            "device": self.device,
            "dataset": cfg.dataset,
            "model": cfg.model,
            # keys sorted: the same arguments given in another order are the same text, as
            # runs.csv of several runs concatenated are told apart by them
            "model_args": json.dumps(cfg.model_kwargs, sort_keys=True),
            "dataset_args": json.dumps(cfg.dataset_kwargs, sort_keys=True),
            "global_batch": cfg.global_batch,
            "epochs": cfg.epochs,
            "max_steps": cfg.max_steps,
            "warmup_steps": cfg.warmup_steps,
            "target_precision_pct": cfg.target_precision,
            "step_timing": cfg.step_timing,
            "nodes": cfg.nodes,
            "procs_per_node": cfg.procs_per_node or "",
            "seed": cfg.seed,
            "lr": cfg.lr,
            "threads_per_rank": self._threads(cell),
            "oversubscribed": self._oversubscribed(cell),
            "options": json.dumps(self._options(cell)),
            "precision": cell.setting.precision,
            "compile": int(cell.setting.compile),
            "compile_mode": cell.setting.compile_mode if cell.setting.compile else "",
            "accumulate": cell.setting.accumulate,
            "sync_bn": int(cell.setting.sync_bn),
            "channels_last": int(cell.setting.channels_last),
            "optimizer": cfg.optimizer,
            "timestamp": dt.datetime.now().isoformat(timespec="seconds"),
            "round": cell.repeat + self.round_offset,
            "run_order": self.order.get(cell.key, ""),
            **self.state.get(cell.key, {}),
            **provenance(self.device),
        }

    def _status_row(
        self, cell: Cell, status: str, reason: str, wall: float | None = None
    ) -> dict[str, Any]:
        return {**self._base_row(cell), "status": status, "reason": reason, "cell_wall_s": wall}

    def _options(self, cell: Cell) -> dict[str, str]:
        """The strategy's options in this cell: its variant's, overridden by --set."""
        return merged_options(strategies.get(cell.strategy), cell.options)

    # ---- running ----
    def _spec(self, cell: Cell, cell_dir: Path) -> Path:
        spec = {
            "config": self.cfg.to_dict(),
            "strategy": cell.strategy,
            "world_size": cell.world_size,
            "setting": dataclasses.asdict(cell.setting),
            "options": dict(cell.options),
            "repeat": cell.repeat,
            "device": self.device,
            "dir": str(cell_dir),
            "workers_per_device": self.workers,
            "threads": self._threads(cell),
            "shares_gpu": self.device == "cuda" and bool(self._oversubscribed(cell)),
        }
        path = cell_dir / "spec.json"
        path.write_text(json.dumps(spec, indent=1))
        return path

    def _threads(self, cell: Cell) -> int:
        return rank_threads(self.cfg, cell)

    def _oversubscribed(self, cell: Cell) -> int:
        """1 if the cell runs more processes on a host than it has cores (CPU) or GPUs (CUDA,
        ranks of a strategy that can share one): --oversubscribe, for correctness."""
        if self.device == "cpu":
            return int(oversubscribed(*cpu_share(self.cfg, cell)))
        spec = strategies.get(cell.strategy)
        gpus = device_count(self.device)
        return int(bool(spec.cls and spec.cls.shares_gpu) and per_host(self.cfg, cell) > gpus)

    def _env(self, cell: Cell, cell_dir: Path) -> dict[str, str]:
        env = launcher_free(os.environ)
        root = str(ROOT)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env["PARABENCH_CELL"] = str(cell_dir)
        env["OMP_NUM_THREADS"] = str(self._threads(cell))
        env["PARABENCH_PG_TIMEOUT_S"] = str(int(self.cfg.timeout_s))  # the cell deadline rules
        env["PYTHONUNBUFFERED"] = "1"
        # a rank started as this harness was killed dies, not trains on (proc.die_with_parent);
        # on one machine alone: ranks srun, ssh or horovodrun -H start elsewhere descend from
        # no process here
        env.pop(proc.HARNESS_VAR, None)
        if not self.cfg.multi_host:
            env[proc.HARNESS_VAR] = str(os.getpid())
        if self.cfg.multi_host:  # the nodes' interface, or gloo's choice
            env.pop("GLOO_SOCKET_IFNAME", None)
            if self.cfg.ifname:
                env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = self.cfg.ifname
            return env
        return on_loopback(env)

    def run_cell(self, cell: Cell) -> list[dict]:
        """Run one cell and write its rows; returns its runs.csv rows."""
        if cell.status:
            return self._write([self._status_row(cell, cell.status, cell.reason)])
        cell_dir = self.dir.path / "cells" / cell.dirname
        shutil.rmtree(cell_dir, ignore_errors=True)
        cell_dir.mkdir(parents=True)
        spec = strategies.get(cell.strategy)
        t0 = time.monotonic()
        env = self._env(cell, cell_dir)
        self.state[cell.key] = machine_state()
        share = CpuShare()
        # the cell's start on the wall clock every process shares: rank 0 reports its
        # start-up phases against it (bench.harness.worker)
        started = time.time()
        env["PARABENCH_CELL_T0"] = repr(started)
        try:
            spec_path = self._spec(cell, cell_dir)
            step = slurm.step_name(self.dir.path.name, cell.dirname)
            # a port of its own per cell: a rank a lost node left behind may hold the last one
            order = self.order.get(cell.key, 0)
            port = nodes.cell_port(self.cfg.rdzv_port, order)
            if self.cfg.launcher == "slurm":  # one srun step, its tasks the ranks
                port = slurm.cell_port(self.cfg.rdzv_port, order)  # apart from other jobs'
                env |= {"MASTER_ADDR": self.cfg.master_addr, "MASTER_PORT": str(port)}
                argv = slurm.step_argv(self.cfg, spec_path, step, self._threads(cell))
                self.ports[cell.key] = port
            elif self.cfg.nodes > 1 and spec.launcher == "horovodrun":  # -H every node
                commands = [nodes.horovod_command(self.cfg, spec_path, env)]
                argv = nodes.launch_argv(commands, cell_dir / "nodes.json")
            elif self.cfg.nodes > 1:  # one torchrun agent per node (bench.harness.nodes)
                rdzv_id = f"{self.dir.path.name}-{cell.dirname}"
                commands = nodes.node_commands(self.cfg, spec_path, rdzv_id, env, port)
                argv = nodes.launch_argv(commands, cell_dir / "nodes.json")
                self.ports[cell.key] = port
            else:
                argv = LAUNCHERS[spec.launcher](spec_path, cell.world_size, self.device)
        except RuntimeError as exc:
            return self._write([self._status_row(cell, results.FAILED, str(exc))])
        # ranks srun or a remote shell started are not this process's children: their CPU
        # time would read as another's, and this kernel did not kill them
        local = not (self.cfg.launcher or self.cfg.host_exec)
        watch = proc.OomWatch() if local else None
        try:
            self.current = proc.CellProcess(argv, env, cell_dir / "log.txt", str(cell_dir))
        except BaseException:  # it never started: the kernel's log is not read
            if watch is not None:
                watch.close()
            raise
        shown = self.progress
        if shown is not None:
            shown.start(_key_text(cell.key), cell_dir, self.cfg.global_batch)
        heard = LastStep(cell_dir)  # whether a cell killed at its deadline still stepped

        def poll() -> None:
            heard.poll()
            if shown is not None:
                shown.poll()

        try:
            deadline = time.monotonic() + self.cfg.timeout_s
            rc, timed_out = self.current.wait(self.cfg.timeout_s, on_poll=poll)
        except BaseException:  # Ctrl-C / SIGTERM while the cell runs
            with proc.stops_ignored():
                self.current.kill()
                self.current = None
                if watch is not None:
                    watch.close()
                if self.cfg.launcher == "slurm":
                    slurm.cancel_step(step)
            raise
        finally:
            if shown is not None:
                shown.end(ran=True)
        # The cell is over: an interrupt now waits until its rows are on disk.
        with proc.stops_held():
            self.current.reap()
            oom = watch.stop(self.current.pids) if watch is not None else None
            self.current = None
            if self.cfg.launcher == "slurm":  # nothing of the step outlives its row
                slurm.cancel_step(step)
            wall = time.monotonic() - t0
            self.state[cell.key].update(share.stop() if local else CpuShare.unknown())
            return self._write(
                *self._collect(
                    cell, cell_dir, rc, timed_out, wall, started + wall, oom, heard.quiet(deadline)
                )
            )

    def _write(
        self, runs: list[dict], steps: Sequence[dict] = (), ranks: Sequence[dict] = ()
    ) -> list[dict]:
        self.dir.write(runs, list(steps), list(ranks))
        return runs

    def _collect(
        self,
        cell: Cell,
        cell_dir: Path,
        rc: int | None,
        timed_out: bool,
        wall: float,
        ended: float = math.nan,
        oom: proc.OomKills | None = None,
        quiet: float = math.nan,
    ):
        records = _read_records(cell_dir / "epochs.jsonl")
        startup = (
            results.startup(records[0].get("startup", {}), records[-1], ended) if records else {}
        )
        runs, steps, ranks = [], [], []
        why_diverged = results.divergences(
            [[float(v) for v in rec["losses"]] for rec in records], self.cfg.diverge_factor
        )
        for rec, diverged in zip(records, why_diverged, strict=True):
            ident = self._ident(cell, rec["epoch"])
            runs.append(
                {
                    **self._base_row(cell, rec["epoch"]),
                    "backend": rec["backend"],
                    "precision": rec["precision"],
                    "data": rec["data"],
                    "data_path": rec.get("data_path", "loader"),
                    "per_rank_batch": rec["per_rank_batch"],
                    "micro_batch": rec["micro_batch"],
                    "model_params": rec.get("model_params", ""),
                    "seq_len": rec.get("tokens_per_sample") or "",
                    "data_ranks": rec.get("data_ranks", ""),
                    **{k: v for k, v in rec.get("extra", {}).items() if k in results.EXTRA},
                    "numerics": rec["numerics"],
                    "hosts": ",".join(dict.fromkeys(r.get("host", "") for r in rec["ranks"])),
                    "loader_workers": rec["loader_workers"],
                    "threads_per_rank": rec["threads_per_rank"],
                    "warmup_steps": rec["warmup_steps"],
                    "notes": rec["notes"],
                    **_epoch_status(
                        diverged,
                        rec.get("eval_error", ""),
                        rec.get("eval_oom"),
                        oom,
                        rec.get("metrics_error", ""),
                    ),
                    "cell_wall_s": wall,
                    **startup,
                    **results.measure(rec, cell.world_size, self.device),
                }
            )
            runs[-1] |= self._mfu(cell, runs[-1])
            if runs[-1].get("trace"):  # relative to the run directory, as the report links it
                runs[-1]["trace"] = str(cell_dir.relative_to(self.dir.path) / runs[-1]["trace"])
            steps += results.step_rows(ident, rec)
            ranks += results.rank_rows(ident, rec)
        # where it ran, for a row that failed too: its ranks' hosts as an epoch's record says
        # them, else the hosts it was started on (the row said none)
        where = {"hosts": runs[-1]["hosts"] if runs else launched_on(self.cfg)}
        # a rank that raised before the deadline, in a cell that then did not end (its
        # teardown hung: a process group destroyed with a collective its peers never
        # joined): the error is why, not a hang. (One raised after it, as the kill took a
        # loader worker from under its rank, is the kill's.)
        deadline = ended - wall + self.cfg.timeout_s  # (ended - wall: the cell's start)
        raised = _raised(cell_dir, deadline) if timed_out else None
        if raised is not None:
            status, reason = _attributed(*raised, oom)
            reason += (
                f"; then the cell did not end within {self.cfg.timeout_s:g} s: all its "
                "processes were killed"
            )
            runs.append(self._status_row(cell, status, reason, wall) | where)
        elif timed_out:
            reason = self._timeout_reason(cell, cell_dir, quiet)
            runs.append(self._status_row(cell, results.TIMEOUT, reason, wall) | where)
        elif rc != 0 or len(records) < self.cfg.epochs:
            status, reason = _failure(cell_dir, rc, oom)
            port = self.ports.get(cell.key)
            if port is not None and _port_taken(cell_dir, port):
                # the cause first: what the row said alone (a node killed, still waiting
                # after the first host's agent failed) read as a fault of the nodes
                reason = f"{self._port_in_use(port)}; then {reason}"
            runs.append(self._status_row(cell, status, reason, wall) | where)
        return runs, steps, ranks

    def _port_in_use(self, port: int) -> str:
        """What to do about the cell's rendezvous port found in use on its first host."""
        if self.cfg.launcher == "slurm":  # slurm.cell_port: the job id picks the ports
            where = self.cfg.master_addr
            why = (
                f"another job's on the same node? jobs whose ids are a multiple of "
                f"{nodes.PORTS // 2} apart take the same ports: give one another --rdzv-port"
            )
        else:
            where = self.cfg.hosts[0]
            why = (
                "another run's? two at once whose first host is the same need --rdzv-port "
                f"values {nodes.PORTS} apart"
            )
        return f"port {port} on {where}, where the cell's rendezvous listens, was in use ({why})"

    def _timeout_reason(self, cell: Cell, cell_dir: Path, quiet: float = math.nan) -> str:
        """Why a cell was killed at its deadline: a hang, as far as the harness can tell, but
        a compiled cell whose rank 0 finished no step was likely still compiling (its first
        step holds torch.compile's work: tens of seconds to minutes, per process, cold), and
        one whose rank 0 was seen stepping shortly before the deadline (`quiet`: seconds
        from its step count's last move to the deadline, on the harness's clock) was still
        training: the reason says how far it got; one whose rank 0 had run every step was
        killed after them, which the reason says too, and one whose rank 0 had ended no step
        may still have been starting."""
        state = read_progress(cell_dir) or {}
        done, total, step_ms = _steps(state) or (0, 0, math.nan)
        why = "hang?"
        if cell.setting.compile and not state.get("done"):
            why = (
                "its first step had not ended, and that step holds torch.compile's "
                "compilation (a minute or more cold on a CPU): a --timeout that leaves room "
                "for it, or a hang"
            )
        # no step ended on rank 0: horovodrun alone takes 7-12 s to start its ranks here
        # (across nodes rank 0 may write its progress on another host: nothing seen here)
        elif not state and self.cfg.nodes == 1:
            why = (
                "hang? rank 0 had ended no step: still starting (the launcher, the ranks' "
                "rendezvous, the data, the first step) for the --timeout, or hung there"
            )
        # still stepping: its step count seen to move at most three steps or 5 s before the
        # deadline (rank 0 rewrites the progress file at most twice a second, the harness
        # reads it about once a second); a nan quiet (never seen to move) is not
        elif 0 < done < total and quiet <= max(5.0, 3 * step_ms / 1e3):
            why = (
                f"still training: rank 0 had run {done} of {total} steps, {step_ms:.3g} ms "
                f"each, its last step seen {max(0.0, quiet):.1f} s before the deadline; a "
                "--timeout that leaves room for the cell"
            )
        elif 0 < done == total:
            why = (
                f"hang? rank 0 had run all {total} of its steps and was killed "
                "after them, in the evaluation, the communication probe or teardown: too long "
                "for the --timeout, or hung there"
            )
        return f"no result within {self.cfg.timeout_s:g} s ({why}); all its processes were killed"

    def _mfu(self, cell: Cell, row: Mapping[str, Any]) -> dict[str, Any]:
        return mfu_columns(self.model_info, self.device, row)

    def run(self, cells: list[Cell]) -> list[dict]:
        self.order = {c.key: i for i, c in enumerate(cells, 1)}
        done = self.dir.done()
        todo = [c for c in cells if c.key not in done]
        # resumed, its cells run apart in time from the rows already there (minutes, or a
        # day, after a stop): their rounds come after those rows', so that the report never
        # pairs two cells as run side by side in one round (a slow round slows both) where
        # one ran before the stop and the other after it
        rounds = [r.get("round") or "" for r in self.dir.runs.read()]
        self.round_offset = 1 + max((int(r) for r in rounds if r.isdigit()), default=-1)
        if done:
            self.echo(
                f"resuming {self.dir.path}: {len(cells) - len(todo)} of {len(cells)} cells already done"
            )
        for i, cell in enumerate(todo, 1):
            label = (
                f"[{i}/{len(todo)}] {cell.strategy:<14} ws={cell.world_size}"
                f"{'' if cell.label == 'fp32' else ' ' + cell.label} repeat={cell.repeat}"
            )
            if not cell.status:
                self.echo(f"{label} running ...")
            runs = self.run_cell(cell)
            self.echo(f"{label} {_summary(runs[-1])}")
        return self.dir.runs.read()

    def interrupt(self) -> None:
        if self.current is not None:  # normally already killed by run_cell
            self.current.kill()


def _steps(state: Mapping[str, Any]) -> tuple[int, int, float] | None:
    """(steps done, steps in all, ms a step) from rank 0's progress file, or None where it
    says nothing (not yet written, or torn)."""
    try:
        return int(state["done"]), int(state["total"]), float(state["step_ms"])
    except (KeyError, TypeError, ValueError):
        return None


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a rank killed mid-write
            out.append(json.loads(line))
    return out


def _failure(cell_dir: Path, rc: int | None, oom: proc.OomKills | None = None) -> tuple[str, str]:
    """(status, reason) of a cell that failed: `oom` where an allocation failed (CUDA's or
    the CPU's), or where the kernel's log names one of the cell's processes as killed by
    its OOM killer. A SIGKILL alone is no proof of that: the reason says what the kernel
    does say (`oom`: what it logged and counted while the cell ran; None: not known here)."""
    return _attributed(*_failed(cell_dir, rc), oom)


def _attributed(
    status: str, reason: str, sigkill: list[int] | None, oom: proc.OomKills | None
) -> tuple[str, str]:
    """`status` and `reason` of a failure, with what the kernel says of its OOM killer where
    a process died of SIGKILL (`sigkill`: the pids named of those, or None), as _failure."""
    if status == results.OOM or oom is None:
        return status, reason + (" (the kernel's OOM killer?)" if sigkill is not None else "")
    killed = oom.of(sigkill or ())
    if killed:
        return (
            results.OOM,
            f"{reason}; the kernel's OOM killer killed one of the cell's processes (its log: "
            f"{killed})",
        )
    return status, reason + (f" ({oom.otherwise()})" if sigkill is not None else "")


#: a rank's words for a DataLoader worker that died without an exception (a signal: the
#: kernel's OOM killer's SIGKILL, a segfault), naming its pids
_WORKER_DIED = re.compile(
    r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) "
    r"(?:is killed by signal: Killed|exited unexpectedly)"
)


def _worker_pids(message: str) -> list[int] | None:
    """The pids a rank's message names of DataLoader workers that died of a signal
    (_WORKER_DIED), or None where it names none."""
    worker = _WORKER_DIED.search(message)
    return [int(p) for p in worker[1].split(",")] if worker else None


def _raised(cell_dir: Path, before: float = math.inf) -> tuple[str, str, list[int] | None] | None:
    """_failed's status and reason from the first error a rank raised (its error-rank file),
    of those raised before `before` (wall clock), or None where none was."""
    errors = []
    for p in cell_dir.glob("error-rank*.json"):
        with contextlib.suppress(json.JSONDecodeError, OSError):
            errors.append(json.loads(p.read_text()))
    errors = [e for e in errors if e["time"] < before]
    if errors:
        first = min(errors, key=lambda e: e["time"])  # the root cause, not the peers it took down
        status = results.OOM if first["oom"] else results.FAILED
        reason = f"rank {first['rank']}: {first['type']}: {first['message']}"
        lost = _lost_node(cell_dir / "log.txt")
        if lost is not None:  # its ranks died unable to write a word: the errors are its peers'
            reason = f"node {lost[0]} killed by {lost[1]}, then {reason}"
        return status, reason, _worker_pids(first["message"])
    return None


def _failed(cell_dir: Path, rc: int | None) -> tuple[str, str, list[int] | None]:
    """_failure's status and reason from the cell's own files, and where a process of it
    died of SIGKILL (a rank, a launcher, a DataLoader worker), the pids it names of them."""
    log = cell_dir / "log.txt"
    dead = _first_failed_rank(log)
    # a rank its launcher saw fail first, killed by a signal with no error of its own (the
    # OOM killer's SIGKILL, a segfault, an abort): its peers' errors are what its death did
    # to them (a connection closed), whichever was written first
    killed = (
        dead is not None
        and dead[1] < 0
        and not (cell_dir / f"error-rank{dead[0]}.json").exists()
        and _lost_node(log) is None  # across nodes: the node first, then its peers' errors
    )
    raised = None if killed else _raised(cell_dir)
    if raised is not None:
        return raised
    rank, code = dead or (None, rc)
    who = "" if rank is None else f"rank {rank} "
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            name = signal.Signals(-code).name
            said = _cpp_error(cell_dir / "log.txt") if name == "SIGABRT" else ""
            reason = f"{who}killed by {name}" + (f": {said}" if said else "")
            return results.FAILED, reason, [] if name == "SIGKILL" else None
    if rank is not None:  # the log's last line is the launcher's summary, not the rank's
        return results.FAILED, f"rank {rank} exited with code {code} (log.txt)", None
    tail = _last_line(cell_dir / "log.txt")
    return results.FAILED, f"exit code {rc}" + (f": {tail}" if tail else ""), None


def _cpp_error(log: Path) -> str:
    """What a C++ exception that nothing caught said as it aborted its process (`terminate
    called after throwing ...`, then `what():`): gloo's collective mismatch, a c10 error in a
    thread. The rank dies of SIGABRT, with no Python error and no error file, so without it
    the row would say only the signal. '' where the log has none."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    # horovodrun prefixes each line with its rank ("[1,0]<stderr>:")
    found = re.search(r"terminate called after throwing .*\n[^\n]*?what\(\):\s*(.+)", text)
    return found[1].strip()[:300] if found else ""


def _lost_node(log: Path) -> tuple[int, str] | None:
    """(node, signal) where the first node command of a cell across nodes to fail was killed
    by a signal (bench.harness.nodes says so in the cell's log): a node lost with its agent
    and ranks, whose peers' errors (a connection reset) are the consequence. A signal is a
    negative code, or a remote shell's 128 + N."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"^parabench: node (\d+) exited with code (-?\d+)$", text, re.M)
    if not found:
        return None
    code = int(found[2])
    code = -code if code < 0 else code - 128
    if code not in {int(s) for s in signal.Signals}:
        return None
    return int(found[1]), signal.Signals(code).name


def _port_taken(cell_dir: Path, port: int) -> bool:
    """Whether the cell's log says `port` was in use where it was to listen: torch's
    EADDRINUSE for the store that the first host's agent (--rdzv c10d) or rank 0 (static)
    serves the rendezvous from."""
    try:
        text = (cell_dir / "log.txt").read_text(errors="replace")
    except OSError:
        return False
    return str(port) in re.findall(r"port: (\d+),[^\n]*EADDRINUSE", text)


def _first_failed_rank(log: Path) -> tuple[int, int] | None:
    """(rank, exit code) of the rank that failed first, as a launcher's summary at the end
    of the cell's log names a rank that died without an error file (a signal: the OOM
    killer's SIGKILL, a segfault; or an os._exit): torchrun's root cause, the process
    mp.spawn saw die (its own exit code is 1 whatever the rank's), horovodrun's first
    process, whose shell gives 128 + the signal, or srun's first task to end (its task is
    the rank). A signal is a negative code, as Popen's."""
    try:
        text = log.read_text(errors="replace")[-20000:]
    except OSError:
        return None
    torchrun = re.search(
        r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
        text,
        re.S,
    )
    if torchrun:
        return int(torchrun[1]), int(torchrun[2])
    spawn = re.search(r"process (\d+) terminated with signal (SIG\w+)", text)  # mp.spawn's
    if spawn and spawn[2] in signal.Signals.__members__:
        return int(spawn[1]), -signal.Signals[spawn[2]]
    spawn = re.search(r"process (\d+) terminated with exit code (\d+)", text)
    if spawn:
        return int(spawn[1]), int(spawn[2])
    horovod = re.search(r"Process name:\s*(\d+)\s*Exit code:\s*(\d+)", text)
    if horovod:
        code = int(horovod[2])
        # its shell's 128 + N for a process killed by signal N; 255 and such are codes
        signalled = code > 128 and code - 128 in {int(s) for s in signal.Signals}
        return int(horovod[1]), 128 - code if signalled else code
    # srun's, a line per task as it ends, the first the root cause: "srun: error: n2: task 1:
    # Killed" (the signal in strsignal's words), "srun: error: n1: tasks 0-1: Exited with exit
    # code 3"; the last line is a peer its --kill-on-bad-exit ended, not the rank that died
    srun = re.search(r"^srun: error: \S+: tasks? (\d+)\S*: (.+?)\s*$", text, re.M)
    if srun:
        exited = re.fullmatch(r"Exited with exit code (\d+)", srun[2])
        if exited:
            return int(srun[1]), int(exited[1])
        words = {signal.strsignal(s): s for s in signal.Signals}
        said = srun[2].removesuffix(" (core dumped)")  # SIGSEGV's, SIGABRT's with a core
        if said in words:
            return int(srun[1]), -words[said]
    return None


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _summary(row: dict[str, Any]) -> str:
    if row["status"] != results.OK:
        return f"{row['status'].upper()}: {row['reason']}"
    return (
        f"ok  {float(row['samples_per_s']):9.1f} samples/s  step p50 {float(row['step_time_ms_p50']):7.2f} ms"
        f"  loss {float(row['train_loss_final']):.3f}"
    )


def open_run(
    cfg: RunConfig,
    resume: Path | None,
    echo: Echo = print,
    retry: bool = False,
    timeout_s: float | None = None,
) -> tuple[RunConfig, RunDir, list[Cell]]:
    """The run's config, directory and cells; nothing is created until `plan` accepts it.
    `retry` (with `resume`): its failed cells run again (RunDir.retry_failed); `timeout_s`
    (with `resume`): its cells' deadline from now on (config.json keeps the one it began
    with, as its cells so far ran with it)."""
    if resume is not None:
        rd = RunDir(resume)
        if not rd.config_path.exists():
            raise ConfigError(
                f"--resume {resume}: no config.json there; is it a parabench run directory?"
            )
        try:
            saved = rd.config()
        except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
            raise ConfigError(f"--resume {resume}: config.json is unreadable ({exc})") from exc
        if saved.launcher == "slurm":  # the allocation now, not the one the run began in
            if not slurm.in_allocation():
                raise ConfigError(
                    f"--resume {resume}: the run's cells are srun steps (--launcher slurm); "
                    "continue it with "
                    + results.resume_command(saved.launcher, rd.path, "", retry, timeout_s)
                )
            try:  # the threads its rows ran with: the CPUs they need on a node
                now = slurm.describe(saved.nodes, saved.procs_per_node, saved.cores_per_node)
            except ConfigError as exc:
                raise ConfigError(f"--resume {resume}: {exc}") from None
            if (now["nodes"], now["procs_per_node"]) != (saved.nodes, saved.procs_per_node):
                raise ConfigError(
                    f"--resume {resume}: the run has {saved.nodes} node(s) x "
                    f"{saved.procs_per_node}; this allocation gives {now['nodes']} x "
                    f"{now['procs_per_node']}"
                )
            saved = saved.replace(hosts=now["hosts"], master_addr=now["master"])
        rd.done()  # a damaged or older runs.csv: one line, before anything is written
        longer = ""  # said once the resume is under way
        if timeout_s is not None and timeout_s != saved.timeout_s:
            longer = (
                f"cells run with --timeout {timeout_s:g} s (the run began with {saved.timeout_s:g})"
            )
            saved = saved.replace(timeout_s=timeout_s)
        # begun before config.json kept them: as it planned them, and where it began
        if not saved.world_sizes:
            saved = saved.replace(world_sizes=rd.planned_sizes())
        if saved.device == "auto":
            saved = saved.replace(device=rd.began_on() or "auto")
        try:
            cells = plan(saved, resuming=True)
        except ConfigError as exc:  # its hint names options that --resume refuses
            root = saved.data_root
            where = (  # begun before config.json kept it whole: read from this folder
                f"; its data root {root} is relative to the folder the run began in"
                if not saved.data_path.is_absolute() and f"under {root}" in str(exc)
                else ""
            )
            raise ConfigError(
                f"--resume {resume}: the run's own options (its config.json) do not hold "
                f"here: {exc}{where} (--resume takes no other options: resume it where they "
                "hold, or correct them in its config.json)"
            ) from None
        unplanned = rd.unplanned(cells)
        if unplanned:  # left out, the resume said the run was whole without them
            raise ConfigError(_unplanned(resume, unplanned))
        try:
            rd.lock()
            if retry:  # held: no other harness writes its rows as they move
                again, left = rd.retry_failed(cells)
                if again:
                    echo(
                        f"retrying {len(again)} failed cell(s), their rows and folders kept "
                        f"in {rd.path / results.RETRIED}: " + "; ".join(again)
                    )
                if left or not again:
                    echo(left or "no failed cell to retry")
            rd.write_plan(cells)  # as it is now (a run from before plan.csv had none)
            rd.drop_unfinished()
            # cells it planned that this machine has too few cores or GPUs for: a skipped
            # row would count them done, and a resume where they fit would never run them
            done = rd.done()
            held = [c for c in cells if c.short and c.key not in done]
            to_run = any(not c.status and c.key not in done for c in cells)  # (held: skipped)
            if to_run:  # the deadline they run with, for the command that goes on from here
                results.keep_resumed_timeout(rd.path, timeout_s if longer else None)
        except OSError as exc:  # read-only now, a full disk: before anything runs
            rd.unlock()
            raise ConfigError(
                f"{rd.path}: cannot write the run there ({exc.strerror or exc})"
            ) from None
        if held and not to_run:
            rd.unlock()  # a resume that would measure nothing and exit 0, the run not whole
            raise ConfigError(
                f"--resume {resume}: nothing it has left can run here: {len(held)} cell(s) "
                f"need more than this machine gives ({held[0].strategy} at world size "
                f"{held[0].world_size}: {held[0].reason}); resume it where they fit"
            )
        if held:
            echo(
                f"{len(held)} cell(s) of the run left for a resume where they fit, no row "
                f"written: {held[0].strategy} at world size {held[0].world_size}: "
                f"{held[0].reason}"
            )
        # once the resume is sure to go on (not refused above), and has a cell to run
        if longer and to_run:
            echo(longer)
        return saved, rd, [c for c in cells if c not in held]
    # the data root as read here, a whole path (data_path: a ~ expanded, as a shell leaves it
    # after --data-root=, not a folder named ~ below this one): kept relative, a --resume
    # from another folder (the default `data`, README's `../shared/data`) looked for the
    # data there, and was refused with a hint of options it does not take, or read other data
    cfg = cfg.replace(run_id=cfg.run_id or _new_run_id(), data_root=str(cfg.data_path.resolve()))
    if cfg.multi_host:  # other hosts start in other folders: whole paths
        cfg = cfg.replace(out_dir=str(Path(cfg.out_dir).resolve()))
    check_new_run(cfg)
    path = Path(cfg.out_dir) / cfg.run_id
    cells = plan(cfg)
    # the device and the world sizes this machine gave the plan (--device auto, no
    # --world-sizes), kept as the run's own: a --resume where fewer devices are seen (another
    # machine, a narrower CPU affinity) planned its own sizes, dropped the cells planned and
    # not yet run, and said the run was whole; one where torch saw no GPU ran the rest on the
    # CPU, its rows beside the GPU's as repeats of the same cells
    sizes = cfg.world_sizes or tuple(sorted({c.world_size for c in cells}))
    cfg = cfg.replace(device=resolve_device(cfg.device), world_sizes=sizes)
    rd = RunDir(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        rd.lock(new_run=True)
        if rd.config_path.exists():  # a run that took the id first, and ended, as this one waited
            rd.unlock()
            raise ConfigError(f"{path} holds a run already; choose another --run-id")
        results.write_whole(rd.config_path, json.dumps(cfg.to_dict(), indent=1))
        rd.write_plan(cells)
    except OSError as exc:  # read-only, no permission, a file where a folder should be
        rd.unlock()
        raise ConfigError(
            f"--out-dir {cfg.out_dir}: cannot write the run there ({exc.strerror or exc})"
        ) from None
    return cfg, rd, cells


def _unplanned(resume: Path, cells: Sequence[tuple[str, int, str, int]]) -> str:
    """Why a --resume is refused whose plan lacks cells the run planned and has not run: a
    strategy of the run that this process has not registered (a plug-in's, named in
    PARABENCH_STRATEGIES as the run began), else another parabench's plan."""

    def few(items: list[str]) -> str:
        return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")

    known = strategies.registry()
    gone = list(dict.fromkeys(s for s, *_ in cells if s not in known))
    n = f"{len(cells)} cell{'' if len(cells) == 1 else 's'}"
    if gone:
        why = (
            f"{n} of {few(gone)}, not registered here (a plug-in: set PARABENCH_STRATEGIES, "
            "or install its package, as when the run began)"
        )
    else:
        said = [f"{s} ws={ws} {label} repeat {r}" for s, ws, label, r in cells]
        why = (
            f"{n} ({few(said)}): this parabench plans the run otherwise (resume it with the "
            "one it began with)"
        )
    return (
        f"--resume {resume}: the run planned cells it has not run that it cannot plan here: "
        f"{why}; or remove their lines from its plan.csv to finish the run without them"
    )


def check_new_run(cfg: RunConfig) -> None:
    """ConfigError if the run id `cfg` names already holds a run, or was submitted as a job
    this process is not (no id: a new one)."""
    out = Path(cfg.out_dir)
    # the nearest folder that exists must be one this process can write in: said before
    # the estimate times anything, not after
    there = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not there.is_dir() or not os.access(there, os.W_OK | os.X_OK):
        why = "not a directory" if not there.is_dir() else "no permission to write"
        raise ConfigError(f"--out-dir {cfg.out_dir}: cannot write the run there ({there}: {why})")
    path = out / cfg.run_id
    if cfg.run_id and path.exists() and not path.is_dir():  # said before the estimate
        raise ConfigError(f"--run-id {cfg.run_id}: {path} is a file, not a run folder")
    if cfg.run_id:  # a run still going is said as such, not as one that stopped
        RunDir(path).check_free(new_run=True)
    if cfg.run_id:
        check_unsubmitted(path)
    if cfg.run_id and (path / "runs.csv").exists():
        raise ConfigError(f"{path} already holds a run; use --resume {path} or another --run-id")
    if cfg.run_id and (path / "config.json").exists():  # begun, stopped before its first row
        raise ConfigError(
            f"{path} holds a run that stopped before its first row (its config.json, and "
            f"measurements a new run would take for its own); use --resume {path} or another "
            "--run-id"
        )


def check_unsubmitted(path: Path) -> None:
    """ConfigError where run folder `path` was submitted (`parabench submit` wrote its
    job.id) and this is not that job: the folder is the job's, whose run, pending, would
    resume a run begun there as its own, and which a job that stopped resumes (sbatch of
    its job.sbatch)."""
    job_file = path / "job.id"
    try:
        job = job_file.read_text().strip()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"{job_file}: cannot read it ({exc.strerror})") from None
    if job == os.environ.get("SLURM_JOB_ID"):
        return
    raise ConfigError(
        f"{path} was submitted already, as job {job} (`{program()} status "
        f"{shlex.quote(str(path))}`; a job that stopped resumes with `sbatch "
        f"{shlex.quote(str(path / 'job.sbatch'))}`); choose another --run-id"
    )


def run_matrix(
    cfg: RunConfig,
    *,
    resume: Path | None = None,
    echo: Echo = print,
    progress: bool = False,
    again: str | None = None,
    kept: bool = True,
    retry: bool = False,
    timeout_s: float | None = None,
) -> tuple[Path, list[dict]]:
    """Plan, then run every cell not yet done. `progress`: show the running cell's steps,
    speed and the ETAs (bench.harness.progress) on stderr. `again`: how to go on, said where
    the run stops (default: its --resume; a run of verify's is one step of verify's own).
    `kept`: whether the run's folder outlives a stop (verify's conditioning runs' does not),
    so that the line says where its rows are kept. `retry`, `timeout_s`: a resume runs the
    failed cells again, and its cells with this deadline (open_run)."""
    cfg, run_dir, cells = open_run(cfg, resume, echo, retry, timeout_s)
    if kept and again is None:  # a run of its own (not one of verify's steps): where to watch it
        where = shlex.quote(str(run_dir.path))
        echo(f"run folder: {run_dir.path} (`{program()} status {where}` says how far it is)")
    proc.become_subreaper()
    runner: Runner | None = None
    old = signal.signal(signal.SIGTERM, proc.raise_interrupt)  # (as parabench's main does)
    try:  # the measurements too: a run stopped in them resumes, and says so
        env_json = run_dir.path / "environment.json"
        # the run's as it began: a --resume (of a run done, one from another machine) left
        # its commit and platform as this checkout's; each row names its own
        here = provenance(resolve_device(cfg.device))
        if not env_json.exists():
            results.write_whole(env_json, json.dumps(here, indent=1))
        elif resume is not None and (moved := moved_since(env_json, here)):
            done = run_dir.done()
            if any(not c.status and c.key not in done for c in cells):  # any to measure
                echo(moved)
        measure_collectives(cfg, cells, run_dir.path, echo)
        measure_flops(cfg, cells, run_dir.path, echo)
        runner = Runner(cfg, run_dir, echo)  # after measure_flops: it reads model.json
        if progress:
            done = run_dir.done()
            runner.progress = Display(sum(1 for c in cells if not c.status and c.key not in done))
        rows = runner.run(cells)
    except (KeyboardInterrupt, BrokenPipeError, OSError) as stop:
        full = isinstance(stop, OSError) and stop.errno in (errno.ENOSPC, errno.EDQUOT)
        if isinstance(stop, OSError) and not (full or isinstance(stop, BrokenPipeError)):
            raise
        with proc.stops_ignored():  # another Ctrl-C: the ranks still die, the line is said
            if runner is not None:
                runner.interrupt()
            n = len(run_dir.runs.read())
            # a resume given --timeout goes on with it (config.json keeps the run's first)
            how = results.resume_command(cfg.launcher, run_dir.path, timeout_s=timeout_s)
            again = again or f"continue with: {how}"
            rows_in = f"{n} finished row{'' if n == 1 else 's'} kept in" if n else "no row yet for"
            line = f"{rows_in} {run_dir.runs.path}; {again}" if kept else again
            if isinstance(stop, KeyboardInterrupt):  # on stderr: seen where output goes to a file
                print(f"interrupted: {line}", file=sys.stderr, flush=True)
        if full:  # a long run filled its disk: the rows written are whole (CsvTable)
            raise RunStopped(
                f"{stop.strerror} in {run_dir.path}, the run stopped: {line} once there is room"
            ) from None
        if isinstance(stop, KeyboardInterrupt):
            raise proc.Interrupted from None  # said: the CLI adds no line of its own
        elif proc.stdout_gone():  # `| head` left: say it where it is read
            print(f"parabench: stdout closed, the run stopped: {line}", file=sys.stderr)
        else:  # another pipe: the CLI shows its traceback
            print(f"parabench: a broken pipe stopped the run: {line}", file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
        proc.become_subreaper(False)
        run_dir.unlock()
    return run_dir.path, rows


#: what a resume compares with the machine the run began on: what its steps' speed depends on
MACHINE = {
    "host": "host",
    "cpu_model": "CPU",
    "cpu_cores": "CPU cores",
    "device_names": "devices",
    "gpu_count": "GPUs",
    "torch_version": "torch",
    "git_commit": "parabench commit",
}


def moved_since(env_json: Path, here: Mapping[str, Any]) -> str:
    """A line where a run resumes on another machine, torch or parabench than it began with
    (environment.json, `here` now): its rows carry their own, but the summary takes the
    repeats measured on both as one cell's, and said nothing of it. '' where none differs
    (or the file cannot be read)."""
    try:
        began = json.loads(env_json.read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(began, dict):
        return ""
    changed = [
        f"{what} {began[k]} -> {here.get(k, '')}"
        for k, what in MACHINE.items()
        if began.get(k) not in (None, "") and str(began[k]) != str(here.get(k, ""))
    ]
    if not changed:
        return ""
    return (
        f"resuming on another setup than the run began on ({'; '.join(changed)}): the cells "
        "measured from now on are summarised with those measured before, as one run's"
    )


def collective_sizes(cfg: RunConfig, cells: list[Cell]) -> list[int]:
    """World sizes above 1 at which the run starts several processes."""
    sizes = set()
    for c in cells:
        spec = strategies.registry().get(c.strategy)
        if not c.status and c.world_size > 1 and spec and spec.cls and spec.cls.multiprocess:
            sizes.add(c.world_size)
    return sorted(sizes)


def measure_collectives(cfg: RunConfig, cells: list[Cell], run_dir: Path, echo: Echo) -> None:
    """The collectives' latency and bandwidth at the run's world sizes, fitted and saved as
    collectives.json (for `parabench predict`), before the cells. A measurement that fails
    is one line; the run goes on without it."""
    from bench.harness import collectives

    path = run_dir / "collectives.json"
    sizes = collective_sizes(cfg, cells)
    if not cfg.scaling_model or not sizes or path.exists():
        return
    if cfg.multi_host:
        echo(
            "collectives: not measured across nodes (measured here they would time this "
            "host's loopback, not the network between nodes): no scaling model for this run"
        )
        return
    device = resolve_device(cfg.device)
    backend = "nccl" if device == "cuda" else "gloo"
    rows: list[dict] = []
    for n in sizes:
        if device == "cuda" and n > device_count(device):
            continue
        try:
            rows += collectives.measure(n, backend, device, timeout_s=min(cfg.timeout_s, 120))
        except (RuntimeError, ValueError, OSError) as exc:
            echo(f"collectives at world size {n}: not measured ({proc.first_line(exc)})")
    if not rows:
        return
    fits = collectives.fit(rows)
    collectives.save(path, rows, fits, {"backend": backend, "device": device})
    for fit in fits.values():
        if fit["op"] == "all_reduce":
            echo(
                f"collectives ({backend}, {fit['world_size']} ranks): "
                f"{collectives.said(fit)} (collectives.json)"
            )


#: what a CPU peak's source says where several threads timed under one thread's figure (a
#: run whose multi-thread cells were slowed by the machine; model.json's `busy_peaks` lists
#: those peaks for predict)
BUSY_PEAK = "measured less: a busy machine"


def peak_key(device: str, threads: Any, precision: Any) -> str:
    """model.json's key of a device peak: per precision, and per thread count on a CPU."""
    return f"{precision}" if device == "cuda" else f"{precision}/{threads}t"


def products_precision(precision: Any) -> str:
    """The precision whose device peak a row's MFU is against: the precision axis' value,
    or for apex.amp's own (a row's `apex_O1`, a cell's `apex` with `opt_level`) the one its
    products run in: fp32 at O0, fp16 at O1 to O3."""
    p = str(precision)
    if not p.startswith("apex"):
        return p
    return "fp32" if p == "apex_O0" else "fp16"


def _epoch_status(
    diverged: str | None,
    eval_error: str,
    eval_oom: Any = False,
    oom: proc.OomKills | None = None,
    metrics_error: str = "",
) -> dict[str, str]:
    """An epoch record's status and reason: a diverged epoch, or one whose evaluation
    failed (out of memory: `oom`), or whose strategy's own measurements (cell_metrics)
    failed, keeps every measurement but is not a result to rank. A DataLoader worker of the
    training's that died meanwhile (its death is raised where the rank is, here in the
    evaluation) is told of as in a failed cell (_failure)."""
    if diverged:
        return {"status": results.DIVERGED, "reason": diverged}
    if eval_error:
        status, reason = _attributed(
            results.OOM if eval_oom else results.FAILED,
            f"evaluation after the timed steps failed: {eval_error}",
            _worker_pids(eval_error),
            oom,
        )
        return {"status": status, "reason": "; ".join(filter(None, [reason, metrics_error]))}
    if metrics_error:
        return {"status": results.FAILED, "reason": metrics_error}
    return {"status": results.OK, "reason": ""}


def mfu_columns(info: Mapping[str, Any], device: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's model FLOPs per sample, achieved TFLOP/s per device and MFU against the
    device's peak (model.json's `info`). A row faster than the peak gets no MFU: the peak
    was measured low (a CPU busy with other work), and peak_source says so."""
    from bench.workload import flops

    fps = info.get("flops_per_sample")
    precision = products_precision(row.get("precision"))
    key = peak_key(device, row.get("threads_per_rank"), precision)
    peak, source = info.get("peaks", {}).get(key, (None, ""))
    if not fps:
        source = info.get("flops_note", "") or source
    elif "peaks" in info and not peak and not source:
        source = f"no {precision} peak was measured for this run"
    elif precision != row.get("precision") and source:
        source = f"{row.get('precision')} computes in {precision}: {source}"
    per_device = float(row.get("samples_per_s_per_device") or "nan")
    achieved = fps * per_device / 1e12 if fps else float("nan")
    mfu = flops.mfu(fps, per_device, peak)
    if mfu > 1:  # faster than the peak: the peak is what is wrong, not a measurement
        source += f"; not used: the cell ran at {100 * mfu:.0f} % of it"
        mfu = float("nan")
    return {
        "flops_per_sample": fps if fps else float("nan"),
        "model_tflops_per_device": achieved,
        "peak_tflops": peak if peak else float("nan"),
        "peak_source": source,
        "mfu_pct": 100 * mfu,
    }


def measure_flops(cfg: RunConfig, cells: list[Cell], run_dir: Path, echo: Echo) -> None:
    """Model FLOPs per training sample (torch's FlopCounterMode), the shape of its
    parameters (for `parabench predict`) and the peak of the device in each precision the
    run trains in (a GPU: its datasheet; a CPU: a matrix product timed here, at each thread
    count a rank gets), saved as model.json for the rows' MFU."""
    from bench.harness.estimate import DTYPES
    from bench.harness.shape import model_shape
    from bench.workload import flops, models

    path = run_dir / "model.json"
    if not cfg.scaling_model or path.exists():
        return
    device = resolve_device(cfg.device)
    bundle = data.load(cfg)
    fps = flops.train_flops_per_sample(cfg, bundle.num_classes, bundle.spec or models.spec(cfg))
    info: dict[str, Any] = {
        "flops_per_sample": fps,
        "flops_note": "" if fps else "FLOPs not countable for this model",
        "shape": dataclasses.asdict(model_shape(cfg, bundle.num_classes)),
        "peaks": {},
        #: the CPU peaks whose several threads timed under one thread (predict.busy_line)
        "busy_peaks": [],
    }
    names = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if device == "cuda"
        else []
    )
    one_thread: dict[str, float] = {}  # a CPU's one-thread peak by dtype measured
    for cell in cells:
        if cell.status:
            continue
        opt_level = dict(cell.options).get("opt_level", "O1")
        precision = products_precision(
            f"apex_{opt_level}" if cell.setting.precision == "apex" else cell.setting.precision
        )
        threads = rank_threads(cfg, cell)
        key = peak_key(device, threads, precision)
        if key in info["peaks"] or precision not in DTYPES:
            continue
        if device == "cuda":
            name = names[0] if names else ""
            if precision == "fp32":
                # fp32 products may run on the tensor cores in TF32: cuDNN's convolutions do
                # by default, matrix products where torch allows it (not by default); the
                # peak is the two peaks weighted by the FLOPs each part of the step does
                # (none where the ranks turn TF32 off: verify's, RunConfig.no_tf32)
                share = (
                    0.0
                    if cfg.no_tf32
                    else 1.0
                    if torch.backends.cuda.matmul.allow_tf32
                    else flops.conv_share(cfg, bundle.num_classes, bundle.spec or models.spec(cfg))
                    if torch.backends.cudnn.allow_tf32
                    else 0.0
                )
                info["peaks"][key] = flops.blended_peak(name, share)
            else:
                info["peaks"][key] = flops.peak_for(name, precision)
        else:
            # a CPU without bf16/fp16 units computes them through fp32: fp32's peak is theirs
            native = precision == "fp32" or flops.cpu_has_units(precision)
            measured = precision if native else "fp32"
            if threads == 1 and measured in one_thread:
                # one thread's figure once for the run: measured again, a busy machine gave
                # half the 2-thread cells' floor, and its ranks at 2 read twice the MFU
                peak = one_thread[measured]
            else:
                peak = flops.measured_cpu_peak(threads, DTYPES[measured])
            if threads == 1:
                one_thread[measured] = peak
            how = f"on {threads} thread(s)"
            if threads > 1:
                # t threads can always do what one does: on a machine where another process
                # holds a core, a t-thread product waits on its slowest thread, and its peak
                # once came out 400x under one thread's (MFU 7,000 %)
                if measured not in one_thread:  # once per dtype, for every thread count
                    one_thread[measured] = flops.measured_cpu_peak(1, DTYPES[measured])
                one = one_thread[measured]
                if one > peak:
                    peak = one
                    how = f"on 1 thread (on {threads} it {BUSY_PEAK})"
                    info["busy_peaks"].append(key)
            why = "" if native else f" (no {precision} units in this CPU: its fp32 peak)"
            info["peaks"][key] = (peak, f"measured: {measured} matmul {how}{why}")
    # whole or not at all: a model.json cut short (the disk filled up) would not be
    # measured again by the --resume the run's message tells of, and fails its Runner
    results.write_whole(path, json.dumps(info, indent=1))
    if fps:
        echo(f"model: {fps / 1e9:.3g} GFLOP per training sample (model.json)")
