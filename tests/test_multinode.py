"""Past one machine (issue 14): cells across nodes with one torchrun agent per node.

The nodes are two network namespaces made by scripts/netns_hosts.sh, joined to each other
by one veth pair and to nothing else (the root namespace has no interface of their network,
only a blackhole route for it): two hosts with their own addresses on this machine, traffic
never leaving it. The tests need root and `ip`; without them they skip, saying so. Every
process in the namespaces is killed and both are removed after the module, failed or not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.cli import main
from bench.config import RunConfig
from tests.conftest import ROOT

# two nodes' agents must reach their first step inside fixed deadlines
pytestmark = pytest.mark.serial

SCRIPT = ROOT / "scripts" / "netns_hosts.sh"
HOSTS = ("10.231.0.1", "10.231.0.2")


def _netns_missing() -> str | None:
    if os.geteuid() != 0:
        return "two network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) not installed"
    return None


@pytest.fixture(scope="module")
def two_hosts():
    """The namespaces' name prefix (NAME0, NAME1), made for this module and removed after."""
    why = _netns_missing()
    if why:
        pytest.skip(why)
    name = f"pb{os.getpid() % 100000}n"
    up = subprocess.run(["bash", str(SCRIPT), "up", name], capture_output=True, text=True)
    if up.returncode:
        subprocess.run(["bash", str(SCRIPT), "down", name], capture_output=True)
        pytest.skip(f"could not make network namespaces here: {up.stderr.strip()[:200]}")
    try:
        yield name
    finally:
        subprocess.run(["bash", str(SCRIPT), "down", name], capture_output=True)


def _pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _args(two_hosts: str, data_root: Path, out: Path, **kw) -> list[str]:
    argv = [
        "run",
        "--dataset=mnist",
        f"--data-root={data_root}",
        "--device=cpu",
        f"--out-dir={out}",
        "--eval-samples=0",
        "--probe-steps=0",
        "--profile-steps=0",
        "--no-scaling-model",
        "--nodes=2",
        "--procs-per-node=1",
        f"--hosts={','.join(HOSTS)}",
        f"--host-exec=ip netns exec {two_hosts}{{node}}",
        "--ifname=pb0",
        "--cores-per-node=1",  # the two hosts share this machine's cores
    ]
    return argv + [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]


def _rows(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "runs.csv").sort_values("run_order").reset_index(drop=True)


def test_a_node_command_is_quoted_for_a_remote_shell_only() -> None:
    """ssh joins the words into one line that a shell on the node splits again: each word is
    quoted, so a value with a space arrives whole; `ip netns exec` runs its arguments as
    they are, so nothing is quoted (quotes would arrive as characters)."""
    import shlex
    from types import SimpleNamespace

    from bench.harness.nodes import _on_node

    env = {"PARABENCH_X": "a b", "HOME": "/root"}
    command = ["/opt/my python/bin/python", "-m", "bench.harness.worker", "/tmp/run 1/spec.json"]
    want = ["env", "PARABENCH_NODE=h1", "PARABENCH_X=a b", *command]
    ssh = SimpleNamespace(host_exec="ssh -p 22 {host}", hosts=["h0", "h1"], timeout_s=90.5)
    argv = _on_node(ssh, 1, env, command, PARABENCH_NODE="h1")
    assert argv[:4] == ["ssh", "-p", "22", "h1"]
    # what the shell on h1 runs: under the cell's deadline, since killing ssh leaves it be
    ends = ["timeout", "--foreground", "--kill-after=10", "91"]
    assert shlex.split(" ".join(argv[4:])) == [*ends, *want]
    wrapped = SimpleNamespace(
        host_exec="sudo -u pb /usr/bin/ssh {host}", hosts=["h0", "h1"], timeout_s=30
    )
    argv = _on_node(wrapped, 1, env, command, PARABENCH_NODE="h1")
    assert argv[:5] == ["sudo", "-u", "pb", "/usr/bin/ssh", "h1"]
    assert shlex.split(" ".join(argv[5:])) == [*ends[:3], "30", *want]
    netns = SimpleNamespace(host_exec="ip netns exec ns{node}", hosts=["h0", "h1"], timeout_s=90)
    assert _on_node(netns, 1, env, command, PARABENCH_NODE="h1") == [
        "ip",
        "netns",
        "exec",
        "ns1",
        *want,
    ]
    here = SimpleNamespace(host_exec="", hosts=["h0", "h1"], timeout_s=90)
    assert _on_node(here, 0, env, command, PARABENCH_NODE="h0")[:2] == ["env", "PARABENCH_NODE=h0"]


