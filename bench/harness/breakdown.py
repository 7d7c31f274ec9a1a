"""Where a step's time goes: the arithmetic of the breakdown, and reading a profiler trace.

A timed step is split inline (bench.harness.probes.PhaseClock) into data wait, forward, backward and
optimizer. Communication hides inside those phases, so a probe after the timed steps
(`Strategy.probe`) measures it two ways, each said in the row's `comm_method`:

- ablation: steps with gradient synchronisation switched off (`Strategy.sync_off`),
  alternated with ordinary steps on the same batch. The difference per phase is the
  communication that is *exposed* there: the time a step is longer because of it.
- profiler: a short torch.profiler window; the union of the collective ops' intervals
  (gloo's and NCCL's, on whatever thread or stream they ran) is the communication's *total*
  time per step. Total minus exposed is the part hidden under compute.

The stacked parts of a step (data wait, forward, backward and optimizer compute, exposed
communication, other) add up to the measured mean step time by construction; `other` is what
the laps do not cover (the step's own bookkeeping), and a large one says the split is off.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: the parts of a step after its data wait, in the order they run; zero_grad is counted with
#: the optimizer step, and a strategy that runs forward and backward in one schedule (the
#: pipelines) reports the whole schedule as backward. Here, not in probes (which times
#: them): probes imports torch, and the report, reading them, needs none
PHASES = ("forward", "backward", "optimizer")

#: on CUDA, seconds at least between two steps that the phase clock laps, and between two
#: held-memory reads, in the training loop: inside it, on an H100 (2026-11-26,
#: benchmarks/overhead.py --loop-cost-only), each cost about 100 us a step (the five laps'
#: CUDA events; the allocator's stats, 18-34 us read alone), 6 % of MNIST's 1.7 ms step
#: each. Taken at most every 20 ms each costs under 0.5 %, and a step longer than that is
#: still lapped and read at every end. On a CPU a lap is the host clock and the read 2-3 us
#: (a file kept open): every step has both. Here beside PHASES, for the report to say it
SPARSE_EVERY_S = {"cuda": 0.02}

#: a collective op as torch.profiler names it: c10d's backends record `gloo:all_reduce`,
#: `nccl:all_gather`..., and NCCL's kernels on the GPU are `ncclDevKernel_...`/`ncclKernel_...`
COLLECTIVE = re.compile(r"^(gloo|nccl|mpi|ucc):|^nccl(Dev)?Kernel", re.IGNORECASE)

#: stacked parts of a step, in plot order
PARTS = (
    "data_wait",
    "forward",
    "backward",
    "optimizer",
    "comm_exposed",
    "other",
)


def union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: overlapping ops count once."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def collective_intervals(events: Iterable[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(start, end) in ms of every collective op in a Chrome trace's events. On a GPU the
    NCCL kernels are the communication (the CPU-side ops only enqueue them); without them,
    the CPU-side ops (gloo runs its collectives on its own threads, and they last as long as
    the transfer)."""
    spans = [e for e in events if e.get("ph") == "X" and COLLECTIVE.search(str(e.get("name", "")))]
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    return [
        (float(e["ts"]) / 1e3, (float(e["ts"]) + float(e.get("dur", 0))) / 1e3)
        for e in (kernels or spans)
    ]


def trace_comm(path: Path, steps: int, ranks: int = 1) -> dict[str, float]:
    """Communication per step from a torch.profiler Chrome trace of `steps` steps. Several
    ranks and no collective seen: the profiler did not see them (nan), not none; their
    count too, which read 0 ops beside that unknown total."""
    events = json.loads(Path(path).read_text()).get("traceEvents", [])
    spans = collective_intervals(events)
    none = float("nan") if ranks > 1 or not steps else 0.0
    return {
        "comm_total_ms": union_ms(spans) / steps if spans and steps else none,
        "comm_ops_per_step": len(spans) / steps if spans and steps else none,
    }


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ablation(
    on: Sequence[Mapping[str, float]],
    off: Sequence[Mapping[str, float]],
    phases: Sequence[str] = PHASES,
) -> dict:
    """Exposed communication per phase from probe steps with synchronisation on and off
    (phase -> ms per step): the difference of the medians, phase by phase, over `phases`;
    the others are not compared (FSDP's sync-off steps have no optimizer step), nan, not 0
    ms, which runs.csv read as measured and none; `comm_exposed_ms` is the sum of those
    compared, signed (noise can make it negative; `stacked` clips per phase for drawing)."""
    out: dict[str, float] = {}
    for phase in PHASES:
        out[f"comm_exposed_{phase}_ms"] = (
            _median([s[phase] for s in on]) - _median([s[phase] for s in off])
            if phase in phases
            else float("nan")
        )
    out["comm_exposed_ms"] = sum(out[f"comm_exposed_{p}_ms"] for p in PHASES if p in phases)
    out["probe_step_ms"] = _median([sum(s.values()) for s in on])
    out["probe_nosync_ms"] = _median([sum(s.values()) for s in off])
    return out


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def stacked(
    step_ms: float, data_ms: float, phase_ms: Mapping[str, float], probe: Mapping[str, Any]
) -> dict[str, float]:
    """The parts of a mean step (PARTS, in ms): each phase's compute is its measured time less
    the communication exposed in it (clipped to [0, the phase]), the exposed communication is
    their sum, and `other` closes the step. The phases' exposed parts are scaled down together
    where they add up to more than the ablation's signed total (`comm_exposed_ms`): a phase
    that got faster with sync (the wait for the other rank moved into another phase) gives
    back what it moved, so the part is what the step measured, as comm_hidden's is. Without
    an ablation nothing is moved out of the phases and exposed communication is nan."""
    parts = {"data_wait": data_ms}
    net = _num(probe.get("comm_exposed_ms"))
    have = not math.isnan(net)
    moved = {}
    for phase in PHASES:
        t = phase_ms.get(phase, float("nan"))
        e = _num(probe.get(f"comm_exposed_{phase}_ms")) if have else 0.0
        moved[phase] = (t, min(max(e, 0.0), t) if not math.isnan(e) else 0.0)
    clipped = sum(e for _, e in moved.values())
    scale = max(net, 0.0) / clipped if have and clipped > max(net, 0.0) else 1.0
    for phase, (t, e) in moved.items():
        parts[phase] = t - e * scale
    parts["comm_exposed"] = clipped * scale if have else float("nan")
    known = sum(v for v in parts.values() if not math.isnan(v))
    parts["other"] = step_ms - known
    return parts


def hidden(total_ms: float, exposed_ms: float) -> float:
    """Communication hidden under compute: the profiler's total less the ablation's exposed
    part (nan where either is missing; never below 0)."""
    if math.isnan(total_ms) or math.isnan(exposed_ms):
        return float("nan")
    return max(total_ms - max(exposed_ms, 0.0), 0.0)
