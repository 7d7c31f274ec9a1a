"""Failure isolation: a crash, a hang and an out-of-memory error each become a row with
its status and reason, the rest of the matrix completes, and no process is left."""

from __future__ import annotations

import time

import psutil
import pytest

from bench.harness.runner import run_matrix
from tests.conftest import faulty_strategies, small_config

pytestmark = pytest.mark.slow


def leftover_processes(run_dir) -> list[psutil.Process]:
    """Processes still running that belong to any cell of this run (they carry
    PARABENCH_CELL in their environment: launchers, ranks, loader workers)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(
                "PARABENCH_CELL", ""
            ).startswith(str(run_dir)):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def faulty():
    with faulty_strategies():
        yield


def test_crash_hang_and_oom_become_rows_and_the_matrix_goes_on(tmp_path, data_root, faulty):
    cfg = small_config(
        tmp_path,
        data_root,
        world_sizes=(1, 2),
        timeout_s=20,
        # seed 34's order runs test_crash and test_hang at 2 (they fail) and test_oom at 1
        # before test_crash and test_hang at 1, where they are plain DDP (by mp.spawn, by
        # torchrun) and must end ok: the matrix goes on after each kind of failure
        strategies=("test_crash", "test_hang", "test_oom"),
        seed=34,
    )
    t0 = time.monotonic()
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    by = {(r["strategy"], int(r["world_size"])): r for r in rows}

    crash = by[("test_crash", 2)]
    assert crash["status"] == "failed"
    assert "rank 1: RuntimeError: deliberate crash in backward at step 3" == crash["reason"]

    hang = by[("test_hang", 2)]
    assert hang["status"] == "timeout" and "20 s" in hang["reason"]
    assert (run_dir / "cells" / "test_hang-ws2-fp32-r0" / "hung").exists()  # it really hung

    oom = by[("test_oom", 1)]
    assert oom["status"] == "oom" and "allocate" in oom["reason"]

    # the rest of the matrix ran, after the failures
    order = [(r["strategy"], int(r["world_size"])) for r in rows]
    for key, after in (
        (("test_crash", 1), ("test_crash", 2)),
        (("test_hang", 1), ("test_hang", 2)),
        (("test_crash", 1), ("test_oom", 1)),
        (("test_hang", 1), ("test_oom", 1)),
    ):
        assert by[key]["status"] == "ok", (key, by[key]["reason"])
        assert order.index(key) > order.index(after), order
    assert time.monotonic() - t0 < 600
    assert leftover_processes(run_dir) == []


def test_a_rank_killed_by_a_signal_is_named_in_its_row(tmp_path, data_root, faulty):
    """A rank the kernel kills leaves no error file: the row names it from its launcher's
    summary (torchrun's used to read `exit code 1: =====...`, its last line)."""
    cfg = small_config(
        tmp_path, data_root, world_sizes=(2,), strategies=("test_killed", "test_killed_spawn")
    )
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    for row in rows:
        assert row["status"] == "failed"
        assert row["reason"] == "rank 1 killed by SIGKILL (the kernel's OOM killer?)", row
    assert leftover_processes(run_dir) == []


def test_the_launchers_summary_names_the_rank_that_died(tmp_path):
    """How torchrun and horovodrun end a cell's log when a rank is killed (their own words,
    cut to what the harness reads), and a log that names no rank."""
    from bench.harness.runner import _failure

    torchrun = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
bench.harness.worker FAILED
-------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 26499)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 26500)  (SIGSEGV)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 26500
=======================================================
"""
    horovod = """RuntimeError: Horovod detected that one or more processes exited with non-zero \