def test_a_command_through_ssh_ends_at_the_cells_deadline_on_its_own() -> None:
    """Killing ssh leaves the command on the node running: the line the node's shell gets
    ends itself at the cell's deadline (here 1 s, for a command that would take 60)."""
    import time
    from types import SimpleNamespace

    from bench.harness.nodes import _on_node

    cfg = SimpleNamespace(host_exec="ssh {host}", hosts=["h0"], timeout_s=1)
    argv = _on_node(cfg, 0, {}, [sys.executable, "-c", "import time; time.sleep(60)"])
    assert argv[:2] == ["ssh", "h0"]
    t0 = time.monotonic()
    # what sshd does with it: one line for the node's shell, in a session of its own
    done = subprocess.run(["sh", "-c", " ".join(argv[2:])], start_new_session=True, timeout=30)
    assert done.returncode == 124 and time.monotonic() - t0 < 10


def test_a_node_killed_outright_is_named_before_the_peer_it_took_down(tmp_path) -> None:
    """A node whose agent and ranks were killed (SIGKILL) leaves no error of its own; its
    peer's broken connection is the only one written, and the row names the node first.
    A node that failed with an ordinary exit code leaves the ranks' errors to say why."""
    import json

    from bench.harness.runner import _failure

    peer = "Read error [10.231.0.2]:24740: Connection reset by peer"
    error = {"rank": 0, "time": 1.0, "type": "RuntimeError", "message": peer, "oom": False}
    (tmp_path / "error-rank0.json").write_text(json.dumps(error))
    for code, says in (
        (-9, "node 1 killed by SIGKILL, then "),
        (137, "node 1 killed by SIGKILL, then "),
        (1, ""),
    ):
        (tmp_path / "log.txt").write_text(
            f"[W1126 socket.cpp:207] warning\nparabench: node 1 exited with code {code}\n"
            "[rank0]: Traceback (most recent call last):\n"
        )
        assert _failure(tmp_path, 247) == ("failed", f"{says}rank 0: RuntimeError: {peer}")


def test_the_node_commands_die_with_the_cells_top_process(tmp_path) -> None:
    """The cell's top process (bench.harness.nodes) dies with its harness (its parent-death
    signal); the node commands it started, each in a session of its own, asked for none:
    a harness SIGKILLed mid-cell left every node's torchrun agent, and its ranks, running."""
    import json

    import psutil

    node = [sys.executable, "-c", "import time; time.sleep(120)"]
    spec = tmp_path / "nodes.json"
    spec.write_text(json.dumps({"commands": [node, node], "grace_s": 1}))
    top = subprocess.Popen([sys.executable, "-m", "bench.harness.nodes", str(spec)], cwd=ROOT)
    deadline = time.monotonic() + 60
    while len(nodes := psutil.Process(top.pid).children()) < 2:
        assert time.monotonic() < deadline, "the node commands did not start"
        time.sleep(0.1)
    top.kill()  # as its parent-death signal does
    top.wait()
    gone, alive = psutil.wait_procs(nodes, timeout=10)
    for p in alive:
        p.kill()
    assert alive == []


