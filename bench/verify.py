"""`parabench verify`: does every strategy still train the same model as the baseline?

Runs every available strategy for K steps through the normal harness (same seed,
global batch and sample order; dropout off, since its masks depend on the rank
layout), then compares each run's per-step losses and final parameters with those of
`single` at fp32 (the plain baseline). Tolerances come from the numeric recipe each
cell declares (its `numerics` column: exact fp32, bf16/fp16 autocast, fp16/bf16 gradient
compression, PowerSGD, apex), never from a precision string; a recipe of several parts
takes the loosest part's. PowerSGD is lossy by design: its check is the mean loss of the last steps within a
stated band of the baseline's, and the table marks it approximate. Exit code 1 if any
strategy fails.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from bench import results
from bench.config import ConfigError, RunConfig
from bench.models import batch_norms
from bench.runner import RunDir, cell_dirname, run_matrix


@dataclass(frozen=True)
class Tolerance:
    loss_abs: float
    param_rel: float  # ||p - p_single|| / ||p_single - p_init||: error relative to the update
    #: initial weights may differ by this much (apex O2 keeps the model's copy in fp16)
    init_abs: float = 0.0
    #: lossy by design (PowerSGD): weights are not compared; the mean loss over the second
    #: half of the steps must be within `loss_abs` of the baseline's, *relative* to it
    approximate: bool = False

    def describe(self) -> str:
        if math.isnan(self.loss_abs):
            return "-"
        if self.approximate:
            return f"late loss within {self.loss_abs:.0%} (approximate)"
        return f"loss<={self.loss_abs:g}, params<={self.param_rel:g}"


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


def batch_norm_reason(row: dict[str, str], norms: int) -> str:
    """Why a cell of a model with BatchNorm computes something else than the one-process
    baseline, or "": each forward normalises over its own share of the batch (per rank, per
    micro-batch, per DataParallel replica) unless SyncBatchNorm joins them."""
    if not norms or row.get("sync_bn") == "1":
        return ""
    global_batch = int(row["global_batch"])
    micro = int(row.get("micro_batch") or global_batch)
    if row.get("launcher") == "inprocess" and int(row["world_size"]) > 1:
        micro //= int(row["world_size"])  # DataParallel splits its batch over its devices
    if micro >= global_batch:
        return ""
    return (
        f"{norms} BatchNorm layers normalise over each forward's {micro} samples, the "
        f"baseline's over {global_batch}: a different computation, not an error "
        "(--sync-bn on GPU, or a model without BatchNorm, makes it comparable)"
    )


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

    @property
    def ok(self) -> bool:
        return self.status in ("pass", results.SKIPPED, results.UNAVAILABLE, NOT_COMPARABLE)

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


BASELINE: Case = ("single", 1, "fp32")


def late_loss_gap(mine: list[float], base: list[float]) -> float:
    """|mean - baseline's mean| / baseline's mean, of the losses of the second half of the
    steps: how far a lossy strategy's training has drifted (NaN counts as infinitely far)."""
    half = len(base) // 2
    a, b = sum(mine[half:]) / len(mine[half:]), sum(base[half:]) / len(base[half:])
    gap = abs(a - b) / abs(b)
    return math.inf if math.isnan(gap) else gap


def compare(run_dir: Path) -> list[Parity]:
    rd = RunDir(run_dir)
    rows = [r for r in rd.runs.read() if r["repeat"] == "0"]
    case_of = {
        id(r): (r["strategy"], int(r["world_size"]), r.get("setting") or "fp32") for r in rows
    }
    base_row = next((r for r in rows if case_of[id(r)] == BASELINE), None)
    if base_row is None or base_row["status"] != results.OK:
        raise ConfigError("the single baseline (fp32) did not run; parity needs it")
    losses = _losses(rd)
    base_loss = losses[BASELINE]
    base_params = _params(rd, BASELINE)
    base_init = _params(rd, BASELINE, "params_init")
    norms = batch_norms(rd.config())
    out = []
    for r in rows:
        case = case_of[id(r)]
        if case == BASELINE:
            continue
        name, ws, setting = case
        numerics = r.get("numerics") or ""
        tol = tolerance(numerics) if numerics else None
        nan = math.nan
        if r["status"] != results.OK:
            out.append(
                Parity(name, ws, setting, numerics, nan, nan, nan, tol or UNKNOWN, r["status"])
            )
            continue
        why = batch_norm_reason(r, norms)
        if why:
            out.append(
                Parity(name, ws, setting, numerics, nan, nan, nan, UNKNOWN, NOT_COMPARABLE, why)
            )
            continue
        if tol is None:
            out.append(Parity(name, ws, setting, numerics, nan, nan, nan, UNKNOWN, "no tolerance"))
            continue
        mine = losses[case]
        n = min(len(mine), len(base_loss))
        loss_abs = max(abs(a - b) for a, b in zip(mine[:n], base_loss[:n], strict=True))
        same_start, _ = _param_diff(_params(rd, case, "params_init"), base_init, base_init)
        p_abs, p_rel = _param_diff(_params(rd, case), base_params, base_init)
        if tol.approximate:
            loss_abs = late_loss_gap(mine, base_loss)
            good = same_start <= tol.init_abs and len(mine) == len(base_loss)
            good = good and loss_abs <= tol.loss_abs
        else:
            good = (
                same_start <= tol.init_abs
                and len(mine) == len(base_loss)
                and loss_abs <= tol.loss_abs
                and p_rel <= tol.param_rel
            )
        status = "pass" if good else "FAIL"
        out.append(Parity(name, ws, setting, numerics, loss_abs, p_abs, p_rel, tol, status))
    return out


