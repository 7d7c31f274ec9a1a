"""SLURM: a cell as one `srun` step inside an allocation; `parabench submit` and `status`
outside one.

Inside an allocation (`salloc`, or the batch script `parabench submit` writes), `--launcher
slurm` runs each cell as `srun --nodes N --ntasks-per-node M python -m bench.harness.worker SPEC`:
SLURM starts the ranks itself and each reads its rank, world size and local rank from
SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID (bench.harness.worker), meeting at MASTER_ADDR, the
address of the allocation's first node (`scontrol show hostnames`, then its NodeAddr).
`--kill-on-bad-exit` ends the step when one rank fails, `--wait` bounds how long the others
may run on after one exits, and after every cell, whatever its end, the step is cancelled
by name, so no rank outlives its row on any node.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import ROOT, program
from bench.config import ConfigError, run_dir_named
from bench.harness import progress, results
from bench.harness.nodes import PORTS

#: after one rank of a step exits, the others get this long before SLURM kills them
WAIT_S = 20


def in_allocation() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID"))


def _run(argv: Sequence[str], timeout: float = 30) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{argv[0]} not found: SLURM's client commands are not installed"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"`{' '.join(argv)}` did not answer in {timeout:g} s") from exc
    if done.returncode:  # one line, however many SLURM's message has
        lines = (done.stderr or done.stdout).splitlines()
        said = "; ".join(line.strip() for line in lines if line.strip())
        raise ConfigError(f"`{' '.join(argv)}` failed: {said[:300]}")
    return done.stdout


def allocation() -> tuple[list[str], list[str]]:
    """The allocation's node names and their addresses (NodeAddr), in SLURM's order."""
    names = _run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]).split()
    addrs = []
    for name in names:
        fields = dict(
            kv.split("=", 1)
            for kv in _run(["scontrol", "-o", "show", "node", name]).split()
            if "=" in kv
        )
        addrs.append(fields.get("NodeAddr") or name)
    return names, addrs


def per_node(counts: str) -> list[int]:
    """A count SLURM gives per node, one number a node: "4(x2),1" (SLURM_TASKS_PER_NODE,
    SLURM_JOB_CPUS_PER_NODE) is [4, 4, 1]."""
    out: list[int] = []
    for count, times in re.findall(r"(\d+)(?:\(x(\d+)\))?", counts):
        out += [int(count)] * int(times or 1)
    return out


def describe(nodes: int | None, procs_per_node: int, cores_per_node: int = 0) -> dict[str, Any]:
    """The node part of a run's config from the allocation it runs in: --nodes (None: not
    given) defaults to all of its nodes, --procs-per-node to its tasks per node (else 1),
    --cores-per-node (0: not given) to the CPUs it has on a node, which it must have."""
    if not in_allocation():
        raise ConfigError(
            "--launcher slurm runs inside an allocation (salloc, or a batch job): outside one, "
            f"`{program()} submit` writes and submits the batch job"
        )
    names, addrs = allocation()
    n = len(names) if nodes is None else nodes
    if n > len(names):
        raise ConfigError(f"--nodes {n}, but the allocation has {len(names)}: {','.join(names)}")
    # --ntasks-per-node's "4"; else SLURM_TASKS_PER_NODE, which SLURM sets for any task
    # count (salloc -N 2 -n 8: "4(x2)"; uneven, -n 5: "3,2"): the fewest a node has, which
    # every node can run
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE", "")
    per = procs_per_node or min(per_node(tasks), default=1)
    # the CPUs the job has on a node (the fewest any has), not those of the machine the
    # driver runs on: salloc's shell runs on a login node, whose cores gave the ranks their
    # threads; unknown (no SLURM_JOB_CPUS_PER_NODE), this machine's as before
    cpus = min(per_node(os.environ.get("SLURM_JOB_CPUS_PER_NODE", "")), default=0)
    if cores_per_node and cpus and cores_per_node > cpus:
        raise ConfigError(
            f"--cores-per-node {cores_per_node}, but the allocation has {cpus} CPU(s) on a "
            "node (SLURM_JOB_CPUS_PER_NODE): give at most that, or ask the job for more "
            "(--cpus-per-task)"
        )
    return {
        "nodes": n,
        "procs_per_node": per,
        "hosts": tuple(names[:n]),
        "master": addrs[0],
        "cores_per_node": cores_per_node or cpus,
    }


def cell_port(base: int, order: int) -> int:
    """The rendezvous port of this job's `order`-th cell (1-based): two ports of the job's
    own in the window above --rdzv-port, 2 x (job id mod 100) and the one after, the cells
    taking them in turn. Jobs that share a node (a partition that shares its nodes, nodes
    behind one address) then meet on different ports unless their ids are a multiple of 100
    apart, where every job's first cell took --rdzv-port itself and the second job's failed
    with EADDRINUSE; each cell still meets on another port than the cell before it."""
    job = int(os.environ.get("SLURM_JOB_ID") or 0)
    return base + 2 * (job % (PORTS // 2)) + max(order - 1, 0) % 2


def step_name(run_id: str, cell: str) -> str:
    return f"parabench-{run_id}-{cell}"[:120]


def step_argv(cfg: Any, spec: Path, name: str, threads: int = 0) -> list[str]:
    """The cell's srun step, its ranks computing with `threads` threads each."""
    # run from inside a step (`srun --pty bash`, an interactive job's shell): that step holds
    # the allocation's CPUs, and a step that does not share them waits for them to be free
    # (srun, --quiet, said nothing), every cell a timeout; parabench's own steps run one at
    # a time, so only where the driver is inside one
    inside = ["--overlap"] if os.environ.get("SLURM_STEP_ID") else []
    # a CPU for each of a rank's threads: a step asks for one a task unless told (srun takes
    # no --cpus-per-task from the job, SLURM 22.05 on), and a task bound to its CPUs (task
    # affinity, cgroups) ran all its threads on one. Only where the node's CPUs are known
    # (--cores-per-node, or the allocation's): this machine's may be more than a node has.
    # More ranks than CPUs (--oversubscribe) is more tasks than CPUs: --overcommit, or
    # srun refuses the step
    cpus = []
    if threads and cfg.cores_per_node:
        cpus = [f"--cpus-per-task={threads}"]
        if cfg.procs_per_node * threads > cfg.cores_per_node:
            cpus.append("--overcommit")
    return [
        "srun",
        *inside,
        f"--nodes={cfg.nodes}",
        # the nodes whose first one's address the ranks meet at: left to srun, a step of
        # fewer nodes than the allocation's went to another where the first was busy, its
        # ranks told to meet at an address where no rank 0 listened
        f"--nodelist={','.join(cfg.hosts[: cfg.nodes])}",
        f"--ntasks={cfg.nodes * cfg.procs_per_node}",
        f"--ntasks-per-node={cfg.procs_per_node}",
        *cpus,
        "--kill-on-bad-exit=1",
        f"--wait={WAIT_S}",
        f"--job-name={name}",
        "--quiet",
        sys.executable,
        "-m",
        "bench.harness.worker",
        str(spec),
    ]