def test_bad_node_descriptions_are_one_line_and_exit_2(
    capsys, data_root, monkeypatch, tmp_path
) -> None:
    from bench.harness import slurm

    def no_slurm(argv, timeout=30):  # a refusal gone would have sbatch look up its cluster
        raise AssertionError(f"reached SLURM: {argv}")

    monkeypatch.setattr(slurm, "_run", no_slurm)
    for bad, says in [
        (["--nodes=2"], "--procs-per-node"),
        # 0 is not 'not given': alone it ran one node, with --nodes it asked for M
        (["--procs-per-node=0"], "--procs-per-node must be at least 1, got 0"),
        (["--nodes=2", "--procs-per-node=0", "--hosts=a,b"], "must be at least 1, got 0"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=10.0.0.1"], "needs --hosts with 2"),
        (["--procs-per-node=2"], "give --nodes N too"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--world-sizes=4"], "world size 2"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--rdzv=etcd"], "c10d or static"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--host-exec=ssh {hots}"], "{host}"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--host-exec=ssh }"], "{host}"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--host-exec=ssh {host.x}"], "{host}"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--host-exec=ssh '{host}"], "quot"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--rdzv-port=80"], "--rdzv-port"),
        (["--cores-per-node=4"], "give --nodes N too"),
        # on one machine the ranks meet on loopback: these were dropped without a word
        (["--ifname=eth0"], "on one machine the ranks meet on loopback"),
        (["--rdzv=static"], "on one machine the ranks meet on loopback"),
        (["--rdzv-port=30000"], "on one machine the ranks meet on loopback"),
        (["--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--cores-per-node=-1"], "positive"),
    ]:
        assert main(["run", f"--data-root={data_root}", "--dry-run", *bad]) == 2, bad
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, (bad, err)
    # verify's baseline runs apart, on this machine; submit checks what the job would run
    for argv, says in [
        (
            ["verify", "--nodes=2", "--procs-per-node=1", "--hosts=a,b", "--strategies=single"],
            "cannot run across 2 nodes: single",
        ),
        (["submit", "--nodes=2", "--strategies=ddp_spawn"], "cannot run as srun's ranks"),
        (["submit", "--nodes=2", "--hosts=a,b"], "no --launcher, --host-exec, --hosts or --rdzv"),
        # static is torchrun's: the job's srun ranks meet by MASTER_ADDR whatever it says
        (["submit", "--nodes=2", "--rdzv=static"], "no --launcher, --host-exec, --hosts or --rdzv"),
        (["submit", "--nodes=2", "--world-sizes=8"], "asks for another"),
        # the job's nodes meet on them: checked past them, not refused as on one machine
        (
            ["submit", "--nodes=2", "--ifname=lo", "--rdzv-port=30000", "--strategies=ddp_spawn"],
            "cannot run as srun's ranks",
        ),
        # the job ran one rank a node, as if it had not been given
        (["submit", "--nodes=2", "--procs-per-node=0"], "must be at least 1, got 0"),
        # a second #SBATCH line of its own wins in SLURM: the job's run, told 1, ran 1 a node
        (
            ["submit", "--nodes=2", "--sbatch-arg=--ntasks-per-node=4"],
            "--sbatch-arg=--ntasks-per-node=4: the job's --ntasks-per-node line is submit's "
            "own; give submit --procs-per-node instead",
        ),
        (["submit", "--nodes=2", "--sbatch-arg=-N 3"], "give submit --nodes instead"),
        (["submit", "--nodes=2", "--sbatch-arg=-n8"], "give submit --procs-per-node instead"),
        (["submit", "--nodes=2", "--sbatch-arg=--output=x.log"], "submit names them itself"),
        # abbreviated, as sbatch takes them: the job asked 2 tasks a node, its run used 1
        (["submit", "--nodes=2", "--sbatch-arg=--ntasks-per-n=2"], "give submit --procs-per-node"),
        (["submit", "--nodes=2", "--sbatch-arg=--out x.log"], "submit names them itself"),
    ]:
        assert main([*argv, f"--data-root={data_root}", f"--out-dir={tmp_path}"]) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, (argv, err)


def test_one_host_drops_what_only_several_nodes_take() -> None:
    """verify's baseline runs on this machine alone: the nodes' interface, rendezvous and
    port go with the nodes, as one machine refuses them."""
    cfg = RunConfig(nodes=2, procs_per_node=1, hosts=("a", "b"), rdzv="static", ifname="lo")
    one = cfg.replace(rdzv_port=30000).one_host()
    assert (one.nodes, one.ifname, one.rdzv, one.rdzv_port) == (1, "", "c10d", 29500)


def test_a_run_saved_on_one_machine_with_a_nodes_option_still_loads() -> None:
    """One machine refuses --ifname, --rdzv and --rdzv-port now; a run saved before that
    kept them in its config.json (its ranks met on loopback without them): it still loads,
    to resume, verify or predict, without them, and a run across nodes keeps them."""
    old = {"ifname": "eth0", "rdzv": "static", "rdzv_port": 30000, "global_batch": 64}
    cfg = RunConfig.from_dict(old)
    assert (cfg.ifname, cfg.rdzv, cfg.rdzv_port, cfg.global_batch) == ("", "c10d", 29500, 64)
    across = dict(old, nodes=2, procs_per_node=1, hosts=["a", "b"])
    assert RunConfig.from_dict(across).rdzv_port == 30000


