"""`parabench verify`: does every strategy still train the same model as the baseline?

Runs every available strategy for K steps through the normal harness (same seed,
global batch and sample order; dropout off, since its masks depend on the rank
layout), then compares each run's per-step losses and final parameters with those of
`single` at fp32 (the plain baseline). Tolerances come from the numeric recipe each
cell declares (its `numerics` column: exact fp32, bf16/fp16 autocast, fp16/bf16 gradient
compression, PowerSGD, apex), never from a precision string; a recipe of several parts
takes the loosest part's. PowerSGD is lossy by design: its check is the mean loss of the last steps within a
stated band of the baseline's, and the table marks it approximate (inconclusive where the
baseline's own loss moves less than the band: a run that never trained would pass too).
Exit code 1 if any strategy fails.

Cells in bf16 or fp16 get a precision reference: `single` in that precision, the batch cut
as the cell's ranks and micro-batches cut it (autocast rounds each part's gradient),
against fp32, which shows what rounding alone moves. Where that is past the recipe's
tolerance (resnet18 at 32 px, whose conditioning shows it amplifies rounding: bf16 alone is
0.38 of an update from fp32 after one step), the reference is reported as such and the
cells in that precision are held to 1.5x its gap, so a correct strategy does not FAIL for
bf16's sake while one that skips its all-reduce still does. Cells in fp32 whose gradients
are compressed (grad_fp16/grad_bf16) get a reference of the same kind, `single --set
compress=...` (COMPRESSED). Against its reference, a cell that is as close to fp32 as fp32
itself FAILs: it does not round as it says (bench.analysis.verify.unrounded). A compressing
cell in bf16/fp16 is told apart on its own layout, against single in that precision with
and without its gradients rounded (bench.analysis.verify.uncompressed).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import json
import math
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.config import SET_BY_VERIFY, ConfigError, RunConfig
from bench.harness import proc, results
from bench.harness.env import device_count
from bench.harness.runner import (
    RunDir,
    cell_dirname,
    default_world_sizes,
    plan,
    run_matrix,
    usable_device,
)
from bench.workload import data
from bench.workload.models import batch_norms, check_model, inert_parameters, meta_model


@dataclass(frozen=True)
class Tolerance:
    loss_abs: float
    param_rel: float  # ||p - p_single|| / ||p_single - p_init||: error relative to the update
    #: initial weights may differ by this much (apex O2 keeps the model's copy in fp16)
    init_abs: float = 0.0
    #: lossy by design (PowerSGD): weights are not compared; the mean loss over the second
    #: half of the steps must be within `loss_abs` of the baseline's, *relative* to it
    approximate: bool = False
    #: where the figures come from: "" (the recipe's), else what they were widened to (a
    #: multiple of a precision reference's own gap, bench.analysis.verify.widened)
    basis: str = ""

    def scaled(self, factor: float) -> Tolerance:
        """Its loss and weight figures `factor` times as wide."""
        return dataclasses.replace(
            self, loss_abs=factor * self.loss_abs, param_rel=factor * self.param_rel
        )

    def describe(self) -> str:
        if math.isnan(self.loss_abs):
            return "-"
        if self.approximate:
            return f"late loss within {self.loss_abs:.0%} (approximate)"
        text = f"loss<={self.loss_abs:.3g}, params<={self.param_rel:.3g}"
        return f"{text} ({REFERENCE_FACTOR:g}x ref)" if self.basis else text


#: by numeric recipe part (the `numerics` column). fp32 strategies differ from the baseline
#: only by the order of float additions (bucketed all-reduce, per-rank means, micro-batches).
RECIPES = {
    "exact": Tolerance(loss_abs=1e-5, param_rel=1e-4),
    "grad_fp16": Tolerance(loss_abs=1e-3, param_rel=1e-2),
    # bf16 keeps 8 bits of mantissa (fp16: 11): gradients rounded 8x more coarsely
    "grad_bf16": Tolerance(loss_abs=5e-3, param_rel=5e-2),
    "autocast_fp16": Tolerance(loss_abs=1e-2, param_rel=5e-2),
    "autocast_bf16": Tolerance(loss_abs=5e-2, param_rel=1e-1),
    # FSDP's MixedPrecisionPolicy: the forward and backward run on rounded weights
    "params_fp16": Tolerance(loss_abs=1e-2, param_rel=5e-2),
    "params_bf16": Tolerance(loss_abs=5e-2, param_rel=1e-1),
    "apex": Tolerance(loss_abs=5e-2, param_rel=1e-1, init_abs=1e-3),
    # a rank-1 approximation of every gradient matrix: the loss must still fall as the
    # baseline's does. Measured on MNIST, 2 ranks: 1.3 % off with SGD (8 steps), 6.9 % with
    # Adam (6 steps); a single step's loss is too noisy to judge by, so the mean over the
    # second half of the steps is compared.
    "powersgd": Tolerance(loss_abs=0.10, param_rel=math.inf, approximate=True),
}


def tolerance(numerics: str) -> Tolerance | None:
    """The tolerance of a recipe such as `autocast_bf16+grad_fp16`: its loosest part's, or
    None if a part has no stated tolerance (a plug-in's own recipe)."""
    parts = [RECIPES.get(p) for p in (numerics or "exact").split("+")]
    if any(t is None for t in parts):
        return None
    return Tolerance(
        loss_abs=max(t.loss_abs for t in parts),
        param_rel=max(t.param_rel for t in parts),
        init_abs=max(t.init_abs for t in parts),
        approximate=any(t.approximate for t in parts),
    )


UNKNOWN = Tolerance(loss_abs=math.nan, param_rel=math.nan)
NOT_COMPARABLE = "not comparable"
#: an approximate check (PowerSGD's late loss) within its band, where the baseline's own
#: loss moved less than the band: a run that never trained would be within it too; or a
#: compressing cell in bf16/fp16 within its tolerance whose compression references did not
#: run (bench.analysis.verify.uncompressed)
INCONCLUSIVE = "inconclusive"

#: precisions of the axis that `single` runs as a precision reference: what rounding in that
#: precision alone does to the baseline, on the cell's layout (bench.analysis.verify.compare)
REDUCED = ("bf16", "fp16")
#: gradient compressions (numerics parts) whose fp32 cells get a reference of their own, in
#: the precision references' place: `single --set compress=...` cut into the cell's ranks'
#: shares (compression_layout), each share's gradient rounded, divided by the ranks and summed
#: in the dtype, as the hooks do. One rounding of the whole gradient, the least a compressed
#: all-reduce does, read 3.43e-3 of an update under AdamW on MNIST (8 steps) where the correct
#: hooks at 2 ranks were 1.06e-2 and 2.10e-2, and FAILed. A hook that never compresses is as
#: close to fp32 as fp32 itself (bench.analysis.verify.unrounded)
COMPRESSED = {"grad_fp16": "fp16", "grad_bf16": "bf16"}


def compressed(numerics: str) -> str:
    """The gradient compression of a recipe such as `exact+grad_fp16` (a COMPRESSED key), or ''."""
    return next((p for p in numerics.split("+") if p in COMPRESSED), "")


def rounding(precision: str, numerics: str) -> str:
    """The rounding whose reference a cell is held against: its precision where REDUCED,
    else its gradient compression (`compressed`), else '' (exact fp32: none)."""
    return precision if precision in REDUCED else compressed(numerics)


#: the part of a compression reference's key that says the cell's all-reduce divides the
#: sum by the ranks, not each rank's rounded gradient (Strategy.compressed_divide: Horovod).
#: In fp16 the two orders differ where a gradient is subnormal: under AdamW on MNIST (8 steps,
#: 2 ranks) ddp_fp16_hook and horovod_fp16 read 1.06e-2 and 2.10e-2 of an update from fp32,
#: and `single` rounding its shares each way reproduced each bit for bit
AFTER_SUM = "after_sum"


def divides_after_sum(row: dict[str, str]) -> bool:
    """Whether a cell's compressed all-reduce divides the ranks' sum (Strategy.compressed_divide),
    from its row's strategy and options; False for a name this install does not register
    (the hooks' way)."""
    import strategies as registry

    try:
        spec = registry.get(row.get("strategy") or "")
        options = json.loads(row.get("options") or "{}")
    except (registry.UnknownStrategy, json.JSONDecodeError):
        return False
    return spec.cls is not None and spec.cls.compressed_divide(options) == AFTER_SUM


def compression_key(precision: str, numerics: str, row: dict[str, str] | None = None) -> str:
    """The reference a cell in a REDUCED precision that compresses its gradients is told
    from an uncompressed one by (bench.analysis.verify.uncompressed): `single` in that
    precision with its gradients rounded alike, keyed as `bf16+grad_fp16` (and `+after_sum`
    where `row`'s all-reduce divides the sum of several ranks); '' for any other cell (its
    `rounding` reference tells all)."""
    squeeze = compressed(numerics)
    if precision not in REDUCED or not squeeze:
        return ""
    after = row is not None and rounding_layout(row)[0] > 1 and divides_after_sum(row)
    return f"{precision}+{squeeze}" + (f"+{AFTER_SUM}" if after else "")


#: where a precision reference is past its recipe (AMPLIFIED), a cell in that precision is
#: held to this multiple of the reference's gap from fp32 where that is wider: its own
#: rounding is of the same size. resnet18 at 32 px in bf16, 2 ranks: one step compared,
#: ddp_spawn and fsdp are 0.376 of an update from fp32 as single is; two steps, ddp_spawn
#: 0.612 against single's 0.617, and a DDP that skips its all-reduce 1.23 (tests/test_parity)
REFERENCE_FACTOR = 1.5
#: a reference further than this from fp32 (its weights off by more than the baseline's
#: whole update) leaves nothing to compare in that precision: rounding swamps the update
REFERENCE_LIMIT = 1.0
#: optimizers that scale each gradient component by its own running size: rounding of a
#: component near zero moves its weight by a whole step (horovod_fp16 under AdamW, MNIST,
#: 2 ranks: its reference, which computes what it does to the bit, 2.10e-2 of an update
#: from fp32, past twice the fp16 compression recipe's 1e-2). A precision reference under
#: one is `amplified` up to ADAPTIVE_FACTOR times its recipe, where elsewhere it fails
#: past UNSHOWN_FACTOR
ADAPTIVE = frozenset({"adam", "adamw"})
ADAPTIVE_FACTOR = 5.0
#: the status of a precision reference beyond its recipe's tolerance (and within
#: REFERENCE_LIMIT): the model, optimizer or steps carry rounding further than the recipes'
#: calibration (SGD on MNIST); reported, not a failure
AMPLIFIED = "amplified"
#: where conditioning does not show the model amplifying rounding (or none ran: no
#: BatchNorm), a reference is AMPLIFIED only within this multiple of its recipe, and FAILs
#: past it (ADAPTIVE_FACTOR under Adam): the recipes are calibrated with SGD, which carries
#: rounding a little further with more steps or another learning rate
UNSHOWN_FACTOR = 2.0


def widened(tol: Tolerance, ref: Parity) -> Tolerance:
    """`tol`, or REFERENCE_FACTOR times the reference's gaps where that is wider."""
    loss = max(tol.loss_abs, REFERENCE_FACTOR * ref.loss_abs)
    param = max(tol.param_rel, REFERENCE_FACTOR * ref.param_rel)
    if (loss, param) == (tol.loss_abs, tol.param_rel):
        return tol
    basis = f"{REFERENCE_FACTOR:g}x {ref.label}'s gap"
    return dataclasses.replace(tol, loss_abs=loss, param_rel=param, basis=basis)


Layout = tuple[int, int]  # (shares of the batch normalised apart, micro-batches per share)


def batch_norm_layout(row: dict[str, str], norms: int) -> Layout:
    """How a cell's forwards cut each global batch, as far as BatchNorm sees it: (data
    ranks, micro-batches per rank). (1, 1) where the whole batch is normalised at once (no
    BatchNorm, SyncBatchNorm on, one rank and one micro-batch)."""
    if not norms:
        return (1, 1)
    global_batch = int(row["global_batch"])
    per_rank = int(row.get("per_rank_batch") or global_batch)
    micro = int(row.get("micro_batch") or per_rank)
    ranks = int(row.get("data_ranks") or 1)
    if row.get("launcher") == "inprocess" or row.get("sync_bn") == "1":
        # DataParallel: one process, handled by batch_norm_reason; SyncBatchNorm joins the
        # ranks' shares, but each micro-batch is still normalised on its own
        ranks = 1
    return (ranks, max(per_rank // max(micro, 1), 1))


def batch_norm_reason(row: dict[str, str], norms: int) -> str:
    """Why a cell of a model with BatchNorm cannot be checked against any baseline here, or
    "": DataParallel cuts its batch over devices in its own scatter, which no baseline
    reproduces (the share baselines cover ranks and micro-batches)."""
    if not norms or row.get("sync_bn") == "1":
        return ""
    if row.get("launcher") == "inprocess" and int(row["world_size"]) > 1:
        micro = int(row.get("micro_batch") or row["global_batch"]) // int(row["world_size"])
        return (
            f"{norms} BatchNorm layers normalise over each device's {micro} samples of "
            "DataParallel's scatter, which no baseline here reproduces (--sync-bn makes it "
            "comparable)"
        )
    return ""


def rounding_layout(row: dict[str, str]) -> Layout:
    """The parts whose gradients a cell rounds apart, as a Layout: in a reduced precision
    autocast's backward hands each rank's micro-batch its gradient already rounded, so the
    sum of two shares is not the gradient of the whole batch, BatchNorm or not (MNIST in
    bf16, 8 steps: DDP at 2 ranks is 9.7e-3 of an update from single in bf16, 0 from
    `single --set shares=2` in bf16)."""
    return batch_norm_layout({**row, "sync_bn": "0"}, norms=1)


def precision_layout(row: dict[str, str], norms: int) -> Layout:
    """Where the precision reference of a cell in a REDUCED precision runs: its
    rounding_layout, BatchNorm or not (MNIST in bf16, 2 ranks, 8 steps: DDP and FSDP are
    9.7e-3 of an update from single in bf16 on the whole batch, 0 from it cut into 2 shares;
    a pipeline's 4 micro-batches 3.1e-2 and 0). Under SyncBatchNorm the ranks' shares
    are normalised together, which no single run cut into shares computes: there the
    cell's BatchNorm layout (its micro-batches apart)."""
    if norms and row.get("sync_bn") == "1":
        return batch_norm_layout(row, norms)
    return rounding_layout(row)


def compression_layout(row: dict[str, str], norms: int) -> Layout:
    """Where the reference of a cell in fp32 whose gradients are compressed runs: cut into
    its data ranks' shares, as each rank rounds its own gradient before the sum, and each
    share into the micro-batches its BatchNorm baseline has (none without BatchNorm: the
    layout of its gradients alone, which fp32 micro-batches sum unrounded). Under
    SyncBatchNorm, the cell's own layout, its gradient rounded once (the least a compressed
    all-reduce rounds)."""
    r, k = precision_layout(row, norms)
    return (r, k if norms else 1)


def rounding_reference(row: dict[str, str], norms: int) -> tuple[Layout, str]:
    """The `rounding` reference a cell is held against, as (the layout it runs on, its key):
    in a REDUCED precision, `precision_layout` and the precision; where it compresses its
    gradients in fp32, `compression_layout` and the compression (`+after_sum` where its
    all-reduce divides the sum of several ranks); its baseline's layout and '' as the key
    where it rounds neither."""
    precision, numerics = row.get("precision") or "", row.get("numerics") or ""
    rounds = rounding(precision, numerics)
    if not rounds:
        return batch_norm_layout(row, norms), rounds
    if precision in REDUCED:
        return precision_layout(row, norms), rounds
    layout = compression_layout(row, norms)
    after = layout[0] > 1 and divides_after_sum(row)
    return layout, rounds + (f"+{AFTER_SUM}" if after else "")


def baseline_label(layout: Layout) -> str:
    r, k = layout
    if layout == (1, 1):
        return "single"
    parts = [f"{r} shares"] if r > 1 else []
    parts += [f"{k} micro-batches"] if k > 1 else []
    return f"single, {' x '.join(parts)}"


@dataclass(frozen=True)
class Parity:
    strategy: str
    world_size: int
    setting: str
    numerics: str
    loss_abs: float
    param_abs: float
    param_rel: float
    tol: Tolerance
    status: str  # pass / FAIL / no tolerance / the cell's own status when it did not run

    #: why the cell cannot be compared with the single baseline (not a pass, not a FAIL)
    reason: str = ""
    #: which baseline it was checked against (bench.analysis.verify.baseline_label)
    baseline: str = "single"
    #: running statistics (BatchNorm buffers): max |difference| from the baseline's, which
    #: follows rank 0's rule (NaN: the model has none)
    buffer_abs: float = math.nan
    #: a precision reference (single in bf16/fp16 against fp32 on the cell's layout), not a
    #: strategy's cell: what rounding alone moves (bench.analysis.verify.compare)
    reference: bool = False
    #: an fp32 baseline that did not run to the end (the whole batch's, or one cut into
    #: shares), not a strategy's cell: no cell held to it was compared, and verify fails
    baseline_run: bool = False

    @property
    def ok(self) -> bool:
        if self.baseline_run:  # whatever its status: the cells held to it went uncompared
            return False
        ok = ("pass", AMPLIFIED, INCONCLUSIVE, results.SKIPPED, results.UNAVAILABLE, NOT_COMPARABLE)
        return self.status in ok

    @property
    def label(self) -> str:
        return (
            self.strategy if self.setting in ("", "fp32") else f"{self.strategy} [{self.setting}]"
        )


Case = tuple[str, int, str]  # strategy, world size, setting


def _losses(rd: RunDir) -> dict[Case, list[float]]:
    out: dict[Case, list[float]] = {}
    for s in rd.steps.read():
        if s["repeat"] == "0":
            key = (s["strategy"], int(s["world_size"]), s.get("setting") or "fp32")
            out.setdefault(key, []).append(float(s["loss"]))
    return out


def _params(rd: RunDir, case: Case, which: str = "params") -> dict[str, torch.Tensor]:
    path = rd.path / "cells" / cell_dirname(*case, 0) / f"{which}.pt"
    return torch.load(path, weights_only=True)


def _split_buffers(
    state: dict[str, torch.Tensor], buffers: set[str]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    params = {k: v for k, v in state.items() if k not in buffers}
    return params, {k: v for k, v in state.items() if k in buffers}


def _buffer_diff(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], init: dict[str, torch.Tensor]
) -> tuple[float, float]:
    """Largest |difference| of the buffers both hold, and the running statistics' difference
    relative to how far the baseline's moved from their start, as the weights' (both
    infinite if the cell lacks one; the relative one where a count such as BatchNorm's
    num_batches_tracked differs at all: a forward too many or too few in train mode)."""
    if b.keys() - a.keys():
        return math.inf, math.inf
    diffs = [(a[k].double() - b[k].double()).abs().max().item() for k in b if b[k].numel()]
    floats = [k for k in b if b[k].is_floating_point()]
    _, rel = _param_diff({k: a[k] for k in floats}, {k: b[k] for k in floats}, init)
    if any(not torch.equal(a[k], b[k]) for k in b.keys() - set(floats)):
        rel = math.inf
    if math.isnan(rel) or any(math.isnan(d) for d in diffs):  # a NaN statistic: not within
        return math.inf, math.inf
    return max(diffs, default=math.nan), rel


def _param_diff(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], init: dict[str, torch.Tensor]
) -> tuple[float, float]:
    """Max absolute difference from the baseline, and the difference relative to how far the
    baseline moved from the initial weights (relative to the weights themselves, a strategy
    that trained wrongly would still look close after a few steps)."""
    if a.keys() != b.keys():
        raise ValueError("parameter names differ from the baseline's")
    num = den = worst = 0.0
    for k in b:
        x, y, y0 = a[k].double(), b[k].double(), init[k].double()
        if x.numel():
            worst = max(worst, (x - y).abs().max().item())
        num += (x - y).pow(2).sum().item()
        den += (y - y0).pow(2).sum().item()
    return worst, math.sqrt(num) / max(math.sqrt(den), 1e-30)


def replicas_apart(rd: RunDir, case: Case, mine: _Baseline) -> str:
    """Why the cell's ranks ended with other weights than rank 0's, which alone are compared
    with the baseline (a rank that skipped a step, or averaged its gradients with no one):
    the farthest rank's ||w_rank - w_0|| relative to how far rank 0's moved, past the exact
    tolerance whatever the cell's numerics (every rank applies the same all-reduced update,
    compressed or in bf16 alike); "" where they agree, or where the cell has no record of
    its replicas (its weights are sharded, or it ran one rank:
    bench.harness.worker._save_replica_gaps)."""
    path = rd.path / "cells" / cell_dirname(*case, 0) / "replicas.json"
    if not path.exists():
        return ""
    gaps = json.loads(path.read_text())["param_gap_by_rank"]
    moved = math.sqrt(
        sum(
            (mine.params[k].double() - mine.init[k].double()).pow(2).sum().item()
            for k in mine.params
        )
    )
    rel = [g / max(moved, 1e-30) for g in gaps]
    rank = max(range(len(rel)), key=lambda i: (math.isnan(rel[i]), rel[i]))
    limit = RECIPES["exact"].param_rel
    if rel[rank] <= limit:
        return ""
    return (
        f"rank {rank}'s weights ended {rel[rank]:.3g} of an update from rank 0's (replicas: "
        f"<={limit:.3g}): its replicas fell out of step, and only rank 0's are compared with "
        "the baseline"
    )


BASELINE: Case = ("single", 1, "fp32")


def late_loss_gap(mine: list[float], base: list[float]) -> float:
    """|mean - baseline's mean| / baseline's mean, of the losses of the second half of the
    steps: how far a lossy strategy's training has drifted (NaN counts as infinitely far; so
    does a run of other steps than the baseline's, whose halves are not the same steps)."""
    if len(mine) != len(base):
        return math.inf
    half = len(base) // 2
    a, b = sum(mine[half:]) / len(mine[half:]), sum(base[half:]) / len(base[half:])
    gap = abs(a - b) / abs(b)
    return math.inf if math.isnan(gap) else gap


def untrained_passes(base: list[float], tol: Tolerance) -> str:
    """Why an approximate check cannot tell training from none here ('' where it can): the
    baseline's late loss is within the band of its first step's, the loss of the initial
    weights, so a run whose loss never left that would pass too."""
    if not tol.approximate:
        return ""
    still = late_loss_gap(base[:1] * len(base), base)
    if still > tol.loss_abs:
        return ""
    return (
        f"the baseline's mean loss over the second half of the steps is only {still:.1%} off "
        f"its first step's, inside the {tol.loss_abs:.0%} band: a run that never trained would "
        "pass too; give more --steps, over which the baseline's loss falls further"
    )


def baselines_dir(run_dir: Path) -> Path:
    """Where verify puts the share baselines of a run (one run each, bench.analysis.verify.Layout)."""
    return run_dir / "baselines"


def _layout_id(layout: Layout) -> str:
    return f"shares{layout[0]}-acc{layout[1]}"


@dataclass(frozen=True)
class _Baseline:
    """What a cell is compared with: a baseline run's losses, initial and final weights
    (buffers apart)."""

    label: str
    losses: list[float]
    init: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    setting: str = "fp32"
    numerics: str = "exact"
    #: the threads per rank it computed with, as _cell_threads reads them (0: not matched)
    threads: int = 0


def _single_row(rd: RunDir, precision: str = "fp32") -> dict[str, str] | None:
    """The run's own row of `single` at world size 1 in `precision` and no other option
    (round 0), if it has one: not where no cell could be at world size 1 (across nodes,
    --world-sizes without 1), whose baseline verify runs apart."""
    case = ("single", 1, precision)
    return next(
        (
            r
            for r in rd.runs.read()
            if r["repeat"] == "0"
            and (r["strategy"], int(r["world_size"]), r.get("setting") or "fp32") == case
        ),
        None,
    )


def _baseline_id(layout: Layout, precision: str = "fp32", threads: int = 0) -> str:
    """Where under baselines/ the run of `single` for a layout and precision goes (an fp32
    one on `threads` per rank: `-t2`, where its cells' threads are matched)."""
    on = f"-t{threads}" if threads and precision == "fp32" else ""
    return _layout_id(layout) + on + ("" if precision == "fp32" else f"-{precision}")


def _cell_threads(row: dict[str, str], norms: int) -> int:
    """The threads per rank of the fp32 baseline a cell is held to: its own, on a CPU for a
    model with BatchNorm, since a convolution's gradient there depends on how many threads
    reduce it (1 vs 2 threads: 8e-5 apart on the worked example's first layer, past the
    exact tolerance within a few steps, which that model's conditioning compares); 0 (not
    matched: the run's own single) on a GPU or without BatchNorm, whose cells are held to
    the whole batch's baseline whatever their ranks' threads."""
    n = row.get("threads_per_rank") or ""
    return int(n) if norms and row.get("device") != "cuda" and n.isdigit() else 0


def _baseline_row(
    rd: RunDir, layout: Layout, precision: str = "fp32", threads: int = 0
) -> tuple[RunDir, dict[str, str]] | None:
    """The row of `single` a cell on `layout` in `precision` (fp32: the baseline; bf16/fp16:
    a precision reference) on `threads` per rank (_cell_threads) is held to, and the run it
    is in, where it ran to the end: the run's own single on the whole batch where that is
    on the cell's threads (on any, where `threads` is 0), else the one run apart."""
    own = _single_row(rd, precision) if layout == (1, 1) else None
    if own is not None and own["status"] == results.OK and _on(own, precision, threads):
        return rd, own
    row = _apart_row(rd, layout, precision, threads)
    if row is None or row["status"] != results.OK:
        return None
    return RunDir(baselines_dir(rd.path) / _baseline_id(layout, precision, threads)), row


def _on(single: dict[str, str], precision: str, threads: int) -> bool:
    """Whether the run's own `single` is on `threads` (any, where 0; a precision reference
    has one count per layout: _layout_threads)."""
    return precision != "fp32" or not threads or single.get("threads_per_rank") == str(threads)


def _baseline(
    rd: RunDir,
    layout: Layout,
    buffers: set[str],
    precision: str = "fp32",
    threads: int = 0,
    inert: frozenset[str] = frozenset(),
) -> _Baseline | None:
    """`single` on `layout` in `precision` on `threads` (_baseline_row), read once; None if
    it did not run. `inert`: parameters left out of the weights compared."""
    found = _baseline_row(rd, layout, precision, threads)
    if found is None:
        return None
    brd, row = found
    case = (row["strategy"], int(row["world_size"]), row.get("setting") or "fp32")
    numerics = row.get("numerics") or "exact"
    base = _load(brd, case, buffers, baseline_label(layout), numerics, inert=inert)
    return dataclasses.replace(base, threads=_cell_threads(row, batch_norms(rd.config())))


def _load(
    rd: RunDir,
    case: Case,
    buffers: set[str],
    label: str,
    numerics: str,
    losses: dict[Case, list[float]] | None = None,
    inert: frozenset[str] = frozenset(),
) -> _Baseline:
    """One cell's losses and weights (initial, final, buffers apart, `inert` parameters left
    out: bench.workload.models.inert_parameters); `losses`: the run's, where the caller has
    read them already."""
    params, buffered = _split_buffers(_params(rd, case), buffers)
    params = {k: v for k, v in params.items() if k not in inert}
    init = _params(rd, case, "params_init")
    losses = losses if losses is not None else _losses(rd)
    return _Baseline(label, losses[case], init, params, buffered, case[2], numerics)


@dataclass(frozen=True)
class _Gaps:
    """How far a run is from a baseline (bench.analysis.verify.compare's columns)."""

    loss_abs: float  # max over steps of |loss - baseline's|
    late: float  # relative gap of the mean loss over the second half (approximate recipes)
    param_abs: float
    param_rel: float
    same_start: float  # max |difference| of the initial weights
    same_steps: bool
    buffer_abs: float
    #: running statistics, relative to the baseline's own move, held to the weights'
    #: tolerance (NaN: the model has none): a strategy can train the weights right and leave
    #: them wrong (an extra forward in train mode), and evaluation normalises by them
    buffer_rel: float = math.nan

    def within(self, tol: Tolerance) -> bool:
        good = self.same_start <= tol.init_abs and self.same_steps
        if tol.approximate:
            return good and self.late <= tol.loss_abs
        good = good and not self.buffer_rel > tol.param_rel
        return good and self.loss_abs <= tol.loss_abs and self.param_rel <= tol.param_rel

    def unlike(self, tol: Tolerance, who: str, steps: int, base_steps: int) -> str:
        """Why `who` (its `steps` losses against the baseline's `base_steps`) did not start or
        run as the baseline did, or "": its gaps then compare nothing like for like."""
        if not self.same_steps:
            return f"{who} ran {steps} step(s), the baseline {base_steps}"
        if not self.same_start <= tol.init_abs:
            return (
                f"{who} did not start from the baseline's weights (initial weights "
                f"{self.same_start:.3g} apart at most, past {tol.init_abs:g})"
            )
        return ""

    def past(self, tol: Tolerance) -> str:
        """Which bound of `tol` the gaps exceed, each with its figure, or "" where none is."""
        if tol.approximate:
            return (
                f"late loss {self.late:.3g} from the baseline's, past {tol.loss_abs:.3g}"
                if not self.late <= tol.loss_abs
                else ""
            )
        gaps = (("loss", self.loss_abs, tol.loss_abs), ("params", self.param_rel, tol.param_rel))
        return "; ".join(f"{k} {v:.3g} past {t:.3g}" for k, v, t in gaps if not v <= t)

    def buffers_off(self, tol: Tolerance) -> str:
        """Why the running statistics fail `tol` where the weights do not, or "" (also where
        the weights or the loss are off too: statistics follow wrong weights, and the
        weights' gap is the cause to name)."""
        if tol.approximate or not self.buffer_rel > tol.param_rel:
            return ""
        if not (self.loss_abs <= tol.loss_abs and self.param_rel <= tol.param_rel):
            return ""
        if math.isinf(self.buffer_rel):
            return (
                "running statistics (BatchNorm buffers) differ from the baseline's: a count "
                "(num_batches_tracked) differs (a forward too many or too few in train "
                "mode?), or the cell lacks a buffer"
            )
        return (
            f"running statistics (BatchNorm buffers) {self.buffer_rel:.3g} of their update "
            f"from the baseline's, past {tol.param_rel:.3g}"
        )


def _wrapped_under(missing: list[str], extra: list[str]) -> str:
    """The prefix (`inner.`) that, put before each name the cell lacks, gives the names it
    has instead, or "" where there is none."""
    if not missing or len(missing) != len(extra):
        return ""
    for name in missing:  # the name extra[0] ends with ('fc.weight' ends 'conv.fc.weight' too)
        prefix = extra[0][: -len(name)]
        wrapped = {prefix + m for m in missing} == set(extra)
        if extra[0].endswith(name) and prefix.endswith(".") and wrapped:
            return prefix
    return ""


def other_model(mine: _Baseline, base: _Baseline) -> str:
    """Why a cell's weights are not the baseline model's (names or shapes), or "": it trained
    another model (a plug-in that builds its own, a layer added or left out), which no gap
    can be measured to, and it FAILs saying so."""
    a, b = {**mine.init, **mine.params}, {**base.init, **base.params}
    missing, extra = sorted(b.keys() - a.keys()), sorted(a.keys() - b.keys())
    shapes = sorted(k for k in a.keys() & b.keys() if a[k].shape != b[k].shape)

    def some(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    prefix = _wrapped_under(missing, extra)
    if prefix and all(a[prefix + k].shape == b[k].shape for k in missing):
        # the same model, its names under a wrapper the strategy kept
        return (
            f"its weights have the baseline's names and shapes under {prefix!r}: the strategy "
            "wraps the model in a module of its own, which its unwrap(model) must take off"
        )
    parts = [f"lacks {some(missing)}"] if missing else []
    parts += [f"has {some(extra)}, which the baseline has not"] if extra else []
    parts += [f"holds {some(shapes)} in another shape"] if shapes else []
    return f"it trained another model than the baseline: it {'; '.join(parts)}" if parts else ""


def _gaps(mine: _Baseline, base: _Baseline, norms: int) -> _Gaps:
    n = min(len(mine.losses), len(base.losses))
    pairs = zip(mine.losses[:n], base.losses[:n], strict=True)
    loss_abs = max((abs(a - b) for a, b in pairs), default=math.inf)  # (no step: none alike)
    same_start, _ = _param_diff(mine.init, base.init, base.init)
    p_abs, p_rel = _param_diff(mine.params, base.params, base.init)
    return _Gaps(
        loss_abs,
        late_loss_gap(mine.losses, base.losses),
        p_abs,
        p_rel,
        same_start,
        len(mine.losses) == len(base.losses),
        *(_buffer_diff(mine.buffers, base.buffers, base.init) if norms else (math.nan,) * 2),
    )


def unrounded(g: _Gaps, ref: Parity) -> bool:
    """Whether a cell in a reduced precision (or with compressed gradients) matches fp32 as
    fp32 itself does, where its precision reference (single in that precision, or with its
    gradients rounded, same layout) shows that rounding: a tenth of the reference's gap at
    most, and within the exact recipe. Such a cell trains in fp32 whatever it says
    (autocast that never took effect, a compression hook that does not compress)."""
    exact = RECIPES["exact"]
    shown = ref.status in ("pass", AMPLIFIED) and ref.param_rel > exact.param_rel
    return shown and g.param_rel <= min(exact.param_rel, ref.param_rel / 10)


def uncompressed(
    mine: _Baseline, plain: _Baseline, squeeze: _Baseline
) -> tuple[float, float] | None:
    """Where a cell in a reduced precision that compresses its gradients is as close to
    `plain` (single in that precision, on the cell's rounding_layout) as a tenth of what
    rounding the gradients alone moves it (`squeeze`: the same run with its gradients
    rounded, bench.analysis.verify.compression_key) at most, while that moves it at all: (the
    cell's gap, the reference's), relative to plain's update; else None. There the unrounded
    check cannot tell: both are dominated by the precision's own rounding, far past the
    exact recipe (MNIST in bf16, 8 steps: 5.5e-2 of an update from fp32), while rounding
    gradients autocast already rounded to bf16 moves single in bf16 by 3.2e-6 (fp16; bf16:
    not at all, nothing to tell). On one layout, a hook that does not compress is
    plain's run (DDP at one rank: 0), one that does is the reference's."""
    steps = len(plain.losses)
    if len(mine.losses) != steps or len(squeeze.losses) != steps:
        return None
    _, shown = _param_diff(squeeze.params, plain.params, plain.init)
    _, gap = _param_diff(mine.params, plain.params, plain.init)
    return (gap, shown) if shown > 0 and gap <= shown / 10 else None


def conditioning_of(run_dir: Path) -> Conditioning | None:
    """What verify's conditioning found for a run (None: the model has no BatchNorm, or the
    run is not a verify's)."""
    path = run_dir / "conditioning.json"
    if not path.exists():
        return None
    return Conditioning(**json.loads(path.read_text()))


def amplifies_rounding(run_dir: Path) -> bool:
    """Whether verify's conditioning found the model amplifies rounding: one ulp moved the
    baseline's loss past half the exact tolerance within the steps asked for."""
    cond = conditioning_of(run_dir)
    return cond is not None and cond.horizon < cond.steps


def _apart_row(
    rd: RunDir, layout: Layout, precision: str, threads: int = 0
) -> dict[str, str] | None:
    """The row of `single` run apart under baselines/ for a layout and precision (and
    threads: _baseline_id), if it ran."""
    path = baselines_dir(rd.path) / _baseline_id(layout, precision, threads) / "runs.csv"
    if not path.exists():
        return None
    return next((r for r in RunDir(path.parent).runs.read() if r["repeat"] == "0"), None)


def _unmeasured(case: Case, numerics: str, tol: Tolerance, status: str, **kw: Any) -> Parity:
    """The row of a cell that was not compared (did not run, not comparable, no tolerance):
    no baseline unless `baseline` names the one it would have had."""
    nan = math.nan
    return Parity(*case, numerics, nan, nan, nan, tol, status, **{"baseline": "", **kw})


def _unrun_baseline(rd: RunDir, layout: Layout, threads: int, several: bool) -> Parity:
    """The row of an fp32 baseline (`single` on `layout` on `threads`) that did not run to
    the end: its status and reason, which fail verify (Parity.baseline_run); `several`: its
    layout has baselines on other thread counts too, which the row tells it from."""
    row = _apart_row(rd, layout, "fp32", threads)
    if layout == (1, 1):
        row = row or _single_row(rd)
    row = row or {}
    # the count it was wanted on (the row may be the run's own single, on another)
    n = str(threads) if threads else row.get("threads_per_rank") or ""
    which = "" if layout == (1, 1) else f" ({baseline_label(layout)})"
    why = f"the fp32 baseline{which}" + (f" on {n} thread(s)" if several and n else "")
    why += " did not run to the end"
    why += f" ({row['reason']})" if row.get("reason") else ""
    why += ": no cell it is the baseline of can be compared"
    status = row["status"] if row.get("status", results.OK) != results.OK else "not run"
    case = ("single", 1, row.get("setting") or "fp32")
    numerics = row.get("numerics") or ""
    return _unmeasured(case, numerics, UNKNOWN, status, reason=why, baseline_run=True)


def _unmeasured_reference(ref: _Baseline, layout: Layout, threads: int, precision: str) -> Parity:
    """The row of a precision reference that ran where the fp32 baseline it is measured
    from (single on the cells' `layout`, on the `threads` it ran on itself) did not: not
    comparable, and its cells keep their recipe's tolerance. Cells of one layout on several
    thread counts have a baseline on each, and the reference runs on the fewest; where that
    baseline alone failed, the cells on the others were compared with no reference and no
    word of it."""
    said = precision.replace(f"+{AFTER_SUM}", "")
    on = f" on {threads} thread(s)" if threads else ""
    why = (
        f"the fp32 baseline it is measured from ({baseline_label(layout)}{on}) did not run to "
        f"the end: what {said} alone moves is not known, and cells in {said} on this layout "
        "keep their recipe's tolerance"
    )
    case = ("single", 1, ref.setting)
    kw = {"reason": why, "baseline": baseline_label(layout), "reference": True}
    return _unmeasured(case, ref.numerics, UNKNOWN, NOT_COMPARABLE, **kw)


def _reference(
    rd: RunDir,
    layout: Layout,
    precision: str,
    ref: _Baseline | None,
    base: _Baseline,
    norms: int,
) -> Parity | None:
    """The row of `single` in a reduced precision on `layout` against fp32 on the cell's
    (`base`): what rounding in that precision alone moves (None: it did not run). Within the
    recipe's tolerance it passes; beyond it, it is AMPLIFIED (reported, not a failure: this
    run carries rounding further than the recipe's calibration), up to REFERENCE_LIMIT where
    conditioning showed the model amplifying rounding, up to ADAPTIVE_FACTOR times the
    recipe under an ADAPTIVE optimizer, and up to UNSHOWN_FACTOR times it elsewhere; past
    that, or where it did not start or run as the baseline did, it FAILs. A reference run
    apart that did not end ok is a row with its status and reason; its cells keep their
    recipe's tolerance. `ref`: that run of single, loaded (`_baseline`)."""
    said = precision.replace(f"+{AFTER_SUM}", "")  # (the order of a sum: in the row's setting)
    if ref is None:
        row = _apart_row(rd, layout, precision)
        if row is None:  # not run apart: the run's own row of it (not ok) is in the table
            return None
        why = row.get("reason") or ""
        why = (
            f"the precision reference did not run ({row['status']}{': ' + why if why else ''}); "
            f"cells in {said} on this layout keep their recipe's tolerance"
        )
        case = ("single", 1, row.get("setting") or precision)
        numerics = row.get("numerics") or ""
        return _unmeasured(
            case, numerics, UNKNOWN, row["status"], reason=why, baseline=base.label, reference=True
        )
    tol = tolerance(ref.numerics) or UNKNOWN
    g = _gaps(ref, base, norms)
    amplifies = amplifies_rounding(rd.path)
    optimizer = rd.config().optimizer
    # how far past its recipe a reference may be where conditioning did not show the model
    # amplifying rounding: further under an optimizer that scales components apart
    twice, factor = UNSHOWN_FACTOR, ADAPTIVE_FACTOR if optimizer in ADAPTIVE else UNSHOWN_FACTOR
    within_twice = g.within(tol.scaled(twice))
    unshown = tol.scaled(factor)
    # what is past the recipe: the weights, the loss or both
    past = [f"the weights {g.param_rel:.3g} of an update"] if g.param_rel > tol.param_rel else []
    past += [f"the loss by {g.loss_abs:.3g}"] if g.loss_abs > tol.loss_abs else []
    if g.buffers_off(tol):
        past += [f"the running statistics {g.buffer_rel:.3g} of their update"]
    moves = f"{said} alone moves {' and '.join(past)} from fp32, past {tol.describe()}"
    reason = ""
    if g.within(tol):
        status = "pass"
    elif unlike := g.unlike(tol, f"single in {said}", len(ref.losses), len(base.losses)):
        status = "FAIL"
        reason = unlike
    elif not g.param_rel <= REFERENCE_LIMIT:
        status = "FAIL"
        reason = (
            f"{said} alone moves the weights {g.param_rel:.3g} of an update from fp32: more "
            "than the update itself, so no cell in it can be told from rounding"
        )
    elif not amplifies and not g.within(unshown):
        status = "FAIL"
        reason = (
            f"{moves}, and past {factor:g}x it on a model whose conditioning does not "
            "show it amplifying rounding"
            + (
                f" (under {optimizer}, which scales each gradient component apart)"
                if optimizer in ADAPTIVE
                else ""
            )
            + ": the precision itself is suspect"
        )
    else:
        status = AMPLIFIED
        if amplifies:
            why = "this model amplifies rounding (see conditioning)"
        elif within_twice:
            why = (
                f"within {twice:g}x the recipe, which is calibrated with SGD on "
                "MNIST: this optimizer or step count carries rounding a little further"
            )
        else:
            why = (
                f"{optimizer} scales each gradient component by its own running size, so "
                "rounding its smallest moves weights by whole steps: further than the "
                "recipes' calibration (SGD on MNIST)"
            )
        reason = (
            f"{moves}: {why}; cells in {said} on this layout are held to "
            f"{REFERENCE_FACTOR:g}x this gap"
        )
    measured = (g.loss_abs, g.param_abs, g.param_rel, tol, status)
    case = ("single", 1, ref.setting)
    return Parity(*case, ref.numerics, *measured, reason, base.label, g.buffer_abs, reference=True)


def compare(run_dir: Path) -> list[Parity]:
    rd = RunDir(run_dir)
    rows = [r for r in rd.runs.read() if r["repeat"] == "0"]
    case_of = {
        id(r): (r["strategy"], int(r["world_size"]), r.get("setting") or "fp32") for r in rows
    }
    cfg = rd.config()
    norms = batch_norms(cfg)
    model = meta_model(cfg)
    buffers = {name for name, _ in model.named_buffers()}
    # parameters that cannot change the output (attention's key bias): rounding alone moves
    # them, under Adam by whole steps, and no strategy can train them wrong. And a tied
    # weight's second name (a head that shares the embedding's): counted under each, it
    # weighed twice in the figures
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    tied -= {n for n, _ in model.named_parameters()}
    inert = frozenset(inert_parameters(model) | tied)
    losses = _losses(rd)  # every cell's, read once
    cond = conditioning_of(run_dir)
    # rounding alone past the exact tolerance at once, where that cut the steps compared
    first = cond.at_once if cond and cond.horizon < cond.steps else None

    @functools.cache
    def baseline(layout: Layout, precision: str = "fp32", threads: int = 0) -> _Baseline | None:
        """single on `layout` in `precision` (or a compression's key) on `threads`, its
        weights read once for every cell and reference that is held against it"""
        return _baseline(rd, layout, buffers, precision, threads, inert)

    out = []
    for layout, counts in sorted(_baseline_threads(rd).items()):
        for n in sorted(c for c in counts if baseline(layout, threads=c) is None):
            # the cells ran, and those held to it cannot be compared: a row of its own says
            # how it ended and why (its row run apart, or the run's own), and fails verify,
            # whether it is the whole batch's or one cut into shares (a share baseline that
            # timed out left its cells not comparable, and verify passed); each cell held to
            # it is not comparable, saying so
            out.append(_unrun_baseline(rd, layout, n, several=len(counts) > 1))
    refs: dict[tuple[Layout, str, Layout], Parity | None] = {}

    def reference(layout: Layout, precision: str, at: Layout | None = None) -> Parity | None:
        """single in `precision` run on `at` (the reference_layout; `layout` where None)
        against the fp32 baseline on `layout`, the cell's"""
        at = at or layout
        if (layout, precision, at) not in refs:
            # against fp32 on the threads it ran on: one count per layout (_layout_threads)
            mine = baseline(at, precision)
            ran = (
                mine.threads if mine else _cell_threads(_apart_row(rd, at, precision) or {}, norms)
            )
            base = baseline(layout, threads=ran)
            if base is None and mine is not None:
                # it ran and nothing measures it: a row that says so, not a reference gone
                # from the table while its cells quietly lose it
                refs[(layout, precision, at)] = _unmeasured_reference(mine, layout, ran, precision)
            else:
                refs[(layout, precision, at)] = base and _reference(
                    rd, at, precision, mine, base, norms
                )
        return refs[(layout, precision, at)]

    unfit = not_compared(
        [(r["strategy"], int(r["world_size"]), r.get("precision", ""), r["status"]) for r in rows]
    )
    for r in sorted(rows, key=lambda r: case_of[id(r)]):
        case = case_of[id(r)]
        precision = r.get("precision", "")
        if case == BASELINE:
            continue
        if (r["strategy"], int(r["world_size"]), precision, r["status"]) in unfit:
            continue  # single at world size 2, amp_ddp in fp32: no cell of what was asked
        numerics = r.get("numerics") or ""
        tol = tolerance(numerics) if numerics else None
        # single in a reduced precision with no other option: a precision reference itself
        itself = case == ("single", 1, precision) and precision in REDUCED
        if r["status"] != results.OK:
            if not (itself and _apart_row(rd, (1, 1), precision)):  # (else: the one run apart)
                out.append(
                    _unmeasured(
                        case, numerics, tol or UNKNOWN, r["status"], reason=r.get("reason", "")
                    )
                )
            continue
        layout = batch_norm_layout(r, norms)
        why = batch_norm_reason(r, norms)
        base = None if why else baseline(layout, threads=_cell_threads(r, norms))
        if base is None:
            why = why or f"its baseline ({baseline_label(layout)}) did not run"
            out.append(_unmeasured(case, numerics, UNKNOWN, NOT_COMPARABLE, reason=why))
            continue
        if itself:
            reference(layout, precision)  # its row comes with the references
            continue
        if tol is None:
            out.append(_unmeasured(case, numerics, UNKNOWN, "no tolerance", baseline=base.label))
            continue
        rounds = rounding(precision, numerics)
        at, key = rounding_reference(r, norms)
        ref = reference(layout, key, at) if rounds else None
        if ref is not None and not tol.approximate and not math.isnan(ref.param_rel):
            if not ref.param_rel <= REFERENCE_LIMIT:
                why = f"its precision reference, {ref.label}: {ref.reason}"
                out.append(_unmeasured(case, numerics, tol, NOT_COMPARABLE, reason=why))
                continue
            if ref.status == AMPLIFIED:
                tol = widened(tol, ref)
        mine = _load(rd, case, buffers, "", numerics, losses, inert)
        if why := other_model(mine, base):
            out.append(_unmeasured(case, numerics, tol, "FAIL", reason=why, baseline=base.label))
            continue
        g = _gaps(mine, base, norms)
        measured = (g.late if tol.approximate else g.loss_abs, g.param_abs, g.param_rel, tol)
        status = "pass" if g.within(tol) else "FAIL"
        if status == "FAIL":
            reason = (
                g.unlike(tol, "it", len(mine.losses), len(base.losses))
                or g.buffers_off(tol)
                or g.past(tol)
            )
        else:
            reason = ""
        if status == "FAIL" and not tol.approximate and first is not None:
            why = (
                f"one-ulp twins of the baseline were already {first:.1e} apart in their first "
                "loss (conditioning.txt): this may be rounding"
            )
            reason = f"{reason}; {why}" if reason else why
        if status == "pass" and (why := replicas_apart(rd, case, mine)):
            status, reason = "FAIL", why
        if status == "pass" and ref is not None and unrounded(g, ref):
            status = "FAIL"
            reason = (
                f"{g.param_rel:.3g} of an update from fp32, within fp32's own tolerance, while "
                f"{rounds} alone moves {ref.label} {ref.param_rel:.3g}: "
                + (
                    f"it does not train in {precision} (its rows' speed and memory are not "
                    f"{precision}'s)"
                    if rounds == precision
                    else "it does not compress its gradients (its rows' speed is an "
                    "uncompressed all-reduce's)"
                )
            )
        key = compression_key(precision, numerics, r)
        if status == "pass" and key:
            parts = rounding_layout(r)
            plain, squeeze = baseline(parts, precision), baseline(parts, key)
            if plain is None or squeeze is None:
                status = INCONCLUSIVE
                reason = (
                    f"single in {precision} on its layout ({baseline_label(parts)}), plain or "
                    f"with its gradients rounded to {COMPRESSED[compressed(key)]}, did not "
                    "run: whether it compresses its gradients is not checked"
                )
            elif gaps := uncompressed(mine, plain, squeeze):
                status = "FAIL"
                reason = (
                    f"{gaps[0]:.3g} of an update from {plain.label} in {precision} (on its "
                    f"layout), while rounding the gradients to {COMPRESSED[compressed(key)]} "
                    f"moves that {gaps[1]:.3g}: it does not compress its gradients (its rows' "
                    "speed is an uncompressed all-reduce's)"
                )
        if status == "pass" and (why := untrained_passes(base.losses, tol)):
            status, reason = INCONCLUSIVE, why
        out.append(
            Parity(
                *case,
                numerics,
                *measured,
                status,
                reason=reason,
                baseline=base.label,
                buffer_abs=g.buffer_abs,
            )
        )
    return out + [ref for ref in refs.values() if ref is not None]


def table(parity: list[Parity], steps: int | None = None) -> str:
    """The parity rows as text, with a legend of what was compared: `steps`, the steps every
    cell ran (the run's --max-steps: --steps, or fewer where conditioning cut them)."""
    width = max([26, *(len(p.label) + 1 for p in parity)])
    bwidth = max([9, *(len(p.baseline) + 2 for p in parity)])
    twidth = max([36, *(len(p.tol.describe()) + 2 for p in parity)])
    head = (
        f"{'strategy':<{width}}{'ws':>3}  {'numerics':<20}{'max |dloss|':>12}{'max |dparam|':>13}"
        f"{'rel dparam':>12}  {'tolerance':<{twidth}}{'baseline':<{bwidth}}result"
    )
    lines = [head, "-" * len(head)]
    for p in parity:
        lines.append(
            f"{p.label:<{width}}{p.world_size:>3}  {p.numerics or '-':<20}{p.loss_abs:>12.2e}"
            f"{p.param_abs:>13.2e}{p.param_rel:>12.2e}  {p.tol.describe():<{twidth}}"
            f"{p.baseline or '-':<{bwidth}}{p.status}{' (precision reference)' if p.reference else ''}"
        )
    lines += [f"{p.label} ws={p.world_size}: {p.reason}" for p in parity if p.reason]
    # how many steps, and whose weights: a replica other than rank 0's is not compared
    over = f"; {steps} step(s) compared" if steps else ""
    lines.append(
        f"baseline: single at world size 1, fp32{over}; loss: max over steps of |loss - "
        "baseline's| (the global batch's, averaged over ranks; approximate: relative gap of "
        "the mean loss over the second half of the steps); rel dparam: ||w - w_base|| / "
        "||w_base - w_init|| over parameters, after the last step (rank 0's, gathered where "
        "sharded)"
    )
    if any(p.baseline not in ("single", "") for p in parity):
        lines.append(
            "single, N shares x K micro-batches: the global batch cut as the cell's ranks and "
            "micro-batches cut it, each part's BatchNorm over that part, gradients averaged "
            "(BatchNorm normalises over what each forward sees, so this is what the cell computes)"
        )
    if any(p.reference for p in parity):
        lines.append(
            "precision reference: single in bf16/fp16 (shares=N, accN: the batch cut as the "
            "cell's ranks and micro-batches cut it, each part's gradient rounded), or in fp32 "
            "with its gradients rounded to fp16/bf16 (compress=; with shares=N, each of N "
            "ranks' shares rounded before the sum, as the hooks do), against single at fp32 "
            "on the cell's layout, what that rounding alone moves (not a strategy's cell); "
            f"'{AMPLIFIED}': past its recipe's tolerance (rounding carried further than the "
            "recipes' calibration, SGD on MNIST), and the cells in that precision are then held "
            f"to {REFERENCE_FACTOR:g}x its gap ('{REFERENCE_FACTOR:g}x ref') where that is wider"
        )
    buffered = [p for p in parity if not math.isnan(p.buffer_abs)]
    if buffered:
        worst = max(buffered, key=lambda p: p.buffer_abs)
        lines.append(
            "running statistics (BatchNorm buffers), held to the weights' tolerance relative to "
            "their own update, counts exactly: every strategy keeps rank 0's (DDP broadcasts "
            "rank 0's buffers each forward; the others save rank 0's), and the baseline updates "
            "them from the first share only; largest |difference| "
            f"{worst.buffer_abs:.2e} ({worst.label} ws={worst.world_size})"
        )
    return "\n".join(lines)


def write_csv(parity: list[Parity], path: Path) -> None:
    # whole or not at all: a stop or a full disk mid-write left the rows before it, a
    # verdict on fewer cells that read as the whole of it
    with results.written_whole(path, newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "strategy",
                "world_size",
                "setting",
                "numerics",
                "baseline",
                "max_abs_loss_diff",
                "max_abs_param_diff",
                "rel_param_diff",
                "max_abs_buffer_diff",
                "loss_tolerance",
                "param_tolerance",
                "approximate",
                "result",
                "reason",
                "precision_reference",
                "tolerance_basis",
            ]
        )
        for p in parity:
            w.writerow(
                [
                    p.strategy,
                    p.world_size,
                    p.setting,
                    p.numerics,
                    p.baseline,
                    p.loss_abs,
                    p.param_abs,
                    p.param_rel,
                    p.buffer_abs,
                    p.tol.loss_abs,
                    p.tol.param_rel,
                    int(p.tol.approximate),
                    p.status,
                    p.reason,
                    int(p.reference),
                    # no tolerance at all (no recipe for its numerics, not comparable): none
                    p.tol.basis or ("" if math.isnan(p.tol.loss_abs) else "recipe"),
                ]
            )


#: the training samples verify takes of data that has more, where --limit does not say
VERIFY_LIMIT = 4096


#: the axes whose baseline value parity_config keeps beside what was asked, with their flags
BASELINE_AXES = {
    "precisions": "--precision",
    "accumulate": "--accumulate",
    "compile": "--compile",
    "sync_bn": "--sync-bn",
    "channels_last": "--channels-last",
}


def added_settings(base: RunConfig, pcfg: RunConfig) -> str:
    """A line saying which settings parity_config put beside those asked for, and why
    (every strategy runs them, not single alone: the axes are a product), or ''."""
    added = []
    for field, flag in BASELINE_AXES.items():
        asked, extra = getattr(base, field), getattr(pcfg, field)
        new = [v for v in extra if v not in asked]
        if asked and new:
            words = [("on" if v else "off") if isinstance(v, bool) else str(v) for v in new]
            added.append(f"{flag} {','.join(words)}")
    if not added:
        return ""
    return (
        f"also run: {'; '.join(added)} beside what was asked: single there is the baseline "
        "every cell is compared with, and each strategy's cell there shows whether a "
        "difference is the strategy's or the asked setting's"
    )


def not_compared(cells: list[tuple[str, int, str, str]]) -> set[tuple[str, int, str, str]]:
    """Of (strategy, world size, precision, status), the skipped cells that are no cell of
    what was asked, which verify neither compares nor lists: single at world sizes past 1
    (a layout it cannot have), and the fp32 cells of strategies that never train in fp32
    (amp_ddp: bf16 or fp16) beside a cell of theirs in another precision at that world
    size: parity_config puts fp32 beside every precision asked, for the baseline (amp_ddp
    in fp16 alone read "1 of 2 cell(s) match", one skipped). A strategy not registered
    here is taken as it is."""
    import strategies as registry

    def never_fp32(name: str) -> bool:
        try:
            cls = registry.get(name).cls
        except registry.UnknownStrategy:
            return False
        return cls is not None and "fp32" not in cls.precisions

    other = {(s, ws) for s, ws, p, _ in cells if p != "fp32"}
    return {
        c
        for c in cells
        if c[3] == results.SKIPPED
        and (
            (c[0] == BASELINE[0] and c[1] > 1)
            or (c[2] == "fp32" and (c[0], c[1]) in other and never_fp32(c[0]))
        )
    }


def parity_config(base: RunConfig, steps: int) -> RunConfig:
    strategies = base.strategies
    # where no cell of the run is at world size 1 (across nodes, or --world-sizes without 1)
    # the baseline runs apart, on this machine (bench.analysis.verify.run_share_baselines)
    in_run = not base.multi_host and (not base.world_sizes or 1 in base.world_sizes)
    if strategies and "single" not in strategies and in_run:
        strategies = ("single", *strategies)
    # The baseline is single at fp32, one micro-batch, not compiled: keep those in the axes.
    return base.replace(
        strategies=strategies,
        precisions=base.precisions
        if not base.precisions or "fp32" in base.precisions
        else ("fp32", *base.precisions),
        accumulate=tuple(dict.fromkeys((1, *base.accumulate))),
        compile=tuple(dict.fromkeys((False, *base.compile))),
        sync_bn=tuple(dict.fromkeys((False, *base.sync_bn))),
        channels_last=tuple(dict.fromkeys((False, *base.channels_last))),
        **SET_BY_VERIFY,
        max_steps=steps,
        save_params=True,
        no_dropout=True,  # its masks depend on how the batch is split over ranks
        no_augment=True,  # the plain images: center crops, as the held-out ones
        no_tf32=True,  # fp32 is fp32 on a GPU too: cuDNN's convolutions round to TF32 by default
    )


def _baselined(rd: RunDir) -> Iterator[tuple[dict[str, str], Layout]]:
    """The rows verify plans baselines for (ok, repeat 0, comparable at all), each with its
    layout: what _baseline_threads, reference_layouts and _layout_threads read alike."""
    norms = batch_norms(rd.config())
    for r in rd.runs.read():
        if r["status"] == results.OK and r["repeat"] == "0" and not batch_norm_reason(r, norms):
            yield r, batch_norm_layout(r, norms)


def baseline_config(cfg: RunConfig, out_dir: Path, run_id: str, **changes) -> RunConfig:
    """`single` alone at world size 1, fp32, no other run option (but `changes`): a baseline
    run of `cfg`'s model and data, into out_dir/run_id, on this machine (where the cells ran
    across nodes too: single runs in one process)."""
    plain = dict(
        strategies=("single",),
        exclude=(),
        world_sizes=(1,),
        precisions=("fp32",),
        accumulate=(1,),
        compile=(False,),
        compile_mode="default",
        sync_bn=(False,),
        channels_last=(False,),
    )
    return cfg.one_host().replace(**{**plain, **changes}, out_dir=str(out_dir), run_id=run_id)


def reference_layouts(run_dir: Path) -> list[tuple[Layout, str]]:
    """The precision references a run's cells need and its own cells do not hold: per
    layout and reduced precision a comparable cell ran in, `single` in that precision; per
    compression_layout and gradient compression of a cell in fp32, `single --set
    compress=...`; per rounding layout of a compressing cell in a reduced precision, single
    in that precision with and without `--set compress=...` (in that order: the first's
    threads are the second's)."""
    rd = RunDir(run_dir)
    norms = batch_norms(rd.config())
    wanted = {
        reference for r, _ in _baselined(rd) if (reference := rounding_reference(r, norms))[1]
    }
    # a compressing cell in a reduced precision: single in it, plain and with its gradients
    # rounded alike, on the cell's rounding layout (bench.analysis.verify.uncompressed)
    wanted |= {
        (rounding_layout(r), p)
        for r, _ in _baselined(rd)
        if (key := compression_key(r.get("precision") or "", r.get("numerics") or "", r))
        for p in (r["precision"], key)
    }
    return sorted(
        (layout, p) for layout, p in wanted if layout != (1, 1) or _apart(_single_row(rd, p))
    )


def _apart(row: dict[str, str] | None) -> bool:
    """Whether `single`'s row (of the baseline or a reference) must run apart: the run could
    not hold it. One that failed in the run is not re-run."""
    return row is None or row["status"] == results.SKIPPED


def again(cfg: RunConfig) -> str:
    """How to go on from a verify stopped part-way (Ctrl-C, SIGTERM, a full disk): the
    --resume of the run it stopped in would finish that run alone, with no verdict, which
    takes the cells, their baselines and the comparison of one verify."""
    other = " under another --run-id" if cfg.run_id else ""
    return f"{results.VERIFY_AGAIN}{other}"


def baseline_runs(run_dir: Path) -> list[tuple[Layout, int]]:
    """The fp32 baselines verify runs apart, as (layout, threads per rank): one per layout
    the cells need and thread count they ran on (_cell_threads), but for the whole batch on
    the threads of the run's own `single`, which is that baseline (any threads, where they
    are not matched), or where that single failed in the run (not re-run). model_split on
    the worked example at 2 ranks (a thread each) was 1.5e-4 of an update from the run's
    single at 2 threads, past the exact tolerance; 0 from single at 1."""
    rd = RunDir(run_dir)
    single = _single_row(rd)
    out = []
    for layout, counts in sorted(_baseline_threads(rd).items()):
        for n in sorted(counts):
            # the run's own single where its threads are the cells' (or one that failed)
            own = layout == (1, 1) and not _apart(single)
            if not (own and (single["status"] != results.OK or _on(single, "fp32", n))):
                out.append((layout, n))
    return out


def _baseline_threads(rd: RunDir) -> dict[Layout, set[int]]:
    """The fp32 baselines the cells are held to, by layout: the thread counts (_cell_threads)
    of the cells on each; the whole batch's always (the table's baseline, and whether it
    ran decides whether verify can say anything), on as many threads as the machine gives
    where no cell is on it."""
    norms = batch_norms(rd.config())
    out: dict[Layout, set[int]] = {}
    for r, layout in _baselined(rd):
        out.setdefault(layout, set()).add(_cell_threads(r, norms))
    out.setdefault((1, 1), {0})
    return out


def run_share_baselines(run_dir: Path, cfg: RunConfig, echo=print) -> None:
    """One `single --set shares=R --accumulate K` run per layout the cells need (and thread
    count they ran on: baseline_runs), through the same harness, under run_dir/baselines/;
    the plain baseline there too where the run's own single could not hold it (across
    nodes, no cell at world size 1, cells on other threads); and the precision references
    (the same in bf16/fp16) the run's own cells do not hold."""
    threads = _layout_threads(run_dir)
    plain = [(layout, "fp32", n) for layout, n in baseline_runs(run_dir)]
    refs = [(layout, p, threads.get(layout, 0)) for layout, p in reference_layouts(run_dir)]
    for layout, precision, n in plain + refs:
        r, k = layout
        options = {"shares": str(r)} if r > 1 else {}
        # the precision the reference trains in, where it is not its key (a compression)
        trains = next((p for p in precision.split("+") if p in REDUCED), "fp32")
        on = f", with {n} thread(s) as its cells had" if n else ""
        if layout == (1, 1) and precision == "fp32":
            echo(f"baseline: single at world size 1, fp32{on or ', on this machine'}")
        elif precision == "fp32":
            echo(f"baseline for BatchNorm over shares: {baseline_label(layout)}{on}")
        elif squeeze := compressed(precision):
            echo(f"precision reference: {baseline_label(layout)}, {precision} (gradients rounded)")
            options["compress"] = COMPRESSED[squeeze]
            if AFTER_SUM in precision.split("+") and r > 1:  # (one share: nothing to place)
                options["compress_divide"] = AFTER_SUM
            # in a reduced precision: run as single in it on this layout ran, which it is
            # compared with (bench.analysis.verify.uncompressed)
            uncompressed = _apart_row(RunDir(run_dir), layout, trains) or (
                _single_row(RunDir(run_dir), trains) if layout == (1, 1) else None
            )
            ran = (uncompressed or {}).get("threads_per_rank") or ""
            if trains != "fp32" and ran.isdigit():
                n = int(ran)
        else:
            echo(f"precision reference: {baseline_label(layout)}, in {precision}")
        layout_cfg = baseline_config(
            cfg,
            baselines_dir(run_dir),
            _baseline_id(layout, precision, n),
            options=options,
            precisions=(trains,),
            threads_per_rank=n,
        )
        run_matrix(layout_cfg.replace(accumulate=(k,)), echo=echo, again=again(cfg))


def _layout_threads(run_dir: Path) -> dict[Layout, int]:
    """The threads per rank a precision reference on each layout runs with: the fewest of
    the cells it is the reference of, one run per layout (what rounding in bf16 moves
    dwarfs what a thread count does), held against the fp32 baseline on its threads."""
    out: dict[Layout, int] = {}
    rd = RunDir(run_dir)
    norms = batch_norms(rd.config())
    for r, layout in _baselined(rd):
        n = r.get("threads_per_rank") or ""
        if r.get("device") != "cuda" and n.isdigit():
            # the cell's layout, the one its rounding reference runs on (a cell's in a
            # reduced precision, or a compressing cell's in fp32), and the rounding layout
            # of a compressing cell in a reduced precision, whose references run on it
            # (bench.analysis.verify.reference_layouts)
            squeezes = compression_key(r.get("precision") or "", r.get("numerics") or "")
            for each in {
                layout,
                rounding_reference(r, norms)[0],
                *([rounding_layout(r)] if squeezes else []),
            }:
                out[each] = min(out.get(each, int(n)), int(n))
    return out


#: twins of the baseline run to measure a model's conditioning (bench.analysis.verify.conditioning)
TWINS = (1, 2)


@dataclass(frozen=True)
class Conditioning:
    """How far rounding alone carries the baseline: per step, the largest |loss difference|
    of its twins (same run, weights one ulp apart), and the steps that can be compared
    before that exceeds half the exact tolerance."""

    steps: int  # asked for
    horizon: int  # steps compared
    gaps: tuple[float, ...]
    shares: int

    @property
    def at_once(self) -> float | None:
        """The twins' gap in their first loss where that is already past half the exact
        tolerance (the forward alone amplifies one ulp: TF32 convolutions on a GPU, or
        BatchNorm over very few samples), else None: one step is still compared, and an
        exact cell's FAIL may then be rounding."""
        first = self.gaps[0] if self.gaps else 0.0
        return first if first > RECIPES["exact"].loss_abs / 2 else None

    def describe(self) -> str:
        gaps = ", ".join(f"{g:.1e}" for g in self.gaps)
        head = (
            f"conditioning: the baseline ({self.shares} share(s)) and {len(TWINS)} twins whose "
            f"weights start one ulp apart differ in loss by [{gaps}] over {self.steps} steps"
        )
        if self.horizon >= self.steps:
            return head + ": every step compared"
        if self.at_once is not None:
            return (
                head + "; rounding alone moves even the first loss past half the exact "
                "tolerance, so 1 step is compared, and a FAIL at the exact tolerance may be "
                "rounding here (a model BatchNorm conditions better, larger images or batch, "
                "tells)"
            )
        return (
            head + f"; rounding alone moves the loss past half the exact tolerance from step "
            f"{self.horizon + 1} on, so {self.horizon} step(s) are compared, losses and the "
            "weights after them (a wrong gradient shows from the first update)"
        )


def conditioning_shares(cfg: RunConfig) -> int:
    """The shares the conditioning runs cut the batch into: as many as the largest world
    size of the matrix, where BatchNorm sees them (1 without)."""
    # the sizes the matrix spans: with no --world-sizes, 1, 2, 4, ... up to the devices, as
    # the runner plans them (a 4-GPU machine's cells at 4 ranks normalise over 4 shares)
    asked = cfg.world_sizes or default_world_sizes(device_count(usable_device(cfg.device)))
    sizes = [w for w in asked if cfg.global_batch % w == 0]
    if not sizes:
        sizes = [2] if cfg.global_batch % 2 == 0 else [1]
    return max(sizes) if batch_norms(cfg) else 1


def conditioning(cfg: RunConfig, steps: int, out_dir: Path, echo=print) -> Conditioning:
    """Run the baseline and its twins for `steps` steps (with the batch cut into as many
    shares as the largest world size asked for, where BatchNorm sees them) and find the
    horizon: the steps before rounding alone moves the loss by more than half the exact
    tolerance. BatchNorm over a few samples can amplify a one-ulp difference a
    thousandfold within a step, past any fixed tolerance (resnet18 at 32 px: 1e-6 at step
    1, 1e-2 at step 4); comparing steps after that would FAIL a correct strategy."""
    shares = conditioning_shares(cfg)
    seeds = ",".join(map(str, (0, *TWINS)))
    run_dir, rows = run_matrix(
        baseline_config(
            cfg, out_dir, "conditioning", options={"shares": str(shares), "perturb": seeds}
        ),
        echo=echo,
        again=again(cfg),
        kept=False,  # verify removes its folder when stopped: no rows there to point to
    )
    bad = [r for r in rows if r["status"] != results.OK]
    if bad:
        # out of the hidden folder verify removes as it ends, which the line pointed to
        kept = Path(cfg.out_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-conditioning-{os.getpid()}"
        try:
            shutil.move(str(run_dir), str(kept))
        except OSError as exc:  # the line still says why the run failed, and where it went
            kept = Path(f"{run_dir} (removed as verify ends: it could not be kept, {exc})")
        raise ConfigError(
            f"verify could not measure the model's conditioning: the baseline or a twin "
            f"ended {bad[0]['status']} ({bad[0].get('reason', '')}); its logs: {kept}"
        )
    # the baseline (perturb=0) first, then its twins
    cases = sorted(_losses(RunDir(run_dir)).items(), key=lambda kv: "perturb=0" not in kv[0][2])
    runs = [losses for _, losses in cases]
    base, twins = runs[0], runs[1:]
    n = min(map(len, runs))
    gaps = tuple(max(abs(t[i] - base[i]) for t in twins) for i in range(n))
    # the loss of step i is computed on the weights after i updates: once it is off, so are
    # those weights, and the updates before it are what can be compared
    limit = RECIPES["exact"].loss_abs / 2
    first_off = next((i for i, g in enumerate(gaps) if not g <= limit), None)
    horizon = steps if first_off is None else max(first_off - 1, 1)
    return Conditioning(steps, horizon, gaps, shares)


def verify(
    base: RunConfig,
    steps: int,
    echo=print,
    condition: bool | None = None,
    *,
    planned: bool = False,
) -> tuple[Path, list[Parity]]:
    """Parity of every cell with its baseline. `condition` (default: for models with
    BatchNorm) first measures how many steps rounding alone leaves comparable, and compares
    only those. `planned`: the caller has planned parity_config(base, steps) already
    (cmd_verify, for its checks), so its cells and data are not checked a second time."""
    cfg = parity_config(base, steps)
    if not planned:
        plan(cfg)  # bad input: one line before anything runs
    with stops_said(cfg):
        return _verify(cfg, base, steps, echo, condition)


@contextlib.contextmanager
def stops_said(cfg: RunConfig) -> Iterator[None]:
    """Ctrl-C or SIGTERM between verify's runs (its comparison, the steps from one run to the
    next) says how to go on, as a stop in one of its runs does, where it was `parabench:
    interrupted` alone."""
    try:
        yield
    except proc.Interrupted:  # in a run, which said it
        raise
    except KeyboardInterrupt:
        print(f"interrupted: {again(cfg)}", file=sys.stderr, flush=True)
        raise proc.Interrupted from None


def _verify(
    cfg: RunConfig, base: RunConfig, steps: int, echo: Any, condition: bool | None
) -> tuple[Path, list[Parity]]:
    cond = None
    scratch = Path(cfg.out_dir) / f".conditioning-{os.getpid()}"
    try:
        if condition if condition is not None else bool(batch_norms(cfg)):
            cond = conditioning(cfg, steps, scratch, echo=echo)
            echo(cond.describe())
            cfg = parity_config(base, cond.horizon)
        run_dir, _ = run_matrix(cfg, echo=echo, again=again(cfg))
        if cond is not None:
            shutil.move(str(scratch / "conditioning"), str(run_dir / "conditioning"))
    finally:  # stopped or not (verify has no --resume): no hidden folder left behind
        shutil.rmtree(scratch, ignore_errors=True)
    if cond is not None:
        # whole or not at all, as the run's own files: a full disk leaves no half a JSON
        results.write_whole(run_dir / "conditioning.txt", cond.describe() + "\n")
        results.write_whole(
            run_dir / "conditioning.json", json.dumps(dataclasses.asdict(cond)) + "\n"
        )
    run_share_baselines(run_dir, cfg, echo=echo)
    parity = compare(run_dir)
    write_csv(parity, run_dir / "verify.csv")
    return run_dir, parity


def cmd_verify(a: argparse.Namespace) -> int:
    from bench.cli import _given, config_from_args

    ignored = _given(
        a, only=(*SET_BY_VERIFY, "max_steps"), but={**SET_BY_VERIFY, "max_steps": a.steps}
    )
    if ignored:
        raise ConfigError(
            f"verify trains every cell the same --steps steps, one epoch, no warm-up, one "
            f"repeat, no probes: {', '.join(ignored)} would be ignored; leave them out"
        )
    cfg = config_from_args(a)
    # bad input: one line before anything runs (the conditioning runs come before the run
    # whose directory the runner checks, and a missing baseline shows only after every cell)
    if a.steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {a.steps}")
    if "single" in cfg.exclude:
        raise ConfigError(
            "--exclude single: verify compares every strategy with single, its baseline; "
            "leave it in"
        )
    path = Path(cfg.out_dir) / cfg.run_id
    # one stopped before its first row too (the runner would say to --resume it)
    if cfg.run_id and any((path / f).exists() for f in ("runs.csv", "config.json")):
        raise ConfigError(f"{path} already holds a run; use another --run-id")
    # verify's own cap on the training samples, where the data has more (a --limit above
    # them is refused); synthetic data has as many as it says
    if a.limit is None and cfg.dataset == "synthetic":
        cfg = cfg.replace(limit=VERIFY_LIMIT)
    # a name no model has, first, as plan() checks it: the data check below would take it
    # for a torchvision model, and a typo read "takes 3-channel images and MNIST is 1-channel"
    check_model(cfg.model)
    samples = data.checked(parity_config(cfg, a.steps))[1]
    if a.limit is None and samples > VERIFY_LIMIT:
        cfg, samples = cfg.replace(limit=VERIFY_LIMIT), VERIFY_LIMIT
    pcfg = parity_config(cfg, a.steps)
    added = added_settings(cfg, pcfg)
    if added:
        # what was asked, alone: where none of its cells can run, the cells verify adds
        # beside them (fp32, one micro-batch, ...) would be verified in their place. Planned
        # as verify runs it (no warm-up, parameters saved), not as `run` would: tp's cells
        # were refused for the warm-up verify itself refuses, under --precision bf16 alone
        asked = {field: getattr(cfg, field) for field in BASELINE_AXES}
        plan(pcfg.replace(strategies=cfg.strategies, **asked))
    cells = plan(pcfg)
    if not any(not c.status and (c.strategy, c.world_size, c.label) != BASELINE for c in cells):
        raise ConfigError(
            "nothing to compare: the only cell to run is the baseline, single at world size 1 "
            "in fp32; name other strategies, world sizes or settings"
        )
    if samples // pcfg.global_batch < a.steps:
        raise ConfigError(
            f"--steps {a.steps}: the data holds {samples // pcfg.global_batch} steps of global "
            f"batch {pcfg.global_batch} ({samples} training samples); lower --steps, or raise "
            "--limit where the data has more"
        )
    if a.dry_run:
        from bench.harness import estimate

        unfit = not_compared(
            [(c.strategy, c.world_size, c.setting.precision, c.status) for c in cells]
        )
        cells = [
            c
            for c in cells
            if (c.strategy, c.world_size, c.setting.precision, c.status) not in unfit
        ]
        print(estimate.plan_text(pcfg, cells, estimate.estimate(pcfg, cells)))
        if batch_norms(pcfg):  # BatchNorm: runs of single that verify() adds (README)
            print(
                f"before the cells, {1 + len(TWINS)} runs of single, the batch cut into "
                f"{conditioning_shares(pcfg)} share(s), weights one ulp apart: the "
                "conditioning (how many of the steps BatchNorm leaves comparable); after them, "
                "single cut as each cell's ranks and micro-batches cut the batch, where they "
                "do: the share baselines (neither is in the estimate above)"
            )
        if not any(c.strategy == "single" and not c.status for c in cells):
            print("then the baseline: single at world size 1, fp32, on this machine")
        reduced = sorted({c.setting.precision for c in cells if not c.status} & set(REDUCED))
        if reduced:
            print(
                f"and single in {', '.join(reduced)} on each layout the cells use, where the "
                "run does not hold it: the precision references (what rounding alone moves)"
            )
        squeezed = sorted({_compresses(c) for c in cells} - {""})
        if squeezed:
            print(
                f"and single with its gradients rounded to {', '.join(squeezed)} on each layout "
                "the compressing cells use: the compression references (what that rounding "
                "alone moves)"
            )
        if added:
            print(added)
        return 0
    if added:
        print(added, flush=True)
    run_dir, parity = verify(cfg, a.steps, planned=True)  # pcfg's plan, above
    print(table(parity, RunDir(run_dir).config().max_steps))
    if cfg.multi_host:
        print(
            f"the cells ran across {cfg.nodes} node(s) ({', '.join(cfg.hosts) or 'srun'}); "
            "their baseline, single, ran on this machine"
        )
    cond = run_dir / "conditioning.txt"
    if cond.exists():
        print(cond.read_text().strip())
    print(f"parity results: {run_dir / 'verify.csv'}")
    print("\n".join(summary(parity)))
    return 0 if all(p.ok for p in parity) else 1


def _compresses(cell: Any) -> str:
    """The dtype a runnable cell's gradients are compressed to (Strategy.compresses), or ""."""
    import strategies as registry

    spec = registry.get(cell.strategy)
    if cell.status or spec is None or spec.cls is None or spec.variant is None:
        return ""
    return spec.cls.compresses({**spec.variant.options, **dict(cell.options)})


def summary(parity: list[Parity]) -> list[str]:
    """verify's closing lines: how many cells pass, and of the rest, why, each kind apart (a
    cell that did not run or has no tolerance fails verify, but it does not mismatch)."""
    # the fp32 baseline's own row, where it did not run to the end (compare): not a cell
    base = [p for p in parity if p.baseline_run]
    cells = [p for p in parity if not p.reference and not p.baseline_run]
    count = Counter(p.status for p in cells)
    lines = [f"{count['pass']} of {len(cells)} cell(s) match their baseline"]
    refs = len(parity) - len(cells) - len(base)
    if not cells and refs:  # single in bf16 alone: a precision reference, no strategy's cell
        lines = [f"no cell of a strategy compared: {refs} precision reference(s) alone"]
    elif not cells:  # single alone at fp32: the baseline, with nothing held to it
        lines = ["no cell of a strategy compared: single at fp32 is the baseline itself"]
    for b in base:
        which = "" if b.setting == BASELINE[2] else f" {b.label}"
        lines.append(
            f"the fp32 baseline{which} ended {b.status}: verify fails, and no cell held to it "
            "was compared (reason above)"
        )
    if count.get(NOT_COMPARABLE):
        lines.append(
            f"{count[NOT_COMPARABLE]} cell(s) not comparable with any baseline (reasons above)"
        )
    # inconclusive: an approximate check a run that never trained would pass too, or a
    # compressing cell in bf16/fp16 whose compression references did not run
    loose = sum(p.status == INCONCLUSIVE and p.tol.approximate for p in cells)
    if loose:
        lines.append(
            f"{loose} approximate check(s) inconclusive: within their band, as a run "
            "that never trained would be (reasons above)"
        )
    if count[INCONCLUSIVE] > loose:
        lines.append(
            f"{count[INCONCLUSIVE] - loose} cell(s) inconclusive: within their tolerance, but "
            "whether they compress their gradients is not checked (reasons above)"
        )
    idle = sum(count[s] for s in (results.SKIPPED, results.UNAVAILABLE))
    if idle:
        lines.append(f"{idle} cell(s) skipped or unavailable here (reasons above)")
    if count.get("FAIL"):
        lines.append(
            f"{count['FAIL']} cell(s) FAIL: outside their tolerance, not started or run as "
            "the baseline was, or too close to fp32 for the rounding they claim (reasons above)"
        )
    if count.get("no tolerance"):
        lines.append(
            f"{count['no tolerance']} cell(s) have no stated tolerance for their numerics: "
            "not judged, and verify fails"
        )
    known = {"pass", "FAIL", "no tolerance", NOT_COMPARABLE, INCONCLUSIVE}
    known |= {results.SKIPPED, results.UNAVAILABLE}
    broken = {s: n for s, n in sorted(count.items()) if s not in known}
    if broken:
        what = ", ".join(f"{n} {s}" for s, n in broken.items())
        lines.append(f"{sum(broken.values())} cell(s) did not run to the end ({what}): no verdict")
    refs = sum(p.reference and not p.ok for p in parity)
    if refs:
        lines.append(f"{refs} precision reference(s) failed (reasons above)")
    return lines
