"""Launchers: how a cell's processes are started. One signature for all of them.

A launcher turns (cell spec path, world size, device) into the command line of the
cell's top process; that process starts the ranks, each of which runs bench.harness.worker.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

Launcher = Callable[[Path, int, str], list[str]]


def inprocess(spec: Path, world_size: int, device: str) -> list[str]:
    return [sys.executable, "-m", "bench.harness.worker", str(spec)]


def spawn(spec: Path, world_size: int, device: str) -> list[str]:
    return [sys.executable, "-m", "bench.harness.worker", "--spawn", str(spec)]


def torchrun(spec: Path, world_size: int, device: str) -> list[str]:
    # --standalone: a local rendezvous on a free port, so concurrent runs do not collide.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={world_size}",
        "--max-restarts=0",
        "-m",
        "bench.harness.worker",
        str(spec),
    ]


def horovodrun_path() -> str | None:
    local = Path(sys.executable).parent / "horovodrun"
    return str(local) if local.exists() else shutil.which("horovodrun")


def horovodrun_argv(spec: Path, ranks: int, slots: str, *options: str) -> list[str]:
    """horovodrun over gloo: `ranks` processes on the hosts of `slots` (`host:n,...`), each
    running the cell's worker."""
    exe = horovodrun_path()
    if exe is None:
        raise RuntimeError("horovodrun not found: run `make horovod`")
    gloo = [exe, "--gloo", "-np", str(ranks), "-H", slots, *options]
    return [*gloo, sys.executable, "-m", "bench.harness.worker", str(spec)]


def horovodrun(spec: Path, world_size: int, device: str) -> list[str]:
    return horovodrun_argv(spec, world_size, f"localhost:{world_size}")


LAUNCHERS: dict[str, Launcher] = {
    "inprocess": inprocess,
    "spawn": spawn,
    "torchrun": torchrun,
    "horovodrun": horovodrun,
}