def _steps(name: str) -> list[str]:
    """This allocation's steps called `name` still in the queue."""
    job = os.environ.get("SLURM_JOB_ID", "")
    try:
        out = subprocess.run(
            ["squeue", "-h", "-s", "-j", job, "-o", "%i %j"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [
        step
        for step, _, step_name_ in (line.partition(" ") for line in out.splitlines())
        if step_name_.strip() == name
    ]


def cancel_step(name: str, wait_s: float = 30.0) -> None:
    """Cancel this allocation's steps called `name`, and wait (up to `wait_s`) until they
    have left the queue: scancel only asks."""
    steps = _steps(name)
    for step in steps:
        subprocess.run(["scancel", step], capture_output=True, timeout=30)
    deadline = time.monotonic() + wait_s
    while steps and _steps(name) and time.monotonic() < deadline:
        time.sleep(0.5)


def ranks_from_slurm() -> None:
    """In a rank started by srun (no RANK from a launcher): rank, world size and local rank
    from SLURM's variables, and the node's name as this rank's host."""
    env = os.environ
    if "RANK" in env or "SLURM_PROCID" not in env or "MASTER_ADDR" not in env:
        return
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env["SLURM_NTASKS"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env.setdefault("PARABENCH_NODE", env.get("SLURMD_NODENAME", ""))


# ---------------------------------------------------------------- submit and status


def asks_for_gpus(sbatch_args: Sequence[str]) -> bool:
    """Whether these sbatch options already ask for GPUs (--gpus*, -G, a gpu --gres)."""
    return any(re.match(r"--gpus|-G|--gres[= ]\S*gpu", a.strip()) for a in sbatch_args)


def asks_for_cpus(sbatch_args: Sequence[str]) -> bool:
    """Whether these sbatch options already say how many CPUs the job has on a node."""
    own = ("-c", "--cpus-per-task", "--cpus-per-gpu", "--mincpus", "--exclusive")
    for arg in sbatch_args:
        name = arg.split("=", 1)[0].split()[0] if arg.strip() else ""
        if name in own or re.fullmatch(r"-c\d+", name):
            return True
    return False


#: the #SBATCH lines submit writes itself, by the sbatch options that set them (long, and
#: short with or without a space before the value), and what to give submit instead
OWN_LINES = {
    ("--nodes", "-N"): "--nodes",
    ("--ntasks-per-node", "--ntasks", "-n"): "--procs-per-node",
    ("--output", "-o", "--job-name", "-J", "--open-mode"): "",
}


def own_line(extra: Sequence[str]) -> str | None:
    """Why an --sbatch-arg sets a line submit writes itself, or None: with a second --nodes
    or --ntasks-per-node the job's lines disagree, and its run goes by submit's (1 rank a
    node of the 4 tasks asked for); a second --output moves the log `parabench status`
    names."""
    for arg in extra:
        name = arg.split("=", 1)[0].split()[0] if arg.strip() else ""
        for names, instead in OWN_LINES.items():
            # sbatch, as getopt does, takes a long option's unique prefix for it: --ntasks-per-n
            abbreviated = len(name) > 3 and name.startswith("--")
            if (
                name in names
                or any(len(n) == 2 and name.startswith(n) for n in names)
                or (abbreviated and any(n.startswith(name) for n in names))
            ):
                why = f"give submit {instead} instead" if instead else "submit names them itself"
                return f"--sbatch-arg={arg}: the job's {names[0]} line is submit's own; {why}"
    return None


def batch_script(
    run_dir: Path, argv: Sequence[str], nodes: int, procs: int, extra: Sequence[str]
) -> str:
    """The job `parabench submit` sends: ConfigError for a run directory no #SBATCH line
    can name."""
    if '"' in str(run_dir) or "\n" in str(run_dir):
        raise ConfigError(
            f"{str(run_dir)!r}: an #SBATCH line cannot name a folder with a double quote or a "
            "line break in its path; choose another --out-dir or --run-id"
        )
    log = str(run_dir).replace("%", "%%") + "/slurm-%j.out"
    lines = [
        "#!/bin/bash",
        f'#SBATCH --job-name="parabench-{run_dir.name}"',  # quoted: a path may hold spaces
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={procs}",
        f'#SBATCH --output="{log}"',  # %% is a literal % in SLURM's file name patterns
        "#SBATCH --open-mode=append",  # a requeued job's log keeps the first attempt's
        *(f"#SBATCH {a}" for a in extra),
        "# written by `parabench submit`: the matrix, each cell one srun step of this job",
        "# this job's id, for `parabench status`: a job resubmitted (`sbatch job.sbatch`) too",
        f'[ -n "$SLURM_JOB_ID" ] && echo "$SLURM_JOB_ID" > {shlex.quote(str(run_dir / "job.id"))}',
        # where submit ran, which relative options (--data-root data) name: a node without
        # that folder fails the job here, not runs it from the home folder on other paths
        f"cd {shlex.quote(os.getcwd())} || exit 1",
        f"export PYTHONPATH={shlex.quote(str(ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "# requeued (a node lost, preempted) after the run began: finish it, do not start anew",
        f"if [ -f {shlex.quote(str(run_dir / 'config.json'))} ]; then",
        "    exec "
        + shlex.join(
            [sys.executable, "-m", "bench.cli", "run", "--resume", str(run_dir)]
            + (["--no-report"] if "--no-report" in argv else [])
        )
        + ' "$@"',  # `sbatch job.sbatch --retry-failed` runs the failed cells again
        "fi",
        "exec "
        + shlex.join([sys.executable, "-m", "bench.cli", "run", "--launcher", "slurm", *argv]),
    ]
    return "\n".join(lines) + "\n"


def submit(run_dir: Path, script: str) -> str:
    """sbatch the script, kept as run_dir/job.sbatch; its job id goes to run_dir/job.id. A
    job sbatch refused leaves neither, nor a run directory made for it."""
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "job.sbatch"
    path.write_text(script)
    try:
        job = _run(["sbatch", "--parsable", str(path)]).strip().split(";")[0]
    except ConfigError:
        path.unlink()
        if made:
            run_dir.rmdir()
        raise
    (run_dir / "job.id").write_text(job + "\n")
    return job


#: states of a job that has ended (squeue shows them for a while: MinJobAge; sacct after)
ENDED = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)


def _job_state(job: str) -> tuple[list[str], str]:
    """(state, elapsed, nodes, where) of the job, from squeue while it knows the job, else
    from sacct where accounting keeps it; [] if neither does, with why SLURM could not be
    asked at all ("" if it could)."""
    try:  # every state (-t all): an ended job stays there for a while
        out = _run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T %M %D %R"])
    except ConfigError as exc:  # a job squeue has forgotten is an error: "Invalid job id"
        if "invalid job id" not in str(exc).lower():
            return [], str(exc).splitlines()[0]
        out = ""
    if out.strip():
        return (out.split(None, 3) + ["", "", "", ""])[:4], ""
    try:  # accounting off, or no such job: nothing to say
        out = _run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,Elapsed,NNodes"])
    except ConfigError:
        return [], ""
    line = out.strip().splitlines()[:1]
    if not line:
        return [], ""
    state, elapsed, count = (line[0].split("|") + ["", "", ""])[:3]
    return [state.split()[0] if state.strip() else "", elapsed, count, ""], ""


def _resubmitted(run_dir: Path, job: str) -> str | None:
    """The newest job squeue knows (of this user's) that runs this run's job.sbatch, where it
    is newer than `job`, job.id's; else None. A job resubmitted (`sbatch job.sbatch`, what a
    stopped job's log says to do) writes its id there only once it starts: while it waits,
    job.id names the job before it, which ended."""
    try:
        out = _run(["squeue", "-h", "-t", "all", "-u", str(os.getuid()), "-o", "%i|%Z|%o"])
    except ConfigError:
        return None
    script = os.path.realpath(run_dir / "job.sbatch")
    newer = []
    for line in out.splitlines():
        i, _, rest = line.partition("|")
        where, _, command = rest.partition("|")
        # the script as sbatch was given it, relative to where it was submitted from
        ran = os.path.realpath(os.path.join(where.strip(), command.strip()))
        if i.strip().isdigit() and int(i) > int(job) and ran == script:
            newer.append(int(i))
    return str(max(newer)) if newer else None


def status(run_dir: Path) -> str:
    """One line: the job's state (running, pending and why, or how it ended) and the rows
    written; for a job that did not complete, where its log is (or that it wrote none)."""
    run_dir = run_dir_named(run_dir)
    job_file = run_dir / "job.id"
    if not job_file.exists():
        raise ConfigError(f"{run_dir} has no job.id: it was not made by `{program()} submit`")
    job = job_file.read_text().strip()
    if not re.fullmatch(r"\d+", job):  # what `sbatch --parsable` printed, its cluster cut off
        raise ConfigError(
            f"{job_file}: {job!r} is not a SLURM job id (`parabench submit` wrote one)"
        )
    again = _resubmitted(run_dir, job)
    name = f"job {again} (resubmitted after job {job})" if again else f"job {job}"
    job = again or job
    fields, unknown = _job_state(job)
    rows = run_dir / "runs.csv"
    read = results.CsvTable(rows, results.RUN_COLUMNS).read()  # (none yet: no rows)
    n = len(read)
    written = f"{n} row{'' if n == 1 else 's'} written to {rows}"
    if unknown:
        return f"{name}: state unknown ({unknown}); {written}"
    if not fields or not fields[0]:
        return f"{name}: ended, not in the queue (finished or cancelled); {written}"
    state, elapsed, count, where = fields
    where = where.strip().strip("()")  # squeue's %R brackets a reason, not a node list
    if state.upper() in ENDED:
        log = run_dir / f"slurm-{job}.out"
        tail = "" if state.upper() == "COMPLETED" else f"; its log: {log}"
        if tail and not log.exists():  # cancelled while pending, or --output sent it elsewhere
            tail = f"; no log at {log}"
        return f"{name}: {state.lower()}, ended after {elapsed}; {written}{tail}"
    if state.upper() == "PENDING":
        return f"{name}: pending ({where}); {written}"
    line = f"{name}: {state.lower()} for {elapsed} on {count} node(s) ({where}); {written}"
    ended = {k for r in read if (k := results.row_key(r)) is not None}
    now = progress.running_now(run_dir, ended)  # the cell it is in, as its progress file says
    return f"{line}; {now}" if now else line