def test_one_host_strategies_are_skipped_rows_across_nodes(data_root, tmp_path) -> None:
    from bench.config import ConfigError
    from bench.harness.runner import plan
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, world_sizes=(), nodes=2, procs_per_node=1, hosts=HOSTS)
    cells = {c.strategy: c for c in plan(cfg)}
    assert cfg.world_sizes == (2,)
    for name, how in [("single", "one process"), ("ddp_spawn", "mp.spawn"), ("dp", "one process")]:
        assert cells[name].status == "skipped"
        assert (
            cells[name].reason.startswith("cannot run across 2 nodes") and how in cells[name].reason
        )
    assert cells["ddp_torchrun"].status == "" and cells["fsdp"].status == ""
    # horovodrun spans hosts with its own host list; under srun it would need an MPI build
    assert (
        cells["horovod"].status in ("", "unavailable") and "across" not in cells["horovod"].reason
    )
    with pytest.raises(ConfigError, match="cannot run across 2 nodes: ddp_spawn"):
        plan(cfg.replace(strategies=("ddp_spawn",)))
    under_srun = cfg.replace(launcher="slurm", hosts=("n1", "n2"), master_addr="127.0.0.1")
    srun_cells = {c.strategy: c for c in plan(under_srun)}
    if srun_cells["horovod"].status != "unavailable":
        assert srun_cells["horovod"].status == "skipped"
        assert "srun --mpi with an MPI build" in srun_cells["horovod"].reason
    assert srun_cells["ddp_torchrun"].status == ""


def test_a_data_root_in_the_home_folder_is_made_whole_for_the_nodes(
    data_root, tmp_path, monkeypatch
) -> None:
    """Across nodes the ranks start in other folders, so the run's paths are made whole. A
    shell leaves `--data-root=~/data` as it is, which a run on one machine reads as
    $HOME/data: across nodes it became <here>/~/data, and the run was refused as having
    no MNIST there."""
    from bench.harness.runner import open_run
    from tests.conftest import small_config

    home = tmp_path / "home"
    home.mkdir()
    (home / "data").symlink_to(data_root)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    cfg = small_config(
        tmp_path / "out", data_root, world_sizes=(), nodes=2, procs_per_node=1, hosts=HOSTS
    ).replace(strategies=("ddp_torchrun",), data_root="~/data")
    opened, run_dir, _ = open_run(cfg, None)
    run_dir.unlock()
    assert opened.data_root == str((home / "data").resolve())


def test_a_nodes_cores_are_shared_by_its_own_ranks(data_root, tmp_path) -> None:
    """--cores-per-node C: each of a node's M ranks gets C / M threads, wherever the agents
    start; a cell is oversubscribed (a skipped row, or with --oversubscribe one thread a
    rank) when M exceeds C, whatever this machine's core count."""
    from bench.config import ConfigError
    from bench.harness.runner import Cell, plan, rank_threads
    from tests.conftest import small_config

    base = small_config(
        tmp_path, data_root, world_sizes=(), nodes=2, procs_per_node=2, hosts=HOSTS
    ).replace(strategies=("ddp_torchrun",))
    cell = Cell("ddp_torchrun", 4, 0)
    for exec_ in ("", "ssh {host}"):
        assert rank_threads(base.replace(host_exec=exec_, cores_per_node=8), cell) == 4
        (ok,) = plan(base.replace(host_exec=exec_, cores_per_node=2))
        assert ok.status == "", ok.reason
        with pytest.raises(ConfigError, match="world size 4 needs 4 cores, found 2"):
            plan(base.replace(host_exec=exec_, cores_per_node=1))
        (over,) = plan(base.replace(host_exec=exec_, cores_per_node=1, oversubscribe=True))
        assert over.status == ""
        assert rank_threads(base.replace(host_exec=exec_, cores_per_node=1), cell) == 1


