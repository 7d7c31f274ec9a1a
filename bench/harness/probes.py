"""Timing and memory probes.

Step time is taken on the host clock after `torch.cuda.synchronize()` on CUDA, so it
covers the device work of the step; the time to get a batch onto the device is kept
apart (data wait), as pytorch/examples' `data_time` and torchtitan's `data_loading(%)`.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import resource
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

# the training loop's (strategies.base) and the tests' probes.SPARSE_EVERY_S
from bench.harness.breakdown import PHASES, SPARSE_EVERY_S  # noqa: F401


@dataclass(frozen=True, slots=True)
class StepRecord:
    total_ms: float
    data_ms: float
    samples: int


class CudaMarks:
    """Timing events recorded on the stream current at the first one. The stream is looked
    up once: `Event.record()` with none asks torch.cuda.current_stream(), which builds a new
    Stream object at every call, inside every timed step."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream: Any = None

    def now(self) -> Any:
        if self._stream is None:
            self._stream = torch.cuda.current_stream(self._device)
        event = torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        return event

    def wait(self) -> None:
        """Until the events recorded on the clock's device have happened (its device named:
        the current device need not be it)."""
        torch.cuda.synchronize(self._device)


class Span:
    """Wall time from `start()` to `stop()` (or, not stopped, to `seconds()`). On CUDA both
    ends are events on the stream (CudaMarks), so the span starts where the stream reaches
    it, after the work queued before it (the last step's optimizer, a batch's copy), which a
    host clock started at once would count in: the pipelines' bubble is this span less their
    chunks' event-timed compute. `stop()` only marks the end; `seconds()` waits for the
    device, so a span stopped inside the loop is read after it."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = CudaMarks(device) if device.type == "cuda" else None
        self._t0: Any = None
        self._t1: Any = None

    def _now(self) -> Any:
        return self._cuda.now() if self._cuda else time.perf_counter()

    def start(self) -> None:
        self._t0, self._t1 = self._now(), None

    def stop(self) -> None:
        self._t1 = self._now()

    def seconds(self) -> float:
        end = self._now() if self._t1 is None else self._t1
        if self._cuda is None:
            return end - self._t0
        self._cuda.wait()
        return self._t0.elapsed_time(end) / 1e3


class Due:
    """Whether a sparse probe is taken now: where at least `every_s` has passed since it
    was last taken, or it is forced (every_s 0: always)."""

    def __init__(self, every_s: float) -> None:
        self._every, self._next = every_s, 0.0

    def __call__(self, force: bool = False) -> bool:
        if not self._every:
            return True
        now = time.perf_counter()
        if force or now >= self._next:
            self._next = now + self._every
            return True
        return False


class PhaseClock:
    """Laps inside a step: forward, backward, optimizer. A lap adds the time since the last
    lap (or `begin`) to a phase, so the laps of a lapped step add up to its compute time
    exactly.

    On a CPU a lap is the host clock: the work is done when the call returns. On CUDA a lap
    is an event recorded on the current stream (no synchronisation inside the step); the
    events are read once, after the epoch, by `steps()`. A lap is a mark and a phase
    appended to the step's list: the clock runs inside timed steps, so it does as little
    as it can (benchmarks/overhead.py --loop-cost-only measures what the loop adds).

    `every_s`: a step is lapped only where at least that long has passed since the last
    lapped step began (the training loop's on CUDA: SPARSE_EVERY_S), and always the steps
    numbered in `always` (the first, the first timed); 0, every step (the probes')."""

    def __init__(
        self, device: torch.device, every_s: float = 0.0, always: tuple[int, ...] = (0,)
    ) -> None:
        self._cuda = CudaMarks(device) if device.type == "cuda" else None
        self._due, self._always = Due(every_s), always
        #: per step: mark, phase, mark, phase, mark, ...; None: a step not lapped
        self._steps: list[list[Any] | None] = []
        self._open: list[Any] | None = None  # the step being lapped

    def _now(self) -> Any:
        return self._cuda.now() if self._cuda else time.perf_counter()

    def begin(self) -> None:
        if not self._due(force=len(self._steps) in self._always):
            self._open = None
            self._steps.append(None)
            return
        self._open = [self._now()]
        self._steps.append(self._open)

    def lap(self, phase: str) -> None:
        if self._open is None:  # a lap outside a step (evaluation, a probe): not counted
            return
        self._open += (phase, self._now())

    def end(self) -> None:
        self._open = None

    def steps(self) -> list[dict[str, float]]:
        """Per step, milliseconds per phase lapped in it (none for a step not lapped). A
        phase no lap closed is absent, not 0: a pipeline's schedule runs its forwards inside
        the backward's lap, and its forward is not measured apart, which 0 ms read as none."""
        if self._cuda:
            self._cuda.wait()
        out: list[dict[str, float]] = []
        for marks in self._steps:
            if marks is None:
                out.append({})
                continue
            ms: dict[str, float] = {}
            for i in range(1, len(marks), 2):
                a, phase, b = marks[i - 1], marks[i], marks[i + 1]
                ms[phase] = ms.get(phase, 0.0) + (
                    a.elapsed_time(b) if self._cuda else (b - a) * 1e3
                )
            out.append(ms)
        return out


#: how steps are timed (--step-timing): see StepTimer
STEP_TIMINGS = ("sync", "events")


class StepTimer:
    """Times each step: its total and its data wait (getting the batch onto the device).

    "sync" (the default): the host clock, read after `torch.cuda.synchronize()` at the
    step's start, when its batch is on the device and at its end, so a step's time covers
    its device work. "events", on CUDA: events recorded on the stream at a step's start and
    when its batch is on the device, and no synchronisation inside the loop, so the host
    queues work ahead of the GPU as a plain training loop does; a step's time is the
    stream's, from its start to the next step's start (the last one's so far, to an event
    recorded when `records()` reads it, which stays its end: each step so carries the loop's
    work after it, not what follows a read), and its data wait the stream's from its start
    to its batch. `records()` reads them (one synchronisation). On a CPU both are the host
    clock: the work is done when the call returns."""

    def __init__(self, device: torch.device, mode: str = "sync") -> None:
        if mode not in STEP_TIMINGS:
            raise ValueError(f"step timing {mode!r}: choose {' or '.join(STEP_TIMINGS)}")
        self._cuda = device.type == "cuda"
        self._device = device
        self._events = CudaMarks(device) if self._cuda and mode == "events" else None
        self._m0: Any = None
        self._m1: Any = None
        self._h0 = 0.0
        #: per step: start, data, end (under "events" None: the next step's start), samples
        self._marks: list[tuple[Any, Any, Any, int]] = []

    @property
    def steps(self) -> int:
        return len(self._marks)

    def _mark(self) -> Any:
        if self._events:
            return self._events.now()
        if self._cuda:
            torch.cuda.synchronize(self._device)
        return time.perf_counter()

    def start(self) -> None:
        self._m0 = self._mark()
        self._h0 = time.perf_counter()

    def data_ready(self) -> None:
        self._m1 = self._mark()

    def stop(self, samples: int) -> float:
        """Ends the step; its milliseconds on the host clock (under "events" the time to
        queue it, which progress reports may show; `records()` has the stream's). Under
        "events" it records nothing: a step ends where the next starts."""
        end = None if self._events else self._mark()
        self._marks.append((self._m0, self._m1, end, samples))
        return (time.perf_counter() - self._h0) * 1e3

    def records(self) -> list[StepRecord]:
        """Every step so far."""
        if not self._events:
            return [StepRecord((c - a) * 1e3, (b - a) * 1e3, n) for a, b, c, n in self._marks]
        if self._marks and self._marks[-1][2] is None:  # the last step so far ends now
            a, b, _, n = self._marks[-1]
            self._marks[-1] = (a, b, self._mark(), n)
        torch.cuda.synchronize(self._device)
        out = []
        for k, (a, b, c, n) in enumerate(self._marks):
            # a step a read closed (--target-precision's, at a block's end) ends at its mark:
            # the ranks' agreement after the read, and the stream idle until the host queues
            # the next step, are no part of it
            end = c if c is not None else self._marks[k + 1][0]
            out.append(StepRecord(a.elapsed_time(end), a.elapsed_time(b), n))
        return out


#: (pid, fd) of this process's /proc/self/statm, kept open for held_mib: opened once per
#: process (a forked child opens its own: the fd names the process that opened it)
_statm: tuple[int, int] | None = None
_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


def held_mib(device: torch.device) -> float:
    """Memory this process holds now: the CUDA allocator's allocated bytes on `device`
    (a host-side counter: no synchronisation), else its resident set size. Read at a step's
    end, outside its timing (HeldReads: every step on a CPU, at most every 20 ms on CUDA): a
    figure that climbs step after step is a leak. Cheaply, as it is read in the loop: the
    allocator's stats unflattened (memory_allocated flattens and sorts all of them into one
    dict each call), and RSS re-read from a file kept open (2 us here, against 17 us opening
    it each step)."""
    global _statm
    if device.type == "cuda":
        stats = torch.cuda.memory_stats_as_nested_dict(device)
        return stats["allocated_bytes"]["all"]["current"] / 2**20
    try:
        if _statm is None or _statm[0] != os.getpid():
            _statm = (os.getpid(), os.open("/proc/self/statm", os.O_RDONLY))
        pages = int(os.pread(_statm[1], 256, 0).split()[1])
    except (OSError, ValueError, IndexError):  # no /proc (macOS): peak RSS is what there is
        return peak_rss_mib()
    return pages * _PAGE_MIB


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",  # free bytes in the arenas
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Any:
    try:
        fn = ctypes.CDLL(None).mallinfo2  # glibc 2.33 on; musl and macOS have none
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [], _MallInfo2
    return fn


def malloc_free_mib() -> float:
    """Memory glibc's malloc holds free in its arenas (mallinfo2's fordblks), in MiB: what
    tensors freed, kept for the next allocation, most of it resident, so in a CPU rank's
    resident set (held_mib, its peak) though no tensor's. Freed between blocks still in use
    it is not given back, and the resident set can climb step after step with the same
    tensors live: model_split's last stage on a CPU grew 350 MiB in 60 steps (in two runs
    of three) with 135 tensors live throughout, 421 MiB free in malloc at the end, and
    malloc_trim gave all of it back; MALLOC_ARENA_MAX=1 did not stop it. NaN where the C
    library has no mallinfo2. It walks the free lists: 0.1 ms a read, about 3 ms where the
    heap is in many pieces, so the loop reads it at most every MALLOC_EVERY_S (HeldReads)."""
    fn = _mallinfo2()
    return fn().fordblks / 2**20 if fn is not None else math.nan


#: on a CPU, the least time between two reads of malloc's free memory (malloc_free_mib,
#: up to ~3 ms a read): outside the rank's timed steps, but its peers wait that long in
#: the next step's collective, so at most 0.6 % of their time where the heap is in pieces
MALLOC_EVERY_S = 0.5


class HeldReads:
    """held_mib at each step's end, at most every `every_s` (the training loop's on CUDA:
    SPARSE_EVERY_S; NaN between; 0, every step), and always at the steps numbered in
    `always` (the first, the first timed: as PhaseClock's) and the last (`readings()`):
    growth compares the first timed quarter with the last. On a CPU, also what malloc
    holds free (malloc_free_mib), at most every MALLOC_EVERY_S and at the same steps always
    (`malloc_free()`): its growth is taken between the same quarters (results.held_growth),
    so the part of a rank's growth that is the allocator's free memory is told from tensors
    kept, the one against the other."""

    def __init__(
        self, device: torch.device, every_s: float = 0.0, always: tuple[int, ...] = (0,)
    ) -> None:
        self._device = device
        self._due, self._always = Due(every_s), always
        self._mib: list[float] = []
        self._cpu = device.type == "cpu"
        self._free_due = Due(MALLOC_EVERY_S)
        self._free: list[float] = []

    def step_end(self) -> None:
        due = self._due(force=len(self._mib) in self._always)
        if self._cpu:
            free = self._free_due(force=len(self._mib) in self._always)
            self._free.append(malloc_free_mib() if free else math.nan)
        self._mib.append(held_mib(self._device) if due else math.nan)

    def malloc_free(self) -> list[float]:
        """On a CPU, MiB malloc held free at the end of each step so far (NaN between
        reads; the last step's read now if it was skipped); none on CUDA, whose held memory
        is the CUDA allocator's."""
        if self._free and math.isnan(self._free[-1]):
            self._free[-1] = malloc_free_mib()
        return self._free

    def readings(self) -> list[float]:
        """Per step so far; the last step's read now if it was skipped (nothing has run
        since its end)."""
        if self._mib and math.isnan(self._mib[-1]):
            self._mib[-1] = held_mib(self._device)
        return self._mib


def peak_rss_mib() -> float:
    """Peak resident set size of this process since reset_peaks (Linux's VmHWM), else since
    it started."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # KiB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)


def reset_peaks(devices: list[torch.device]) -> None:
    """Start the peaks memory_snapshot reads anew (at each epoch's start): the CUDA
    allocator's, and on Linux the resident set's, which would otherwise keep the previous
    epoch's evaluation as every later epoch's peak on a CPU."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident set back to the current one
    except OSError:
        pass


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
