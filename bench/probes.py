"""Timing and memory probes.

Step time is taken on the host clock after `torch.cuda.synchronize()` on CUDA, so it
covers the device work of the step; the time to get a batch onto the device is kept
apart (data wait), as pytorch/examples' `data_time` and torchtitan's `data_loading(%)`.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class StepRecord:
    total_ms: float
    data_ms: float
    samples: int


#: the parts of a step after its data wait, in the order they run; zero_grad is counted with
#: the optimizer step, and a strategy that runs forward and backward in one schedule (the
#: pipelines) reports the whole schedule as backward
PHASES = ("forward", "backward", "optimizer")


class PhaseClock:
    """Laps inside a step: forward, backward, optimizer. A lap adds the time since the last
    lap (or `begin`) to a phase, so the laps of a step add up to its compute time exactly.

    On a CPU a lap is the host clock: the work is done when the call returns. On CUDA a lap
    is an event recorded on the current stream (no synchronisation inside the step); the
    events are read once, after the epoch, by `steps()`."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._steps: list[list[tuple[str, Any]]] = []
        self._last: Any = None

    def _now(self) -> Any:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def begin(self) -> None:
        self._steps.append([])
        self._last = self._now()

    def lap(self, phase: str) -> None:
        if self._last is None:  # a lap outside a step (evaluation, a probe): not counted
            return
        now = self._now()
        self._steps[-1].append((phase, (self._last, now)))
        self._last = now

    def end(self) -> None:
        self._last = None

    def steps(self) -> list[dict[str, float]]:
        """Per step, milliseconds per phase (every phase present, 0 where none ran)."""
        if self._cuda:
            torch.cuda.synchronize()
        out = []
        for laps in self._steps:
            ms = dict.fromkeys(PHASES, 0.0)
            for phase, (a, b) in laps:
                ms[phase] += a.elapsed_time(b) if self._cuda else (b - a) * 1e3
            out.append(ms)
        return out


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


def reset_peaks(devices: list[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)


def memory_snapshot(devices: list[torch.device]) -> dict[str, float]:
    """Peak memory from the allocator's own counters (CUDA) and the host's RSS.

    `devices` are those this process drives (several for DataParallel); the figure is the
    largest per-device peak, so it reads as memory per device like the one-rank-per-GPU
    strategies' figures.
    """
    snap = {"peak_rss_mib": peak_rss_mib()}
    cuda = [d for d in devices if d.type == "cuda"]
    if cuda:
        snap["peak_alloc_mib"] = max(torch.cuda.max_memory_allocated(d) for d in cuda) / 2**20
        snap["peak_reserved_mib"] = (
            max(torch.cuda.memory_stats(d).get("reserved_bytes.all.peak", 0) for d in cuda) / 2**20
        )
    return snap


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes of `t` this process holds: a DTensor's local shard, not its global size."""
    if t is None or not isinstance(t, torch.Tensor):
        return 0
    to_local = getattr(t, "to_local", None)  # DTensor (FSDP2, tensor parallel)
    if to_local is not None:
        t = to_local()
    return t.numel() * t.element_size()


def model_state_mib(params: Iterable[torch.Tensor], optimizer_states: Iterable[Any]) -> dict:
    """What this rank holds of the model's training state, in MiB: parameters, gradients and
    optimizer state as they are held (local shards of FSDP's DTensors, ZeRO's partition).

    Peak RSS on a CPU is mostly torch's own libraries, and an allocator peak mixes in
    activations; these three say what sharding saves."""
    params = list(params)
    optim = sum(
        local_bytes(v) for state in optimizer_states for v in state.values() if torch.is_tensor(v)
    )
    return {
        "param_mib": sum(local_bytes(p) for p in params) / 2**20,
        "grad_mib": sum(local_bytes(p.grad) for p in params) / 2**20,
        "optim_mib": optim / 2**20,
    }
