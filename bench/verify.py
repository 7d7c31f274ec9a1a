"""`parabench verify`: does every strategy still train the same model as the baseline?

Runs every available strategy for K steps through the normal harness (same seed,
global batch and sample order; dropout off, since its masks depend on the rank
layout), then compares each run's per-step losses and final parameters with those of
`single`. Tolerances depend on the precision the strategy trains in; they are printed
with every row. Exit code 1 if any strategy fails.
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
from bench.runner import RunDir, run_matrix


@dataclass(frozen=True)
class Tolerance:
    loss_abs: float
    param_rel: float  # ||p - p_single|| / ||p_single - p_init||: error relative to the update
    #: initial weights may differ by this much (apex O2 keeps the model's copy in fp16)
    init_abs: float = 0.0

    def describe(self) -> str:
        return f"loss<={self.loss_abs:g}, params<={self.param_rel:g}"


#: by the `precision` column; fp32 strategies differ from the baseline only by the order
#: of float additions (bucketed all-reduce, per-rank means).
TOLERANCES = {
    "fp32": Tolerance(loss_abs=1e-5, param_rel=1e-4),
    "fp32 (fp16 gradients)": Tolerance(loss_abs=1e-3, param_rel=1e-2),
    "amp_bf16": Tolerance(loss_abs=5e-2, param_rel=1e-1),
    "amp_fp16": Tolerance(loss_abs=1e-2, param_rel=5e-2),
}
MIXED = Tolerance(loss_abs=5e-2, param_rel=1e-1, init_abs=1e-3)


def tolerance(precision: str) -> Tolerance:
    return TOLERANCES.get(precision, MIXED)


@dataclass(frozen=True)
class Parity:
    strategy: str
    world_size: int
    precision: str
    loss_abs: float
    param_abs: float
    param_rel: float
    tol: Tolerance
    status: str  # pass / FAIL / the cell's own status when it did not run

    @property
    def ok(self) -> bool:
        return self.status in ("pass", results.SKIPPED, results.UNAVAILABLE)


def _losses(rd: RunDir) -> dict[tuple[str, int], list[float]]:
    out: dict[tuple[str, int], list[float]] = {}
    for s in rd.steps.read():
        if s["repeat"] == "0":
            out.setdefault((s["strategy"], int(s["world_size"])), []).append(float(s["loss"]))
    return out


def _params(rd: RunDir, strategy: str, ws: int, which: str = "params") -> dict[str, torch.Tensor]:
    path = rd.path / "cells" / f"{strategy}-ws{ws}-r0" / f"{which}.pt"
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


def compare(run_dir: Path) -> list[Parity]:
    rd = RunDir(run_dir)
    rows = [r for r in rd.runs.read() if r["repeat"] == "0"]
    base_row = next((r for r in rows if r["strategy"] == "single" and r["world_size"] == "1"), None)
    if base_row is None or base_row["status"] != results.OK:
        raise ConfigError("the single baseline did not run; parity needs it")
    losses = _losses(rd)
    base_loss = losses[("single", 1)]
    base_params = _params(rd, "single", 1)
    base_init = _params(rd, "single", 1, "params_init")
    out = []
    for r in rows:
        name, ws = r["strategy"], int(r["world_size"])
        if name == "single" and ws == 1:
            continue
        tol = tolerance(r["precision"])
        if r["status"] != results.OK:
            out.append(
                Parity(name, ws, r["precision"], math.nan, math.nan, math.nan, tol, r["status"])
            )
            continue
        mine = losses[(name, ws)]
        n = min(len(mine), len(base_loss))
        loss_abs = max(abs(a - b) for a, b in zip(mine[:n], base_loss[:n], strict=True))
        same_start, _ = _param_diff(_params(rd, name, ws, "params_init"), base_init, base_init)
        p_abs, p_rel = _param_diff(_params(rd, name, ws), base_params, base_init)
        good = (
            same_start <= tol.init_abs
            and len(mine) == len(base_loss)
            and loss_abs <= tol.loss_abs
            and p_rel <= tol.param_rel
        )
        out.append(
            Parity(
                name, ws, r["precision"], loss_abs, p_abs, p_rel, tol, "pass" if good else "FAIL"
            )
        )
    return out


def table(parity: list[Parity]) -> str:
    head = (
        f"{'strategy':<16}{'ws':>3}  {'precision':<22}{'max |dloss|':>12}{'max |dparam|':>13}"
        f"{'rel dparam':>12}  {'tolerance':<28}result"
    )
    lines = [head, "-" * len(head)]
    for p in parity:
        lines.append(
            f"{p.strategy:<16}{p.world_size:>3}  {p.precision:<22}{p.loss_abs:>12.2e}"
            f"{p.param_abs:>13.2e}{p.param_rel:>12.2e}  {p.tol.describe():<28}{p.status}"
        )
    return "\n".join(lines)


def write_csv(parity: list[Parity], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "strategy",
                "world_size",
                "precision",
                "max_abs_loss_diff",
                "max_abs_param_diff",
                "rel_param_diff",
                "loss_tolerance",
                "param_tolerance",
                "result",
            ]
        )
        for p in parity:
            w.writerow(
                [
                    p.strategy,
                    p.world_size,
                    p.precision,
                    p.loss_abs,
                    p.param_abs,
                    p.param_rel,
                    p.tol.loss_abs,
                    p.tol.param_rel,
                    p.status,
                ]
            )


def parity_config(base: RunConfig, steps: int) -> RunConfig:
    strategies = base.strategies
    if strategies and "single" not in strategies:
        strategies = ("single", *strategies)
    return base.replace(
        strategies=strategies,
        epochs=1,
        max_steps=steps,
        warmup_steps=0,
        repeats=1,
        eval_samples=0,
        save_params=True,
        model_kwargs={**base.model_kwargs, "dropout": 0.0}
        if base.model == "mnist_cnn"
        else base.model_kwargs,
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
