"""Live progress of a running matrix: where the current cell is, how fast it goes, and
when the cell and the whole matrix should end.

Rank 0 of a cell writes `progress.json` into its cell directory after a step, outside the
step's timing and at most twice a second (a small file replaced atomically; never a
collective). The harness reads it while it waits for the cell and shows a tqdm bar on a
terminal, or a plain line every few seconds where the output is a log (CI).
"""

from __future__ import annotations

import collections
import contextlib
import csv
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

from bench.config import ConfigError, not_a_run
from bench.harness import results

PROGRESS_FILE = "progress.json"


class StepReporter:
    """Rank 0's side: `step(ms)` after every step; writes at most every `every_s` seconds."""

    def __init__(self, cell_dir: Path, epochs: int, steps_per_epoch: int, every_s: float = 0.5):
        self.path = cell_dir / PROGRESS_FILE
        self.epochs, self.steps_per_epoch, self.every_s = epochs, steps_per_epoch, every_s
        self.epoch, self.step_in_epoch, self.done = 0, 0, 0
        self.recent: list[float] = []
        self.last_write: float | None = None  # (monotonic time starts near 0 at boot)

    def start_epoch(self, epoch: int) -> None:
        # the steps before are the earlier epochs', whole: one --target-precision ended
        # early has no steps left to run (else the cell's ETA would count them)
        self.epoch, self.step_in_epoch = epoch, 0
        self.done = epoch * self.steps_per_epoch

    def step(self, step_ms: float) -> None:
        self.done += 1
        self.step_in_epoch += 1
        self.recent = [*self.recent[-9:], step_ms]
        now = time.monotonic()
        last = self.step_in_epoch == self.steps_per_epoch
        if self.last_write is None or now - self.last_write >= self.every_s or last:
            self.last_write = now
            self._write()

    def _write(self) -> None:
        state = {
            "epoch": self.epoch,
            "epochs": self.epochs,
            "step": self.step_in_epoch,
            "steps": self.steps_per_epoch,
            "done": self.done,
            "total": self.epochs * self.steps_per_epoch,
            "step_ms": sum(self.recent) / len(self.recent),
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)


