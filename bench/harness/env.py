"""Hardware detection and provenance: what every result row carries about where it ran."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from bench import ROOT


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def device_count(device: str) -> int:
    """Devices a strategy can put ranks on: GPUs, or CPU cores (one core per rank at least)."""
    return torch.cuda.device_count() if device == "cuda" else cpu_cores()


def threads_per_process(processes: int, cores: int = 0) -> int:
    # The processes of a cell share the cores (this machine's unless said): cores / processes
    # each, so no strategy is oversubscribed and none leaves cores idle (DataParallel is one
    # process).
    return max(1, (cores or cpu_cores()) // processes)


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
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        return ""


@functools.cache
def provenance(device: str) -> dict[str, str | int]:
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
