"""No lost results: a harness killed mid-matrix keeps every finished row, leaves no
process, and `--resume` finishes the rest. Plus concurrent runs and determinism."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.harness import proc
from bench.harness.runner import RunDir
from tests.conftest import ROOT, faulty_strategies, small_config
from tests.test_failures import leftover_processes

pytestmark = pytest.mark.slow

#: four cells; the seeded order (bench.harness.runner.plan) runs ddp_torchrun at world size
#: 2, single at 1, single at 2 (a skipped row) and ddp_torchrun at 1: the SIGKILL test stops
#: the run in the last (torchrun's agent and its rank: a tree the harness's death must take
#: down), which --resume redoes; the others stop it in the second, a real cell too
STRATEGIES = ("single", "ddp_torchrun")
MATRIX = ["--strategies", ",".join(STRATEGIES), "--world-sizes", "1,2"]
#: for the tests about stopping, not resuming: no probes, profile or scaling model (the
#: SIGKILL test keeps them, so --resume finds their files already written)
CELLS_ONLY = ("--probe-steps=0", "--profile-steps=0", "--no-scaling-model")


def _ended(pid: int, timeout_s: float) -> bool:
    """Whether process `pid` ends (is gone, or a zombie its parent has yet to reap) within
    `timeout_s`."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def _cli(out, data_root, *extra, matrix=MATRIX):
    return [
        sys.executable,
        "-m",
        "bench.cli",
        "run",
        *matrix,
        "--dataset",
        "mnist",
        "--data-root",
        str(data_root),
        "--max-steps",
        "6",
        "--warmup-steps",
        "2",
        "--limit",
        "2048",
        "--global-batch",
        "32",
        "--eval-samples",
        "100",
        "--device",
        "cpu",
        "--out-dir",
        str(out),
        "--no-report",
        *extra,
    ]


