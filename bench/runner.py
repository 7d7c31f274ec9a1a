"""The matrix: plan every (strategy, world size, repeat) cell, run each isolated, keep rows.

Planning happens before anything starts, so bad input costs nothing. Each cell runs in
its own process tree with a deadline; whatever it does (crash, OOM, hang), it becomes
rows with a status and a reason, its processes are gone afterwards, and the matrix
goes on. Rows are written as each cell ends; `--resume` skips finished cells.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import strategies
from bench import data, proc, results
from bench.config import ConfigError, RunConfig
from bench.env import device_count, provenance, resolve_device, threads_per_process
from bench.launchers import LAUNCHERS
from bench.models import check_model

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


@dataclass(frozen=True)
class Cell:
    strategy: str
    world_size: int
    repeat: int
    status: str = ""  # pre-decided: skipped / unavailable
    reason: str = ""

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.strategy, self.world_size, self.repeat)

    @property
    def dirname(self) -> str:
        return f"{self.strategy}-ws{self.world_size}-r{self.repeat}"


def default_world_sizes(n_devices: int) -> tuple[int, ...]:
    sizes, ws = [], 1
    while ws <= n_devices:
        sizes.append(ws)
        ws *= 2
    return tuple(sizes)


def plan(cfg: RunConfig) -> list[Cell]:
    """Every cell of the matrix, or a ConfigError that says what is wrong with the request."""
    device = resolve_device(cfg.device)
    if device == "cuda" and not _cuda_available():
        raise ConfigError(
            "--device cuda asked for, but torch sees no CUDA device; use --device cpu"
        )
    n_dev = device_count(device)
    sizes = cfg.world_sizes or default_world_sizes(n_dev)
    explicit = bool(cfg.strategies)
    specs = (
        [strategies.get(n) for n in cfg.strategies]
        if explicit
        else list(strategies.registry().values())
    )
    check_model(cfg.model)
    for ws in sizes:
        if cfg.global_batch % ws:
            raise ConfigError(
                f"global batch {cfg.global_batch} is not divisible by world size {ws}; "
                "every rank must get the same share"
            )
    data.check(cfg)
    _check_options(cfg.options, specs)
    cells: list[Cell] = []
    for spec in specs:
        why_not = spec.unavailable(device)
        if why_not and explicit:
            raise ConfigError(f"strategy {spec.name} is unavailable: {why_not}")
        reasons = {ws: spec.cannot_run(ws, device, n_dev) if not why_not else None for ws in sizes}
        if explicit and all(reasons.values()):
            raise ConfigError(
                f"{spec.name} cannot run at world size {','.join(map(str, sizes))}: "
                f"{next(iter(reasons.values()))}"
            )
        for ws in sizes:
            for r in range(cfg.repeats):
                if why_not:
                    cells.append(Cell(spec.name, ws, r, results.UNAVAILABLE, why_not))
                elif reasons[ws]:
                    cells.append(Cell(spec.name, ws, r, results.SKIPPED, reasons[ws] or ""))
                else:
                    cells.append(Cell(spec.name, ws, r))
    return cells


def _check_options(options: dict[str, str], specs: list[strategies.StrategySpec]) -> None:
    for key, value in options.items():
        takers = [s for s in specs if s.cls is not None and key in s.cls.accepts]
        if not takers:
            known = sorted({k for s in specs if s.cls for k in s.cls.accepts})
            raise ConfigError(
                f"--set {key}: no selected strategy takes this option; "
                f"options: {', '.join(known) or 'none'}"
            )
        for s in takers:
            allowed = s.cls.accepts[key]
            if value not in allowed:
                raise ConfigError(
                    f"--set {key}={value}: {s.name} takes {key} = {' | '.join(allowed)}"
                )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C / SIGTERM wait until a CSV write is complete."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs = results.CsvTable(path / "runs.csv", results.RUN_COLUMNS)
        self.steps = results.CsvTable(path / "steps.csv", results.STEP_COLUMNS)
        self.ranks = results.CsvTable(path / "ranks.csv", results.RANK_COLUMNS)

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def done(self) -> set[tuple[str, int, int]]:
        return {(r["strategy"], int(r["world_size"]), int(r["repeat"])) for r in self.runs.read()}

    def write(self, runs: list[dict], steps: list[dict], ranks: list[dict]) -> None:
        with _signals_held():
            # steps and ranks first: a row in runs.csv means the cell is complete.
            self.steps.append(steps)
            self.ranks.append(ranks)
            self.runs.append(runs)


def _new_run_id() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


class Runner:
    def __init__(self, cfg: RunConfig, run_dir: RunDir, echo: Echo = print) -> None:
        self.cfg = cfg
        self.dir = run_dir
        self.echo = echo
        self.device = resolve_device(cfg.device)
        self.run_id = run_dir.path.name
        self.workers = (
            cfg.workers if cfg.workers is not None else (4 if self.device == "cuda" else 0)
        )
        self.current: proc.CellProcess | None = None

    # ---- rows ----
    def _ident(self, cell: Cell, epoch: int | str) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "strategy": cell.strategy,
            "world_size": cell.world_size,
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
            "global_batch": cfg.global_batch,
            "epochs": cfg.epochs,
            "max_steps": cfg.max_steps,
            "warmup_steps": cfg.warmup_steps,
            "seed": cfg.seed,
            "lr": cfg.lr,
            "threads_per_rank": self._threads(cell),
            "options": json.dumps(
                {**(spec.variant.options if spec.variant else {}), **cfg.options}
            ),
            "precision": spec.cls.precision if spec.cls else "",
            "timestamp": dt.datetime.now().isoformat(timespec="seconds"),
            **provenance(self.device),
        }

    def _status_row(
        self, cell: Cell, status: str, reason: str, wall: float | None = None
    ) -> dict[str, Any]:
        return {**self._base_row(cell), "status": status, "reason": reason, "cell_wall_s": wall}

    # ---- running ----
    def _spec(self, cell: Cell, cell_dir: Path) -> Path:
        spec = {
            "config": self.cfg.to_dict(),
            "strategy": cell.strategy,
            "world_size": cell.world_size,
            "repeat": cell.repeat,
            "device": self.device,
            "dir": str(cell_dir),
            "workers_per_device": self.workers,
            "threads": self._threads(cell),
        }
        path = cell_dir / "spec.json"
        path.write_text(json.dumps(spec, indent=1))
        return path

    def _threads(self, cell: Cell) -> int:
        spec = strategies.get(cell.strategy)
        return threads_per_process(spec.cls.processes(cell.world_size) if spec.cls else 1)

    def _env(self, cell: Cell, cell_dir: Path) -> dict[str, str]:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env["PARABENCH_CELL"] = str(cell_dir)
        env["OMP_NUM_THREADS"] = str(self._threads(cell))
        env["PARABENCH_PG_TIMEOUT_S"] = str(int(self.cfg.timeout_s))  # the cell deadline rules
        for var in LAUNCHER_VARS:  # a harness started under torchrun/horovodrun must not leak them
            env.pop(var, None)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("HOROVOD_GLOO_IFACE", "lo")
        return env

    def run_cell(self, cell: Cell) -> list[dict]:
        """Run one cell and write its rows; returns its runs.csv rows."""
        if cell.status:
            return self._write([self._status_row(cell, cell.status, cell.reason)])
        cell_dir = self.dir.path / "cells" / cell.dirname
        shutil.rmtree(cell_dir, ignore_errors=True)
        cell_dir.mkdir(parents=True)
        spec = strategies.get(cell.strategy)
        t0 = time.monotonic()
        try:
            argv = LAUNCHERS[spec.launcher](
                self._spec(cell, cell_dir), cell.world_size, self.device
            )
        except RuntimeError as exc:
            return self._write([self._status_row(cell, results.FAILED, str(exc))])
        self.current = proc.CellProcess(
            argv, self._env(cell, cell_dir), cell_dir / "log.txt", str(cell_dir)
        )
        try:
            rc, timed_out = self.current.wait(self.cfg.timeout_s)
        except BaseException:  # Ctrl-C / SIGTERM while the cell runs
            self.current.kill()
            self.current = None
            raise
        # The cell is over: an interrupt now waits until its rows are on disk.
        with _signals_held():
            self.current.reap()
            self.current = None
            wall = time.monotonic() - t0
            return self._write(*self._collect(cell, cell_dir, rc, timed_out, wall))

    def _write(
        self, runs: list[dict], steps: Sequence[dict] = (), ranks: Sequence[dict] = ()
    ) -> list[dict]:
        self.dir.write(runs, list(steps), list(ranks))
        return runs

    def _collect(self, cell: Cell, cell_dir: Path, rc: int | None, timed_out: bool, wall: float):
        records = _read_records(cell_dir / "epochs.jsonl")
        runs, steps, ranks = [], [], []
        for rec in records:
            ident = self._ident(cell, rec["epoch"])
            runs.append(
                {
                    **self._base_row(cell, rec["epoch"]),
                    "backend": rec["backend"],
                    "precision": rec["precision"],
                    "data": rec["data"],
                    "per_rank_batch": rec["per_rank_batch"],
                    "loader_workers": rec["loader_workers"],
                    "threads_per_rank": rec["threads_per_rank"],
                    "warmup_steps": rec["warmup_steps"],
                    "notes": rec["notes"],
                    "status": results.OK,
                    "reason": "",
                    "cell_wall_s": wall,
                    **results.measure(rec, cell.world_size, self.device),
                }
            )
            steps += results.step_rows(ident, rec)
            ranks += results.rank_rows(ident, rec)
        if timed_out:
            runs.append(
                self._status_row(
                    cell,
                    results.TIMEOUT,
                    f"no result within {self.cfg.timeout_s:g} s (hang?); all its processes were killed",
                    wall,
                )
            )
        elif rc != 0 or len(records) < self.cfg.epochs:
            status, reason = _failure(cell_dir, rc)
            runs.append(self._status_row(cell, status, reason, wall))
        return runs, steps, ranks

    def run(self, cells: list[Cell]) -> list[dict]:
        done = self.dir.done()
        todo = [c for c in cells if c.key not in done]
        if done:
            self.echo(
                f"resuming {self.dir.path}: {len(cells) - len(todo)} of {len(cells)} cells already done"
            )
        for i, cell in enumerate(todo, 1):
            label = (
                f"[{i}/{len(todo)}] {cell.strategy:<14} ws={cell.world_size} repeat={cell.repeat}"
            )
            if not cell.status:
                self.echo(f"{label} running ...")
            runs = self.run_cell(cell)
            self.echo(f"{label} {_summary(runs[-1])}")
        return self.dir.runs.read()

    def interrupt(self) -> None:
        if self.current is not None:  # normally already killed by run_cell
            self.current.kill()


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a rank killed mid-write
            out.append(json.loads(line))
    return out


def _failure(cell_dir: Path, rc: int | None) -> tuple[str, str]:
    errors = []
    for p in cell_dir.glob("error-rank*.json"):
        with contextlib.suppress(json.JSONDecodeError, OSError):
            errors.append(json.loads(p.read_text()))
    if errors:
        first = min(errors, key=lambda e: e["time"])  # the root cause, not the peers it took down
        status = results.OOM if first["oom"] else results.FAILED
        return status, f"rank {first['rank']}: {first['type']}: {first['message']}"
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name
        hint = " (the kernel's OOM killer?)" if name == "SIGKILL" else ""
        return results.FAILED, f"killed by {name}{hint}"
    tail = _last_line(cell_dir / "log.txt")
    return results.FAILED, f"exit code {rc}" + (f": {tail}" if tail else "")


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


def open_run(cfg: RunConfig, resume: Path | None) -> tuple[RunConfig, RunDir, list[Cell]]:
    """The run's config, directory and cells; nothing is created until `plan` accepts it."""
    if resume is not None:
        rd = RunDir(resume)
        if not rd.config_path.exists():
            raise ConfigError(
                f"--resume {resume}: no config.json there; is it a parabench run directory?"
            )
        try:
            saved = RunConfig.from_dict(json.loads(rd.config_path.read_text()))
        except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
            raise ConfigError(f"--resume {resume}: config.json is unreadable ({exc})") from exc
        return saved, rd, plan(saved)
    cfg = cfg.replace(run_id=cfg.run_id or _new_run_id())
    path = Path(cfg.out_dir) / cfg.run_id
    if (path / "runs.csv").exists():
        raise ConfigError(f"{path} already holds a run; use --resume {path} or another --run-id")
    cells = plan(cfg)
    path.mkdir(parents=True, exist_ok=True)
    rd = RunDir(path)
    rd.config_path.write_text(json.dumps(cfg.to_dict(), indent=1))
    return cfg, rd, cells


def run_matrix(
    cfg: RunConfig, *, resume: Path | None = None, echo: Echo = print
) -> tuple[Path, list[dict]]:
    cfg, run_dir, cells = open_run(cfg, resume)
    (run_dir.path / "environment.json").write_text(
        json.dumps(provenance(resolve_device(cfg.device)), indent=1)
    )
    proc.become_subreaper()
    runner = Runner(cfg, run_dir, echo)
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        rows = runner.run(cells)
    except KeyboardInterrupt:
        runner.interrupt()
        n = len(run_dir.runs.read())
        echo(
            f"interrupted: {n} finished rows kept in {run_dir.runs.path}; "
            f"continue with: parabench run --resume {run_dir.path}"
        )
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
        proc.become_subreaper(False)
    return run_dir.path, rows


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