@pytest.fixture
def ssh_between(two_hosts, tmp_path, monkeypatch):
    """An `ssh` first on PATH that runs its command in the namespace owning the address
    (scripts/netns_hosts.sh ssh): how horovodrun, which reaches other nodes by ssh, reaches
    the namespace hosts. Everything past the remote shell is horovodrun's own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ssh"
    shim.write_text(f'#!/bin/sh\nexec bash {SCRIPT} ssh {two_hosts} "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return two_hosts


@pytest.mark.slow
def test_verify_across_two_hosts(ssh_between, data_root, tmp_path, capsys) -> None:
    """`parabench verify` with the cells across the two namespace hosts, reached by `ssh
    {host}`: ddp_torchrun (one torchrun agent per host) and horovod (horovodrun -H with both
    hosts, where Horovod is built) train the same model as single, which runs on this
    machine; every cell's ranks are on both hosts."""
    from strategies.horovod import Horovod

    names = "ddp_torchrun" if Horovod.unavailable("cpu") else "ddp_torchrun,horovod"
    # the nodes reached as over ssh: each command one line through a remote shell
    argv = _args(ssh_between, data_root, tmp_path, strategies=names, run_id="v", steps=6)
    argv.append("--host-exec=ssh {host}")
    argv[0] = "verify"
    dropped = ("--eval-samples", "--probe-steps", "--profile-steps", "--no-scaling-model")
    code = main([a for a in argv if not a.startswith(dropped)])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "their baseline, single, ran on this machine" in out
    parity = pd.read_csv(tmp_path / "v" / "verify.csv").set_index("strategy")
    assert sorted(parity.index) == sorted(names.split(","))
    assert (parity["result"] == "pass").all() and (parity["world_size"] == 2).all()
    rows = _rows(tmp_path / "v").set_index("strategy")
    for name in names.split(","):
        assert rows.loc[name, "hosts"] == ",".join(HOSTS)
        assert rows.loc[name, "nodes"] == 2 and rows.loc[name, "procs_per_node"] == 1
        assert rows.loc[name, "threads_per_rank"] == 1  # --cores-per-node 1 / 1 rank per node
    assert "single" not in rows.index  # it ran apart
    ranks = pd.read_csv(tmp_path / "v" / "ranks.csv")
    for name, group in ranks.groupby("strategy"):
        assert sorted(group["host"]) == sorted(HOSTS), name
    base = _rows(tmp_path / "v" / "baselines" / "shares1-acc1")
    assert list(base["strategy"]) == ["single"] and base.loc[0, "nodes"] == 1
    for ns in (f"{ssh_between}0", f"{ssh_between}1"):
        assert _pids(ns) == [], f"processes left in {ns}"


def _fault_mid_cell(
    two_hosts: str,
    data_root: Path,
    out: Path,
    fault,
    repeats: int,
    timeout: int,
    strategy: str = "ddp_torchrun",
):
    """Run `strategy` across the two hosts; once round 0's cell trains, apply `fault()`.
    Returns the rows, the seconds from the fault to round 0's failed row, and the output."""
    argv = _args(
        two_hosts,
        data_root,
        out,
        strategies=strategy,
        repeats=repeats,
        global_batch=16,
        max_steps=30,
        limit=2048,
        run_id="two",
        timeout=timeout,
    )
    run = out / "two"
    harness = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        progress = run / "cells" / f"{strategy}-ws2-fp32-r0" / "progress.json"
        deadline = time.monotonic() + 90
        while not progress.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert progress.exists(), "the first cell never started training"
        at = time.monotonic()
        fault()
        became_row = None
        while harness.poll() is None and time.monotonic() - at < timeout + 60:
            if (run / "runs.csv").exists() and strategy in (run / "runs.csv").read_text():
                became_row = time.monotonic() - at
                break
            time.sleep(0.2)
        out_text, _ = harness.communicate(timeout=240)
    finally:
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
    assert harness.returncode in (0, 1), out_text[-2000:]
    for ns in (f"{two_hosts}0", f"{two_hosts}1"):
        assert _pids(ns) == [], f"processes left in {ns}"
    return _rows(run), became_row, out_text


@pytest.mark.slow
@pytest.mark.parametrize("strategy,repeats", [("ddp_torchrun", 2), ("horovod", 1)])
def test_a_lost_node_is_a_failed_row(ssh_between, data_root, tmp_path, strategy, repeats) -> None:
    """ddp_torchrun (an agent per host, c10d rendezvous on the first) or horovod (horovodrun
    on the first host, -H both) over the two namespaces; in round 0 every process of the
    second node is killed mid-cell (SIGKILL): that round is a failed row within seconds,
    nothing is left running, and (ddp_torchrun) round 1 trains across both."""
    from strategies.horovod import Horovod

    if strategy == "horovod" and Horovod.unavailable("cpu"):
        pytest.skip(Horovod.unavailable("cpu"))
    two_hosts = ssh_between

    def kill_node() -> None:
        victims = _pids(f"{two_hosts}1")
        assert victims, "no process ran in the second namespace"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    rows, became_row, out = _fault_mid_cell(
        two_hosts, data_root, tmp_path, kill_node, repeats, 120, strategy
    )
    assert became_row is not None, out[-2000:]
    print(f"{strategy}, node killed: a failed row {became_row:.1f} s later")
    ddp = rows.set_index("round")
    assert ddp.loc[0, "status"] == "failed", out[-2000:]
    assert became_row < 40  # the peer fails within seconds
    if repeats == 1:
        return
    assert ddp.loc[1, "status"] == "ok", ddp.loc[1, "reason"]
    assert ddp.loc[1, "hosts"] == ",".join(HOSTS)  # one rank on each host
    assert ddp.loc[1, "nodes"] == 2 and ddp.loc[1, "procs_per_node"] == 1
    ranks = pd.read_csv(tmp_path / "two" / "ranks.csv")
    assert sorted(ranks[ranks["repeat"] == 1]["host"]) == sorted(HOSTS)


