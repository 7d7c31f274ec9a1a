"""Failure isolation: a crash, a hang and an out-of-memory error each become a row with
its status and reason, the rest of the matrix completes, and no process is left."""

from __future__ import annotations

import contextlib
import re
import socket
import time
from pathlib import Path

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


@pytest.mark.serial  # its healthy cells must end inside the 20 s deadline
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
    # a failed cell wrote no epoch, and its row's `hosts` was empty where an ok row names
    # its ranks' hosts: a failure on one node of several said nothing of where. It names
    # the hosts the cell was started on (test_a_failed_row_says_where_it_ran: --hosts)
    assert crash["hosts"] == socket.gethostname()

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


def test_a_failed_row_says_where_it_ran():
    """A failed row names the hosts its cell was started on: this machine
    (test_crash_hang_and_oom_become_rows_and_the_matrix_goes_on), or --hosts across nodes."""
    from bench.config import RunConfig
    from bench.harness.runner import launched_on

    across = RunConfig(nodes=2, procs_per_node=1, hosts=("a", "b"), rdzv="static", ifname="lo")
    assert launched_on(across) == "a,b"


def test_a_slurm_cell_whose_port_was_in_use_names_it(tmp_path, data_root):
    """Jobs sharing a node whose ids are a multiple of 100 apart take the same ports
    (slurm.cell_port), and the second's cell failed with EADDRINUSE in its log alone: the
    row named the port in use for a run across nodes without SLURM only, and worked out its
    port a second time. The port the cell listened on is kept, and named by launcher."""
    import dataclasses

    from bench.harness.runner import Cell, RunDir, Runner
    from strategies.base import Setting

    cfg = small_config(tmp_path, data_root)
    cell = Cell("ddp_torchrun", 2, 0, Setting())
    cell_dir = tmp_path / "cells" / cell.dirname
    cell_dir.mkdir(parents=True)
    (cell_dir / "log.txt").write_text(
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        "local network address. port: 29712, useIpv6: false, code: -98, name: EADDRINUSE, "
        "message: address already in use\n"
    )

    def reason(runner: Runner) -> str:
        (row,) = runner._collect(cell, cell_dir, 1, False, 3.0)[0]
        assert row["status"] == "failed"
        return row["reason"]

    in_job = dict(launcher="slurm", master_addr="n7", hosts=("n7",), procs_per_node=2)
    slurm = Runner(dataclasses.replace(cfg, world_sizes=(2,), **in_job), RunDir(tmp_path))
    assert not reason(slurm).startswith("port")  # the harness chose no port for it
    slurm.ports[cell.key] = 29712
    assert reason(slurm).startswith(
        "port 29712 on n7, where the cell's rendezvous listens, was in use (another job's on "
        "the same node? jobs whose ids are a multiple of 100 apart take the same ports: give "
        "one another --rdzv-port); then "
    )
    slurm.ports[cell.key] = 29713  # another port in use: not this cell's
    assert not reason(slurm).startswith("port")


def test_a_rank_killed_by_a_signal_is_named_in_its_row(tmp_path, data_root, faulty):
    """A rank the kernel kills leaves no error file: the row names it from its launcher's
    summary (torchrun's used to read `exit code 1: =====...`, its last line)."""
    cfg = small_config(
        tmp_path, data_root, world_sizes=(2,), strategies=("test_killed", "test_killed_spawn")
    )
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    for row in rows:
        assert row["status"] == "failed"  # a SIGKILL alone is no proof of the OOM killer
        assert row["reason"].startswith("rank 1 killed by SIGKILL ("), row
        assert "OOM killer" in row["reason"], row  # what the kernel says of it
    assert leftover_processes(run_dir) == []


@pytest.mark.serial  # rank 1 must raise inside the 25 s deadline
def test_a_rank_that_raised_then_never_ended_is_failed_with_its_error(tmp_path, data_root, faulty):
    """A rank wrote its error only after its teardown: one whose teardown never ended left
    no word of what it raised, and the cell read as a hang at its deadline ('timeout: ...
    hang?'). The error is written as it is raised: the row is failed with it, and says the
    cell was then killed at its deadline."""
    cfg = small_config(
        tmp_path, data_root, world_sizes=(2,), strategies=("test_crash_stuck",), timeout_s=25
    )
    run_dir, (row,) = run_matrix(cfg, echo=lambda m: None)
    assert row["status"] == "failed", row
    assert row["reason"] == (
        "rank 1: RuntimeError: deliberate crash in backward at step 2; then the cell did not "
        "end within 25 s: all its processes were killed"
    )
    assert leftover_processes(run_dir) == []


