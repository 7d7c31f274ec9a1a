"""Timing and memory probes.

Step time is taken on the host clock after `torch.cuda.synchronize()` on CUDA, so it
covers the device work of the step; the time to get a batch onto the device is kept
apart (data wait), as pytorch/examples' `data_time` and torchtitan's `data_loading(%)`.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class StepRecord:
    total_ms: float
    data_ms: float
    samples: int


class StepTimer:
    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._device = device
        self._t0 = self._t1 = 0.0

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self._device)

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def data_ready(self) -> None:
        self._sync()
        self._t1 = time.perf_counter()

    def stop(self, samples: int) -> StepRecord:
        self._sync()
        t2 = time.perf_counter()
        return StepRecord((t2 - self._t0) * 1e3, (self._t1 - self._t0) * 1e3, samples)


def peak_rss_mib() -> float:
    """Peak resident set size of this process since it started."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_snapshot(device: torch.device) -> dict[str, float]:
    """Peak memory from the allocator's own counters (CUDA) and the host's RSS."""
    snap = {"peak_rss_mib": peak_rss_mib()}
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        snap["peak_alloc_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        snap["peak_reserved_mib"] = stats.get("reserved_bytes.all.peak", 0) / 2**20
    return snap
