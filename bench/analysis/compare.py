"""`parabench compare A B`: how run B differs from run A, cell by cell.

For every (strategy, world size) with an ok result in both runs: the ratio B/A of the
medians over repeats of samples/s, step time p50 and peak memory per device. The metric
chosen with --metric decides the verdict: a change for the worse by more than --factor
that is also significant over the repeats (one-sided Mann-Whitney U at 5 %, bench.harness.stats)
is flagged (exit code 1); one beyond the factor but not significant is "within noise",
and with fewer than 3 repeats a side "too few repeats to tell": neither is flagged.
`--no-stats` flags on the factor alone (the behaviour before). A change for the better
is noted the same way. Cells with
a result in only one run are listed as such; one that was ok in A and failed, ran out of
memory or timed out in B is flagged too (exit code 1). Medians come from the same selection as the
report (bench.analysis.report.summarise), so the two never disagree.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from bench.analysis import report
from bench.config import ConfigError
from bench.harness import results, stats

#: metric -> True where higher is better
METRICS = {
    "samples_per_s": True,
    "step_time_ms_p50": False,
    "step_time_ms_p90": False,
    "timed_s": False,
    "peak_mem_mib": False,
}
#: shown for every cell, whatever the verdict metric
SHOWN = ("samples_per_s", "step_time_ms_p50", "peak_mem_mib")
LABELS = {
    "samples_per_s": "samples/s (median)",
    "step_time_ms_p50": "step p50 (ms)",
    "peak_mem_mib": "peak mem/device (MiB)",
}
EXIT_SAME, EXIT_WORSE = 0, 1
#: a cell ok in A and broken in B (failed, oom, timeout, diverged) is the worst regression
BROKEN = results.BROKEN


@dataclass(frozen=True)
class Comparison:
    table: pd.DataFrame  # one row per cell present in both runs
    only_a: list[tuple[str, int, str]]  # (strategy, world size, what B has instead)
    only_b: list[tuple[str, int, str]]
    metric: str
    factor: float
    stats: bool = True

    @property
    def regressions(self) -> pd.DataFrame:
        return self.table[self.table["verdict"] == worse_word(self.metric)]

    @property
    def broken(self) -> list[tuple[str, int, str]]:
        """Cells ok in A that crashed, ran out of memory, hung or diverged in B: the worst
        regression.
        (Skipped or unavailable in B is a different machine, not a regression.)"""
        return [c for c in self.only_a if c[2].split(":")[0] in BROKEN]


def worse_word(metric: str) -> str:
    return "MORE MEMORY" if metric == "peak_mem_mib" else "SLOW-DOWN"


def better_word(metric: str) -> str:
    return "less memory" if metric == "peak_mem_mib" else "improvement"


def verdict(ratio: float, metric: str, factor: float) -> str:
    """The flag for a ratio B/A of `metric`: worse / better by more than `factor`, or ''."""
    if math.isnan(ratio):
        return ""
    gain = ratio if METRICS[metric] else 1 / ratio if ratio > 0 else math.inf
    if gain < 1 / factor:
        return worse_word(metric)
    if gain > factor:
        return better_word(metric)
    return ""


def _status(run: report.Run, name: str, ws: int) -> str:
    """What a run has for a cell without an ok result: its status and reason, or nothing."""
    rows = run.runs[
        (run.runs["strategy"] == name)
        & (run.runs["world_size"] == ws)
        & (run.runs["status"] != "ok")
    ]
    if rows.empty:
        return "not run"
    first = rows.iloc[0]
    return f"{first['status']}: {first['reason']}" if first["reason"] else str(first["status"])


def _repeats(run: report.Run, metric: str) -> dict[tuple[str, int], list[float]]:
    """Per cell, the metric of every counted repeat (the report's selection)."""
    counted = report.counted_rows(run.runs)
    out: dict[tuple[str, int], list[float]] = {}
    for (name, ws), grp in counted.groupby(report.KEY):
        values = pd.to_numeric(grp[metric], errors="coerce").dropna()
        out[(str(name), int(ws))] = [float(v) for v in values]
    return out


def noise_verdict(flag: str, before: list[float], after: list[float], metric: str) -> str:
    """A factor verdict kept only where the repeats say the change is real."""
    if not flag:
        return ""
    worse = flag == worse_word(metric)
    lower_is_worse = METRICS[metric]
    # the direction tested: worse, or better (the opposite)
    p = stats.significant_change(before, after, worse_if_lower=lower_is_worse == worse)
    if math.isnan(p):
        return f"{flag}? too few repeats to tell"
    return flag if p <= stats.ALPHA else f"{flag}? within noise (p={p:.2f})"


def compare(
    a: report.Run,
    b: report.Run,
    metric: str = "samples_per_s",
    factor: float = 1.1,
    use_stats: bool = True,
) -> Comparison:
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if not (factor >= 1 and math.isfinite(factor)):  # NaN fails both; inf would flag nothing
        raise ConfigError(
            f"--factor must be a finite number of at least 1 (1.1 flags changes over 10%), "
            f"got {factor}"
        )
    sa, sb = report.summarise(a.runs), report.summarise(b.runs)
    cols = report.KEY + [f"{m}_median" for m in METRICS]
    both = sa[cols].merge(
        sb[cols], on=report.KEY, suffixes=("_a", "_b"), how="outer", indicator=True
    )
    table = both[both["_merge"] == "both"].copy()
    for m in METRICS:
        table[f"{m}_ratio"] = table[f"{m}_median_b"] / table[f"{m}_median_a"]
    table["verdict"] = [verdict(r, metric, factor) for r in table[f"{metric}_ratio"]]
    if use_stats:
        ra, rb = _repeats(a, metric), _repeats(b, metric)
        table["verdict"] = [
            noise_verdict(v, ra.get((s, int(w)), []), rb.get((s, int(w)), []), metric)
            for v, s, w in zip(
                table["verdict"], table["strategy"], table["world_size"], strict=True
            )
        ]
    table = table.drop(columns="_merge").sort_values(report.KEY).reset_index(drop=True)

    def only(side: str, other: report.Run) -> list[tuple[str, int, str]]:
        rows = both[both["_merge"] == side].sort_values(report.KEY)
        return [
            (s, int(w), _status(other, s, int(w)))
            for s, w in rows[report.KEY].itertuples(index=False)
        ]

    return Comparison(table, only("left_only", b), only("right_only", a), metric, factor, use_stats)


def _fmt(v: float, digits: int) -> str:
    return "–" if math.isnan(v) else f"{v:.{digits}f}"


def format_table(cmp: Comparison, a_name: str, b_name: str) -> str:
    """A fixed-width text table for the terminal: per metric A, B and B/A."""
    group = f"{'':<19}" + "".join(f"  {LABELS[m]:^25}" for m in SHOWN)
    head = f"{'strategy':<16}{'ws':>3}" + f"  {'A':>9}{'B':>9}{'B/A':>7}" * len(SHOWN)
    test = ", U test at 5 %" if cmp.stats else ", factor alone"
    head += f"  verdict ({cmp.metric}, factor {cmp.factor:g}{test})"
    lines = [f"A: {a_name}", f"B: {b_name}", group, head, "-" * len(head)]
    for _, r in cmp.table.iterrows():
        line = f"{r['strategy']:<16}{int(r['world_size']):>3}"
        for m in SHOWN:
            line += (
                f"  {_fmt(r[f'{m}_median_a'], 1):>9}{_fmt(r[f'{m}_median_b'], 1):>9}"
                f"{_fmt(r[f'{m}_ratio'], 2):>7}"
            )
        lines.append(line + f"  {r['verdict']}")
    if cmp.table.empty:
        lines.append("(no strategy and world size has an ok result in both runs)")
    for label, cells in (("only in A", cmp.only_a), ("only in B", cmp.only_b)):
        for name, ws, other in cells:
            lines.append(f"{name:<16}{ws:>3}  {label} (the other run: {other})")
    return "\n".join(line.rstrip() for line in lines)


def cmd_compare(args: argparse.Namespace) -> int:
    a, b = report.load_run(args.a), report.load_run(args.b)
    cmp = compare(a, b, args.metric, args.factor, use_stats=not args.no_stats)
    print(format_table(cmp, str(a.path), str(b.path)))
    worse = cmp.regressions
    if len(worse):
        cells = ", ".join(f"{s} ws={w}" for s, w in worse[report.KEY].itertuples(index=False))
        print(f"{worse_word(cmp.metric).lower()} beyond x{cmp.factor:g} in {cmp.metric}: {cells}")
    for name, ws, what in cmp.broken:
        print(f"ok in A, {what.split(':')[0]} in B: {name} ws={ws}")
    return EXIT_WORSE if len(worse) or cmp.broken else EXIT_SAME


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two runs; exit 1 on a slow-down",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("a", metavar="A", help="the reference run directory")
    p.add_argument("b", metavar="B", help="the run directory to check against A")
    p.add_argument(
        "--factor",
        type=float,
        default=1.1,
        help="flag changes larger than this ratio (default 1.1: 10%%)",
    )
    p.add_argument(
        "--metric",
        default="samples_per_s",
        choices=list(METRICS),
        help="the metric whose change decides the exit code (default samples_per_s)",
    )
    p.add_argument(
        "--no-stats",
        action="store_true",
        help="flag on --factor alone, without asking the repeats whether the change is "
        "beyond noise (the behaviour before; for runs of fewer than 3 repeats)",
    )
    p.set_defaults(func=cmd_compare)