HUNGRY = Path(__file__).resolve().parent / "plugins" / "hungry_data.py"


def _hungry_run(tmp_path: Path, data_root: Path, how: str, cgroup: Path | None = None) -> dict:
    """`parabench run` of single on a data set whose DataLoader worker dies (how=kill: by
    SIGKILL; how=hog: by the OOM killer of the memory cgroup it runs in); its row."""
    import csv
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "bench.cli", "run", "--strategies", "single"]
    argv += ["--world-sizes", "1", "--dataset", f"{HUNGRY}:hungry", "--model", "mnist_cnn"]
    argv += ["--dataset-arg", f"how={how}", "--workers", "1", "--max-steps", "6"]
    argv += ["--warmup-steps", "1", "--global-batch", "32", "--repeats", "1", "--no-report"]
    argv += ["--device", "cpu", "--out-dir", str(tmp_path), "--run-id", how]
    env = {**os.environ, "PYTHONPATH": str(root), "PARABENCH_DATA_ROOT": str(data_root)}

    def join() -> None:  # the run and every process of its cells, in the cgroup
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    done = subprocess.run(
        argv,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=join if cgroup else None,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    with open(tmp_path / how / "runs.csv") as f:
        (row,) = csv.DictReader(f)
    return row


def test_a_loader_worker_killed_by_sigkill_is_failed_and_says_what_the_kernel_says(
    tmp_path, data_root
):
    """SIGKILL is what the OOM killer sends, but not proof of it: the row stays failed,
    and its reason says what the kernel says of OOM kills while the cell ran."""
    from bench.harness import proc

    before = proc.oom_kill_count()
    row = _hungry_run(tmp_path, data_root, "kill")
    assert row["status"] == "failed", row
    assert row["reason"].startswith("rank 0: RuntimeError: DataLoader worker (pid"), row
    if before is not None and proc.oom_kill_count() == before:  # none on this machine meanwhile
        assert "(not the kernel's OOM killer: " in row["reason"], row
    else:
        assert "OOM killer" in row["reason"], row


def _memory_cgroup(tmp_path: Path) -> Path:
    """A memory cgroup of 3 GiB below this process's own (cgroup v1 or v2), or a skip."""
    import os

    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        v1 = "memory" in controllers.split(",")
        if not (v1 or controllers == ""):
            continue
        base = Path("/sys/fs/cgroup/memory" if v1 else "/sys/fs/cgroup") / path.lstrip("/")
        cg = base / f"parabench-test-{os.getpid()}"
        try:
            cg.mkdir()
            (cg / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(3 << 30))
            return cg
        except OSError:
            with contextlib.suppress(OSError):
                cg.rmdir()
    pytest.skip("no memory cgroup to make here (root, and a writable cgroup hierarchy, needed)")


@pytest.mark.serial  # a real OOM kill: the machine's count and kernel log
def test_a_loader_worker_the_oom_killer_killed_is_an_oom_row_with_the_kernels_words(
    tmp_path, data_root
):
    """In a memory cgroup of 3 GiB, a DataLoader worker allocates until the kernel's OOM
    killer kills it: where the kernel's log can be read (root here), the row is `oom` and
    quotes the kernel's line naming the worker."""
    from bench.harness import proc

    watch = proc.OomWatch()
    if not watch.stop().whole:
        pytest.skip("the kernel's log cannot be read here (kernel.dmesg_restrict)")
    cgroup = _memory_cgroup(tmp_path)
    try:
        row = _hungry_run(tmp_path, data_root, "hog", cgroup)
    finally:
        cgroup.rmdir()
    assert row["status"] == "oom", row
    pid = re.search(r"DataLoader worker \(pid(?:\(s\))? (\d+)\)", row["reason"])
    assert pid, row
    said = "; the kernel's OOM killer killed one of the cell's processes (its log: Memory "
    assert f"{said}cgroup out of memory: Killed process {pid[1]} (" in row["reason"], row


def test_the_launchers_summary_names_the_rank_that_died(tmp_path):
    """How torchrun, mp.spawn, horovodrun and srun end a cell's log when a rank is killed
    (their own words, cut to what the harness reads), and a log that names no rank."""
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
    spawn = """    raise ProcessExitedException(
torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 3
"""
    srun = """srun: error: n2: task 1: Killed
slurmstepd-n1: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-11-27T09:19:06 ***
srun: error: n1: task 0: Terminated
"""
    for text, reason in (
        (torchrun, "rank 1 killed by SIGSEGV"),
        (horovod, "rank 0 killed by SIGKILL (the kernel's OOM killer?)"),
        (torchrun.replace("-11 (pid", "3 (pid"), "rank 1 exited with code 3 (log.txt)"),
        # past 128 but no signal's: the process's own code, not a signal of -127
        (horovod.replace("137", "255"), "rank 0 exited with code 255 (log.txt)"),
        ("ImportError: no module named x\n", "exit code 1: ImportError: no module named x"),
        # mp.spawn's, where its launcher's exit code 1 is not the rank's
        (spawn, "rank 1 exited with code 3 (log.txt)"),
        (spawn.replace("exit code 3", "signal SIGSEGV"), "rank 1 killed by SIGSEGV"),
        # srun's, a step of --launcher slurm: the first task to end, not the peer that its
        # --kill-on-bad-exit ended after it (the log's last line)
        (srun, "rank 1 killed by SIGKILL (the kernel's OOM killer?)"),
        (
            srun.replace("task 1: Killed", "tasks 1-3: Exited with exit code 3"),
            "rank 1 exited with code 3 (log.txt)",
        ),
        # a signal that dumped a core: srun adds so to strsignal's words
        (
            srun.replace("task 1: Killed", "task 1: Segmentation fault (core dumped)"),
            "rank 1 killed by SIGSEGV",
        ),
    ):
        (tmp_path / "log.txt").write_text(text)
        assert _failure(tmp_path, 1) == ("failed", reason)


def test_a_rank_aborted_by_a_cpp_exception_says_what_it_said(tmp_path):
    """A C++ exception nothing caught aborts its rank (SIGABRT) with no Python error and no
    error file: torch's PowerSGD hook on gloo with two buckets in flight, as this machine's
    log had it. The row says gloo's words, not the signal alone."""
    from bench.harness.runner import _failure

    gloo = (
        "[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:464]"
        " op.preamble.length <= op.nbytes. 140 vs 96. Received data size doesn't match "
        "expected size. Is there a distributed collective mismatch in your code?"
    )
    summary = """Root Cause (first observed failure):
[0]:
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 12548)  (SIGABRT)
  traceback : Signal 6 (SIGABRT) received by PID 12548
=======================================================
"""
    aborted = "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
    aborted += f"  what():  {gloo}\n"
    (tmp_path / "log.txt").write_text(aborted + "Traceback (most recent call last):\n" + summary)
    assert _failure(tmp_path, 1) == ("failed", f"rank 0 killed by SIGABRT: {gloo}")
    # horovodrun prefixes each line with its rank
    prefixed = "".join(f"[1,0]<stderr>:{line}\n" for line in aborted.splitlines())
    (tmp_path / "log.txt").write_text(prefixed + summary)
    assert _failure(tmp_path, 1) == ("failed", f"rank 0 killed by SIGABRT: {gloo}")
    # an abort with nothing said keeps the signal alone
    (tmp_path / "log.txt").write_text(summary)
    assert _failure(tmp_path, 1) == ("failed", "rank 0 killed by SIGABRT")


@pytest.mark.parametrize(
    ("message", "oom"),
    [
        ("CUDA out of memory. Tried to allocate 8.00 GiB", True),
        ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4000 bytes", True),
        # cuBLAS's and cuDNN's own allocations, the first to fail on a full GPU
        ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
        ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
        (
            "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...)`",
            False,
        ),
        ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED", False),
    ],
)
def test_an_allocation_cublas_or_cudnn_could_not_make_is_oom(tmp_path, message, oom):
    """A rank's error that says an allocation failed makes the row `oom`, with its words:
    cuBLAS's and cuDNN's too, whose handles and workspaces torch's allocator does not make
    (a row `failed` for them read as a bug in the strategy, not a GPU too small)."""
    import json

    from bench.harness import proc
    from bench.harness.runner import _failure

    exc = RuntimeError(message)
    error = {"rank": 1, "time": 1.0, "type": "RuntimeError", "message": message}
    (tmp_path / "error-rank1.json").write_text(json.dumps({**error, "oom": proc.is_oom(exc)}))
    status = "oom" if oom else "failed"
    assert _failure(tmp_path, 1) == (status, f"rank 1: RuntimeError: {message}")


def test_a_sigkill_is_oom_only_where_the_kernels_log_names_the_process(tmp_path):
    """What the kernel says of its OOM killer over the cell decides: its log naming one of
    the cell's processes (the rank, or a DataLoader worker its error names) makes the row
    `oom`; otherwise it stays `failed` and says what is known, and no more."""
    import json

    from bench.harness.proc import OomKills
    from bench.harness.runner import _failure

    (tmp_path / "log.txt").write_text(
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -9 (pid: 26500)\n"
    )
    line = "Out of memory: Killed process 26500 (python) total-vm:9kB, anon-rss:8kB"
    other = line.replace("26500", "777")
    killed = "rank 1 killed by SIGKILL"
    for kernel, status, reason in (
        (
            OomKills(frozenset({26499, 26500}), 1, (line,), True),
            "oom",
            f"{killed}; the kernel's OOM killer killed one of the cell's processes (its log: "
            "Out of memory: Killed process 26500 (python))",
        ),
        (
            OomKills(frozenset({26500}), 1, (other,), True),
            "failed",
            f"{killed} (not the kernel's OOM killer: its log names no process of the cell)",
        ),
        (
            OomKills(frozenset({26500}), 0),
            "failed",
            f"{killed} (not the kernel's OOM killer: it killed no process on this machine "
            "while the cell ran (/proc/vmstat oom_kill))",
        ),
        (
            OomKills(frozenset({26500}), 2),
            "failed",
            f"{killed} (the kernel's OOM killer killed 2 process(es) on this machine while the "
            "cell ran (/proc/vmstat oom_kill); whether one of the cell's, only the kernel's log "
            "says (dmesg: root's alone where kernel.dmesg_restrict is 1))",
        ),
        (OomKills(), "failed", f"{killed} (the kernel's OOM killer? this machine does not say)"),
        (None, "failed", f"{killed} (the kernel's OOM killer?)"),  # ranks on other machines
    ):
        assert _failure(tmp_path, 1, kernel) == (status, reason)
    # its peer's error, written as its connection to the killed rank closed, is the death's
    # consequence: the rank killed first is named (the peer's error read as the cause)
    error = {"rank": 0, "time": 1.0, "type": "RuntimeError", "oom": False}
    error["message"] = "[gloo/transport/tcp/pair.cc:561] Connection closed by peer"
    (tmp_path / "error-rank0.json").write_text(json.dumps(error))
    assert _failure(tmp_path, 1, None) == ("failed", f"{killed} (the kernel's OOM killer?)")
    # a worker's death as its rank tells it: the pid it names is the one the log must name
    (tmp_path / "log.txt").write_text(
        "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 26499)\n"
    )
    error["message"] = "DataLoader worker (pid(s) 4321) exited unexpectedly"
    (tmp_path / "error-rank0.json").write_text(json.dumps(error))
    logged = OomKills(
        frozenset(), 1, (line.replace("26500 (python)", "4321 (pt_data_worker)"),), True
    )
    assert _failure(tmp_path, 1, logged) == (
        "oom",
        f"rank 0: RuntimeError: {error['message']}; the kernel's OOM killer killed one of the "
        "cell's processes (its log: Out of memory: Killed process 4321 (pt_data_worker))",
    )
    assert _failure(tmp_path, 1, OomKills(frozenset(), 0)) == (
        "failed",
        f"rank 0: RuntimeError: {error['message']} (not the kernel's OOM killer: it killed no "
        "process on this machine while the cell ran (/proc/vmstat oom_kill))",
    )
    # an error of another kind says nothing of the OOM killer it had nothing to do with
    error["message"] = "deliberate crash"
    (tmp_path / "error-rank0.json").write_text(json.dumps(error))
    assert _failure(tmp_path, 1, OomKills(frozenset(), 0)) == (
        "failed",
        "rank 0: RuntimeError: deliberate crash",
    )


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
    from bench.harness.probes import malloc_free_mib

    if malloc_free_mib() == malloc_free_mib():  # glibc's: tensors kept, not malloc's free
        assert section.rstrip().endswith("| memory in use |"), section


def test_memory_that_grows_on_another_rank_than_0_is_named_too(tmp_path, data_root, faulty):
    """The growth was read from rank 0's memory alone: a leak on rank 1 went unseen (the row
    said about 0 MiB). The row takes the rank that grew most, ranks.csv gives each rank's
    growth, and the report names the cell."""
    import pandas as pd

    from bench.analysis import report

    cfg = small_config(
        tmp_path, data_root, strategies=("test_leaky_rank1",), world_sizes=(2,), max_steps=14
    )
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    (row,) = rows
    assert row["status"] == "ok", row["reason"]
    assert float(row["held_growth_mib"]) > 150, row  # about 9 steps of 24 MiB, on rank 1
    ranks = pd.read_csv(run_dir / "ranks.csv").set_index("rank")["held_growth_mib"]
    assert ranks[1] > 150 and abs(ranks[0]) < 64, ranks
    text = report.render(run_dir).read_text()
    section = text.split("## Memory that grew step after step")[1].split("## ")[0]
    assert "| test_leaky_rank1 | 2 | 0 |" in section, section


def test_model_state_counts_the_optimizer_state_after_a_skipped_first_step(
    tmp_path, data_root, faulty
):
    """fp16's loss scaling skips a first step whose gradients overflow: the optimizer then
    holds no state yet. The row still says what the rank holds once it trains: SGD's
    momentum, one buffer per parameter (it read 0 MiB, read after that skipped step)."""
    cfg = small_config(tmp_path, data_root, strategies=("test_skips_first",), world_sizes=(1,))
    _, rows = run_matrix(cfg, echo=lambda m: None)
    (row,) = rows
    assert row["status"] == "ok", row["reason"]
    assert "skipped 1 of" in row["notes"]  # the scaler did skip the first step
    assert float(row["param_mib"]) == pytest.approx(4.577, abs=1e-3)  # the CNN's fp32 weights
    assert float(row["optim_mib"]) == pytest.approx(float(row["param_mib"]))


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


def test_notes_that_fail_keep_the_measured_steps(tmp_path, data_root, faulty):
    from bench.harness import results

    cfg = small_config(tmp_path, data_root, strategies=("test_notes_fail",), world_sizes=(1,))
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    [row] = rows
    assert row["status"] == results.OK, row["reason"]
    assert float(row["samples_per_s"]) > 0 and int(row["timed_steps"]) == 4
    assert row["notes"] == "NotesFail.run_notes() raised KeyError: 'no such option'"
    assert not leftover_processes(run_dir)


def test_cell_metrics_that_fail_keep_the_measured_steps(tmp_path, data_root, faulty):
    """A strategy's own measurements that raise on one rank: a failed row that says so,
    with the steps measured kept (the cell and every step were lost)."""
    import pandas as pd

    from bench.harness import results

    cfg = small_config(tmp_path, data_root, strategies=("test_metrics_fail",), world_sizes=(2,))
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    [row] = rows
    assert row["status"] == results.FAILED
    assert row["reason"] == "rank 1: MetricsFail.cell_metrics() raised KeyError: 'bubble_pct'"
    assert float(row["samples_per_s"]) > 0 and int(row["timed_steps"]) == 4
    assert len(pd.read_csv(run_dir / "steps.csv")) == 6
    assert not leftover_processes(run_dir)


def test_cell_metrics_that_fail_on_one_rank_before_its_gather_fail_the_cell_at_once(
    tmp_path, data_root, faulty
):
    """Rank 1's cell_metrics raises before the gather rank 0 waits in (as a pipeline's
    bubble is gathered): rank 1 went on, its next collectives paired with the wrong ones
    of rank 0's, and the cell hung to its --timeout, a timeout row blaming the evaluation.
    Now a failed row with what rank 1 raised, long before the timeout, nothing left."""
    import time

    from bench.harness import results, worker

    cfg = small_config(
        tmp_path, data_root, strategies=("test_gathered_metrics_fail",), world_sizes=(2,)
    )
    began = time.monotonic()
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    took = time.monotonic() - began
    [row] = rows
    assert row["status"] == results.FAILED, row["reason"]
    assert row["reason"].startswith(
        "rank 1: PeersLeftWaiting: GatheredMetricsFail.cell_metrics() raised KeyError: "
        "'bubble_pct' (a peer, not past it within"
    ), row["reason"]
    assert "(a peer, not past it within 4 s," in row["reason"], row["reason"]  # its wait, cut
    assert took < cfg.timeout_s - worker.PEERS_PAST_S, took
    assert not leftover_processes(run_dir)


def test_ranks_with_no_process_group_go_on_when_their_cell_metrics_raised(monkeypatch):
    """Horovod's ranks (and one process's DataParallel) meet through no torch.distributed
    store: a cell_metrics that raised there fails the row with the steps kept, as before
    the store's wait, not ended as if a peer waited in a collective."""
    import types

    import torch.distributed as dist

    from bench.harness import worker

    def no_group():  # what torch says where no process group was made
        raise ValueError("Default process group has not been initialized")

    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", no_group)
    strategy = types.SimpleNamespace(ctx=types.SimpleNamespace(world_size=2, rank=1))
    assert worker._peers_past_metrics(strategy, 0, "cell_metrics() raised KeyError") is None


def test_the_oom_watch_reads_the_kernels_records_and_ends_at_an_end_of_file(monkeypatch):
    """OomWatch reads the kernel's log record by record until there is no more: EAGAIN from
    /dev/kmsg, or an end of file where a container put /dev/null (or a file) in its place,
    which looped for ever, the harness's signals held, after the first cell."""
    import os
    import threading

    from bench.harness import proc

    read_end, write_end = os.pipe()
    opened = []

    def log_open(path, flags, *a):
        assert path == "/dev/kmsg"
        opened.append(read_end)
        return read_end

    monkeypatch.setattr(proc.os, "open", log_open)
    monkeypatch.setattr(proc.os, "lseek", lambda *a: 0)
    watch = proc.OomWatch()
    records = [
        "6,101,5,-;usb 1-1: new device\n",
        "3,102,6,-;Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB\n",
    ]
    for r in records:
        os.write(write_end, r.encode())
    os.close(write_end)  # then an end of file, as /dev/null gives at once
    done = threading.Thread(target=lambda: opened.append(watch.stop({4242})), daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), "stop() never ended"
    kills = opened[-1]
    assert kills.of() == "Memory cgroup out of memory: Killed process 4242 (python)"
    assert watch.fd is None  # closed
    with pytest.raises(OSError):
        os.fstat(read_end)


def test_a_pipeline_evaluation_that_fails_on_rank_0_keeps_the_measured_steps(
    tmp_path, data_root, faulty
):
    """A pipeline gathers its stages' weights to rank 0 (every rank takes part), then rank 0
    alone builds the whole model and runs its forward: a failure there (out of memory, a
    forward that raises) fails the row with its reason and keeps the steps. One before the
    gather, with a peer waiting in it, still fails the cell."""
    import pandas as pd

    from bench.harness import results

    strategies = ("test_pipeline_evaloom", "test_pipeline_evalfails", "test_pipeline_gatherfails")
    cfg = small_config(tmp_path, data_root, strategies=strategies, world_sizes=(2,), timeout_s=60)
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    row = {r["strategy"]: r for r in rows}
    assert row["test_pipeline_evaloom"]["status"] == results.OOM
    assert row["test_pipeline_evaloom"]["reason"] == (
        "evaluation after the timed steps failed: OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 8.00 GiB"
    )
    assert row["test_pipeline_evalfails"]["status"] == results.FAILED
    assert row["test_pipeline_evalfails"]["reason"] == (
        "evaluation after the timed steps failed: RuntimeError: deliberate failure in the "
        "evaluation's forward"
    )
    for name in ("test_pipeline_evaloom", "test_pipeline_evalfails"):
        r = row[name]
        assert float(r["samples_per_s"]) > 0 and int(r["timed_steps"]) == 4  # kept
        assert float(r["bubble_pct"]) > 0  # the strategy's own measurements too
    assert len(pd.read_csv(run_dir / "steps.csv")) == 2 * 6
    gather = row["test_pipeline_gatherfails"]
    assert gather["status"] == results.FAILED
    assert "deliberate failure before the weight gather" in gather["reason"]
    assert not leftover_processes(run_dir)