def _wait_rows(rd: RunDir, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(rd.runs.read()) < n:
        assert proc.poll() is None, "harness ended before it was killed"
        assert time.monotonic() < deadline, "no rows appeared"
        time.sleep(0.2)


def _wait_gone(run_dir, timeout: float = 20) -> list:
    deadline = time.monotonic() + timeout
    while (left := leftover_processes(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _interrupt_mid_matrix(
    tmp_path, data_root, run_id: str, sig: int, rows: int, *extra: str
) -> tuple[RunDir, str, int]:
    """Start the harness, let `rows` cells finish and the next start, send `sig`."""
    proc = subprocess.Popen(
        _cli(tmp_path, data_root, "--run-id", run_id, *extra),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rd = RunDir(tmp_path / run_id)
    _wait_rows(rd, rows, proc)
    time.sleep(1.0)  # ... and into the next cell (a real one: seconds long)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    return rd, out, proc.returncode


def test_sigkilled_harness_loses_nothing_and_resumes(tmp_path, data_root):
    rd, _, _ = _interrupt_mid_matrix(tmp_path, data_root, "r1", signal.SIGKILL, rows=3)
    run_dir = rd.path
    before = rd.runs.read()
    assert len(before) == 3
    assert _wait_gone(run_dir) == [], "ranks outlived the killed harness"

    done = subprocess.run(
        # the run's own options (config.json): --resume takes no others
        [sys.executable, "-m", "bench.cli", "run", "--resume", str(run_dir), "--no-report"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "3 of 4 cells already done" in done.stdout
    after = rd.runs.read()
    keys = [(r["strategy"], r["world_size"], r["repeat"]) for r in after]
    assert len(keys) == len(set(keys)) == 4
    assert after[: len(before)] == before  # earlier rows untouched
    assert all(r["status"] in ("ok", "skipped") for r in after)
    steps = {(s["strategy"], s["world_size"]) for s in rd.steps.read()}
    assert steps == {(r["strategy"], r["world_size"]) for r in after if r["status"] == "ok"}
    from bench.analysis import report

    assert report.load_run(run_dir).missing == []  # resumed: every planned cell has a row
    assert len(report.load_run(run_dir).planned) == 4


def test_a_rank_whose_launcher_dies_as_it_starts_dies_with_it(tmp_path):
    """A harness SIGKILLed as a cell started takes its launcher down (die_with_parent); the
    ranks asked for the same only after importing torch, seconds in which the launcher's
    death sent them nothing: two torchrun ranks were left waiting on its store. A rank
    now asks first; here its parent is gone while it imports, and nothing follows."""

    log = tmp_path / "rank.log"
    parent = (
        "import subprocess, sys, time\n"
        f"out = open({str(log)!r}, 'w')\n"
        "argv = [sys.executable, '-m', 'bench.harness.worker', 'no-such-spec.json']\n"
        "p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)\n"
        "print(p.pid, flush=True)\n"
        # until the rank maps libtorch: in torch's import (which takes a second or more
        # after that), so past its request, and long before it reads its spec
        "maps = f'/proc/{p.pid}/maps'\n"
        "deadline = time.monotonic() + 30\n"
        "while 'libtorch' not in open(maps).read() and time.monotonic() < deadline:\n"
        "    time.sleep(0.005)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", parent], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    rank = int(done.stdout)
    _ended(rank, 30)
    # killed in its imports: it never came to read its spec (and say there is none)
    assert log.read_text() == ""


@pytest.mark.parametrize("harness_lives", [False, True])
def test_a_rank_whose_harness_died_before_it_asked_dies_too(tmp_path, harness_lives):
    """A parent already gone when a rank asks the kernel to kill it with its parent sends it
    nothing: mp.spawn's ranks, started as their harness was SIGKILLed, trained on into the
    dead run's cell folder. A rank whose harness ($PARABENCH_HARNESS) is no longer among its
    ancestors now dies at once; one whose harness lives, two processes up, runs on."""

    log = tmp_path / "rank.log"
    harness = (
        "import os, subprocess, sys\n"
        f"out = open({str(log)!r}, 'w')\n"
        "worker = [sys.executable, '-m', 'bench.harness.worker', 'no-such-spec.json']\n"
        # a launcher between them, as torchrun's agent or mp.spawn's parent is
        "launcher = [sys.executable, '-c', f'import subprocess; subprocess.call({worker!r})']\n"
        "env = dict(os.environ, PARABENCH_HARNESS=str(os.getpid()))\n"
        "p = subprocess.Popen(launcher, stdout=out, stderr=subprocess.STDOUT, env=env)\n"
        "print(p.pid, flush=True)\n"
        f"sys.exit(p.wait() if {harness_lives} else 0)  # gone before the rank's interpreter is up\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", harness], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    launcher = int(done.stdout)  # it ends when the rank does
    assert _ended(launcher, 60), "the rank outlived its harness"
    said = log.read_text()
    if harness_lives:  # it ran on, to its spec (there is none)
        assert "no-such-spec.json" in said, said
    else:  # killed before it did anything
        assert said == ""


def test_a_collectives_rank_whose_harness_died_as_it_started_dies_too(tmp_path):
    """The collectives' ranks, started before the cells: a harness killed as it started one
    left it waiting on the dead harness's store until the measurement's timeout, then
    writing its error; it now dies at once, having written nothing."""

    harness = (
        "import os, subprocess\n"
        "from bench.harness import collectives\n"
        "popen = subprocess.Popen\n"
        "def started(cmd, **kw):\n"
        "    rank = popen(cmd, **kw)\n"
        "    if '--worker' not in cmd:  # another's (torch's imports run ldconfig)\n"
        "        return rank\n"
        "    print(rank.pid, kw['stderr'].name, flush=True)\n"
        "    os._exit(0)  # as a SIGKILL: its first rank is gone before it is up\n"
        "collectives.subprocess.Popen = started\n"
        "collectives.measure(2, timeout_s=5)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", harness], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    pid, err = done.stdout.split()
    _ended(int(pid), 60)
    said = Path(err).read_text()
    shutil.rmtree(os.path.dirname(err))  # the temporary folder its harness did not remove
    assert said == ""


def test_a_cell_on_this_machine_names_its_harness_to_its_ranks(tmp_path, data_root):
    """The harness's pid goes in the cell's environment where the ranks descend from it, and
    not where srun, ssh or horovodrun -H start them on other nodes (they would all die)."""
    from bench.harness.runner import Cell, Runner

    cfg = small_config(tmp_path, data_root)
    env = Runner(cfg, RunDir(tmp_path))._env(Cell("ddp_spawn", 2, 0), tmp_path)
    assert env["PARABENCH_HARNESS"] == str(os.getpid())
    across = cfg.replace(nodes=2, hosts=("a", "b"), procs_per_node=1)
    assert "PARABENCH_HARNESS" not in Runner(across, RunDir(tmp_path))._env(
        Cell("ddp_torchrun", 2, 0), tmp_path
    )


def test_sigterm_stops_cleanly_and_says_how_to_resume(tmp_path, data_root, capsys):
    rd, out, code = _interrupt_mid_matrix(tmp_path, data_root, "r2", signal.SIGTERM, 1, *CELLS_ONLY)
    run_dir = rd.path
    assert code == 130
    assert f"continue with: parabench run --resume {run_dir}" in out
    n = len(rd.runs.read())
    assert 1 <= n < 4  # stopped in the matrix, not at its end
    assert leftover_processes(run_dir) == []
    # its report and a comparison with it say it is incomplete, and which cells it lacks
    from bench.analysis import report
    from bench.cli import main

    text = report.render(run_dir).read_text()
    assert f"**Incomplete: {4 - n} of 4 planned cells have no row" in text, text[:600]
    assert f"it stopped; to finish it, parabench run --resume {run_dir}.**" in text
    assert "Every cell finished ok" not in text
    missing = report.load_run(run_dir).missing
    assert len(missing) == 4 - n and all(name in STRATEGIES for name, *_ in missing)
    assert main(["compare", str(run_dir), str(run_dir), "--no-stats"]) == 0
    said = capsys.readouterr().out
    assert f"B is incomplete: {4 - n} of 4 planned cells have no row" in said, said


def test_ctrl_c_again_while_the_run_stops_still_says_how_to_resume(
    tmp_path, data_root, monkeypatch, capsys, sigint_raises
):
    """A user who presses Ctrl-C again (and again) while the harness stops the cell's ranks
    (seconds: SIGTERM, a grace, SIGKILL) cut that clean-up short: the line with the
    `--resume` command was never said, only "parabench: interrupted", and the kill was left
    half done. Now the stop goes on to its end, whatever else is pressed: its one line, exit
    130, no rank left."""
    from bench.cli import main

    wait, kill = proc.CellProcess.wait, proc.CellProcess.kill
    kills = []

    def stopped(self, *args, **kwargs):  # the first Ctrl-C, once the cell's tree is there
        self._track()
        os.kill(os.getpid(), signal.SIGINT)
        return wait(self, *args, **kwargs)

    def impatient(self, *args, **kwargs):  # another Ctrl-C as each kill begins
        kills.append(self.popen.pid)
        os.kill(os.getpid(), signal.SIGINT)
        kill(self, *args, **kwargs)

    monkeypatch.setattr(proc.CellProcess, "wait", stopped)
    monkeypatch.setattr(proc.CellProcess, "kill", impatient)
    argv = _cli(tmp_path, data_root, "--run-id", "cc", *CELLS_ONLY, matrix=[])[3:]
    argv += ["--strategies", "single", "--world-sizes", "1"]
    try:
        code = main(argv)
    except KeyboardInterrupt:
        pytest.fail("a second Ctrl-C left parabench as a traceback")
    run_dir = tmp_path / "cc"
    err = capsys.readouterr().err
    assert code == 130
    assert kills, "the cell was not stopped"
    assert err.splitlines()[-1] == (
        f"interrupted: no row yet for {run_dir}/runs.csv; "
        f"continue with: parabench run --resume {run_dir}"
    ), err
    assert "parabench: interrupted" not in err
    assert leftover_processes(run_dir) == []


def test_ctrl_c_as_a_cells_rows_are_written_waits_for_the_last_table(tmp_path, sigint_raises):
    """A cell's steps, ranks and runs rows are written with Ctrl-C held off, so a stop never
    leaves a cell's steps without its row. The hold was a signal mask, the main thread's
    alone: in a harness that had run a torch op (the estimate times steps in it), torch's
    threads took the signal and it was raised inside the write all the same, after
    steps.csv, before runs.csv: the finished cell lost. Now it waits for the row."""
    import torch

    from bench.harness import results

    torch.randn(256, 256) @ torch.randn(256, 256)  # torch's threads, as in the harness
    rd = RunDir(tmp_path)
    append, written = results.CsvTable.append, []

    def stopped(self, rows):
        append(self, rows)
        written.append(self.path.name)
        if len(written) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    row = {"strategy": "single", "world_size": 1, "repeat": 0, "status": "ok"}
    try:
        results.CsvTable.append = stopped
        with pytest.raises(KeyboardInterrupt):
            rd.write([row], [dict(row, step=1)], [dict(row, rank=0)])
    finally:
        results.CsvTable.append = append
    assert written == ["steps.csv", "ranks.csv", "runs.csv"]
    assert [r["status"] for r in rd.runs.read()] == ["ok"]


def test_a_reader_that_leaves_mid_run_stops_it_saying_how_to_resume(tmp_path, data_root):
    """`parabench run ... | head`: once head has its lines the run stops as if interrupted
    (its rows kept, no rank left) and says on stderr how to go on, then exits 141."""
    err_path = tmp_path / "stderr"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            # cells after the one running when the reader leaves: the run notices at that
            # cell's line, and must stop there, not finish the matrix
            _cli(tmp_path, data_root, "--run-id", "r3", *CELLS_ONLY),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            # stdout into a pipe as Python buffers it by default (block-wise): this machine
            # sets PYTHONUNBUFFERED, which would hide a run that says nothing until its end
            env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
        )
        rd = RunDir(tmp_path / "r3")
        _wait_rows(rd, 1, proc)
        proc.stdout.close()  # the reader leaves
        code = proc.wait(timeout=120)
    err = err_path.read_text()
    assert code == 141, err
    assert "stdout closed, the run stopped" in err, err
    assert f"continue with: parabench run --resume {rd.path}" in err
    assert "Traceback" not in err
    assert 1 <= len(rd.runs.read()) < 4
    assert leftover_processes(rd.path) == []


def test_two_runs_at_once_both_complete_with_the_same_loss_curves(tmp_path, data_root):
    """Both runs rendezvous (torchrun's and mp.spawn's) at once: each needs its own free
    port. Same seed, same curves, exactly: two processes per cell, each with its own seeds
    and threads, and another run's four ranks on the same cores."""
    matrix = ["--strategies", "ddp_spawn,ddp_torchrun", "--world-sizes", "2"]
    procs = [
        subprocess.Popen(
            _cli(tmp_path, data_root, "--run-id", f"c{i}", *CELLS_ONLY, matrix=matrix),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err
    curves = []
    for i in range(2):
        rd = RunDir(tmp_path / f"c{i}")
        assert [(r["strategy"], r["status"]) for r in rd.runs.read()] == [
            ("ddp_spawn", "ok"),
            ("ddp_torchrun", "ok"),
        ]
        curves.append([(s["strategy"], s["step"], s["loss"]) for s in rd.steps.read()])
    assert len(curves[0]) == 2 * 6
    assert curves[0] == curves[1]


def test_the_interrupted_matrix_ends_in_a_cell_that_runs(data_root, tmp_path):
    """What the interrupt tests rely on: their matrix's last cell is a real one, so three
    rows in, a cell is running (a skipped row last would end the run before the signal)."""
    from bench.harness.runner import plan

    cfg = small_config(tmp_path, data_root, strategies=STRATEGIES, world_sizes=(1, 2))
    cells = plan(cfg)
    assert len(cells) == 4 and cells[-1].status == "" and cells[1].status == ""
    assert (cells[-1].strategy, cells[-1].world_size) == ("ddp_torchrun", 1)


def test_a_disk_that_fills_up_stops_the_run_saying_how_to_resume(
    tmp_path, data_root, monkeypatch, capsys
):
    """No space left for a cell's rows (a long run's disk filled up): a traceback of three
    chained OSErrors used to end the run. Now one line, exit 1, the rows written so far
    whole, no rank left, and --resume finishes the run once there is room."""
    import errno

    from bench.cli import main
    from bench.harness import results

    append = results.CsvTable.append

    def full(self, rows):
        if self.path.name == "runs.csv":
            raise OSError(errno.ENOSPC, "No space left on device")
        append(self, rows)

    monkeypatch.setattr(results.CsvTable, "append", full)
    argv = _cli(tmp_path, data_root, "--run-id", "full", *CELLS_ONLY, matrix=[])[3:]
    argv += ["--strategies", "single", "--world-sizes", "1"]
    assert main(argv) == 1
    run_dir = tmp_path / "full"
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"parabench: No space left on device in {run_dir}, the run stopped: no row yet for "
        f"{run_dir}/runs.csv; continue with: parabench run --resume {run_dir} once "
        "there is room"
    )
    assert "Traceback" not in err
    assert leftover_processes(run_dir) == []

    # the cell's steps and ranks went in before its row could not: the resume runs the cell
    # again, and its steps.csv holds its steps once (they stood twice, a loss curve and a
    # step-time spread of two runs)
    assert len(RunDir(run_dir).steps.read()) == 6
    monkeypatch.setattr(results.CsvTable, "append", append)  # room again
    assert main(["run", "--resume", str(run_dir), "--no-report"]) == 0
    assert [r["status"] for r in RunDir(run_dir).runs.read()] == ["ok"]
    steps = [s["step"] for s in RunDir(run_dir).steps.read()]
    assert len(steps) == len(set(steps)) == 6
    assert len(RunDir(run_dir).ranks.read()) == 1


def test_a_disk_that_fills_up_as_the_model_is_measured_leaves_a_run_that_resumes(
    tmp_path, data_root, monkeypatch, capsys
):
    """The disk filled up as model.json (the FLOPs and peaks) was written: that file was left
    empty, the --resume the message asks for skipped measuring it again, since it was
    there, and stopped on its JSON with a traceback. Now the file is written whole or not
    at all, and the resume measures it."""
    import errno
    import io

    from bench.cli import main

    real_open = io.open

    def full_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        name = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else str(file)
        if "w" in mode and "model.json" in os.path.basename(name):

            def write(text):  # the file is there (open made it); its blocks are not
                raise OSError(errno.ENOSPC, "No space left on device")

            f.write = write
        return f

    monkeypatch.setattr(io, "open", full_open)
    argv = _cli(tmp_path, data_root, "--run-id", "full", matrix=[])[3:]
    argv += ["--strategies", "single", "--world-sizes", "1", "--probe-steps=0"]
    assert main([*argv, "--profile-steps=0"]) == 1
    run_dir = tmp_path / "full"
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"parabench: No space left on device in {run_dir}")
    assert leftover_processes(run_dir) == []

    monkeypatch.setattr(io, "open", real_open)  # room again
    assert main(["run", "--resume", str(run_dir), "--no-report"]) == 0
    assert [r["status"] for r in RunDir(run_dir).runs.read()] == ["ok"]
    assert float(RunDir(run_dir).runs.read()[0]["flops_per_sample"]) > 0
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".model.json")] == []


def test_sigterm_before_the_cells_and_while_the_report_is_written_is_as_ctrl_c(
    tmp_path, data_root, monkeypatch, capsys
):
    """SIGTERM (kill, a job cancelled) as the estimate timed its steps, or once every row was
    in and the report was being written, ended the harness silently with 143 and no word of
    `parabench report`, where Ctrl-C said what was left and exited 130 as the README says of
    both. The test's own handler stands in for the default one, which would end pytest."""
    from bench.analysis import report
    from bench.cli import main
    from bench.harness import estimate

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, before this returns
        raise AssertionError("SIGTERM did not stop the run")

    heard = []
    old = signal.signal(signal.SIGTERM, lambda *args: heard.append(args))
    try:
        argv = _cli(tmp_path, data_root, "--run-id", "t", *CELLS_ONLY, matrix=[])[3:]
        argv = [a for a in argv if a != "--no-report"] + [
            "--strategies",
            "single",
            "--world-sizes",
            "1",
        ]
        with monkeypatch.context() as m:
            m.setattr(estimate, "estimate", terminated)
            assert main(argv) == 130
        assert capsys.readouterr().err.splitlines()[-1] == "parabench: interrupted"
        assert not (tmp_path / "t").exists()  # nothing had started

        monkeypatch.setattr(report, "render", terminated)
        assert main(argv) == 130
        run_dir = tmp_path / "t"
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"interrupted while writing the report: every row is in {run_dir}; "
            f"`parabench report {run_dir}` writes it"
        )
        assert [r["status"] for r in RunDir(run_dir).runs.read()] == ["ok"]
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the test's again
        assert heard == []
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_command_stopped_as_it_starts_says_one_line(monkeypatch, capsys, sig, sigint_raises):
    """Ctrl-C or SIGTERM in a command's first seconds, as its parser imports torch: one line
    and exit 130, where Ctrl-C there gave a traceback of torch's imports (SIGTERM ended it
    silently with 143: here the test's own handler hears it)."""
    from bench import cli

    def stopped():
        os.kill(os.getpid(), sig)
        raise AssertionError("the signal did not stop the command")

    heard = []
    old = signal.signal(signal.SIGTERM, lambda *args: heard.append(args))
    try:
        monkeypatch.setattr(cli, "build_parser", stopped)
        try:
            code = cli.main(["list"])
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C went past main as a traceback")
        assert code == 130
        assert capsys.readouterr().err == "parabench: interrupted\n"
        assert heard == []
    finally:
        signal.signal(signal.SIGTERM, old)


def test_sigterm_stops_any_command_as_ctrl_c(monkeypatch, capsys):
    """Not only run: verify between its runs, report, predict... SIGTERM in any command is
    Ctrl-C's one line and exit 130, where its default ended them silently with 143 (here in
    `list`, as it reads the strategies). The test's own handler is back after."""
    import strategies
    from bench.cli import main

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")

    heard = []
    old = signal.signal(signal.SIGTERM, lambda *args: heard.append(args))
    try:
        monkeypatch.setattr(strategies, "registry", terminated)
        assert main(["list"]) == 130
        assert capsys.readouterr().err.splitlines()[-1] == "parabench: interrupted"
        signal.raise_signal(signal.SIGTERM)  # the test's handler again
        assert len(heard) == 1
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_rank_of_a_harness_that_is_pid_1_runs(tmp_path):
    """In a container the harness is often pid 1 (`docker run IMAGE parabench run`): its
    ranks descend from it. The walk up their parents stopped short of pid 1, found no
    harness, and every rank killed itself. A pid namespace of its own makes the harness 1."""
    import shutil as sh

    if sh.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a pid namespace")
    harness = (
        "import os, subprocess, sys\n"
        "assert os.getpid() == 1\n"
        "rank = 'from bench.harness import proc; proc.die_with_parent(); print(\"ran\")'\n"
        "env = dict(os.environ, PARABENCH_HARNESS='1')\n"
        "sys.exit(subprocess.run([sys.executable, '-c', rank], env=env).returncode)\n"
    )
    done = subprocess.run(
        ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, "-c", harness],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr


def test_retry_failed_runs_a_failed_cell_again_and_keeps_its_first_attempt(
    tmp_path, data_root, capsys
):
    """`run --resume RUN --retry-failed`: a cell that failed (test_fails_once fails its first
    time only) runs again and its row is ok; the failed attempt's row and folder (its log)
    are kept under retried/, the report lists it, and the cell that was ok is not run again.
    The run said how to retry. The retried cell ran apart in time from the rows already there,
    but its row said the round of its repeat, and the report paired it, as run side by side,
    with cells measured before: its round comes after every round already in runs.csv."""
    import pandas as pd

    from bench import program
    from bench.analysis import report
    from bench.cli import main

    argv = _cli(tmp_path, data_root, "--run-id", "r", "--repeats", "2")[3:]
    argv[argv.index(MATRIX[1])] = "test_fails_once"
    argv[argv.index(MATRIX[3])] = "1"
    run_dir = tmp_path / "r"
    with faulty_strategies():
        assert main(argv) == 1
        said = capsys.readouterr().out
        # where its rows go, said as it begins: `status` in another terminal follows it
        assert f"run folder: {run_dir} (`{program()} status {run_dir}` says" in said
        assert f"{program()} run --resume {run_dir} --retry-failed" in said
        first = pd.read_csv(run_dir / "runs.csv")
        assert list(first["round"]) == list(first["repeat"]) == [0, 1]  # a run not resumed
        (failed,) = first[first["status"] != "ok"].itertuples()
        assert failed.status == "failed" and "deliberate failure" in failed.reason
        run = report.load_run(run_dir)
        text = report.report_markdown(run, report.summarise(run.runs), [])
        assert f"`parabench run --resume {run_dir} --retry-failed`" in text

        assert main(["run", "--resume", str(run_dir), "--retry-failed", "--no-report"]) == 0
        said = capsys.readouterr().out
        assert "retrying 1 failed cell(s)" in said and "deliberate failure" in said
        assert "1 of 2 cells already done" in said
        after = pd.read_csv(run_dir / "runs.csv").set_index("repeat")
        assert list(after["status"]) == ["ok", "ok"]
        kept = 1 - failed.repeat
        pd.testing.assert_series_equal(  # the ok cell's row as it was: not run again
            after.loc[kept], first.set_index("repeat").loc[kept], check_names=False
        )
        assert after.loc[failed.repeat, "round"] == 2, after[["round", "status"]]

        cell = f"test_fails_once-ws1-fp32-r{failed.repeat}"
        (old,) = RunDir(run_dir).retried.read()
        assert (old["attempt"], old["status"]) == ("1", "failed")
        assert old["attempt_dir"] == f"retried/{cell}-attempt1"
        assert "deliberate failure" in (run_dir / old["attempt_dir"] / "log.txt").read_text()
        assert "deliberate failure" not in (run_dir / "cells" / cell / "log.txt").read_text()
        run = report.load_run(run_dir)
        text = report.report_markdown(run, report.summarise(run.runs), [])
        assert f"--resume {run_dir} --retry-failed" not in text  # nothing failed now
        row = next(ln for ln in text.splitlines() if f"{cell}-attempt1/" in ln)
        assert "failed: " in row and "| ok |" in row

        # nothing failed: nothing runs
        assert main(["run", "--resume", str(run_dir), "--retry-failed", "--no-report"]) == 0
        assert "no failed cell to retry" in capsys.readouterr().out
    assert len(RunDir(run_dir).retried.read()) == 1


#: armed by the test below: a SIGTERM to this process from inside a fork's hooks
_TERM_IN_FORK: list[bool] = []


def _term_in_fork() -> None:
    if _TERM_IN_FORK:
        _TERM_IN_FORK.clear()
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_while_a_cell_forks_stops_the_run(tmp_path):
    """SIGTERM (or Ctrl-C) as a cell's process forked ran the handler inside the fork's
    own hooks, which drop what it raises ("Exception ignored in _releaseLock"): the stop was
    lost and the run went on to its end, exit 0. It is heard once the process has started,
    which is killed."""
    os.register_at_fork(after_in_parent=_term_in_fork)  # no way to remove it: disarmed after
    old = signal.signal(signal.SIGTERM, proc.raise_interrupt)  # as run_matrix
    # its own command line (tmp_path's): the search below is of every process on the machine
    argv = [sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path)]
    try:
        _TERM_IN_FORK.append(True)
        with pytest.raises(KeyboardInterrupt):
            proc.CellProcess(argv, dict(os.environ), tmp_path / "log.txt", "stopped")
        assert not _TERM_IN_FORK  # the signal was sent as it forked
        assert [
            p.info for p in psutil.process_iter(["pid", "cmdline"]) if p.info["cmdline"] == argv
        ] == []
        assert signal.getsignal(signal.SIGTERM) is proc.raise_interrupt  # its own again
        # started without a stop, it runs
        cell = proc.CellProcess(argv, dict(os.environ), tmp_path / "log.txt", "started")
        try:
            assert cell.popen.poll() is None
        finally:
            cell.kill()
    finally:
        _TERM_IN_FORK.clear()
        signal.signal(signal.SIGTERM, old)


def test_a_stop_while_a_node_command_forks_stops_every_node(tmp_path):
    """fan_out (a multi-node cell's node commands) had the same window as a cell's start:
    SIGTERM as a node's command forked was dropped with its handler's exit, and the nodes
    after it started. It is heard once that command has started, and every node stops."""
    from bench.harness import nodes

    os.register_at_fork(after_in_parent=_term_in_fork)  # no way to remove it: disarmed after
    argv = [sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path)]
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        _TERM_IN_FORK.append(True)
        with pytest.raises(SystemExit) as stopped:
            nodes.fan_out([argv, argv])
        assert stopped.value.code == 128 + signal.SIGTERM and not _TERM_IN_FORK
        left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == argv]
        assert left == []  # the node started, and none after it
    finally:
        _TERM_IN_FORK.clear()
        for s, handler in old.items():
            signal.signal(s, handler)