def table(parity: list[Parity]) -> str:
    width = max([26, *(len(p.label) + 1 for p in parity)])
    head = (
        f"{'strategy':<{width}}{'ws':>3}  {'numerics':<20}{'max |dloss|':>12}{'max |dparam|':>13}"
        f"{'rel dparam':>12}  {'tolerance':<36}result"
    )
    lines = [head, "-" * len(head)]
    for p in parity:
        lines.append(
            f"{p.label:<{width}}{p.world_size:>3}  {p.numerics or '-':<20}{p.loss_abs:>12.2e}"
            f"{p.param_abs:>13.2e}{p.param_rel:>12.2e}  {p.tol.describe():<36}{p.status}"
        )
    lines += [f"{p.label} ws={p.world_size}: {p.reason}" for p in parity if p.reason]
    lines.append(
        "baseline: single at world size 1, fp32; loss: max over steps of |loss - baseline's| "
        "(approximate: relative gap of the mean loss over the second half of the steps); "
        "rel dparam: ||w - w_base|| / ||w_base - w_init||"
    )
    return "\n".join(lines)


def write_csv(parity: list[Parity], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "strategy",
                "world_size",
                "setting",
                "numerics",
                "max_abs_loss_diff",
                "max_abs_param_diff",
                "rel_param_diff",
                "loss_tolerance",
                "param_tolerance",
                "approximate",
                "result",
                "reason",
            ]
        )
        for p in parity:
            w.writerow(
                [
                    p.strategy,
                    p.world_size,
                    p.setting,
                    p.numerics,
                    p.loss_abs,
                    p.param_abs,
                    p.param_rel,
                    p.tol.loss_abs,
                    p.tol.param_rel,
                    int(p.tol.approximate),
                    p.status,
                    p.reason,
                ]
            )


def parity_config(base: RunConfig, steps: int) -> RunConfig:
    strategies = base.strategies
    if strategies and "single" not in strategies:
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
        epochs=1,
        max_steps=steps,
        warmup_steps=0,
        repeats=1,
        eval_samples=0,
        save_params=True,
        no_dropout=True,  # its masks depend on how the batch is split over ranks
    )


def verify(base: RunConfig, steps: int, echo=print) -> tuple[Path, list[Parity]]:
    run_dir, _ = run_matrix(parity_config(base, steps), echo=echo)
    parity = compare(run_dir)
    write_csv(parity, run_dir / "verify.csv")
    return run_dir, parity


def cmd_verify(a: argparse.Namespace) -> int:
    from bench.cli import config_from_args

    cfg = config_from_args(a)
    run_dir, parity = verify(cfg, a.steps)
    print(table(parity))
    print(f"parity results: {run_dir / 'verify.csv'}")
    apart = [p for p in parity if p.status == NOT_COMPARABLE]
    if apart:
        print(f"{len(apart)} cell(s) not comparable with the single baseline (reasons above)")
    failed = [p for p in parity if not p.ok]
    if failed:
        print(f"{len(failed)} strategy/world-size pair(s) do not match the single baseline")
        return 1
    return 0


def add_parser(sub) -> None:
    from bench.cli import add_run_options

    p = sub.add_parser("verify", help="check every strategy trains the same model as `single`")
    add_run_options(p)
    p.add_argument("--steps", type=int, default=8, help="training steps to compare (default 8)")
    p.set_defaults(func=cmd_verify, global_batch=32, limit=4096, out_dir="results/verify")
