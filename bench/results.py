"""Result records and tidy CSVs.

runs.csv has one row per (run, strategy, world size, repeat, epoch): identity, then
parameters, then status, then measurements, then provenance (pytest-benchmark's
order). steps.csv has every step of rank 0; ranks.csv every rank's memory and
throughput. Files are rewritten whole through a temporary file and `os.replace`, so a
killed harness leaves either the old or the new file, never half a row.
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ID = ["run_id", "strategy", "world_size", "repeat", "epoch"]
PARAMS = [
    "launcher",
    "backend",
    "precision",
    "device",
    "dataset",
    "data",
    "model",
    "global_batch",
    "per_rank_batch",
    "epochs",
    "max_steps",
    "warmup_steps",
    "loader_workers",
    "threads_per_rank",
    "seed",
    "lr",
    "options",
]
STATUS = ["status", "reason", "notes"]
MEASUREMENTS = [
    "steps",
    "timed_steps",
    "samples",
    "timed_s",
    "samples_per_s",
    "samples_per_s_per_device",
    "step_time_ms_p50",
    "step_time_ms_p90",
    "step_time_ms_iqr",
    "step_time_ms_mean",
    "data_wait_ms_p50",
    "compute_ms_p50",
    "data_wait_pct",
    "train_loss_first",
    "train_loss_final",
    "train_loss_mean",
    "eval_loss",
    "eval_accuracy",
    "peak_mem_mib",
    "mem_source",
    "peak_alloc_mib",
    "peak_reserved_mib",
    "peak_rss_mib",
    "cell_wall_s",
]
PROVENANCE = [
    "timestamp",
    "host",
    "cpu_model",
    "cpu_cores",
    "device_type",
    "device_names",
    "gpu_count",
    "python_version",
    "torch_version",
    "torchvision_version",
    "cuda_version",
    "cudnn_version",
    "nccl_version",
    "horovod_version",
    "apex_version",
    "parabench_version",
    "git_commit",
    "platform",
]
RUN_COLUMNS = ID + PARAMS + STATUS + MEASUREMENTS + PROVENANCE
STEP_COLUMNS = ID[:-1] + [
    "epoch",
    "step",
    "warmup",
    "step_time_ms",
    "data_wait_ms",
    "compute_ms",
    "loss",
]
RANK_COLUMNS = ID + [
    "rank",
    "samples",
    "timed_s",
    "samples_per_s",
    "peak_rss_mib",
    "peak_alloc_mib",
    "peak_reserved_mib",
]

#: statuses a cell can end with
OK, FAILED, OOM, TIMEOUT, SKIPPED, UNAVAILABLE = (
    "ok",
    "failed",
    "oom",
    "timeout",
    "skipped",
    "unavailable",
)
STATUSES = (OK, FAILED, OOM, TIMEOUT, SKIPPED, UNAVAILABLE)


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def measure(record: Mapping[str, Any], world_size: int, device: str) -> dict[str, Any]:
    """Measurement columns from one epoch record written by rank 0."""
    warm = record["warmup_steps"]
    step = np.asarray(record["step_times_ms"][warm:], dtype=float)
    wait = np.asarray(record["data_wait_ms"][warm:], dtype=float)
    compute = step - wait
    ranks = record["ranks"]
    samples = sum(r["samples"] for r in ranks)
    timed_s = max(r["timed_s"] for r in ranks)
    losses = record["losses"]
    cuda = device == "cuda"
    peak = {
        k: max((r.get(k, float("nan")) for r in ranks), default=float("nan"))
        for k in ("peak_alloc_mib", "peak_reserved_mib", "peak_rss_mib")
    }
    sps = samples / timed_s if timed_s > 0 else float("nan")
    return {
        "steps": record["steps"],
        "timed_steps": len(step),
        "samples": samples,
        "timed_s": timed_s,
        "samples_per_s": sps,
        "samples_per_s_per_device": sps / world_size,
        "step_time_ms_p50": _pct(step, 50),
        "step_time_ms_p90": _pct(step, 90),
        "step_time_ms_iqr": _pct(step, 75) - _pct(step, 25),
        "step_time_ms_mean": float(step.mean()) if step.size else float("nan"),
        "data_wait_ms_p50": _pct(wait, 50),
        "compute_ms_p50": _pct(compute, 50),
        "data_wait_pct": 100 * float(wait.sum() / step.sum())
        if step.size and step.sum() > 0
        else float("nan"),
        "train_loss_first": losses[0] if losses else float("nan"),
        "train_loss_final": losses[-1] if losses else float("nan"),
        "train_loss_mean": float(np.mean(losses)) if losses else float("nan"),
        "eval_loss": record.get("eval_loss", float("nan")),
        "eval_accuracy": record.get("eval_accuracy", float("nan")),
        "peak_mem_mib": peak["peak_alloc_mib"] if cuda else peak["peak_rss_mib"],
        "mem_source": "cuda_allocator" if cuda else "host_rss",
        **peak,
    }


def step_rows(ident: Mapping[str, Any], record: Mapping[str, Any]) -> list[dict[str, Any]]:
    warm = record["warmup_steps"]
    rows = []
    for i, (t, w) in enumerate(zip(record["step_times_ms"], record["data_wait_ms"], strict=True)):
        loss = record["losses"][i] if i < len(record["losses"]) else float("nan")
        rows.append(
            {
                **ident,
                "step": i,
                "warmup": int(i < warm),
                "step_time_ms": t,
                "data_wait_ms": w,
                "compute_ms": t - w,
                "loss": loss,
            }
        )
    return rows


def rank_rows(ident: Mapping[str, Any], record: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in record["ranks"]:
        sps = r["samples"] / r["timed_s"] if r["timed_s"] > 0 else float("nan")
        rows.append(
            {
                **ident,
                "rank": r["rank"],
                "samples": r["samples"],
                "timed_s": r["timed_s"],
                "samples_per_s": sps,
                "peak_rss_mib": r.get("peak_rss_mib"),
                "peak_alloc_mib": r.get("peak_alloc_mib"),
                "peak_reserved_mib": r.get("peak_reserved_mib"),
            }
        )
    return rows


def _fmt(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if np.isnan(v) else f"{v:.10g}"
    return v


class CsvTable:
    """A CSV file that only grows, rewritten atomically on every append."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns

    def read(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        existing = self.read()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
                w.writeheader()
                w.writerows(existing)
                w.writerows({k: _fmt(v) for k, v in r.items()} for r in rows)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