status, thus causing the job to be terminated. The first process to do so was:
Process name: 0
Exit code: 137
"""
    for text, reason in (
        (torchrun, "rank 1 killed by SIGSEGV"),
        (horovod, "rank 0 killed by SIGKILL (the kernel's OOM killer?)"),
        (torchrun.replace("-11 (pid", "3 (pid"), "rank 1 exited with code 3 (log.txt)"),
        ("ImportError: no module named x\n", "exit code 1: ImportError: no module named x"),
    ):
        (tmp_path / "log.txt").write_text(text)
        assert _failure(tmp_path, 1) == ("failed", reason)


def test_missing_launcher_executable_is_a_failed_row(tmp_path, data_root, faulty, monkeypatch):
    import bench.harness.launchers as launchers

    monkeypatch.setattr(launchers, "horovodrun_path", lambda: None)
    monkeypatch.setitem(launchers.LAUNCHERS, "spawn", launchers.horovodrun)
    cfg = small_config(tmp_path, data_root, world_sizes=(2,), strategies=("ddp_spawn",))
    _, rows = run_matrix(cfg, echo=lambda m: None)
    assert rows[0]["status"] == "failed" and "horovodrun not found" in rows[0]["reason"]


def test_a_diverged_run_is_a_row_of_its_own_kept_out_of_the_rankings(tmp_path, data_root):
    from bench.analysis import report
    from bench.harness import results

    cfg = small_config(
        tmp_path, data_root, strategies=("single",), world_sizes=(1,), lr=1e6, warmup_steps=1
    )
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    (row,) = rows
    assert row["status"] == results.DIVERGED, row
    assert row["reason"].startswith("loss ") and " at step " in row["reason"]  # where it went
    assert float(row["samples_per_s"]) > 0  # what was measured is kept
    run = report.load_run(run_dir)
    assert report.summarise(run.runs).empty  # nothing to rank
    assert "diverged" in report.problems_markdown(run.runs, report.summarise(run.runs))


def test_memory_that_grows_step_after_step_is_named_in_the_report(tmp_path, data_root, faulty):
    """A strategy that keeps 24 MiB a step: steps.csv has what rank 0 held at each step's
    end, its row how much that grew over the timed steps, and the report names it, and
    not the steady single beside it."""
    import pandas as pd

    from bench.analysis import report

    cfg = small_config(
        tmp_path, data_root, strategies=("single", "test_leaky"), world_sizes=(1,), max_steps=14
    )
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    growth = {r["strategy"]: float(r["held_growth_mib"]) for r in rows}
    assert growth["test_leaky"] > 150, growth  # about 9 steps of 24 MiB between the quarters
    assert abs(growth["single"]) < 64, growth
    steps = pd.read_csv(run_dir / "steps.csv")
    leaky = steps[steps["strategy"] == "test_leaky"]["held_mib"]
    assert len(leaky) == 14 and leaky.iloc[-1] - leaky.iloc[0] > 250  # 13 steps' 24 MiB
    text = (report.render(run_dir)).read_text()
    section = text.split("## Memory that grew step after step")[1].split("## ")[0]
    assert "| test_leaky | 1 | 0 |" in section and "| single |" not in section


def test_an_evaluation_that_fails_keeps_the_measured_steps(tmp_path, data_root, faulty):
    import pandas as pd

    from bench.harness import results

    cfg = small_config(
        tmp_path, data_root, strategies=("test_evalfails", "test_evaloom"), world_sizes=(1,)
    )
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    row = {r["strategy"]: r for r in rows}
    assert row["test_evalfails"]["status"] == results.FAILED
    assert row["test_evalfails"]["reason"] == (
        "evaluation after the timed steps failed: RuntimeError: Error(s) in loading "
        "state_dict: Missing key(s): head.weight"
    )
    assert row["test_evaloom"]["status"] == results.OOM
    assert "OutOfMemoryError: CUDA out of memory" in row["test_evaloom"]["reason"]
    for r in rows:
        assert float(r["samples_per_s"]) > 0 and int(r["timed_steps"]) == 4  # kept
    assert len(pd.read_csv(run_dir / "steps.csv")) == 2 * 6
    assert not leftover_processes(run_dir)