def test_a_resume_keeps_the_environment_the_run_began_in(tmp_path, data_root):
    """`--resume` of a run (done already, or from another machine) rewrote its
    environment.json as this checkout's: a committed reference run resumed to see whether
    it was whole came out with this machine's platform and commit. The run's own is kept;
    one stopped before it was written gets it."""
    import json

    from bench.harness.runner import run_matrix

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    run_dir, _ = run_matrix(cfg, echo=lambda m: None)
    path = run_dir / "environment.json"
    elsewhere = json.loads(path.read_text()) | {"host": "elsewhere", "git_commit": "abc123"}
    path.write_text(json.dumps(elsewhere))
    run_matrix(cfg, resume=run_dir, echo=lambda m: None)
    assert json.loads(path.read_text()) == elsewhere
    path.unlink()
    run_matrix(cfg, resume=run_dir, echo=lambda m: None)
    assert json.loads(path.read_text())["host"] not in ("", "elsewhere")


def test_a_run_resumed_under_another_folder_name_keeps_its_run_id(tmp_path, data_root):
    """A run folder renamed (or copied under another name) and resumed: its new rows said
    the folder's name as their run_id beside the earlier rows' own, so that runs.csv files
    put together and grouped by run_id split the one run in two. They say the id the run
    began under (its config.json's), as its earlier rows do."""
    import json

    from bench.config import RunConfig
    from bench.harness.runner import Runner, plan

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1, 2))
    cfg = cfg.replace(run_id="first")
    cells = plan(cfg)
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / "config.json").write_text(json.dumps(cfg.to_dict()))
    rd = RunDir(renamed)
    saved = RunConfig.from_dict(json.loads((renamed / "config.json").read_text()))
    done = next(c for c in cells if not c.status)  # single at 1: its row from before
    rd.write(
        [
            {
                "run_id": "first",
                "strategy": "single",
                "world_size": 1,
                "setting": done.label,
                "repeat": 0,
                "epoch": 0,
                "status": "ok",
            }
        ],
        [],
        [],
    )
    skipped = next(c for c in cells if c.status)  # single at 2: a row, no process
    Runner(saved, rd, echo=lambda m: None).run([done, skipped])
    assert [r["run_id"] for r in rd.runs.read()] == ["first", "first"]
