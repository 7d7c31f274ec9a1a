"""benchmarks/startup.py: the bare launchers it times against the harness's cells."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_startup():
    spec = importlib.util.spec_from_file_location("startup", ROOT / "benchmarks" / "startup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("options", "said"),
    [
        # a StatisticsError traceback (no median of no repeat)
        (["--repeats", "0"], "--repeats must be at least 1, got 0"),
        # a ConfigError traceback, after the bare in-process launcher had been timed
        (["--world-size", "0"], "--world-size must be at least 1, got 0"),
        # more ranks than the machine's cores: the harness's reason, not a traceback
        (["--world-size", "100000"], "ddp_spawn cannot run at world size 100000"),
        # a FileExistsError traceback
        (["--out", "{tmp}/a-file"], "--out {tmp}/a-file: File exists"),
    ],
)
def test_bad_options_are_one_line_and_exit_2_before_any_timing(
    tmp_path, monkeypatch, capsys, options, said
):
    """In this process (the script's main; the test below runs the script itself)."""
    (tmp_path / "a-file").touch()
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "startup.py")])  # its prog
    monkeypatch.chdir(ROOT)
    startup = load_startup()
    monkeypatch.setattr(startup, "bare", lambda *a, **kw: pytest.fail("a bare launcher ran"))
    monkeypatch.setattr(startup, "harness", lambda *a, **kw: pytest.fail("a cell ran"))
    with pytest.raises(SystemExit) as stopped:
        startup.main(["--out", str(tmp_path), *options])
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("startup.py: error: "), err
    assert said.replace("{tmp}", str(tmp_path)) in lines[0]
    assert not (tmp_path / "runs").exists()  # no cell ran


def test_a_world_size_past_the_cores_names_no_option_startup_lacks(tmp_path, capsys):
    """The harness's refusal advised "--oversubscribe runs it anyway", an option startup.py
    does not have: following it failed on argparse. (The script itself, run as a user
    runs it: its exit code and its one line on stderr.)"""
    script = [sys.executable, str(ROOT / "benchmarks" / "startup.py")]
    run = subprocess.run(
        [*script, "--out", str(tmp_path), "--world-size", "100000"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("startup.py: error: "), run.stderr
    line = lines[0]
    assert "ddp_spawn cannot run at world size 100000" in line and "needs 100000 cores" in line
    assert not (tmp_path / "runs").exists()  # no cell ran
    with pytest.raises(SystemExit) as shown:  # its --help, in this process
        load_startup().main(["--help"])
    assert shown.value.code == 0
    known = capsys.readouterr().out
    assert "--world-size" in known
    assert set(re.findall(r"--[a-z][\w-]*", line)) <= set(re.findall(r"--[a-z][\w-]*", known))


def test_the_bare_launchers_leave_out_the_users_rendezvous_variables(tmp_path, monkeypatch):
    """As the harness's cells do: a MASTER_ADDR the user exported (a cluster's first node)
    does not reach the bare ranks, which would meet there instead of on this machine (a
    hang where it cannot be reached); they run on the loopback, as the cells do."""
    startup = load_startup()
    script = tmp_path / "bare.py"
    script.write_text(startup.BARE)
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.1")  # TEST-NET-1: never routed
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    real = subprocess.Popen
    started = []

    def popen(argv, **kw):
        # checked before the ranks start: a leak would have them reach for that address
        env = kw.get("env")
        assert env is not None, "the bare launcher inherits the whole environment"
        assert not {"MASTER_ADDR", "MASTER_PORT", "RANK"} & set(env)
        assert env["GLOO_SOCKET_IFNAME"] == "lo"
        started.append(argv)
        return real(argv, **kw)

    monkeypatch.setattr(startup.subprocess, "Popen", popen)
    assert startup.bare("spawn", 2, script, timeout_s=120) > 0  # the ranks met, here
    assert len(started) == 1


def test_a_bare_launcher_that_fails_says_why_in_one_line(tmp_path):
    """A bare launcher's failure (here its script raising; on a busy machine a port taken
    between free_port and the rendezvous) was a CalledProcessError traceback that hid the
    ranks' output, the reason with it: now one line naming the launcher and the last line
    the ranks wrote, as a harness cell's failure is."""
    startup = load_startup()
    script = tmp_path / "bare.py"
    script.write_text("raise RuntimeError('the ranks could not meet (test)')\n")
    with pytest.raises(SystemExit) as stopped:
        startup.bare("torchrun", 1, script)
    # torchrun closes with a summary of its own after the ranks' error: the error is said
    assert str(stopped.value) == (
        "bare torchrun failed (exit 1): RuntimeError: the ranks could not meet (test)"
    )


# the timeout: long enough for the rank to start its child and say it waits (torchrun imports
# torch first, seconds on a busy machine; spawn's rank is a bare Python, which imports nothing)
@pytest.mark.serial  # torchrun's rank must start inside the 10 s
@pytest.mark.parametrize(("launcher", "world", "limit"), [("spawn", 2, 6), ("torchrun", 1, 10)])
def test_a_bare_launcher_that_hangs_is_killed_with_its_ranks_after_the_timeout(
    tmp_path, launcher, world, limit
):
    """A bare launcher whose ranks never meet hung the script for ever (it waited with no
    limit): after --timeout it is killed with every process it started, and says so;
    torchrun's ranks too, each in a session of its own."""
    import contextlib
    import time

    import psutil

    startup = load_startup()
    pids = tmp_path / "pids"
    script = tmp_path / "bare.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "print('waiting for the other ranks', flush=True)\n"
        "time.sleep(600)\n"
    )
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        startup.bare(launcher, world, script, timeout_s=limit)
    assert time.monotonic() - t0 < limit + 50
    assert str(stopped.value) == (
        f"bare {launcher} did not finish in {limit} s (killed; --timeout): "
        "waiting for the other ranks"
    )
    time.sleep(0.5)
    for pid in map(int, pids.read_text().split()):  # the rank and its child: gone (or a
        with contextlib.suppress(psutil.NoSuchProcess):  # zombie its new parent keeps)
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