@pytest.mark.slow
def test_a_link_down_ends_the_cell_by_its_deadline(two_hosts, data_root, tmp_path) -> None:
    """The link between the hosts goes down mid-cell: neither side sees a broken connection,
    so the process-group timeout and the cell's deadline (--timeout 15) end it: a failed or
    timed-out row, nothing left running."""
    link = ["ip", "-n", f"{two_hosts}1", "link", "set", "pb0"]
    try:
        rows, became_row, out = _fault_mid_cell(
            two_hosts,
            data_root,
            tmp_path,
            lambda: subprocess.run([*link, "down"], check=True),
            1,
            15,
        )
    finally:
        subprocess.run([*link, "up"], check=True)
    assert became_row is not None, out[-2000:]
    print(f"link down: a {rows.loc[0, 'status']} row {became_row:.1f} s later")
    assert rows.loc[0, "status"] in ("failed", "timeout"), out[-2000:]
    assert became_row < 15 + 15  # the deadline and the kill's grace


@pytest.mark.slow
def test_a_killed_agent_fails_the_cell_not_the_run(two_hosts, data_root, tmp_path) -> None:
    """Only the second node's torchrun agent is killed: its rank goes with it (ranks die with
    their parent), the peer fails, and the row says so well before torchrun's 300 s exit
    barrier would have."""

    def kill_agent() -> None:
        agents = [
            pid
            for pid in _pids(f"{two_hosts}1")
            if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(agents) == 1, agents
        os.kill(agents[0], signal.SIGKILL)

    rows, became_row, out = _fault_mid_cell(two_hosts, data_root, tmp_path, kill_agent, 1, 120)
    assert became_row is not None, out[-2000:]
    print(f"agent killed: a {rows.loc[0, 'status']} row {became_row:.1f} s later")
    assert rows.loc[0, "status"] == "failed", out[-2000:]
    assert became_row < 40


@pytest.mark.parametrize("args", [[], ["up"], ["up", ""], ["bogus", "pbx"]])
def test_the_hosts_script_without_an_action_and_a_name_is_its_usage_and_exit_2(args):
    """No root needed: the script stops before any `ip`. A missing action or name was
    bash's own `line 15: 1: usage: ...` and exit 1; now the usage line, as for an unknown
    action, and exit 2."""
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"usage: {SCRIPT} up|down|ssh NAME"]


@pytest.mark.slow
def test_a_rendezvous_port_another_run_holds_is_named_in_the_row(two_hosts, data_root, tmp_path):
    """Another run's rendezvous store on the first host, on the port this run's cell takes
    (runs at once whose --rdzv-port values are closer than 200): the first host's agent
    cannot listen there, and the row said only `node(s) 1 still running 20 s after another
    failed: killed`, as if the nodes were at fault. It names the port and the cause first."""
    holder = subprocess.Popen(
        [
            *("ip", "netns", "exec", f"{two_hosts}0", sys.executable, "-c"),
            "import time, torch.distributed as d\n"
            f"s = d.TCPStore('{HOSTS[0]}', 29710, is_master=True, wait_for_workers=False)\n"
            "print('held', flush=True)\n"
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        argv = _args(
            two_hosts,
            data_root,
            tmp_path,
            strategies="ddp_torchrun",
            global_batch=16,
            max_steps=8,
            warmup_steps=2,
            limit=512,
            run_id="held",
            rdzv_port=29710,
            timeout=120,
        )
        assert main([*argv, "--no-report"]) == 1
    finally:
        holder.kill()
        holder.wait()
    row = _rows(tmp_path / "held").iloc[0]
    assert row["status"] == "failed"
    assert row["reason"].startswith(
        f"port 29710 on {HOSTS[0]}, where the cell's rendezvous listens, was in use (another "
        "run's? two at once whose first host is the same need --rdzv-port values 200 apart); "
        "then "
    ), row["reason"]
    for ns in (f"{two_hosts}0", f"{two_hosts}1"):
        assert _pids(ns) == [], f"processes left in {ns}"
