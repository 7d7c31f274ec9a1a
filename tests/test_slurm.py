"""Under SLURM (issue 14): cells as srun steps inside an allocation, a submitted job run to
completion, and a cancelled job leaving nothing behind, on a real one-host cluster that
scripts/slurm_cluster.sh starts (slurmctld and two slurmd as nodes n1 and n2, on loopback).
The tests need root and slurm-wlm (`make test` installs it where apt-get can); without them
they skip, saying so. The cluster is stopped after the module, failed or not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"
# the machine's one SLURM cluster, on fixed ports; its jobs' processes must go in seconds
pytestmark = [pytest.mark.slow, pytest.mark.serial]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """SLURM_CONF of a running two-node cluster, for the module's span."""
    if os.geteuid() != 0:
        pytest.skip("a SLURM cluster's slurmd needs root")
    if not all(shutil.which(t) for t in ("slurmctld", "slurmd", "munged", "srun", "sbatch")):
        pytest.skip("slurm-wlm is not installed (scripts/slurm_cluster.sh install)")
    where = Path(f"/tmp/pbslurm-{os.getpid()}")  # short: munge's socket path has a limit
    up = subprocess.run(["bash", str(SCRIPT), "up", str(where)], capture_output=True, text=True)
    if up.returncode:
        subprocess.run(["bash", str(SCRIPT), "down", str(where)], capture_output=True)
        pytest.fail(f"the test cluster did not start: {up.stderr.strip()[-600:]}")
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", str(where / "slurm.conf"))
    try:
        yield where / "slurm.conf"
    finally:
        mp.undo()
        subprocess.run(["bash", str(SCRIPT), "down", str(where)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


def _run_args(data_root: Path, out: Path, run_id: str, **kw) -> list[str]:
    argv = [
        "--dataset=mnist",
        f"--data-root={data_root}",
        "--device=cpu",
        f"--out-dir={out}",
        f"--run-id={run_id}",
        "--strategies=ddp_torchrun",
        "--eval-samples=0",
        "--probe-steps=0",
        "--profile-steps=0",
        "--no-scaling-model",
        "--global-batch=16",
        "--limit=2048",
        "--max-steps=30",
        "--ifname=lo",  # the cluster's nodes are this machine: loopback only
    ]
    return argv + [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench.cli", *args]


def _status(run: Path) -> str:
    done = subprocess.run(_cli("status", str(run)), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _wait_left_queue(run: Path, limit: float) -> str:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = _status(run)
        if "ended" in line:  # "completed, ended after ..." or gone from the queue
            return line
        time.sleep(1)
    raise AssertionError(f"the job is still queued or running after {limit:g} s: {_status(run)}")


def _left_behind(run: Path) -> list[str]:
    """Processes of this run still alive: its ranks and srun steps, found by their cell."""
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(run) in " ".join(p.info["cmdline"] or []) or str(run) in p.environ().get(
                "PARABENCH_CELL", ""
            ):
                left.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
        except psutil.Error:
            continue
    return left


def test_a_cell_across_two_nodes_inside_an_allocation(cluster, data_root, tmp_path) -> None:
    """`parabench verify --launcher slurm` inside salloc: the DDP cell is one srun step over
    n1 and n2, its baseline single runs where salloc runs, and the two train the same model."""
    argv = [a for a in _run_args(data_root, tmp_path, "alloc") if not a.startswith("--max-steps")]
    done = subprocess.run(
        [
            "salloc",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--quiet",
            *_cli("verify", "--launcher=slurm", "--steps=6", *argv),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    row = pd.read_csv(tmp_path / "alloc" / "runs.csv").iloc[0]
    assert row["status"] == "ok", row["reason"]
    assert row["hosts"] == "n1,n2" and row["nodes"] == 2 and row["world_size"] == 2
    ranks = pd.read_csv(tmp_path / "alloc" / "ranks.csv")
    assert sorted(ranks["host"]) == ["n1", "n2"]  # each rank read its node from SLURM
    parity = pd.read_csv(tmp_path / "alloc" / "verify.csv").iloc[0]
    assert parity["strategy"] == "ddp_torchrun" and parity["result"] == "pass", parity.to_dict()
    assert "their baseline, single, ran on this machine" in done.stdout


def _submit(
    data_root: Path, out: Path, run_id: str, *extra: str, nodes: int = 2, procs: int = 1, **kw
) -> tuple[Path, str, str]:
    """`parabench submit`, by default on both nodes, one rank each: (the run, its job id, what
    it printed)."""
    done = subprocess.run(
        _cli(
            "submit",
            f"--nodes={nodes}",
            f"--procs-per-node={procs}",
            *extra,
            *_run_args(data_root, out, run_id, **kw),
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    run = out / run_id
    return run, (run / "job.id").read_text().strip(), done.stdout


def test_submit_runs_the_matrix_as_a_batch_job(cluster, data_root, tmp_path) -> None:
    """In a folder with a space, under a run id with a %: sbatch reads the quoted #SBATCH
    lines, and the job's log is where `status` says."""
    out = tmp_path / "sp ace"
    run, job, said = _submit(data_root, out, "job%1", "--no-report", "--cores-per-node=1")
    assert f"submitted job {job}" in said
    line = _wait_left_queue(run, 240)
    log = run / f"slurm-{job}.out"
    assert "completed, ended after" in line and "1 row written" in line, (line, log.read_text())
    row = pd.read_csv(run / "runs.csv").iloc[0]
    assert row["status"] == "ok" and row["hosts"] == "n1,n2"
    assert row["threads_per_rank"] == 1  # --cores-per-node reached the job
    assert (
        (run / "job.sbatch")
        .read_text()
        .startswith('#!/bin/bash\n#SBATCH --job-name="parabench-job%1"')
    )
    assert _left_behind(run) == []


def test_a_cancelled_job_leaves_no_process(cluster, data_root, tmp_path) -> None:
    run, job, _ = _submit(data_root, tmp_path, "cancel", max_steps=1000, epochs=50)
    deadline = time.monotonic() + 120
    while not list(run.glob("cells/*/progress.json")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert list(run.glob("cells/*/progress.json")), _status(run)
    subprocess.run(["scancel", job], check=True)
    line = _wait_left_queue(run, 60)
    log = run / f"slurm-{job}.out"
    assert line.startswith(f"job {job}: cancelled, ended after") and str(log) in line, line
    # the job script resumes its run: what the log says to do
    assert f"continue with: sbatch {run}/job.sbatch" in log.read_text(), log.read_text()[-2000:]
    deadline = time.monotonic() + 15  # slurmd's KillWait is 5 s
    while _left_behind(run) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _left_behind(run) == []


def test_two_jobs_sharing_an_address_meet_apart(cluster, data_root, tmp_path) -> None:
    """Two one-node jobs at once, on n1 and n2, whose NodeAddr is the same 127.0.0.1, as two
    jobs on one shared node: each meets on a port of its own, where both took --rdzv-port
    and the second to start failed with EADDRINUSE. Both are held until both are queued,
    so their cells overlap."""
    runs = []
    for run_id in ("one", "two"):
        # held, on one node, two ranks; released together, each job's agent holds its port
        # from before its ranks start (seconds, on this machine) to after their last step,
        # so _run_args' 30 steps overlap the other's as 100 did
        run, job, _ = _submit(
            data_root, tmp_path, run_id, "--no-report", "--sbatch-arg=--hold",
            nodes=1, procs=2, cores_per_node=2,
        )  # fmt: skip
        runs.append((run, job))
    subprocess.run(["scontrol", "release", ",".join(job for _, job in runs)], check=True)
    spans = []
    for run, _ in runs:
        line = _wait_left_queue(run, 240)
        rows = pd.read_csv(run / "runs.csv")
        assert "completed" in line and list(rows["status"]) == ["ok"], rows["reason"]
        assert _left_behind(run) == []
        # the row is written as the cell ends (to the second): it began cell_wall_s before
        end = pd.Timestamp(rows["timestamp"].iloc[0]).timestamp() + 1
        spans.append((end - 1 - float(rows["cell_wall_s"].iloc[0]), end))
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1, f"the jobs' cells ran one after the other, not at once: {spans}"
