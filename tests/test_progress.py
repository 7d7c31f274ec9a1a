"""Live progress: rank 0 reports its steps through a small file, outside the timed steps;
the harness turns it into a bar on a terminal or a plain line in a log, with ETAs."""

from __future__ import annotations

import io
import json

import pytest

from bench.harness import progress
from bench.harness.progress import Display, StepReporter


def test_rank_zero_reports_steps_through_a_file(tmp_path):
    r = StepReporter(tmp_path, epochs=2, steps_per_epoch=4, every_s=0)
    r.start_epoch(0)
    for ms in (10.0, 20.0, 30.0):
        r.step(ms)
    state = json.loads((tmp_path / progress.PROGRESS_FILE).read_text())
    assert state == {
        "epoch": 0,
        "epochs": 2,
        "step": 3,
        "steps": 4,
        "done": 3,
        "total": 8,
        "step_ms": 20.0,
    }


def test_reports_are_throttled_but_an_epochs_last_step_is_written(tmp_path):
    r = StepReporter(tmp_path, epochs=1, steps_per_epoch=3, every_s=3600)
    r.start_epoch(0)
    r.step(5.0)  # the first is written (nothing was yet)
    r.step(5.0)  # too soon
    assert progress.read(tmp_path)["done"] == 1
    r.step(5.0)  # the epoch's last
    assert progress.read(tmp_path)["done"] == 3


def test_an_epoch_that_stopped_early_leaves_no_steps_to_wait_for(tmp_path):
    """--target-precision ends an epoch once its steps are precise enough: the next starts
    at its own place in the cell, and the cell's ETA counts only the steps still to run."""
    r = StepReporter(tmp_path, epochs=2, steps_per_epoch=100, every_s=0)
    r.start_epoch(0)
    for _ in range(60):  # stopped at step 60 of 100
        r.step(10.0)
    r.start_epoch(1)
    r.step(10.0)
    state = progress.read(tmp_path)
    assert (state["done"], state["total"]) == (101, 200)
    assert Display(1, stream=io.StringIO(), tty=False).cell_eta(state) == pytest.approx(0.99)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _state(tmp_path, done, total=100, step_ms=50.0):
    (tmp_path / progress.PROGRESS_FILE).write_text(
        json.dumps(
            {
                "epoch": 0,
                "epochs": 1,
                "step": done,
                "steps": total,
                "done": done,
                "total": total,
                "step_ms": step_ms,
            }
        )
    )


def test_a_log_gets_a_plain_line_every_few_seconds_with_both_etas(tmp_path):
    out, clock = io.StringIO(), Clock()
    shown = Display(3, stream=out, tty=False, every_s=10, clock=clock)
    shown.start("ddp_spawn ws=2 repeat=0", tmp_path, global_batch=64)
    _state(tmp_path, done=20)
    clock.t = 5
    shown.poll()
    assert out.getvalue() == ""  # not yet: a line every 10 s
    clock.t = 12
    shown.poll()
    # 80 steps left at 50 ms: 4 s; then 2 more cells, each as long as this one should be
    # (12 s so far + 4 s left)
    assert out.getvalue().strip() == (
        "ddp_spawn ws=2 repeat=0: step 20/100, 1,280 samples/s, cell ends in 4 s, matrix in 36 s"
    )
    shown.end(ran=True)
    shown.start("ddp_spawn ws=2 repeat=1", tmp_path, global_batch=64)
    _state(tmp_path, done=50)
    assert shown.matrix_eta(progress.read(tmp_path)) == pytest.approx(2.5 + 12)


def test_a_cell_past_its_last_step_is_finishing_not_ending_in_0_s(tmp_path):
    """After its steps a cell still runs its probes and evaluation, a minute or more on a
    busy CPU: its line says so, not "cell ends in 0 s" every 10 s as if it hung."""
    out, clock = io.StringIO(), Clock()
    shown = Display(1, stream=out, tty=False, every_s=10, clock=clock)
    shown.start("ddp_torchrun ws=1 repeat=0", tmp_path, global_batch=64)
    _state(tmp_path, done=100)
    clock.t = 12
    shown.poll()
    line = out.getvalue().strip()
    assert "cell ends in" not in line
    assert line.startswith("ddp_torchrun ws=1 repeat=0: step 100/100, 1,280 samples/s, ")
    assert "steps done, the cell finishing (probes, evaluation), matrix in " in line


def test_a_terminal_gets_a_bar(tmp_path):
    out = io.StringIO()
    shown = Display(1, stream=out, tty=True)
    shown.start("single ws=1 repeat=0", tmp_path, global_batch=32)
    _state(tmp_path, done=10, total=40, step_ms=100.0)
    shown.poll()
    shown.end(ran=True)
    text = out.getvalue()
    assert "single ws=1 repeat=0" in text and "10/40" in text and "320 samples/s" in text


def test_durations_read_naturally():
    assert progress.duration(42) == "42 s"
    assert progress.duration(600) == "10 min"
    assert progress.duration(7200) == "2.0 h"
    assert progress.duration(float("nan")) == "?"


@pytest.mark.slow
def test_a_real_cell_reports_every_step(tmp_path, data_root):
    from bench.harness.runner import run_matrix
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("ddp_spawn",), world_sizes=(2,))
    run_dir, rows = run_matrix(cfg, echo=lambda m: None, progress=True)
    assert rows[0]["status"] == "ok"
    state = progress.read(run_dir / "cells" / "ddp_spawn-ws2-fp32-r0")
    assert state["done"] == state["total"] == 6 and state["step_ms"] > 0
