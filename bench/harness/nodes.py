"""Past one machine: a cell's ranks on several nodes, one torchrun agent per node.

The harness stays one process on one machine (the driver) and starts, for every cell, one
torchrun agent on each node through the command that reaches that node: `--host-exec`, a
template such as `ssh {host}` or `ip netns exec pbnode{node}` (none: the agents run on this
machine, each bound to its own address). The agents meet at a rendezvous: c10d on the first
host (the default; node ranks are assigned there, `--node-rank` does not apply) or static
(`--rdzv static`, node i is node rank i). The ranks write where the cell's spec says, so
results arrive where the driver reads them when the nodes share its file system, as cluster
home directories and this machine's namespaces do.

`python -m bench.harness.nodes COMMANDS.json` is the cell's top process: it starts the node
commands, waits for all, and when one fails gives the others `grace_s` to fail on their
own (a peer that lost its node sees the broken connection within seconds) before it kills
them, so a lost node becomes a failed row and no agent waits out torchrun's exit barrier.
Where the nodes are this machine's namespaces, every process is in the cell's process tree
and the harness's kill reaches it. Over ssh, killing ssh does not end the command on the
node: it runs under `timeout` with the cell's deadline (torchrun's agents or horovodrun),
besides the agents' `--max-restarts 0` and the process-group timeout
(`PARABENCH_PG_TIMEOUT_S`), so it outlives the cell by the ssh start-up and
`KILL_AFTER_S` at most (horovodrun's ranks on other nodes, which it reaches by its own ssh,
end when their peers' connections break).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: a failed node's peers get this long to fail on their own before they are killed
GRACE_S = 20.0
#: what a node's command is given explicitly (a remote shell need not pass the environment
#: on), besides PARABENCH_*: the nodes' interface among it (Runner._env sets it from --ifname)
PASSED_ON = (
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
)
#: launchers that can start a cell's ranks across nodes: torchrun, one agent per node, and
#: horovodrun on the first node with every node in its host list (-H)
MULTI_NODE_LAUNCHERS = ("torchrun", "horovodrun")


#: cells take ports from --rdzv-port up, one each, cycling through this many
PORTS = 200


def cell_port(base: int, order: int) -> int:
    """The rendezvous port of the cell run `order`-th (1-based; 0: the base)."""
    return base + max(order - 1, 0) % PORTS


#: seconds a remote node command has after its deadline's SIGTERM before SIGKILL
KILL_AFTER_S = 10

#: --host-exec programs that join the command's words into one line for a shell on the node
REMOTE_SHELLS = ("ssh", "rsh")


def _on_node(
    cfg: Any, i: int, env: Mapping[str, str], command: Sequence[str], **more: str
) -> list[str]:
    """`command` run on node i: --host-exec's prefix, then `env` with what the ranks need (a
    remote shell need not pass the environment on) and `more`, then the command. Through a
    remote shell (ssh, anywhere in the prefix) every word is quoted, since the shell there
    splits the line it gets again; through a program that runs its arguments as they are
    (`ip netns exec`, srun) nothing is."""
    passed = {k: v for k, v in env.items() if k.startswith("PARABENCH_") or k in PASSED_ON}
    passed |= more
    prefix = shlex.split(cfg.host_exec.format(host=cfg.hosts[i], node=i)) if cfg.host_exec else []
    words = ["env", *(f"{k}={v}" for k, v in sorted(passed.items())), *command]
    if any(os.path.basename(w) in REMOTE_SHELLS for w in prefix):  # `timeout 60 ssh {host}` too
        # killing ssh here does not end the command there: it ends itself at the cell's
        # deadline (coreutils' timeout: SIGTERM, which torchrun's agent and horovodrun pass to
        # their ranks, then SIGKILL; --foreground keeps it in the caller's process group,
        # where a kill from this side reaches it when the "node" is on this machine)
        words = [
            "timeout",
            "--foreground",
            f"--kill-after={KILL_AFTER_S}",
            f"{math.ceil(cfg.timeout_s)}",
            *words,
        ]
        words = [shlex.quote(w) for w in words]
    return [*prefix, *words]


def horovod_command(cfg: Any, spec: Path, env: Mapping[str, str]) -> list[str]:
    """horovodrun on the first node, every node in its host list with --procs-per-node slots.
    horovodrun reaches the other nodes itself, over ssh (passwordless, as horovodrun always
    needs), and passes them its environment; --ifname is its --network-interface."""
    from bench.harness.launchers import horovodrun_argv

    slots = ",".join(f"{h}:{cfg.procs_per_node}" for h in cfg.hosts)
    nic = ["--network-interface", cfg.ifname] if cfg.ifname else []
    # --disable-cache: no check results kept in ~/.horovod between cells
    command = horovodrun_argv(spec, cfg.nodes * cfg.procs_per_node, slots, *nic, "--disable-cache")
    return _on_node(cfg, 0, env, command)


def node_commands(
    cfg: Any, spec: Path, rdzv_id: str, env: Mapping[str, str], port: int
) -> list[list[str]]:
    """One torchrun agent's command line per node, for the cell whose spec is `spec`."""
    hosts, n = list(cfg.hosts), cfg.nodes
    out = []
    for i, host in enumerate(hosts):
        if cfg.rdzv == "static":
            meet = [
                "--rdzv-backend=static",
                f"--master-addr={hosts[0]}",
                f"--master-port={port}",
                f"--node-rank={i}",
            ]
        else:
            # c10d: the store is served by the agent on the first host; said outright, since
            # agents that share an address (one machine) cannot tell which of them it is
            meet = [
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={hosts[0]}:{port}",
                f"--rdzv-id={rdzv_id}",
                f"--rdzv-conf=is_host={'true' if i == 0 else 'false'}",
            ]
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={n}",
            f"--nproc-per-node={cfg.procs_per_node}",
            "--max-restarts=0",
            f"--local-addr={host}",
            *meet,
            "-m",
            "bench.harness.worker",
            str(spec),
        ]
        out.append(_on_node(cfg, i, env, command, PARABENCH_NODE=host))
    return out