class LastStep:
    """When, on the harness's own clock, rank 0's step count last moved, read from its
    progress file on the harness's polls (at most every `every_s` seconds). A deadline is
    then compared with this machine's time alone: the file's mtime is set by the clock of
    the node that wrote it, which on a shared file system may be seconds off this one's."""

    def __init__(
        self, cell_dir: Path, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cell_dir, self.every_s, self.clock = cell_dir, every_s, clock
        self.done: Any = None
        self.at = math.nan  # when `done` was first seen at its value; nan: never
        self.read_at = -math.inf

    def poll(self) -> None:
        now = self.clock()
        if now - self.read_at < self.every_s:
            return
        self.read_at = now
        done = (read(self.cell_dir) or {}).get("done")
        if done is not None and done != self.done:
            self.done, self.at = done, now

    def quiet(self, deadline: float) -> float:
        """Seconds from the last step count seen to `deadline` (this clock); nan: none seen."""
        return deadline - self.at


def read(cell_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((cell_dir / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


def duration(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


class Display:
    """The harness's side: one bar (terminal) or a line every `every_s` seconds (log) for
    the running cell, with its samples/s and the ETAs of the cell and of the matrix."""

    def __init__(
        self,
        runnable: int,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.every_s, self.clock = every_s, clock
        self.tty = self.stream.isatty() if tty is None else tty
        self.left = runnable  # cells that will run, the current one included
        self.walls: list[float] = []  # wall time of the cells that ran
        self.bar: Any = None
        self.cell_dir: Path | None = None

    def start(self, label: str, cell_dir: Path, global_batch: int) -> None:
        self.label, self.cell_dir, self.global_batch = label, cell_dir, global_batch
        self.t0 = self.clock()
        self.last_line = self.t0

    def poll(self) -> None:
        if self.cell_dir is None:
            return
        state = read(self.cell_dir)
        if state is None:
            return
        if self.tty:
            self._bar(state)
        elif self.clock() - self.last_line >= self.every_s:
            self.last_line = self.clock()
            print(self.line(state), file=self.stream, flush=True)

    def samples_per_s(self, state: dict[str, Any]) -> float:
        return self.global_batch / (state["step_ms"] / 1e3) if state["step_ms"] > 0 else math.nan

    def cell_eta(self, state: dict[str, Any]) -> float:
        return (state["total"] - state["done"]) * state["step_ms"] / 1e3

    def matrix_eta(self, state: dict[str, Any] | None) -> float:
        """This cell's remaining steps, plus the cells after it at the mean wall time of
        those already run (at this one's expected wall time while none has)."""
        here = self.cell_eta(state) if state else math.nan
        elapsed = self.clock() - self.t0
        per_cell = sum(self.walls) / len(self.walls) if self.walls else elapsed + here
        return here + (self.left - 1) * per_cell

    def line(self, state: dict[str, Any]) -> str:
        sps = self.samples_per_s(state)
        epoch = f" (epoch {state['epoch'] + 1}/{state['epochs']})" if state["epochs"] > 1 else ""
        # past its last step a cell still probes, evaluates and tears down, for as long as a
        # minute or more: "ends in 0 s" line after line would read as a hang
        cell = (
            "steps done, the cell finishing (probes, evaluation)"
            if state["done"] >= state["total"]
            else f"cell ends in {duration(self.cell_eta(state))}"
        )
        return (
            f"{self.label}: step {state['done']}/{state['total']}{epoch}, {sps:,.0f} samples/s, "
            f"{cell}, matrix in {duration(self.matrix_eta(state))}"
        )

    def _bar(self, state: dict[str, Any]) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(
                total=state["total"], desc=self.label, unit="step", file=self.stream, leave=False
            )
        self.bar.update(state["done"] - self.bar.n)
        self.bar.set_postfix_str(
            f"{self.samples_per_s(state):,.0f} samples/s, matrix ends in {duration(self.matrix_eta(state))}"
        )

    def end(self, ran: bool) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if ran:
            self.walls.append(self.clock() - self.t0)
        self.left -= 1
        self.cell_dir = None


def running_now(path: Path, ended: Iterable[tuple[str, int, str, int]]) -> str:
    """`now <cell>, step N of M`: of the run's cells that have begun with no row yet (`ended`
    have one), the last to begin, as its progress file says; "" where none has."""
    gone = {results.cell_dirname(*k) for k in ended}
    begun = []
    for file in path.glob(f"cells/*/{PROGRESS_FILE}"):
        with contextlib.suppress(OSError):  # rewritten as it is read
            if file.parent.name not in gone:
                begun.append((file.stat().st_mtime, file.parent))
    if not begun:
        return ""
    cell = max(begun)[1]
    state = read(cell)
    total = state.get("total") if isinstance(state, dict) else None
    return f"now {cell.name}" + (f", step {state.get('done', '?')} of {total}" if total else "")


def run_status(path: Path) -> str:
    """One line on a run of this machine's (not a submitted job's: slurm.status): running
    (the parabench holding it, the cell it is in and how far, about how long is left),
    stopped (and the command that finishes it) or complete (and its report), with how its
    cells ended so far."""
    config_path = path / "config.json"
    if not config_path.exists():
        raise not_a_run(path, "config.json")
    ended: dict[tuple[str, int, str, int], str] = {}  # the cell's first status not ok, else ok
    walls: dict[tuple[str, int, str, int], float] = {}  # the cells that ran: their wall time
    try:
        rows = results.CsvTable(path / "runs.csv", results.RUN_COLUMNS).read()
        plan = results.CsvTable(path / "plan.csv", results.PLAN_COLUMNS).read()
        config = json.loads(config_path.read_text())
    except (OSError, ValueError, csv.Error) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"{path}: its files cannot be read ({exc})") from None
    for r in rows:
        # a runs.csv from before run options has no setting column: a cell per row's
        # strategy, world size and repeat (as the report reads it)
        if (key := results.row_key({"setting": "", **r})) is None:
            continue
        if ended.get(key, results.OK) == results.OK:
            ended[key] = r.get("status") or "?"
        with contextlib.suppress(TypeError, ValueError):
            if math.isfinite(wall := float(r.get("cell_wall_s") or "nan")):
                walls[key] = wall
    planned = {k for r in plan if (k := results.row_key(r)) is not None} | set(ended)
    counts = collections.Counter(ended.values()).most_common()
    # a run from before plan.csv: the cells it set out to run are not known, nor whether it
    # ran them all (it was said complete, with "0 of 0 cells done" where its runs.csv was
    # older than run options too)
    unplanned = not (path / "plan.csv").exists()
    done = f"{len(ended)}{'' if unplanned else f' of {len(planned)}'} cells done"
    done += f" ({', '.join(f'{n} {status}' for status, n in counts)})" if counts else ""
    launcher = str(config.get("launcher") or "") if isinstance(config, dict) else ""
    # a verify's run (it saves the final weights): its --resume would finish the run with
    # no verdict, which takes every cell, baseline and comparison of one verify
    verify = results.of_verify(config)
    pid = results.held_by(path)
    if pid is not None:
        line = f"{path}: running (parabench pid {pid}): {done}"
        if now := running_now(path, ended):
            line += f"; {now}"
        left = len(planned) - len(ended)
        if not left and not unplanned:  # run_matrix's end: `run` holds it for its report
            line += "; writing its report"
        if walls and left:  # a skipped cell counts as one of no time: the plan interleaves
            # them, so the cells left hold them in the share those done did
            each = sum(walls.values()) / len(ended)
            line += f"; about {duration(left * each)} left ({duration(each)} a cell so far)"
        return line
    if unplanned:
        line = f"{path}: not running, {done} (no plan.csv, an older parabench's run: which "
        line += "cells it planned is not known)"
    elif len(ended) < len(planned):
        how = (
            results.VERIFY_AGAIN
            if verify
            else f"to finish it: {results.resume_command(launcher, path)}"
        )
        return f"{path}: stopped, {done}; {how}"
    else:
        line = f"{path}: complete, {done}"
    if (path / "report.md").exists():
        line += f"; report: {path / 'report.md'}"
    if verify:
        return line
    # an older runs.csv's (no setting column) --resume is refused: no cell can be told
    if rows and "setting" in rows[0] and any(s in results.RETRYABLE for s in ended.values()):
        retry = results.resume_command(launcher, path, retry=True)
        line += f"; to run the failed cells again: {retry}"
    return line
