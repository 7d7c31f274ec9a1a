"""Hardware detection, provenance and the machine's state: what every result row carries
about where it ran, and what else ran beside it."""

from __future__ import annotations

import functools
import math
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from bench import ROOT

# torch is imported by the functions that ask it: the report reads this module's BUSY_PCT
# and oversubscribed, and a run made elsewhere is reported without torch's seconds


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def device_count(device: str) -> int:
    """Devices a strategy can put ranks on: GPUs, or CPU cores (one core per rank at least)."""
    import torch

    return torch.cuda.device_count() if device == "cuda" else cpu_cores()


def threads_per_process(processes: int, cores: int = 0) -> int:
    # The processes of a cell share the cores (this machine's unless said): cores / processes
    # each, so no strategy is oversubscribed and none leaves cores idle (DataParallel is one
    # process).
    return max(1, (cores or cpu_cores()) // processes)


def oversubscribed(processes: int, cores: int) -> bool:
    """Whether a cell's processes outnumber the cores they share: each still gets a thread
    (threads_per_process), but no longer a core of its own, so its speed is not comparable
    (--oversubscribe runs it for correctness). Up to one a core they share the cores."""
    return processes > cores


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def nccl_version() -> str:
    import torch

    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        return ""


@functools.cache
def provenance(device: str) -> dict[str, str | int]:
    import torch

    names = ""
    if device == "cuda" and torch.cuda.is_available():
        names = ";".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_cores": cpu_cores(),
        "device_type": device,
        "device_names": names or cpu_model(),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "torchvision_version": _version("torchvision"),
        "cuda_version": torch.version.cuda or "",
        "cudnn_version": str(torch.backends.cudnn.version() or "")
        if torch.cuda.is_available()
        else "",
        "nccl_version": nccl_version() if torch.cuda.is_available() else "",
        "horovod_version": _version("horovod"),
        "apex_version": _version("apex"),
        "parabench_version": _version("parabench"),
        "git_commit": git_commit(),
        "platform": platform.platform(),
    }


def machine_state() -> dict[str, float]:
    """What can be read about the machine as a cell starts: the 1-minute load average (runnable
    processes; above the core count, something else competes) and the mean CPU clock where
    the kernel shows it (a throttled or power-saving CPU runs slower)."""
    nan = float("nan")
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = nan
    mhz = nan
    try:
        clocks = [
            float(line.split(":")[1])
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("cpu MHz")
        ]
        mhz = sum(clocks) / len(clocks) if clocks else nan
    except (OSError, ValueError, IndexError):
        pass
    return {"load_avg_1m": load, "cpu_mhz": mhz}


#: other processes' share of the CPUs (CpuShare's other_cpu_pct) from which the pre-run
#: estimate and the report say so: steps timed then ran on what those processes left
BUSY_PCT = 20.0


class CpuShare:
    """Who else used the CPUs while a cell ran, from the kernel's counters (/proc/stat) and
    this process's and its reaped descendants' CPU time (getrusage): `other_cpu_pct`, the
    share of all cores' time spent busy by anything but the cell and the harness, and
    `cpu_steal_pct`, the share a hypervisor gave to other guests (a VM's noisy neighbours).
    Both are nan where the kernel does not show them. A cell's process that its parent did
    not reap is not counted as the cell's: it shows up as other."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[list[int], float] | None:
        import resource

        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        if len(fields) < 8:
            return None
        own = sum(
            getattr(resource.getrusage(who), t)
            for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
            for t in ("ru_utime", "ru_stime")
        )
        return fields, own

    @staticmethod
    def unknown() -> dict[str, float]:
        return {"other_cpu_pct": math.nan, "cpu_steal_pct": math.nan}

    def stop(self) -> dict[str, float]:
        end = self._read()
        if self.start is None or end is None:
            return self.unknown()
        delta = [b - a for a, b in zip(self.start[0], end[0], strict=True)]
        # user nice system idle iowait irq softirq steal, in clock ticks over all cores
        total = sum(delta)
        if total <= 0:
            return self.unknown()
        busy = total - delta[3] - delta[4] - delta[7]
        own = (end[1] - self.start[1]) * os.sysconf("SC_CLK_TCK")
        return {
            "other_cpu_pct": round(100 * max(0.0, busy - own) / total, 2),
            "cpu_steal_pct": round(100 * delta[7] / total, 2),
        }