def launch_argv(commands: Sequence[Sequence[str]], path: Path) -> list[str]:
    """The cell's top process: this module, fanning out to the node commands saved at `path`."""
    path.write_text(json.dumps({"commands": [list(c) for c in commands], "grace_s": GRACE_S}))
    return [sys.executable, "-m", "bench.harness.nodes", str(path)]


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM the node commands still running, SIGKILL what is left after `grace_s`. Each
    leads its own process group: its agent and ranks go with it."""
    from bench.harness.proc import signal_group

    for p in procs:
        if p.poll() is None:
            signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            signal_group(p.pid, signal.SIGKILL)
            p.wait()


def fan_out(commands: Sequence[Sequence[str]], grace_s: float = GRACE_S) -> int:
    """Run the node commands together; 0 if all succeed, else the first failure's code
    (after the others had `grace_s` to end, then were killed)."""
    procs: list[subprocess.Popen] = []

    def stop_all(signum: int, _frame: Any) -> None:
        _stop(procs, 3.0)
        sys.exit(128 + signum)

    # before the first node starts: a signal from here on reaches every node started
    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    from bench.harness.proc import dies_with_this, stops_after_fork

    for c in commands:
        # each dies with this process, as this one does with the harness: a harness killed
        # outright left every node's agent and ranks running (a remote shell's command ends
        # at the cell's deadline itself, _on_node)
        with stops_after_fork():  # heard as it forked: stop_all, this node with the rest
            procs.append(
                subprocess.Popen(
                    list(c),
                    start_new_session=True,
                    preexec_fn=dies_with_this(),
                )
            )
    first: int | None = None
    failed_at = 0.0
    while True:
        codes = [p.poll() for p in procs]
        bad = [c for c in codes if c not in (None, 0)]
        if bad and first is None:
            first, failed_at = bad[0], time.monotonic()
            i = codes.index(first)
            print(f"parabench: node {i} exited with code {first}", file=sys.stderr, flush=True)
        if all(c is not None for c in codes):
            return first or 0
        if first is not None and time.monotonic() - failed_at > grace_s:
            alive = [i for i, c in enumerate(codes) if c is None]
            print(
                f"parabench: node(s) {', '.join(map(str, alive))} still running {grace_s:g} s "
                "after another failed: killed",
                file=sys.stderr,
                flush=True,
            )
            _stop(procs, 3.0)
            return first
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    from bench.harness import proc

    proc.die_with_parent()
    args = list(sys.argv[1:] if argv is None else argv)
    spec = json.loads(Path(args[0]).read_text())
    return fan_out(spec["commands"], float(spec.get("grace_s", GRACE_S)))


if __name__ == "__main__":
    sys.exit(main())
