"""`parabench report RUN_DIR`: summary.csv, plots and report.md from a run's CSVs.

The reporter reads only what a run wrote (runs.csv, steps.csv, and optionally
environment.json / config.json), so a run copied from another machine reports the same.

Which rows count: a repeat counts when all its rows are `ok` (a repeat that failed in a
later epoch is reported as failed, not as a shorter success), and from each counted repeat
only its last epoch is used. One value per repeat keeps the repeats independent samples for
the median and spread, and the last epoch is the one whose loss and accuracy are the
end-of-training values. Step-level plots use the same epochs, warm-up steps excluded.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.config import ConfigError, first_line, not_a_run, run_dir_named
from bench.harness import breakdown, proc, results, stats

#: the per-repeat measurements that summary.csv gives a median and spread for
SUMMARY_METRICS = (
    "samples_per_s",
    "tokens_per_s",
    "timed_s",
    "step_time_ms_p50",
    "step_time_ms_p90",
    "data_wait_pct",
    "peak_mem_mib",
    "malloc_free_mib",
    "model_state_mib",
    "model_state_mib_lightest",
    "param_mib",
    "grad_mib",
    "optim_mib",
    "train_loss_final",
    "eval_accuracy",
)
SPREAD = ("median", "iqr", "min", "max")
KEY = ["strategy", "world_size"]
BASELINE = ("single", 1)

#: image file in the run directory -> the function of bench.analysis.plots that draws it
PLOTS = {
    "throughput.png": "throughput",
    "scaling_efficiency.png": "scaling_efficiency",
    "peak_memory.png": "peak_memory",
    "step_time.png": "step_time_distribution",
    "loss.png": "loss_curves",
    "time_split.png": "time_split",
    "model_state.png": "model_state",
}
#: drawn only where the run holds what they show (their function returns None otherwise)
OPTIONAL_PLOTS = {"option_sweep.png": "option_sweep"}


@dataclass(frozen=True)
class Run:
    """The tables of one run directory, as written by the runner."""

    path: Path
    runs: pd.DataFrame
    steps: pd.DataFrame
    ranks: pd.DataFrame
    environment: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    #: plan.csv: every cell the run set out to run (empty for a run from before it)
    planned: pd.DataFrame = field(default_factory=lambda: pd.DataFrame())
    #: runs.csv's infinite figures, read as not measured: "row N (cell): column inf" each
    not_finite: tuple[str, ...] = ()
    #: retried/runs.csv: the earlier attempts of cells `--retry-failed` ran again
    retried: pd.DataFrame = field(default_factory=lambda: pd.DataFrame())
    #: why retried/runs.csv could not be read ("" where it could, or there is none): the
    #: report says so in its place, the rest of the run is reported
    retried_unread: str = ""
    _departing: dict[str, list[str] | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def name(self) -> str:
        return self.path.name

    @functools.cached_property
    def missing(self) -> list[tuple[str, int, str, int]]:
        """The planned cells with no row: (strategy, world size, setting, repeat), in plan
        order (worked out once: the report and compare ask more than once). A run stopped
        (Ctrl-C, a job cancelled) before them; --resume runs them."""
        if self.planned.empty:
            return []
        keys = ["strategy_name", "world_size", "setting", "repeat"]
        have = set(self.runs[keys].itertuples(index=False, name=None))
        plan = self.planned[["strategy", "world_size", "setting", "repeat"]]
        return [
            (str(n), int(w), str(s), int(r))
            for n, w, s, r in plan.itertuples(index=False, name=None)
            if (n, int(w), s, int(r)) not in have
        ]

    @functools.cached_property
    def fits(self) -> dict[str, dict]:
        """Each collective's fit that predictions use (predict.best_fits of collectives.json),
        read once: the run's every prediction and the rough-fits line ask. A ConfigError
        where it is unreadable or holds no fit to predict from."""
        return self.fits_for()

    def fits_for(self, busbw: bool = True, latency: bool = True) -> dict[str, dict]:
        """predict.best_fits of the run's collectives.json, as read once (`collectives`)."""
        from bench.analysis import predict

        return predict.best_fits(self.path / "collectives.json", busbw, latency, self.collectives)

    @functools.cached_property
    def collectives(self) -> dict[str, Any]:
        """collectives.json as read, once; ConfigError where it is unreadable."""
        from bench.analysis import predict

        return predict.read_collectives(self.path / "collectives.json")

    def departing(self, base: str) -> list[str] | None:
        """The cells whose training loss departs from `base`'s (single's label) at world size
        1, as `departing` names them; None where the run has no loss curve of base's. Worked
        out once per base: the loss plot's title and "Which to pick" both ask."""
        if base not in self._departing:
            gone = None
            if not self.steps.empty:
                counted = counted_rows(self.runs)
                steps = counted_steps(self.steps, counted, timed_only=False, all_epochs=True)
                gone = loss_departures(steps, base)
            self._departing[base] = None if gone is None else departing(gone)
        return self._departing[base]

    def missing_text(self, command: str = "parabench") -> str:
        """One sentence on the planned cells with no row, or "" where every one has one.
        `command`: parabench as the resume command names it; report.md and a notebook, read
        on other machines and in other folders, say plain `parabench`, not how this process
        was called (the terminal: bench.program())."""
        missing = self.missing
        if not missing:
            return ""
        shown = [f"{n} ws={w} {s} repeat {r}" for n, w, s, r in missing[:6]]
        more = f", and {len(missing) - 6} more" if len(missing) > 6 else ""
        head = (
            f"incomplete: {len(missing)} of {len(self.planned)} planned cells have no row yet "
            f"({'; '.join(shown)}{more})"
        )
        pid = results.held_by(self.path)
        # (this process's own hold: `run` writing the report of the run it ended, whose
        # cells left are for a machine they fit on)
        if pid not in (None, str(os.getpid())):  # its --resume would be refused: not stopped
            return (
                f"{head}: the run is still going (parabench pid {pid} holds it); these are "
                "its rows so far"
            )
        if results.of_verify(self.config):  # no verdict from its resume
            return f"{head}: the run is still going, or it stopped; {results.VERIFY_AGAIN}"
        how = results.resume_command(str(self.config.get("launcher") or ""), self.path, command)
        return f"{head}: the run is still going, or it stopped; to finish it, {how}"


# ---------------------------------------------------------------- loading


def _read_csv(
    path: Path, columns: Sequence[str], required: Sequence[str] = (), *, rows: bool = False
) -> pd.DataFrame:
    """A run's table; ConfigError if it is unreadable, lacks a `required` column, or (`rows`:
    runs.csv) is an empty file. A column of `columns` it lacks is added, empty."""
    # An older parabench wrote no table with no rows (steps.csv when every cell was skipped);
    # one left empty (the run killed as it opened the file) holds no more than a missing one
    if not path.exists():
        return pd.DataFrame(columns=list(columns))
    try:  # the first read of it (its head) fails as pandas' would: one line, not a traceback
        if path.is_file() and not _head(path).strip():
            if rows:
                raise ConfigError(f"{path} is empty: the run wrote no row")
            return pd.DataFrame(columns=list(columns))
        text = dict.fromkeys(TEXT_COLUMNS, str)
        df = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=text)
        short = _short_row(path)
    except (
        OSError,
        UnicodeDecodeError,
        csv.Error,  # Python 3.10's reader on a file that ends in NUL bytes (a crash's)
        pd.errors.ParserError,
        pd.errors.EmptyDataError,
    ) as exc:
        raise ConfigError(f"{path} is unreadable ({first_line(exc)})") from None
    if short:
        raise ConfigError(f"{path} is unreadable ({short})")
    if not isinstance(df.index, pd.RangeIndex):  # pandas made the surplus fields an index
        raise ConfigError(f"{path} is unreadable (its rows have more fields than its header)")
    df = df.rename(columns=results.renamed(df.columns))  # an older parabench's names
    missing = sorted(set(required) - set(df.columns))
    if missing:
        raise ConfigError(f"{path}: not a parabench {path.name} (no column {', '.join(missing)})")
    # one written before a column was added: empty, as when not measured (added at once)
    absent = [col for col in columns if col not in df]
    if absent:
        df = pd.concat([df, pd.DataFrame(math.nan, index=df.index, columns=absent)], axis=1)
    for col in df.columns:
        if col in TEXT_COLUMNS or pd.api.types.is_numeric_dtype(df[col]):
            continue
        # `nan` or `inf` written as text (keep_default_na leaves them text) makes a numeric
        # column a text one: numbers again when every other value is a number
        as_numbers = pd.to_numeric(df[col], errors="coerce")
        if as_numbers.notna().sum() + df[col].isna().sum() + _nan_text(df[col]).sum() == len(df):
            df[col] = as_numbers
    for col in ("status", "reason", "notes", "strategy"):
        if col in df:
            # object first: an all-empty column reads as float, which "" cannot fill
            df[col] = df[col].astype(object).fillna("").astype(str)
    return df


def _short_row(path: Path) -> str:
    """The first row with fewer fields than the header, said in words ("" where none): a
    file cut short (a copy that stopped) ends in one, which pandas fills out with empty
    fields, and its cell would read as run but not measured. parabench writes every field
    of every row."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        for n, row in enumerate(filter(None, reader), start=2):
            if len(row) < len(header):
                return (
                    f"row {n} has {len(row)} of its header's {len(header)} fields: the file "
                    "is cut short, or was edited by hand"
                )
    return ""


#: columns that hold names, not numbers, even when every value of a run looks like one;
#: read as text as written: pandas took CUDA "13.0" for 13.0 (the report said CUDA 13),
#: torchvision "0.30" for 0.3, and a commit hash of digits and one e ("1234567e8901") for
#: a float, inf, which the report gave as the run's git commit
TEXT_COLUMNS = frozenset(
    {"run_id", "strategy", "setting", "status", "reason", "notes", "host", "hosts"}
    | {c for c in results.PROVENANCE if c.endswith("_version")}
    | {"git_commit"}
)


def _nan_text(values: pd.Series) -> pd.Series:
    """Which of `values` are text that means not-a-number (pandas' `nan`, Python's `nan`,
    `NaN`), which to_numeric leaves NaN."""
    text = values.astype(str).str.strip().str.lower()
    return values.notna() & text.isin({"nan", "-nan", "+nan"})


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4096)


def _read_json(path: Path) -> dict[str, Any]:
    """The object a run's JSON file holds; {} if there is none (the file is optional), and
    a ConfigError if it is there but unreadable: a damaged run is not reported as a clean one."""
    if not path.exists():
        return {}
    try:
        got = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is unreadable ({first_line(exc)}); fix or remove it") from None
    if not isinstance(got, dict):
        raise ConfigError(f"{path} holds {type(got).__name__}, not an object; fix or remove it")
    return got


def _check_whole_numbers(df: pd.DataFrame, path: Path, least: Mapping[str, int]) -> None:
    """Every value of each column of `least` a whole number no less than its least (the
    keys the summary groups, sorts and divides by)."""
    for col, lowest in least.items():
        values = df[col].astype(str).str.strip()
        empty = values[df[col].isna() | (values == "")]
        if len(empty):
            raise ConfigError(f"{path}: column {col} is empty (row {empty.index[0] + 2})")
        bad = values[~values.str.fullmatch(r"-?\d+(\.0*)?")]
        if len(bad):
            raise ConfigError(
                f"{path}: column {col} holds {bad.iloc[0]!r}, not a whole number "
                f"(row {bad.index[0] + 2})"
            )
        small = values[pd.to_numeric(values) < lowest]
        if len(small):
            raise ConfigError(
                f"{path}: column {col} holds {small.iloc[0]}, less than {lowest} "
                f"(row {small.index[0] + 2})"
            )


def _check_numbers(df: pd.DataFrame, path: Path, least: Mapping[str, int]) -> None:
    """steps.csv and ranks.csv: the keys of `least` whole numbers (epoch where the file has
    it), every other column but the names a number or empty; ConfigError naming the first
    value that is not, before anything of the report is written."""
    if df.empty:
        return
    keys = {c: n for c, n in least.items() if c != "epoch" or df[c].notna().any()}
    _check_whole_numbers(df, path, keys)
    _check_number_columns(df, path, [c for c in df.columns if c not in TEXT_COLUMNS])


def _check_number_columns(df: pd.DataFrame, path: Path, columns: Sequence[str]) -> None:
    """Every value of `columns` a number or empty; ConfigError naming the first that is not."""
    for col in columns:
        if pd.api.types.is_numeric_dtype(df[col]):
            continue
        values = df[col].astype(str).str.strip()
        not_numbers = pd.to_numeric(values, errors="coerce").isna() & ~_nan_text(df[col])
        bad = values[not_numbers & df[col].notna()]
        if len(bad):
            raise ConfigError(
                f"{path}: column {col} holds {bad.iloc[0]!r}, not a number (row {bad.index[0] + 2})"
            )


#: runs.csv's measurements that are numbers: one a hand or a spreadsheet left text (`n/a`,
#: `1,039.3`) would read as not measured, its cell ranked on the other repeats alone; the
#: strategies' own (cell_metrics) are left out, a plug-in's text there no reason to refuse
RUN_NUMBERS = tuple(
    c
    for c in results.MEASUREMENTS
    if c not in {"mem_source", "comm_method", "trace", "peak_source", *results.EXTRA}
)


#: runs.csv's figures that cannot be infinite: times, rates, sizes (a loss can be, a run's
#: that diverged); one that is (a cell whose timed steps took no time, a hand edit) broke
#: every plot's axes, so it is read as not measured and the report names its row
FINITE_NUMBERS = tuple(c for c in RUN_NUMBERS if "loss" not in c)


def _not_finite(runs: pd.DataFrame) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """runs with its infinite FINITE_NUMBERS emptied, and a line for each row that had one."""
    cols = [c for c in FINITE_NUMBERS if c in runs]
    infinite = runs[cols].apply(pd.to_numeric, errors="coerce").isin([math.inf, -math.inf])
    lines = []
    for i in infinite.index[infinite.any(axis=1)]:
        r = runs.loc[i]
        which = ", ".join(f"{c} {r[c]}" for c in cols if infinite.at[i, c])
        cell = f"{r['strategy']} ws={_plain(r['world_size'])} repeat {_plain(r['repeat'])}"
        lines.append(f"row {i + 2} ({cell}): {which}")
    if lines:
        runs = runs.copy()
        runs[cols] = runs[cols].mask(infinite)
    return runs, tuple(lines)


def load_run(run_dir: str | Path) -> Run:
    """A run's tables; ConfigError when the directory or its runs.csv is missing."""
    path = run_dir_named(run_dir)
    begun = (path / "config.json").is_file()  # a run stopped before its first row has no runs.csv
    if not (path / "runs.csv").is_file() and not begun:
        raise not_a_run(path, "runs.csv")
    required = ("strategy", "world_size", "repeat", "status", "epoch")
    runs = _read_csv(path / "runs.csv", results.RUN_COLUMNS, required, rows=True)
    _check_whole_numbers(runs, path / "runs.csv", {"world_size": 1, "repeat": 0})
    # a row that ran says its epoch: the report counts each repeat's last (a skipped row has none)
    _check_whole_numbers(runs[runs["status"] == results.OK], path / "runs.csv", {"epoch": 0})
    _check_number_columns(runs, path / "runs.csv", RUN_NUMBERS)
    runs, not_finite = _not_finite(runs)
    settings = runs["setting"].notna().any()  # a run from before the column has none
    if not settings:
        _check_one_setting(runs, path / "runs.csv")
    tables = [runs]
    for name, columns, key in (
        ("steps.csv", results.STEP_COLUMNS, "step"),
        ("ranks.csv", results.RANK_COLUMNS, "rank"),
    ):
        # what every parabench wrote there, and the plots select by: added empty, a table
        # without them would match no cell (or, without `warmup`, have no timed step), and
        # its plots would be blank with no word why
        need = ("strategy", "world_size", "repeat", key, *(("warmup",) if key == "step" else ()))
        need += ("setting",) if settings else ()
        table = _read_csv(path / name, columns, need)
        _check_numbers(table, path / name, {"world_size": 1, "repeat": 0, "epoch": 0, key: 0})
        tables.append(table)
    # a cell killed between writing its steps and its row runs again on --resume and
    # writes its steps (and ranks) again: the last write of each counts, once
    tables = [
        t.drop_duplicates(subset=[c for c in [*results.ID, *extra] if c in t], keep="last")
        for t, extra in zip(tables, ([], ["step", "rank"], ["rank"]), strict=True)
    ]
    labelled = _labelled(tables)
    planned = _read_csv(path / "plan.csv", results.PLAN_COLUMNS)
    _check_whole_numbers(planned, path / "plan.csv", {"world_size": 1, "repeat": 0})
    planned["setting"] = planned["setting"].astype(object).fillna("").astype(str)
    return Run(
        path=path,
        runs=labelled[0],
        steps=labelled[1],
        ranks=labelled[2],
        environment=_read_json(path / "environment.json"),
        config=_read_json(path / "config.json"),
        planned=planned,
        not_finite=not_finite,
        **_read_retried(path / results.RETRIED / "runs.csv"),
    )


def _read_retried(path: Path) -> dict[str, Any]:
    """retried/runs.csv as Run keeps it: its rows, or none and why (`retried_unread`). The
    earlier attempts are no part of the results: one damaged stops no command."""
    try:
        rows = _read_csv(
            path, results.ATTEMPT + results.RUN_COLUMNS, ("strategy", "world_size", "repeat")
        )
        _check_whole_numbers(rows, path, {"world_size": 1, "repeat": 0})
    except ConfigError as exc:
        return {"retried_unread": str(exc)}
    return {"retried": rows}


#: the runs.csv columns a cell's setting is made of
SETTING_PARTS = ("precision", "compile", "compile_mode", "accumulate", "sync_bn")
SETTING_PARTS += ("channels_last", "options")


def _check_one_setting(runs: pd.DataFrame, path: Path) -> None:
    """A runs.csv without `setting` (from before it, or edited): ConfigError where a cell
    has rows in more than one setting (a sweep), which would read as one cell written twice
    (a resumed cell's rows), all but the last dropped and the rest under the wrong name."""
    parts = [c for c in SETTING_PARTS if c in runs]
    key = ["strategy", "world_size", "repeat", "epoch"]
    if not parts or runs.empty:
        return
    several = runs.groupby(key, dropna=False)[parts].nunique(dropna=False).gt(1).any(axis=1)
    if several.any():
        name, ws, repeat, _ = several[several].index[0]
        raise ConfigError(
            f"{path}: no column setting, and {name} ws={_plain(ws)} repeat {_plain(repeat)} "
            "has rows in more than one setting (its precision or options differ): restore "
            "the column"
        )


def _labelled(tables: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """Every table with `strategy` holding the display name of the case (strategy plus the
    run options that vary, see results.case_labels); the registry name moves to
    `strategy_name`. Everything downstream (summary, plots, compare) groups by it."""
    for t in tables:
        t["setting"] = t["setting"].astype(object).fillna("").astype(str) if "setting" in t else ""
    pairs = [(s, g) for t in tables for s, g in zip(t["strategy"], t["setting"], strict=True)]
    labels = results.case_labels(pairs)
    out = []
    for t in tables:
        t = t.copy()
        t["strategy_name"] = t["strategy"]
        t["strategy"] = [labels[p] for p in zip(t["strategy"], t["setting"], strict=True)]
        out.append(t)
    return out


# ---------------------------------------------------------------- selection


def counted_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The last epoch of every repeat whose rows are all `ok` (see the module docstring)."""
    rep = ["strategy", "world_size", "repeat"]
    bad = runs.loc[runs["status"] != results.OK, rep].drop_duplicates()
    ok = runs[runs["status"] == results.OK]
    ok = ok.merge(bad.assign(_bad=True), on=rep, how="left")
    ok = ok[ok["_bad"].isna()].drop(columns="_bad")
    if ok.empty:
        return ok
    last = ok.groupby(rep)["epoch"].transform("max")
    return ok[ok["epoch"] == last].sort_values(rep).reset_index(drop=True)


def counted_steps(
    steps: pd.DataFrame, counted: pd.DataFrame, *, timed_only: bool = True, all_epochs: bool = False
) -> pd.DataFrame:
    """steps.csv rows of the counted repeats: their last epoch (or all), warm-up excluded."""
    keys = ["strategy", "world_size", "repeat"] + ([] if all_epochs else ["epoch"])
    if steps.empty or counted.empty:
        return steps.iloc[0:0]
    sel = steps.merge(counted[keys].drop_duplicates(), on=keys, how="inner")
    if timed_only:
        sel = sel[sel["warmup"] == 0]
    return sel.reset_index(drop=True)


# ---------------------------------------------------------------- summary


def _spread(values: pd.Series) -> dict[str, float]:
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return dict.fromkeys(SPREAD, math.nan)
    return {
        "median": float(v.median()),
        # one repeat has no spread to measure: NaN, as its CV, not an IQR of 0 read as steady
        "iqr": float(v.quantile(0.75) - v.quantile(0.25)) if len(v) > 1 else math.nan,
        "min": float(v.min()),
        "max": float(v.max()),
    }


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (strategy, world size) with an ok repeat: median and spread over repeats.

    Columns: strategy, world_size, n_repeats, <metric>_{median,iqr,min,max} for each of
    SUMMARY_METRICS, speedup_vs_single (median over the median of `single` at world
    size 1), scaling_efficiency (the same over `single` in the row's own run options where
    the run has it, else over plain single, / world size), efficiency_over (that single's
    case), mem_source, oversubscribed (1 where
    a counted repeat ran more CPU ranks than cores: such a cell ran for correctness, its
    speed is not comparable, so its speed-up and efficiency are NaN).
    """
    counted = counted_rows(runs)
    cols = KEY + ["strategy_name", "setting", "n_repeats"]
    cols += [f"{m}_{s}" for m in SUMMARY_METRICS for s in SPREAD]
    cols += ["speedup_vs_single", "scaling_efficiency", "efficiency_over", "mem_source"]
    cols += ["oversubscribed"]
    cols += INTERVAL_COLUMNS
    if counted.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    sps: dict[tuple[str, int], pd.Series] = {}  # each cell's samples/s over its repeats
    for (name, ws), grp in counted.groupby(KEY, sort=True):
        sps[(name, int(ws))] = pd.to_numeric(grp["samples_per_s"], errors="coerce")
        row: dict[str, Any] = {"strategy": name, "world_size": int(ws), "n_repeats": len(grp)}
        row["strategy_name"] = grp["strategy_name"].iloc[0] if "strategy_name" in grp else name
        row["setting"] = grp["setting"].iloc[0] if "setting" in grp else ""
        for metric in SUMMARY_METRICS:
            values = grp[metric] if metric in grp else pd.Series(dtype=float)
            for stat, value in _spread(values).items():
                row[f"{metric}_{stat}"] = value
        row["mem_source"] = ",".join(sorted(set(grp["mem_source"].dropna().astype(str))))
        row["oversubscribed"] = int(oversubscribed(grp))
        row |= _intervals(grp)
        rows.append(row)
    table = pd.DataFrame(rows)
    base = baseline_row(table)
    if base is not None and base["oversubscribed"]:
        base = None  # its speed is not comparable: no speed-up at all
    for i, r in table.iterrows():
        key = (r["strategy"], int(r["world_size"]))
        # speed-up: over the plain baseline; efficiency: over single in the row's own run
        # options where the run has it (a bf16 channels-last DDP cell scales over single
        # bf16 channels-last, not over fp32), else over the plain baseline too
        like = _single_like(table, r["setting"]) if base is not None else None
        table.loc[i, "efficiency_over"] = "" if like is None else like["strategy"]
        ws = r["world_size"]
        for col, ci, over, n in (
            ("speedup_vs_single", "speedup", base, 1),
            ("scaling_efficiency", "scaling_efficiency", like, ws),
        ):
            if over is None:
                ratio = low = high = math.nan
            elif (over["strategy"], 1) == key:
                # the baseline over itself, the same repeats: exactly 1, but an interval
                # only where its repeats give one (as any other row's), never invented; and
                # no speed-up at all where it has no speed (an ok row with samples/s empty)
                ratio = 1.0 if pd.notna(r["samples_per_s_median"]) else math.nan
                enough = sps[key].notna().sum() >= stats.MIN_REPEATS
                low = high = 1.0 if enough else math.nan
            else:
                ratio = r["samples_per_s_median"] / over["samples_per_s_median"]
                low, high = stats.ratio_interval(sps[key], sps[(over["strategy"], 1)])
            table.loc[i, [col, f"{ci}_ci_low", f"{ci}_ci_high"]] = [ratio / n, low / n, high / n]
    # more ranks than cores time-share the cores: correct results, but no speed to rank
    ratios = [c for c in table.columns if c.startswith(("speedup", "scaling_efficiency"))]
    table.loc[table["oversubscribed"] == 1, ratios] = math.nan
    return in_case_order(table).reset_index(drop=True)[cols]


def in_case_order(rows: pd.DataFrame) -> pd.DataFrame:
    """rows by case (each strategy's plain setting first, numbers as numbers: a sweep's 1,
    25, 100), then world size: results.case_key, the order of every table and plot."""
    keys = [
        results.case_key(s, w) for s, w in zip(rows["strategy"], rows["world_size"], strict=True)
    ]
    return rows.iloc[sorted(range(len(rows)), key=keys.__getitem__)]


def _by_case(rows: pd.DataFrame, *more: str) -> list[tuple[tuple, pd.DataFrame]]:
    """rows grouped by case and world size (and `more` columns), in the summary's order
    (in_case_order's), not the text order groupby sorts in."""
    groups = rows.groupby([*KEY, *more], sort=True)
    return sorted(groups, key=lambda g: results.case_key(*g[0][:2]))


#: 95 % intervals over repeats (bench.harness.stats; nan with fewer than 3), the coefficient of
#: variation of samples/s over repeats and whether it marks the cell unstable
INTERVAL_COLUMNS = [
    "samples_per_s_ci_low",
    "samples_per_s_ci_high",
    "step_time_ms_p50_ci_low",
    "step_time_ms_p50_ci_high",
    "speedup_ci_low",
    "speedup_ci_high",
    "scaling_efficiency_ci_low",
    "scaling_efficiency_ci_high",
    "samples_per_s_cv_pct",
    "unstable",
    # the most any repeat's machine gave to others while it ran (bench.harness.runner.CpuShare)
    "other_cpu_pct_max",
    "cpu_steal_pct_max",
]


def _intervals(grp: pd.DataFrame) -> dict[str, Any]:
    """A cell's t-intervals over its repeats, its CV and stability."""
    sps = pd.to_numeric(grp["samples_per_s"], errors="coerce")
    step = pd.to_numeric(grp["step_time_ms_p50"], errors="coerce")
    out: dict[str, Any] = {}
    for col, values in (("samples_per_s", sps), ("step_time_ms_p50", step)):
        low, high = stats.t_interval(values)
        # neither is ever below 0: a t-interval of very noisy repeats (a CV over 40 % at 3)
        # reaches below it, a negative samples/s; cut there, it covers the mean as often
        out[f"{col}_ci_low"], out[f"{col}_ci_high"] = max(low, 0.0) if low == low else low, high
    cv = stats.cv_pct(sps)
    out["samples_per_s_cv_pct"] = cv
    out["unstable"] = int(cv > stats.UNSTABLE_CV_PCT) if cv == cv else 0
    for col in ("other_cpu_pct", "cpu_steal_pct"):
        seen = pd.to_numeric(grp[col], errors="coerce") if col in grp else pd.Series(dtype=float)
        out[f"{col}_max"] = float(seen.max()) if seen.notna().any() else math.nan
    return out


def oversubscribed(rows: pd.DataFrame | Mapping[str, Any]) -> bool:
    """Whether any of these rows (or this one row) ran more CPU ranks than cores."""
    if isinstance(rows, pd.DataFrame):
        return bool(results.oversubscribed_rows(rows).any())
    value = pd.to_numeric(pd.Series([rows.get("oversubscribed")]), errors="coerce").iloc[0]
    return bool(value > 0)


def cell_name(row: Mapping[str, Any]) -> str:
    """The strategy label of a summary row as tables show it: marked when oversubscribed."""
    return f"{row['strategy']} (oversubscribed)" if oversubscribed(row) else str(row["strategy"])


def _run_options(setting: Any) -> str:
    """A setting label's run options (precision, compile, accumulation, SyncBN, layout),
    without the strategy options (`key=value`) that single does not take."""
    return ",".join(t for t in str(setting).split(",") if t and "=" not in t)


def _single_like(summary: pd.DataFrame, setting: Any) -> pd.Series | None:
    """`single` at world size 1 in these run options, not oversubscribed; else the plain
    baseline (baseline_row)."""
    single = _singles(summary)
    if "setting" in single:
        want = _run_options(setting)
        same = single[single["setting"].map(_run_options) == want]
        # single as it comes before single with options of its own (verify's shares=2)
        same = same.assign(_own=same["setting"].astype(str).str.contains("="))
        same = same.sort_values("_own", kind="stable").drop(columns="_own")
        if len(same) and not same.iloc[0]["oversubscribed"]:
            return same.iloc[0]
    return baseline_row(summary)


def _singles(summary: pd.DataFrame) -> pd.DataFrame:
    """The rows of `single` at world size 1, whatever their settings."""
    names = summary["strategy_name"] if "strategy_name" in summary else summary["strategy"]
    return summary[(names == BASELINE[0]) & (summary["world_size"] == BASELINE[1])]


def baseline_row(summary: pd.DataFrame) -> pd.Series | None:
    """`single` at world size 1 in its plainest setting (the baseline every speed-up is
    over): fp32 with no other run option where the run has it, else the setting fewest
    axes away from plain, each axis's plain value first (results.plainness); None if
    absent. Not the first in the table's order: that put `[compile]` before `[eager]`
    and `[bf16]` before `[fp32]` in a run that swept them at `--accumulate 2`."""
    single = _singles(summary)
    if single.empty:
        return None
    if "setting" not in single:
        return single.iloc[0]
    order = single["setting"].map(lambda s: results.plainness(str(s)))
    return single.loc[order.sort_values(kind="stable").index[0]]


def _one_host(rows: pd.DataFrame) -> pd.Series:
    """Per row, whether its ranks ran on one host (its `hosts`, else its `nodes`; a run from
    before those columns ran on this machine)."""
    hosts = rows["hosts"] if "hosts" in rows else pd.Series(math.nan, index=rows.index)
    nodes = pd.to_numeric(rows.get("nodes", hosts), errors="coerce")
    named = hosts.map(lambda h: len({x for x in str(h).split(",") if x}) if pd.notna(h) else 0)
    return named.where(named > 0, nodes.fillna(1)) <= 1


def thread_shares(counted: pd.DataFrame) -> tuple[float | None, dict[int, float]]:
    """On a CPU, the threads `single` at world size 1 computed with where the ranks of a
    larger world size computed with fewer (a node's cores split among its ranks), and per
    world size whose N ranks together had exactly single's threads on one host (single's
    cores split evenly), 1/N: the efficiency of a cell exactly as fast as single, the most
    it can reach there. (None, {}) where no rank had fewer threads than single."""
    if counted.empty or not {"device", "threads_per_rank"} <= set(counted.columns):
        return None, {}
    cpu = counted[counted["device"] == "cpu"]
    threads = pd.to_numeric(_singles(cpu)["threads_per_rank"], errors="coerce").dropna()
    if threads.empty:
        return None, {}
    single = threads.min()
    ranks = cpu[cpu["world_size"] > 1]
    mine = pd.to_numeric(ranks["threads_per_rank"], errors="coerce")
    whole = (mine * ranks["world_size"] == single) & _one_host(ranks)
    by_ws = pd.DataFrame({"most": mine, "whole": whole}).groupby(ranks["world_size"].astype(int))
    fewer = {int(ws): g["whole"].all() for ws, g in by_ws if g["most"].max() < single}
    shares = {ws: 1.0 / ws for ws, split in fewer.items() if split}
    return (float(single) if fewer else None), shares


def shared_cores_markdown(counted: pd.DataFrame) -> str:
    """On a CPU, where ranks computed with fewer threads than `single` at world size 1 (a
    node's cores are split among its ranks): a sentence saying so, since efficiency
    divides by world size as if each rank had what single had; and where N ranks split
    single's threads on one host, that a cell as fast as single is at 1/N there."""
    threads, shares = thread_shares(counted)
    if threads is None:
        return ""
    text = (
        f" On this CPU `single` at world size 1 computed with {_plain(threads)} "
        "thread(s), and each rank of a larger cell with fewer, a share of its node's cores "
        "(threads per rank, under Conditions): efficiency divides speed-up by world size as "
        "if each rank had what single had, so it falls short of 1 on that count alone."
    )
    if shares:
        sizes = ", ".join(str(ws) for ws in sorted(shares))
        many = len(shares) > 1
        text += (
            f" At world size{'s' if many else ''} {sizes} the ranks split single's "
            f"{_plain(threads)} thread(s) on one machine, together the cores single had, not "
            f"{'world size' if many else sizes} times them: there a cell exactly as fast as "
            f"single has speed-up 1 and efficiency 1/{'world size' if many else sizes}."
        )
    return text


def strong_scaling_markdown(counted: pd.DataFrame) -> str:
    """Where the counted cells span world sizes: a sentence saying that their efficiency is
    strong scaling (the global batch fixed, each rank's share of it shrinking with the world
    size), with each world size's batch per data-parallel share. The report said only that
    the global batch was "the same for every strategy at a world size", and an efficiency
    of 0.6 at 8 ranks read as communication's cost alone, where each rank computed an
    eighth of single's batch; "" with one world size."""
    if counted.empty or "world_size" not in counted or counted["world_size"].max() <= 1:
        return ""
    batch = pd.to_numeric(counted.get("global_batch"), errors="coerce").dropna()
    if batch.empty:
        return ""
    sizes = ", ".join(_plain(float(b)) for b in sorted(batch.unique()))
    shares = pd.to_numeric(counted.get("data_ranks"), errors="coerce")
    per_ws: dict[int, set[int]] = {}
    for (ws, g), n in zip(
        counted[["world_size", "global_batch"]].itertuples(index=False), shares, strict=True
    ):
        if n == n and n > 1 and _count(g):
            per_ws.setdefault(int(ws), set()).add(int(_count(g) // n))
    each = "; ".join(
        f"world size {ws}: {', '.join(str(b) for b in sorted(bs))} samples a share"
        for ws, bs in sorted(per_ws.items())
    )
    return (
        f" Efficiency here is strong scaling: the global batch is {sizes} samples a step at "
        "every world size, so each of a cell's N data-parallel shares computes 1/N of it"
        + (f" ({each})" if each else "")
        + ", not single's whole batch; a device that computes a smaller batch less "
        "efficiently lowers efficiency as communication does. Weak scaling (each rank keeping "
        "single's batch, the global batch growing with the ranks) is not what it measures."
    )


def median_loss_by_step(steps: pd.DataFrame) -> dict[tuple[str, int], pd.Series]:
    """Each cell's training loss by global step (its position in the repeat across epochs),
    median over repeats: the curves of the loss plot."""
    curves = {}
    for (name, ws), one in steps.groupby(KEY, sort=False):
        one = one.sort_values(["repeat", "epoch", "step"])
        one = one.assign(gstep=one.groupby("repeat").cumcount())
        curves[(str(name), int(ws))] = (
            pd.to_numeric(one["loss"], errors="coerce").groupby(one["gstep"]).median()
        )
    return curves


#: a loss curve whose mean over the steps differs from single's by more than this (% of
#: single's mean) departs from it. Strategies that compute what single computes differ by
#: the order of float additions, and at world size 2 by the dropout masks of a split batch:
#: make bench on MNIST (140 steps) put every exact fp32, bf16 and fp16 cell within 2 %,
#: PowerSGD's rank-1 gradients 32-35 % above.
DEPART_PCT = 10.0


def loss_departures(steps: pd.DataFrame, base: str) -> dict[tuple[str, int], float] | None:
    """Each cell's training loss against `base` (single's label) at world size 1: the mean
    over their common steps of the difference of the two curves, in % of base's mean there;
    None where `steps` has no curve of base's."""
    curves = median_loss_by_step(steps)
    ref = curves.get((base, 1))
    if ref is None or ref.dropna().empty:
        return None
    out = {}
    for key, curve in curves.items():
        both = pd.concat([curve, ref], axis=1, join="inner").dropna()
        mean = both.iloc[:, 1].mean()
        if len(both) and mean:
            out[key] = 100.0 * (both.iloc[:, 0].mean() - mean) / abs(mean)
    return out


def departing(departures: Mapping[tuple[str, int], float] | None) -> list[str]:
    """The cells whose loss departs from single's (DEPART_PCT), as `name ws=N (+x %)`."""
    return [
        f"{name} ws={ws} ({pct:+.0f} %)"
        for (name, ws), pct in sorted(
            (departures or {}).items(), key=lambda kv: results.case_key(*kv[0])
        )
        if abs(pct) > DEPART_PCT
    ]


# ---------------------------------------------------------------- markdown


def _num(v: Any, digits: int = 1) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return "–" if math.isnan(f) else f"{f:,.{digits}f}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        # every line break, a lone CR too (Markdown ends a line there): one row, one line
        return " ".join(str(v).replace("|", "\\|").splitlines())

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _with_range(row: Mapping[str, Any], metric: str, digits: int) -> str:
    med, lo, hi = (row[f"{metric}_{s}"] for s in ("median", "min", "max"))
    if row["n_repeats"] < 2 or _num(lo, digits) == _num(hi, digits):
        return _num(med, digits)
    return f"{_num(med, digits)} ({_num(lo, digits)}–{_num(hi, digits)})"


def model_state_text(r: Mapping[str, Any]) -> str:
    """Largest rank's params + grads + optimizer state; the smallest rank's too where uneven."""
    top, low = r.get("model_state_mib_median"), r.get("model_state_mib_lightest_median")
    if top is None or pd.isna(top):
        return "–"
    parts = "/".join(_num(r.get(f"{k}_median"), 1) for k in ("param_mib", "grad_mib", "optim_mib"))
    # (a pipeline's stages differ by a few kB: 'least' is said where it reads less)
    uneven = low is not None and not pd.isna(low) and _num(low, 1) != _num(top, 1)
    return f"{_num(top, 1)} ({parts})" + (f"; least {_num(low, 1)}" if uneven else "")


def _interval(r: Mapping[str, Any], metric: str, digits: int) -> str:
    low, high = r[f"{metric}_ci_low"], r[f"{metric}_ci_high"]
    return "–" if low != low else f"{_num(low, digits)}–{_num(high, digits)}"


def precision_markdown(runs: pd.DataFrame) -> str:
    """How many steps --target-precision chose and where the target was not reached, in the
    rows the summary counts (each repeat's last epoch: every epoch stops by precision)."""
    if "target_precision_pct" not in runs:
        return ""
    runs = counted_rows(runs)
    target = pd.to_numeric(runs["target_precision_pct"], errors="coerce")
    ok = runs[target.notna()]
    if ok.empty:
        return ""
    goal = float(pd.to_numeric(ok["target_precision_pct"]).iloc[0])
    steps = pd.to_numeric(ok["timed_steps"], errors="coerce")
    got = pd.to_numeric(ok["step_precision_pct"], errors="coerce")
    short = ok[~(got <= goal)]
    missed = ", ".join(
        f"{r['strategy']} ws={r['world_size']} round {r.get('round', '?')} "
        f"(±{_num(r['step_precision_pct'], 1)} % in {_plain(r['timed_steps'])} steps)"
        for _, r in short.iterrows()
    )
    return (
        f"Timed steps chosen by precision (--target-precision {goal:g}): each cell stopped "
        f"once its mean step time was known to within ±{goal:g} % (95 %, blocks of 10 steps): "
        f"{int(steps.min())}–{int(steps.max())} timed steps, median {int(steps.median())}. "
        + (f"Not reached by the bound: {missed}." if missed else "Every cell reached it.")
    )


def resumed_markdown(counted: pd.DataFrame) -> str:
    """The counted repeats that a --resume measured, after the run had stopped: a run's rounds
    are its repeats, and a resume's come after every round already run (Runner.run), so a
    round past its repeat is one. Their rows read as any other, where they ran minutes or
    days apart from the cell's repeats before the stop; named where the cell has repeats
    from before it (its rounds past its repeats by other amounts: a cell whose repeats all
    ran in one resume is apart from none of its own); nothing for a run from before rounds."""
    if counted.empty or "round" not in counted:
        return ""
    offset = pd.to_numeric(counted["round"], errors="coerce") - pd.to_numeric(
        counted["repeat"], errors="coerce"
    )
    first = offset.groupby([counted[k] for k in KEY]).transform("min")
    later = counted[offset > first]
    if later.empty:
        return ""
    names = ", ".join(
        f"{cell_name(r)} ws={_plain(r['world_size'])} repeat {_plain(r['repeat'])} "
        f"(round {_plain(r['round'])}"
        f"{'' if pd.isna(r.get('timestamp')) else ', ' + str(r['timestamp'])})"
        for _, r in later.sort_values(["strategy", "world_size", "repeat"]).iterrows()
    )
    return (
        "Repeats measured by a `--resume`, after the run had stopped: apart in time from "
        "their cells' repeats before the stop (whatever changed on the machine in between is "
        f"in the spread over repeats), and never paired round by round with them: {names}."
    )


def factory_args(given: Mapping[str, Any]) -> str:
    """A run's --model-arg / --dataset-arg (config.json) as `k=v, ...`, sorted: the report's
    conditions and compare say them alike."""
    return ", ".join(f"{k}={v}" for k, v in sorted(given.items()))


def per_round(runs: pd.DataFrame | None) -> dict[tuple[str, int], dict[int, float]]:
    """Each cell's samples/s by round, from the counted rows: what pairs two cells of an
    interleaved run round by round; none for a run from before rounds (no `round`)."""
    if runs is None or runs.empty or "repeat" not in runs:
        return {}
    return {
        (name, int(ws)): by
        for (name, ws), grp in counted_rows(runs).groupby(KEY)
        if (by := _by_round(grp, "samples_per_s"))
    }


def _by_round(rows: pd.DataFrame, col: str) -> dict[int, float]:
    """A cell's `col` by the round each of its rows ran in; {} where the rows do not say
    (a run from before the matrix ran round by round ran a cell's repeats back to back, so
    its repeat r of two cells ran minutes apart: nothing a pair would cancel)."""
    rounds = pd.to_numeric(
        rows.get("round", pd.Series(math.nan, index=rows.index)), errors="coerce"
    )
    if rounds.isna().any():  # (or a round that is not a number: none to pair by)
        return {}
    values = pd.to_numeric(rows[col], errors="coerce")
    return dict(zip(rounds.astype(int), values, strict=True))


def _leaders(grp: pd.DataFrame, rounds: Mapping[tuple[str, int], Mapping[int, float]]):
    """The fastest of these summary rows (one world size) and those within noise of it
    (stats.leaders: paired round by round where `rounds` has them), and how that was decided;
    rows oversubscribed or with no samples/s left out; how is "" where fewer than 2 are left
    (nothing to rank against)."""
    grp = grp[(grp["oversubscribed"] != 1) & grp["samples_per_s_median"].notna()]
    cells = [
        (
            cell_name(r),
            r["samples_per_s_median"],
            (r["samples_per_s_ci_low"], r["samples_per_s_ci_high"]),
        )
        for _, r in grp.iterrows()
    ]
    mine = {
        cell_name(r): rounds[(r["strategy"], int(r["world_size"]))]
        for _, r in grp.iterrows()
        if (r["strategy"], int(r["world_size"])) in rounds
    }
    if len(cells) < 2:
        return [c[0] for c in cells], [], ""
    return stats.leaders(cells, rounds=mine)


def ranking_markdown(summary: pd.DataFrame, runs: pd.DataFrame | None = None) -> str:
    """Per world size, the fastest cell and those tied with it within noise (paired round by
    round where `runs` has the rounds); the unstable cells, and those measured while other
    processes took the CPUs."""
    lines = ranking_lines(summary, runs)
    if busy := busy_line(summary, runs):
        lines.append(busy)
    return "\n".join(f"- {t}" for t in lines)


def ranking_lines(summary: pd.DataFrame, runs: pd.DataFrame | None = None) -> list[str]:
    """ranking_markdown's lines but the busy one: per world size the fastest cell and those
    within noise of it, and the unstable cells."""
    lines = []
    rounds = per_round(runs)
    for ws, grp in summary.groupby("world_size"):
        best, untold, how = _leaders(grp, rounds)
        if not how:
            continue  # one cell: nothing to rank it against
        tied = (
            f"; within noise of it: {', '.join(best[1:])}"
            if best[1:]
            else "; no other within noise"
        )
        tied += "" if "no interval" in how else f" (by {how})"
        if "no interval" in how:
            tied = f" ({how})"
        if untold:  # fewer than 3 repeats: neither within noise nor shown slower
            tied += f"; {stats.untold_text(untold)}"
        lines.append(f"world size {ws}: fastest {best[0]}{tied}")
    unstable = summary[summary["unstable"] == 1]
    if len(unstable):
        names = ", ".join(
            f"{cell_name(r)} ws={r['world_size']}{_busy(r)}" for _, r in unstable.iterrows()
        )
        lines.append(
            f"unstable (samples/s varies more than {stats.UNSTABLE_CV_PCT:g} % over repeats): "
            f"{names}. More repeats (--repeats) or a quieter machine would narrow them."
        )
    return lines


def busy_share(summary: pd.DataFrame, runs: pd.DataFrame | None) -> pd.Series:
    """Per summary row, the most other processes used of the CPUs while a repeat of that
    cell ran on a CPU (its other_cpu_pct_max), where that is BUSY_PCT % or more; NaN for
    the rest, and for all where the run does not say (on a GPU the steps compute on the
    device)."""
    from bench.harness.env import BUSY_PCT

    none = pd.Series(math.nan, index=summary.index, dtype=float)
    if runs is None or not {"device", "other_cpu_pct"} <= set(runs.columns) or summary.empty:
        return none
    cpu = runs[runs["device"] == "cpu"]
    on_cpu = {(str(s), int(ws)) for s, ws in zip(cpu["strategy"], cpu["world_size"], strict=True)}
    took = pd.to_numeric(summary.get("other_cpu_pct_max", none), errors="coerce")
    here = [
        (str(s), int(ws)) in on_cpu
        for s, ws in zip(summary["strategy"], summary["world_size"], strict=True)
    ]
    return took.where(pd.Series(here, index=summary.index) & (took >= BUSY_PCT))


def busy_line(summary: pd.DataFrame, runs: pd.DataFrame | None) -> str:
    """The cells on a CPU that ran while other processes used BUSY_PCT % of the CPUs or more
    (a repeat's other_cpu_pct, busy_share): their steps ran on what those left them, so
    beside cells measured quieter they compare the load, not the strategies; a steady load
    leaves the repeats steady, and an unstable mark alone did not say it. "" where none did
    (on a GPU the steps compute on the device)."""
    from bench.harness.env import BUSY_PCT

    took = busy_share(summary, runs)
    busy = summary[took.notna()]
    if busy.empty:
        return ""
    names = (
        f"every cell (at most {took.max():.1f} %)"
        if len(busy) == len(summary) > 1
        else ", ".join(
            f"{cell_name(r)} ws={r['world_size']} (at most {r['other_cpu_pct_max']:.1f} %)"
            for _, r in busy.iterrows()
        )
    )
    return (
        f"measured while other processes used {BUSY_PCT:g} % of the CPUs or more: "
        f"{names}. Their steps ran on what those processes left them, so beside cells "
        "measured on a quieter machine they compare the load, not the strategies: rerun them "
        "on a quiet one."
    )


def run_end_lines(run_dir: str | Path) -> tuple[list[str], str]:
    """What `parabench run` prints under its table, of the run in `run_dir`: the ranking's
    lines (ranking_lines: which cells are within noise of the fastest, or that too few
    repeats tell none apart) and busy_line, so that a reader of the terminal alone does not
    take a speed-up within noise, or the load's, for the strategy's, as the report's reader
    does not. Nothing where its rows cannot be read (the table said what ran)."""
    try:
        run = load_run(run_dir)
    except ConfigError:
        return [], ""
    summary = summarise(run.runs)
    return ranking_lines(summary, run.runs), busy_line(summary, run.runs)


def cell_numerics(counted: pd.DataFrame) -> dict[tuple[str, int], str]:
    """Each cell's numeric recipe, its `numerics` (`exact` fp32, `autocast_bf16`, `grad_fp16`,
    `powersgd`, ...); in a run from before that column, `exact` for fp32 and else its
    precision, gradient compression not told apart; none where neither is there."""
    out = {}
    for (name, ws), grp in counted.groupby(KEY):
        r = grp.iloc[0]
        recipe = str(r["numerics"]) if pd.notna(r.get("numerics")) else ""
        if not recipe and pd.notna(r.get("precision")):
            p = str(r["precision"])
            recipe = "exact" if p == "fp32" else p
        if recipe:
            out[(str(name), int(ws))] = recipe
    return out


def _pace(r: Mapping[str, Any]) -> str:
    """A cell's speed-up over single with its interval, or its samples/s where it has none;
    and whether the summary marks it unstable (a leader named without it read as steady)."""
    shaky = (
        f", unstable (samples/s CV {_num(r['samples_per_s_cv_pct'], 1)} % over repeats)"
        if r.get("unstable") == 1
        else ""
    )
    if r["speedup_vs_single"] != r["speedup_vs_single"]:
        return f"{_num(r['samples_per_s_median'], 1)} samples/s{shaky}"
    ci = _interval(r, "speedup", 2)
    pace = f"{_num(r['speedup_vs_single'], 2)}x single"
    return pace + ("" if ci == "–" else f" ({ci})") + shaky


def _beside(r: Mapping[str, Any], base: Mapping[str, Any] | None, metric: str, what: str) -> str:
    """`what` of a cell, beside single's where there is one."""
    mine = r[f"{metric}_median"]
    if mine != mine:
        return ""
    theirs = math.nan if base is None else base[f"{metric}_median"]
    return f"{what} {_num(mine, 3)}" + ("" if theirs != theirs else f" (single {_num(theirs, 3)})")


def _speed_lines(
    ws: int,
    grp: pd.DataFrame,
    same: pd.DataFrame,
    rounds: Mapping[tuple[str, int], Mapping[int, float]],
    recipes: Mapping[tuple[str, int], str],
    want: str,
    base: pd.Series | None,
) -> list[str]:
    """At world size `ws`, of its timed cells `grp`: the fastest of those with single's
    numerics (`same`; `want`, named plainly where there is no single `base`), those within
    noise of it and the slowest; and the fastest of all where it is another recipe, with its
    accuracy and loss beside single's (and the first's name where it is within noise of it)."""
    if grp.empty:
        return []  # no speed to rank here (oversubscribed, or no samples/s)
    named = {cell_name(r): r for _, r in grp.iterrows()}
    best, untold, how = _leaders(same, rounds) if len(same) else ([], [], "")
    numerics = f"numerics `{want}`" if base is None else f"single's numerics (`{want}`)"
    if not best:
        lines = [f"world size {ws}: no cell with {numerics} timed"]
    else:
        first = "fastest" if len(same) > 1 else "only"
        line = f"world size {ws}, with {numerics}: {first} {best[0]}, "
        line += _pace(named[best[0]])
        if "no interval" in how:
            line += f" ({how})"
        elif how:
            line += f"; within noise of it: {', '.join(best[1:])}" if best[1:] else ""
            line += "" if best[1:] else "; no other within noise"
            line += f"; {stats.untold_text(untold)}" if untold else ""
        slowest = cell_name(same.loc[same["samples_per_s_median"].idxmin()])
        if slowest not in best:
            line += f"; slowest {slowest}, {_pace(named[slowest])}"
        lines = [line]
    top, top_untold, _ = (best, untold, how) if len(same) == len(grp) else _leaders(grp, rounds)
    if top and top[0] not in best:
        r = named[top[0]]
        recipe = recipes.get((str(r["strategy"]), ws), "?")
        # ahead by its median alone where single's numerics' fastest is within noise of it
        # (or not told apart): named as the fastest, it read as a gain bought with its recipe
        level = (
            f"; within noise of it: {best[0]}, with {numerics}"
            if best and best[0] in top
            else f"; {stats.untold_text(best[:1])}"
            if best and best[0] in top_untold
            else ""
        )
        said = [
            t
            for t in (
                _beside(r, base, "eval_accuracy", "eval accuracy"),
                _beside(r, base, "train_loss_final", "final loss"),
            )
            if t
        ]
        lines.append(
            f"world size {ws}, fastest of all: {top[0]} (`{recipe}`), {_pace(r)}{level}"
            + (f"; {', '.join(said)}" if said else "")
        )
    return lines


def _no_gain_line(
    ws: int, same: pd.DataFrame, threads: float | None, shares: Mapping[int, float]
) -> str:
    """At world size `ws` > 1, a line where no cell of `same` (single's numerics) is shown
    faster than single at world size 1, and why where its ranks split single's threads."""
    if ws == 1 or same.empty:
        return ""
    low = same["speedup_ci_low"].where(same["speedup_ci_low"].notna(), same["speedup_vs_single"])
    if (low > 1).any():
        return ""
    why = (
        f": their ranks share the {_plain(threads)} thread(s) single computed with "
        "alone (threads per rank, under Conditions)"
        if ws in shares
        else ""
    )
    return (
        f"world size {ws}: no cell with single's numerics is shown faster than "
        f"single at world size 1 (speed-up, or its 95 % interval where it has one, above 1){why}"
    )


def _state_line(ws: int, rows: pd.DataFrame) -> str:
    """At world size `ws`, the cells with the lightest model state on their heaviest rank,
    and those split unevenly that save nothing there; "" where all hold the same."""
    state = rows.dropna(subset=["model_state_mib_median"])
    mib = state["model_state_mib_median"]
    if len(state) < 2 or mib.min() >= 0.99 * mib.max():
        return ""
    most, least = mib.max(), mib.min()
    light = state[mib <= 1.01 * least]
    # cells within 1 % of the least are named together; where they round apart (6.1 and
    # 6.2), the figure is their range, as the summary shows each, not the least alone
    top = _num(light["model_state_mib_median"].max(), 1)
    held = _num(least, 1) if top == _num(least, 1) else f"{_num(least, 1)}–{top}"
    line = (
        f"world size {ws}, lightest model state on the heaviest rank: "
        f"{', '.join(cell_name(r) for _, r in light.iterrows())} "
        f"({held} MiB, against up to {_num(most, 1)})"
    )
    lop = state[(mib >= 0.99 * most) & (state["model_state_mib_lightest_median"] < 0.99 * most)]
    if len(lop):
        line += "; split unevenly over ranks, saving nothing on the heaviest: " + ", ".join(
            f"{cell_name(r)} (least {_num(r['model_state_mib_lightest_median'], 1)})"
            for _, r in lop.iterrows()
        )
    return line


def _loss_line(run: Run, base: pd.Series | None) -> str:
    """The cells whose training loss departs from single's (DEPART_PCT); "" where none does
    or there is no single to compare with."""
    gone = None if base is None else run.departing(str(base["strategy"]))
    if not gone:
        return ""
    return (
        f"training loss more than {DEPART_PCT:g} % off single's (mean over the "
        f"steps; loss plot): {', '.join(gone)}"
    )


def pick_markdown(run: Run, summary: pd.DataFrame) -> str:
    """Which strategy to pick, from this run's measurements: per world size the fastest cell
    that trains what single trains (its numerics) and those within noise of it, the fastest
    of all where that is another recipe (with what it does to accuracy and loss), whether any
    beats single at world size 1, the lightest model state, and losses that depart; "" where
    there is none of these."""
    if summary.empty:
        return ""
    counted = counted_rows(run.runs)
    recipes = cell_numerics(counted)
    base = baseline_row(summary)
    want = recipes.get((str(base["strategy"]), 1), "exact") if base is not None else "exact"
    rounds = per_round(run.runs)
    threads, shares = thread_shares(counted)
    lines = []
    for ws, rows in summary.groupby("world_size"):
        ws = int(ws)
        grp = rows[(rows["oversubscribed"] != 1) & rows["samples_per_s_median"].notna()]
        mine = grp["strategy"].map(lambda s, ws=ws: recipes.get((str(s), ws), want) == want)
        same = grp[mine.astype(bool)]
        lines += _speed_lines(ws, grp, same, rounds, recipes, want, base)
        if base is not None:
            lines.append(_no_gain_line(ws, same, threads, shares))
        lines.append(_state_line(ws, rows))
    lines.append(_loss_line(run, base))
    lines.append(busy_line(summary, run.runs))
    if recipes and ("numerics" not in counted or counted["numerics"].isna().all()):
        lines.append(
            "this run predates the `numerics` column: cells are told apart by precision "
            "only, so compressed gradients count as single's numerics"
        )
    lines = [t for t in lines if t]
    if not lines:
        return ""
    against = (
        "no `single` at world size 1 to compare with, so samples/s and no speed-ups"
        if base is None
        else "speed-up over `single` at world size 1, in brackets its 95 % interval"
    )
    return f"From this run alone ({against}; within noise as under Summary):\n\n" + "\n".join(
        f"- {t}" for t in lines
    )


def _busy(row: Mapping[str, Any]) -> str:
    """What else ran while an unstable cell's repeats ran, where it was measured: a cell that
    varies while nothing else ran points at the machine (clock, hypervisor), not a neighbour."""
    other, steal = row.get("other_cpu_pct_max", math.nan), row.get("cpu_steal_pct_max", math.nan)
    said = [
        f"{what} at most {v:.1f} %"
        for what, v in (("other processes' CPU", other), ("steal", steal))
        if v == v
    ]
    return f" ({', '.join(said)})" if said else ""


def summary_markdown(summary: pd.DataFrame) -> str:
    header = [
        "strategy",
        "world size",
        "repeats",
        "samples/s",
        "95% CI",
        "CV %",
        "speed-up",
        "efficiency",
        "timed epoch (s)",
        "step p50 (ms)",
        "step p90 (ms)",
        "data wait (%)",
        "peak mem/device (MiB)",
        "model state/rank (MiB)",
        "final loss",
        "eval acc",
    ]
    rows = []
    # efficiency over a single in other run options than the row's own: marked †
    marks = [over_other_single(summary, r) for _, r in summary.iterrows()]
    for (_, r), mark in zip(summary.iterrows(), marks, strict=True):
        speedup = _num(r["speedup_vs_single"], 2)
        rows.append(
            [
                cell_name(r),
                r["world_size"],
                r["n_repeats"],
                _with_range(r, "samples_per_s", 1),
                _interval(r, "samples_per_s", 1),
                _num(r["samples_per_s_cv_pct"], 1) + (" unstable" if r["unstable"] else ""),
                (speedup if speedup == "–" else f"{speedup}x")
                + (
                    f" ({_interval(r, 'speedup', 2)})"
                    if r["speedup_ci_low"] == r["speedup_ci_low"]
                    else ""
                ),
                _num(r["scaling_efficiency"], 2) + ("†" if mark else ""),
                _with_range(r, "timed_s", 3),
                _with_range(r, "step_time_ms_p50", 1),
                _with_range(r, "step_time_ms_p90", 1),
                _with_range(r, "data_wait_pct", 1),
                _with_range(r, "peak_mem_mib", 0),
                model_state_text(r),
                _num(r["train_loss_final_median"], 3),
                _num(r["eval_accuracy_median"], 3),
            ]
        )
    tokens = pd.to_numeric(summary.get("tokens_per_s_median"), errors="coerce")
    if tokens is not None and tokens.notna().any():  # a token model: its work in tokens too
        at = header.index("speed-up")  # after samples/s and its interval and CV
        header.insert(at, "tokens/s")
        for row, (_, r) in zip(rows, summary.iterrows(), strict=True):
            row.insert(at, _with_range(r, "tokens_per_s", 0))
    note = (
        "\n\n† efficiency over plain `single`: the run has no `single` in this row's run "
        "options, so it includes what they change, not only how the cell scales."
    )
    return md_table(header, rows) + (note if any(marks) else "")


def token_note(summary: pd.DataFrame) -> str:
    """What a sample is where the summary has tokens/s (a token model), or ''. samples/s
    alone reads like images; for a language model it counts sequences."""
    if "tokens_per_s_median" not in summary:  # a run of before the column
        return ""
    tokens = pd.to_numeric(summary["tokens_per_s_median"], errors="coerce")
    if not tokens.notna().any():
        return ""
    sps = pd.to_numeric(summary["samples_per_s_median"], errors="coerce")
    per = sorted({round(t / s) for t, s in zip(tokens, sps, strict=True) if t == t and s > 0})
    each = f"{per[0]:,} tokens" if len(per) == 1 else "its tokens"
    return f" A sample is one sequence of {each}: tokens/s is samples/s times that."


def over_other_single(summary: pd.DataFrame, r: pd.Series) -> bool:
    """Whether a row's efficiency is over a single in other run options than its own (the
    table's †, the efficiency plot's hollow marker)."""
    over = summary[summary["strategy"] == r.get("efficiency_over", "")]
    if over.empty or r["scaling_efficiency"] != r["scaling_efficiency"]:
        return False
    return _run_options(over.iloc[0]["setting"]) != _run_options(r["setting"])


#: model-parallel measurements of runs.csv (pipeline and tensor-parallel rows only)
MODEL_PARALLEL = results.EXTRA


def _is_model_parallel(rows: pd.DataFrame) -> pd.Series:
    """Per row: whether it has pipeline stages or bytes of tensor-parallel collectives."""
    flags = pd.Series(False, index=rows.index)
    for col in ("pipeline_stages", "collective_mib_per_step"):
        if col in rows:
            flags |= pd.to_numeric(rows[col], errors="coerce").notna()
    return flags


def model_parallel_markdown(counted: pd.DataFrame, summary: pd.DataFrame) -> str:
    """The pipeline and tensor-parallel figures of the counted rows, medians over repeats,
    one row per strategy label and world size; '' when no counted row has any."""
    if counted.empty:
        return ""
    rows_mp = counted[_is_model_parallel(counted)]
    if rows_mp.empty:
        return ""
    by_cell = {(str(r["strategy"]), int(r["world_size"])): r for _, r in summary.iterrows()}
    header = [
        "strategy",
        "world size",
        "stages",
        "micro-batches",
        "bubble measured (%)",
        "bubble textbook (%)",
        "MiB between stages/step",
        "MiB of collectives/step",
        "model state/rank (MiB)",
    ]
    digits = dict(zip(MODEL_PARALLEL, (0, 0, 1, 1, 1, 1), strict=True))
    table = []
    for (name, ws), grp in _by_case(rows_mp):
        med = {
            col: pd.to_numeric(grp[col], errors="coerce").median() if col in grp else math.nan
            for col in MODEL_PARALLEL
        }
        stages, m = med["pipeline_stages"], med["microbatches"]
        if stages >= ws >= 1 and m >= 1:  # as the formula is now, for a run made before it
            med["bubble_theory_pct"] = 100 * results.textbook_bubble(ws, stages / ws, m)
        cell = by_cell.get((str(name), int(ws)))
        label = cell_name(cell) if cell is not None else str(name)
        if cell is None and oversubscribed(grp):
            label = f"{name} (oversubscribed)"
        table.append(
            [
                label,
                int(ws),
                *(_num(med[col], digits[col]) for col in MODEL_PARALLEL),
                model_state_text(cell) if cell is not None else "–",
            ]
        )
    note = (
        "Bubble measured: the share of each rank's pipeline time (its forward and backward "
        "of the step's micro-batches) spent outside its own forward and backward chunks, that "
        "is waiting for a neighbouring stage or sending to it; mean over ranks. Textbook: "
        "(p-1)/(v*m+p-1) for p ranks, v stages per rank and m micro-batches (interleaved with "
        "fewer micro-batches than ranks, 1-v*m/(m+v*p-1): the pipe cannot fill), which assumes "
        "equal stages and free communication, so uneven stages and slow sends show as a "
        "measured bubble above it (and oversubscribed ranks, which share cores, wait more). "
        "MiB per optimizer step, summed over ranks: between stages, the activations sent "
        "forward and their gradients sent back; collectives, what the ranks hand to "
        "collective operations (tensor parallelism's, and FSDP's where combined with it)."
    )
    return md_table(header, table) + "\n\n" + note


def _distinct(runs: pd.DataFrame, col: str) -> str:
    if col not in runs:
        return ""
    return ", ".join(sorted({_plain(v) for v in runs[col].dropna().unique()} - {""}))


def _plain(v: Any) -> str:
    # int-valued columns read back as float when a status row left them empty
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def environment_markdown(run: Run) -> str:
    """Hardware and versions, from the rows' provenance columns (environment.json if none)."""
    labels = {
        "host": "host",
        "device_type": "device type",
        "device_names": "devices",
        "gpu_count": "GPUs",
        "cpu_model": "CPU",
        "cpu_cores": "CPU cores",
        "platform": "platform",
        "python_version": "Python",
        "torch_version": "torch",
        "torchvision_version": "torchvision",
        "cuda_version": "CUDA",
        "cudnn_version": "cuDNN",
        "nccl_version": "NCCL",
        "horovod_version": "Horovod",
        "apex_version": "apex",
        "parabench_version": "parabench",
        "git_commit": "git commit",
    }
    rows = []
    for col, label in labels.items():
        value = _distinct(run.runs, col) or str(run.environment.get(col, "") or "")
        rows.append([label, value or "–"])
    stamps = run.runs["timestamp"].dropna().astype(str) if "timestamp" in run.runs else []
    if len(stamps):
        rows.append(["run time", f"{min(stamps)} .. {max(stamps)}"])
    return md_table(["", "value"], rows)


def _one_value(counted: pd.DataFrame, col: str) -> str:
    """A condition that must be equal for all strategies: the value, or a loud warning."""
    vals = _distinct(counted, col)
    return vals if "," not in vals else f"**differs: {vals}**"


def fairness_markdown(run: Run, counted: pd.DataFrame) -> str:
    cfg = run.config
    if counted.empty:  # nothing ran: the planned conditions are still worth stating
        counted = run.runs

    def said(col: str) -> str:
        """The rows' value, else (no row says: none ran) config.json's."""
        got = _one_value(counted, col)
        if got or cfg.get(col) is None:
            return got
        return _plain(cfg[col])

    def args(key: str) -> str:
        """--model-arg / --dataset-arg as given (config.json): what the name alone does not
        say, as the lm's size (tiny and base are both `lm`)."""
        given = cfg.get(key) or {}
        if not isinstance(given, dict) or not given:
            return ""
        return " with " + factory_args(given)

    lines = [
        f"- data set: {said('dataset') or '–'}{args('dataset_kwargs')} "
        f"({_distinct(counted, 'data') or 'no description'})",
        f"- model: {said('model')}{args('model_kwargs')}; device: {said('device')}",
        f"- global batch (the same for every strategy and at every world size, whose "
        f"data-parallel ranks share it: strong scaling): {said('global_batch')}",
        f"- warm-up steps excluded from timing, per epoch: {said('warmup_steps')}",
        f"- seed: {said('seed')}; learning rate: {said('lr')}; "
        f"optimizer: {said('optimizer') or 'sgd'}",
        f"- epochs: {said('epochs')}; max steps per epoch: "
        f"{said('max_steps') or 'all'}; repeats asked for: {cfg.get('repeats', '–')}",
    ]
    unnamed = _unnamed_options(counted)
    if unnamed:
        said = "; ".join(f"{case} ({hidden})" for case, each in unnamed.items() for hidden in each)
        cases = {name for (name, _), _ in _by_case(counted)}
        lines.append(
            f"- strategy options (--set) beyond those in the case names: {said}"
            + ("; none for the other cases" if len(cases) > len(unnamed) else "")
        )
    per_cell = {
        "launcher": "launcher",
        "backend": "backend",
        "precision": "precision",
        "numerics": "numerics",
        "data path": "data_path",  # batches indexed on the device, or a DataLoader's
        "loader workers": "loader_workers",
        "threads per rank": "threads_per_rank",
        "notes": "notes",
    }
    header = ["strategy", "world size", "global batch split", *per_cell]
    rows = [
        [name, ws, batch_split(grp), *(_distinct(grp, col) or "–" for col in per_cell.values())]
        for (name, ws), grp in _by_case(counted)
    ]
    note = (
        "Global batch split: the micro-batch computed at a time x micro-batches per optimizer "
        "step (accumulated, or fed through a pipeline's stages) x data-parallel shares (the "
        "parts of the global batch trained at once, each on different samples); every "
        "strategy at a world size takes the same global batch per optimizer step. Pipeline "
        "stages and tensor-parallel ranks train one share between them ('ranks per share'); "
        "DataParallel's one process splits its one share across its GPUs itself."
    )
    return "\n".join(lines) + "\n\n" + note + "\n\n" + md_table(header, rows)


def _unnamed_options(rows: pd.DataFrame) -> dict[str, list[str]]:
    """Each case's --set options that its name leaves out (case -> `option, ...` for each
    setting it ran): a name shows only the options that vary in the run, so `--set
    bucket_cap_mb=1` on every DDP cell left `ddp_spawn` bare, read as DDP's default
    buckets."""
    if "setting" not in rows:
        return {}
    out: dict[str, list[str]] = {}
    for case, grp in _by_case(rows.drop_duplicates([*KEY, "setting"])):
        shown = set(case[0].partition(" [")[2].rstrip("]").split(", "))
        for setting in dict.fromkeys(grp["setting"]):
            hidden = ", ".join(t for t in str(setting).split(",") if "=" in t and t not in shown)
            if hidden and hidden not in out.get(case[0], []):
                out.setdefault(case[0], []).append(hidden)
    return out


def _count(v: Any) -> int | None:
    """A positive whole number from a cell of runs.csv, or None (empty, NaN, text, 0)."""
    try:
        n = int(float(v))
    except (TypeError, ValueError, OverflowError):
        return None
    return n if n > 0 else None


def batch_split(grp: pd.DataFrame) -> str:
    """How a cell's global batch per optimizer step is split, e.g. `16 x 2 x 2 data-parallel
    shares`, with `, 2 ranks per share` where model parallelism has ranks share one."""
    row = grp.iloc[0]
    per_rank, global_batch = _count(row.get("per_rank_batch")), _count(row.get("global_batch"))
    if per_rank is None or global_batch is None:
        return "–"
    micro = _count(row.get("micro_batch")) or per_rank
    acc = max(per_rank // micro, 1)
    # runs from before data_ranks: one share per per-rank batch
    shares = _count(row.get("data_ranks")) or max(global_batch // per_rank, 1)
    text = f"{micro} x {acc} x {shares} data-parallel share{'' if shares == 1 else 's'}"
    ws = _count(row.get("world_size"))
    if ws and shares < ws and bool(_is_model_parallel(grp.iloc[[0]]).iloc[0]):
        text += f", {ws // shares} ranks per share"
    return text


def growth_markdown(counted: pd.DataFrame) -> str:
    """The counted cells whose memory grew over their timed steps (results.grew), or ""."""
    if "held_growth_mib" not in counted:
        return ""
    growth = pd.to_numeric(counted["held_growth_mib"], errors="coerce")
    peak = pd.to_numeric(counted["peak_mem_mib"], errors="coerce")
    free = pd.to_numeric(
        counted.get("malloc_free_growth_mib", pd.Series(math.nan, index=counted.index)),
        errors="coerce",
    )
    grown = [
        (r, g, p, f)
        for (_, r), g, p, f in zip(counted.iterrows(), growth, peak, free, strict=True)
        if results.grew(g, p)
    ]
    if not grown:
        return ""
    from bench.harness.breakdown import SPARSE_EVERY_S  # how often a GPU's loop reads it

    header = ["strategy", "world size", "repeat", "grew (MiB)", "peak (MiB)"]
    said = any(f == f for *_, f in grown)  # a CPU row's, where the C library says
    rows = [
        [r["strategy"], int(r["world_size"]), int(r["repeat"]), _num(g, 0), _num(p, 0)]
        + ([_num(f, 0) if f == f else "–", _malloc_verdict(g, f)] if said else [])
        for r, g, p, f in grown
    ]
    malloc = (
        " On a CPU the resident set also holds what glibc's malloc keeps free once tensors "
        "are freed, for its next allocations: freed between blocks still in use it is not "
        "given back, and the resident set can climb step after step with no tensor more "
        "(model_split's last stage grew 350 MiB in 60 steps with the same tensors live; "
        "malloc_trim gave it all back). `malloc free grew` is how much more malloc held "
        "free, taken as `grew` is, the last quarter of the timed steps against the first "
        "(runs.csv `malloc_free_growth_mib`): where it is about the growth, the growth is "
        "malloc's keeping, no tensor kept, though the process holds that memory all the same."
        if said
        else ""
    )
    return (
        "What a rank held at the end of each step (the allocator's allocated memory on a "
        "GPU, the resident set on a CPU; each rank's growth in ranks.csv, rank 0's "
        "readings in steps.csv `held_mib`) grew over the timed steps of these cells (the "
        f"rank that grew most), by more than {results.GROWTH_MIB:.0f} MiB and "
        f"{results.GROWTH_SHARE:.0%} of their peak (the median of the readings in the last "
        "quarter of the timed steps less the first quarter's; on a GPU a step is read at "
        f"most every {SPARSE_EVERY_S['cuda'] * 1e3:g} ms). Steady training holds the same at "
        "every step's "
        "end: this is a leak (tensors kept from step to step) or work a collective has not "
        f"released yet{', or on a CPU memory malloc keeps free' if said else ''}, and a "
        f"longer run's peak would be higher still.{malloc}\n\n"
        + md_table(header + (["malloc free grew (MiB)", "what grew"] if said else []), rows)
    )


def loader_workers_note(counted: pd.DataFrame) -> str:
    """Where CPU cells' DataLoaders had workers: that the rank's resident set leaves them
    out, or ""."""
    cpu = counted[counted.get("mem_source", pd.Series("", index=counted.index)) == "host_rss"]
    workers = pd.to_numeric(cpu.get("loader_workers", pd.Series(dtype=float)), errors="coerce")
    if not (workers > 0).any():
        return ""
    return (
        " A rank's DataLoader workers (loader workers, under Conditions) are processes of "
        "their own, not in it: each holds what it decodes and prefetches besides (20 and "
        "43 MiB of their own for two workers of the ImageNet subset at 224 pixels, batch "
        "32), and shares the rest of its resident set with its rank."
    )


def malloc_free_note(summary: pd.DataFrame) -> str:
    """The CPU cells whose rank at the peak ended its steps with much of its resident set
    free in malloc (past GROWTH_MIB and GROWTH_SHARE of the peak, as growth is named), or
    "": such a peak is partly the allocator's keeping, no tensor's."""
    if "malloc_free_mib_median" not in summary:
        return ""
    free = pd.to_numeric(summary["malloc_free_mib_median"], errors="coerce")
    peak = pd.to_numeric(summary["peak_mem_mib_median"], errors="coerce")
    cells = [
        f"{cell_name(r)} at world size {int(r['world_size'])}, {_num(f, 0)} of {_num(p, 0)} MiB"
        for (_, r), f, p in zip(summary.iterrows(), free, peak, strict=True)
        if "host_rss" in str(r.get("mem_source")) and results.grew(f, p)
    ]
    if not cells:
        return ""
    return (
        " Part of a resident set can be memory glibc's malloc keeps free for its next "
        "allocations once tensors are freed, no tensor's: the rank at these cells' peak "
        "ended its steps with this much of its resident set free in malloc (runs.csv "
        f"`malloc_free_mib`), and that much less in tensors: {'; '.join(cells)}."
    )


def _malloc_verdict(growth: float, free: float) -> str:
    """What a CPU row's growth is, from how much of it malloc held free (growth_markdown)."""
    if free != free:
        return "not known"
    return "malloc's free memory" if free >= growth / 2 else "memory in use"


def problems_markdown(
    runs: pd.DataFrame, summary: pd.DataFrame, missing: int = 0, retry: str = ""
) -> str:
    """Every non-ok cell with its status and reason, and strategies with no result at all
    (`missing`: the planned cells with no row, which the report's head lists). `retry`: the
    command that runs the failed ones again, said where any failed, ran out of memory or
    timed out."""
    bad = runs[runs["status"] != results.OK]
    lines = []
    no_result = sorted(set(runs["strategy"]) - set(summary["strategy"]), key=results.natural_key)
    if no_result:
        lines.append(
            f"Strategies with no ok result (not in the summary): {', '.join(no_result)}.\n"
        )
    if runs.empty:
        return "No cell has a row yet (the run stopped before its first cell ended)."
    if bad.empty:
        lines.append(
            f"Every cell that ran finished ok; {missing} planned cell(s) did not run (above)."
            if missing
            else "Every cell finished ok."
        )
        return "\n".join(lines)
    rows = []
    for (name, ws, status, reason), grp in _by_case(bad, "status", "reason"):
        repeats = ", ".join(f"r{int(r)}" for r in sorted(grp["repeat"].unique()))
        rows.append([name, ws, status, repeats, reason or "–"])
    lines.append(
        "A repeat listed here is left out of the summary, even where some of its epochs "
        "finished. repeat(s): which repeats, by index from r0 (not how many).\n"
    )
    lines.append(md_table(["strategy", "world size", "status", "repeat(s)", "reason"], rows))
    if retry and bad["status"].isin(results.RETRYABLE).any():
        lines.append(
            f"\nTo run those that failed, ran out of memory or timed out again: `{retry}` "
            "(each earlier attempt is kept, under retried/)."
        )
    return "\n".join(lines)


def retry_command(run: Run) -> str:
    """The command that runs the run's failed cells again; "" for a verify's run, whose
    resume finishes its cells with no verdict (verify has none: it is run again whole)."""
    if results.of_verify(run.config):
        return ""
    return results.resume_command(
        str(run.config.get("launcher") or ""), run.path, "parabench", True
    )


def retried_markdown(run: Run) -> str:
    """The cells `--retry-failed` ran again: each earlier attempt, how it ended and where
    its rows and folder are kept, beside how the cell's row ends now; "" where none."""
    if run.retried_unread:
        return (
            "The earlier attempts of the cells `run --resume RUN --retry-failed` ran again "
            f"are not listed: {run.retried_unread}"
        )
    old = run.retried
    if old.empty:
        return ""
    # the row that says how the attempt ended (its epochs before it are rows of their own)
    old = old[old["status"].isin(results.RETRYABLE)]
    if old.empty:  # none says how an attempt ended (a file edited by hand): no empty table
        return ""
    now: dict[tuple[str, int, str, int], str] = {}
    for r in run.runs.itertuples():
        key = (str(r.strategy_name), int(r.world_size), str(r.setting), int(r.repeat))
        if now.get(key, results.OK) == results.OK:  # the cell's first status not ok, else ok
            now[key] = str(r.status)
    rows = []
    for r in old.itertuples():
        setting = "" if pd.isna(r.setting) else str(r.setting)
        key = (str(r.strategy), int(r.world_size), setting, int(r.repeat))
        extra = "" if setting in ("", "fp32") else f" {setting}"
        rows.append(
            [
                f"{r.strategy}{extra}",
                int(r.world_size),
                f"r{int(r.repeat)}",
                "–" if pd.isna(r.attempt) else _plain(r.attempt),
                f"{r.status}: {r.reason or '–'}",
                now.get(key, "no row yet"),
                "–" if pd.isna(r.attempt_dir) else f"{r.attempt_dir}/",
            ]
        )
    return (
        "Cells run again by `run --resume RUN --retry-failed`: each earlier attempt (1 is the "
        "first), how it ended, and how the cell ends now. An attempt's rows are in "
        "retried/runs.csv (steps and ranks beside it), its log and epochs in its folder.\n\n"
        + md_table(["strategy", "world size", "repeat", "attempt", "ended", "now", "kept in"], rows)
    )


def startup_markdown(counted: pd.DataFrame, runs: pd.DataFrame | None = None) -> str:
    """Start-up and teardown per launcher (medians over the ok cells), and the share of
    the cells' wall time that is timed training, every epoch of theirs in `runs` (counted
    holds only the last); "" for a run from before they were kept."""
    if "startup_s" not in counted or counted["startup_s"].isna().all():
        return ""
    cols = ["startup_launch_s", "startup_rendezvous_s", "startup_setup_s", "startup_s"]
    cols += ["teardown_s"]
    rows = []
    for launcher, grp in counted.groupby("launcher"):
        med = grp[cols].median()
        rows.append([launcher, len(grp), *(f"{med[c]:.2f}" for c in cols)])
    wall = counted["cell_wall_s"].sum()
    rep = ["strategy", "world_size", "repeat"]
    epochs = counted if runs is None else runs.merge(counted[rep], on=rep)
    timed = pd.to_numeric(epochs["timed_s"]).sum() / wall if wall > 0 else float("nan")
    return (
        "Seconds per cell, median over its cells: launch (the launcher, the interpreter and "
        "imports, to the worker's entry on rank 0), rendezvous (joining the process group), "
        "setup (data, model, wrapping), their sum to the first step, and teardown (from the "
        "last record to the cell's end). `.venv/bin/python benchmarks/startup.py` measures "
        "each launcher bare, for what the harness adds.\n\n"
        + md_table(
            ["launcher", "cells", "launch", "rendezvous", "setup", "to first step", "teardown"],
            rows,
        )
        + f"\n\nTimed training is {timed:.0%} of the cells' wall time (the rest: start-up, "
        "warm-up steps, evaluation, teardown)."
    )


def _within_noise(mine: pd.DataFrame, theirs: pd.DataFrame, col: str) -> bool:
    """Whether two cells' `col` over their counted repeats are not told apart, by the rule
    the summary's ranking uses (stats.tied), either way round: the paired ratio's 95 %
    interval reaching 1 where they share 3 rounds, else their 95 % intervals overlapping;
    False where either has no interval (fewer than 3 repeats: the point estimates stand)."""
    a, b = (pd.to_numeric(g[col], errors="coerce") for g in (mine, theirs))
    rounds = (_by_round(mine, col), _by_round(theirs, col))
    return bool(stats.tied(rounds, (stats.t_interval(a), stats.t_interval(b)))[0])


def compile_markdown(runs: pd.DataFrame, counted: pd.DataFrame) -> str:
    """What torch.compile cost beside what it bought: each compiled case's first step
    (epoch 0's first_step_ms, which holds the compilation; median over the counted repeats)
    beside the eager case's of the same strategy, world size and other options where the
    run has one, and the steps at their median step times that repay the difference; ""
    where no compiled cell counts. The summary's figures are timed steps only, so without
    this the one-off cost (a minute on a CPU) shows nowhere in the report."""
    if counted.empty or "first_step_ms" not in runs or "setting" not in counted:
        return ""
    compiled = counted[counted["setting"].map(lambda s: results.compiled(str(s)))]
    if compiled.empty:
        return ""
    rep = ["strategy", "world_size", "repeat"]
    first = runs[pd.to_numeric(runs["epoch"], errors="coerce") == 0].merge(counted[rep], on=rep)
    first = first.assign(first_step_s=pd.to_numeric(first["first_step_ms"], errors="coerce") / 1e3)
    rows = []
    for (case, ws), grp in _by_case(compiled):
        mine = first[(first["strategy"] == case) & (first["world_size"] == ws)]
        key = results.setting_key(str(grp["setting"].iloc[0]), compile="eager")
        twin = counted[
            (counted["strategy_name"] == grp["strategy_name"].iloc[0])
            & (counted["world_size"] == ws)
            & (counted["setting"].map(results.setting_key) == key)
        ]
        theirs = first[first["strategy"].isin(set(twin["strategy"])) & (first["world_size"] == ws)]
        step, eager_step = _median_of(grp, "step_time_ms_p50"), _median_of(twin, "step_time_ms_p50")
        # the cold compile: the slowest first step (later repeats may find the cache warm)
        cold = pd.to_numeric(mine["first_step_s"], errors="coerce").max()
        extra = cold - _median_of(theirs, "first_step_s")
        saved = (eager_step - step) / 1e3
        if twin.empty or math.isnan(extra + saved):
            repaid = "–"
        elif _within_noise(grp, twin, "step_time_ms_p50"):
            # a saving (or a loss) the repeats do not show: any count of steps, or "never",
            # would be the noise's
            repaid = "not shown (steps within noise of eager's)"
        elif saved <= 0:
            repaid = "never (no faster a step)"
        elif extra <= 0:
            repaid = "at once"
        else:
            repaid = f"{math.ceil(extra / saved):,} steps"
        rows.append(
            [
                cell_name(grp.iloc[0]),
                int(ws),
                _spread_text(mine, "first_step_s", 2),
                _spread_text(theirs, "first_step_s", 2) if len(twin) else "–",
                _num(step, 2),
                _num(eager_step, 2),
                repaid,
            ]
        )
    return (
        "torch.compile compiles in a compiled cell's first step, a warm-up step the summary "
        "never times: *first step* is that step (epoch 0's `first_step_ms`, median over "
        "repeats, in brackets their range: a cell that finds inductor's on-disk cache warm "
        "from an earlier one compiles faster), beside the first step of the eager case of "
        "the same strategy, world size and other options where the run has one (`--compile "
        "off,on`); *repaid after*: the extra time of the slowest first step (the coldest "
        "cache) over what each compiled step saves against the eager one (median step "
        "times), the steps a training run must take before compiling pays for itself, not "
        "shown where the two step times are within noise of each other (as the summary's "
        "ranking decides, from 3 repeats on). With "
        "`--compile-mode reduce-overhead`, recording the CUDA graphs falls in the next "
        "warm-up steps, not counted here.\n\n"
        + md_table(
            [
                "strategy",
                "ws",
                "first step (s)",
                "eager first step (s)",
                "step p50 (ms)",
                "eager step p50 (ms)",
                "repaid after",
            ],
            rows,
        )
    )


def _median_of(grp: pd.DataFrame, col: str) -> float:
    if col not in grp:
        return float("nan")
    return float(pd.to_numeric(grp[col], errors="coerce").median())


def _spread_text(grp: pd.DataFrame, col: str, digits: int) -> str:
    """A column's median over a cell's repeats with their range, as the summary shows it."""
    values = pd.to_numeric(grp.get(col, pd.Series(dtype=float)), errors="coerce").dropna()
    row = {f"{col}_{k}": v for k, v in _spread(values).items()} | {"n_repeats": len(values)}
    return _with_range(row, col, digits)


def lapped(counted: pd.DataFrame) -> bool:
    """Whether the run's steps were lapped into parts (runs from before the laps were not).
    Any phase's part: a pipeline's forward is empty (not measured apart from its backward),
    and a run of pipelines alone is lapped all the same."""
    return bool(results.lapped_rows(counted).any())


def _band(r: Mapping[str, Any]) -> str:
    """A prediction's samples/s with its band, e.g. `826.7 (826.7–900.4)`."""
    return (
        f"{_num(r['samples_per_s'])} "
        f"({_num(r['samples_per_s_low'])}–{_num(r['samples_per_s_high'])})"
    )


def _lapped_step(grp: pd.DataFrame) -> float:
    """The mean step a cell's parts split, median over its repeats: each repeat's parts
    summed (they add up to it by construction, bench.harness.breakdown.stacked). On a GPU
    that is the mean of the lapped steps only (breakdown.SPARSE_EVERY_S apart, the first timed
    one always, each carrying its laps' cost), not the timed steps' mean, step_time_ms_mean:
    beside it the parts missed their step by that difference, `other` none the wiser."""
    cols = [f"part_{p}_ms" for p in breakdown.PARTS if f"part_{p}_ms" in grp]
    parts = grp[cols].apply(pd.to_numeric, errors="coerce").sum(axis=1, min_count=1)
    step = float(parts.median()) if parts.notna().any() else float("nan")
    # a row with no parts (an older run's): its timed steps' mean, as before the laps
    return step if step == step else _median_of(grp, "step_time_ms_mean")


def ablation_keeps(grp: pd.DataFrame) -> str:
    """What the case's ablation leaves running (Strategy.kept_by_ablation), read from its
    strategy's class and its --sync-bn: a run measured before its rows said so (the
    committed references) holds total less exposed as hidden for ZeRO-1's broadcast, FSDP's
    all-gathers and SyncBatchNorm's collectives. "" where no row says its ablation ran ("no
    ablation (loss scaling ...)", or a one-process row's empty method): it left nothing on."""
    methods = [v for v in grp.get("comm_method", []) if isinstance(v, str) and v]
    if not any(_measured_by(m, "ablation") for m in methods):
        return ""  # none ran: one process's row, or loss scaling's "no ablation (...)"
    from strategies.base import NO_BN_TO_SYNC, SYNC_BN_KEPT  # (torch's seconds: only here)

    keeps = [_class_says(grp, "ablation_keeps")]
    sync_bn = pd.to_numeric(grp.get("sync_bn", pd.Series(dtype=float)), errors="coerce")
    notes = " ".join(str(v) for v in grp.get("notes", ()))
    if sync_bn.eq(1).any() and NO_BN_TO_SYNC not in notes:
        keeps.append(SYNC_BN_KEPT)
    return " and ".join(k for k in keeps if k)


def comm_unseen(grp: pd.DataFrame) -> str:
    """Why the profiler saw none of the case's collectives (Strategy.comm_unseen), read from
    its strategy's class: Horovod's row read `ablation+profiler` beside a comm total of –,
    with nothing to say the profiler cannot see them."""
    return _class_says(grp, "comm_unseen")


def _class_says(grp: pd.DataFrame, attr: str) -> str:
    """A class attribute of the case's strategy (its words); "" where it is not registered."""
    import strategies

    name = grp["strategy_name"].iloc[0] if "strategy_name" in grp else grp["strategy"].iloc[0]
    spec = strategies.registry().get(str(name))
    return getattr(spec.cls, attr, "") if spec is not None else ""


def _measured_by(method: str, how: str) -> bool:
    """Whether a row's comm_method ("ablation+profiler; ...") says `how` measured it."""
    return how in method.split(";")[0].split("+")


def breakdown_markdown(counted: pd.DataFrame) -> str:
    """Where the time goes, per cell (medians over its repeats): the stacked parts of a mean
    step, communication in all and hidden, rank skew, MFU and the trace; "" for a run from
    before the breakdown was kept."""
    from bench.harness.breakdown import SPARSE_EVERY_S  # how often a GPU's loop laps a step

    if not lapped(counted):
        return ""
    rows = []
    shared = False  # a case's ranks took turns on cores (or GPUs): --oversubscribe
    for (name, ws), grp in _by_case(counted):
        if oversubscribed(grp):
            name, shared = f"{name} (oversubscribed)", True
        m = {
            c: _median_of(grp, c)
            for c in counted.columns
            if c.endswith(("_ms", "_pct")) or c == "step_time_ms_mean"
        }
        step = _lapped_step(grp)
        method = next((v for v in grp.get("comm_method", []) if isinstance(v, str) and v), "")
        keeps = ablation_keeps(grp)
        if keeps and results.no_hidden_part(keeps) not in method:  # a row measured before
            method += "; " + results.no_hidden_part(keeps)
        unseen = comm_unseen(grp) if _measured_by(method, "profiler") else ""
        if unseen and results.no_total(unseen) not in method:  # a row measured before
            method += "; " + results.no_total(unseen)
        trace = next((v for v in grp.get("trace", []) if isinstance(v, str) and v), "")
        # a pipeline's schedule runs forward and backward in one call, lapped as backward:
        # its forward is not 0 but not measured apart
        schedule = (
            "pipeline_stages" in grp
            and pd.to_numeric(grp["pipeline_stages"], errors="coerce").notna().any()
        )
        rows.append(
            [
                name,
                ws,
                _num(step, 2),
                _num(m["part_data_wait_ms"], 2),
                "–" if schedule else _num(m["part_forward_ms"], 2),
                _num(m["part_backward_ms"], 2),
                _num(m["part_optimizer_ms"], 2),
                _spread_text(grp, "part_comm_exposed_ms", 2),
                _comm_total(m["comm_total_ms"], step, m.get("profiled_step_ms", float("nan"))),
                _num(float("nan") if keeps else m["comm_hidden_ms"], 2),
                _num(100 * m["part_other_ms"] / step if step > 0 else float("nan"), 1),
                _num(m["rank_skew_pct"], 1),
                _num(m.get("mfu_pct", float("nan")), 1),
                method or "–",
                f"[trace]({trace})" if trace else "",
            ]
        )
    return (
        "Milliseconds of a mean timed step, median over repeats. The laps of every step "
        "(data wait, forward, backward, optimizer; other: what the laps do not cover, in % of "
        "the step) add up to the step in each repeat; each column's median over repeats may "
        "come from another repeat, so a row's parts can miss its step by a little. The step "
        "is the mean of the steps the laps split: on a GPU only those at least "
        f"{SPARSE_EVERY_S['cuda'] * 1e3:g} ms apart are lapped (and the first timed one), each carrying its laps' cost, so it can be "
        "longer than the summary's step time. A "
        "pipeline's schedule runs the forward and backward "
        "of its micro-batches in one call, so its row counts both under backward "
        "(forward+backward) and shows – for forward. Communication is measured after the "
        "timed steps "
        "(`comm_method`): *ablation* runs steps with gradient synchronisation switched off "
        "beside ordinary ones, and the difference per phase is the communication *exposed* "
        "there, moved out of that phase into its own column (no more in all than the phases' "
        "signed sum, which hidden is counted from; FSDP's parameter all-gathers "
        "cannot be switched off and stay in forward/backward; ZeRO-1's broadcast stays in the "
        "optimizer step); *profiler* reads the collectives in a torch.profiler window: "
        "communication in flight in all (waiting for the slower rank included), of which "
        "*hidden* ran under compute (none given where the ablation left some of it running, "
        "as FSDP's, ZeRO-1's and, under --sync-bn, SyncBatchNorm's: the total holds it, the "
        "exposed part not). Comm exposed is a "
        "difference of two noisy step times: "
        "in brackets its range over repeats; where it reads more than the profiler's total, "
        "hidden is 0. Comm total is per profiled step, which the profiler's own cost makes "
        "slower than a timed one: where it reads more than the step, in brackets that "
        "profiled step. Skew: the slowest rank's median step over the fastest's. "
        "MFU: model FLOPs (FlopCounterMode) per sample x samples/s per device over the "
        "device's peak (a GPU's datasheet, or a matrix product timed on this CPU at the "
        "rank's threads). `--profile` keeps each cell's trace (open it in Perfetto or "
        "chrome://tracing)."
        + (
            " Rows marked (oversubscribed) ran more ranks than cores (or GPUs), which they took "
            "turns on: their step, its parts and their communication are not comparable with "
            "the other rows' (nor is their skew: a rank waits for its turn)."
            if shared
            else ""
        )
        + "\n\n"
        + md_table(
            [
                "strategy",
                "ws",
                "step",
                "data",
                "forward",
                "backward",
                "optimizer",
                "comm exposed",
                "comm total",
                "hidden",
                "other %",
                "skew %",
                "MFU %",
                "method",
                "trace",
            ],
            rows,
        )
    )


def _comm_total(total: float, step: float, profiled: float) -> str:
    """The profiler's communication per step, and where it exceeds the timed step, the
    profiled step it was measured in (a pipeline's receives wait out its bubble there)."""
    text = _num(total, 2)
    if step < total <= profiled:  # the profiled step holds it; else the bracket explains nothing
        text += f" (of {_num(profiled, 2)})"
    return text


def _why_none(why: Sequence[str]) -> str:
    """`predict`'s reasons for the cases it left out, on one line: each reason once, with
    the cases it holds for ("no cells/ folder here ... (ddp, fsdp)")."""
    cases: dict[str, list[str]] = {}
    for line in why:
        case, sep, reason = line.partition(": ")
        if sep:
            cases.setdefault(reason, []).append(case)
        else:  # not about one case (a world size)
            cases.setdefault(line, [])
    if not cases:
        return "no modelled strategy of the run could be predicted here"
    return "; ".join(f"{r} ({', '.join(c)})" if c else r for r, c in cases.items())


def scaling_markdown(run: Run) -> str:
    """Predicted against measured at the world sizes run (each predicted from the
    one-process cell and the collectives' fit alone), and what-if world sizes on named links;
    "" where the run has no collectives' fit."""
    from bench.analysis import predict

    if not (run.path / "collectives.json").exists():
        return ""
    why: list[str] = []
    try:
        checked = predict.check_run(run.path, why=why, run=run)
        what_if = [
            r
            for link in predict.WHAT_IF_LINKS
            for r in predict.predict_run(
                run.path, predict.WHAT_IF_SIZES, link=link, run=run, why=why
            )
        ]
    except (ConfigError, ValueError, KeyError) as exc:
        return f"No prediction: {first_line(exc)}"
    if not checked and not what_if:
        return f"No prediction: {_why_none(why)}."
    doubtful = predict.doubtful(checked)
    head = ["strategy", "ws", "compute ms", "comm ms", "exposed", "samples/s (band)"]
    body = [
        [
            r["case"],
            r["world_size"],
            _num(r["compute_ms"], 2),
            _num(r["comm_ms"], 2),
            _num(r["exposed_fraction"], 2),
            _band(r),
        ]
        for r in checked
    ]
    text = (
        "`parabench predict` (bench/analysis/predict.py: the model and its assumptions) from each "
        "strategy's one-process cell (its compute, measured again at smaller batches after "
        "its timed steps), the collectives' latency and bandwidth measured at the start of "
        "the run (collectives.json) and the bytes each strategy moves per step. The figure "
        "takes the median compute over the one-process cell's repeats (pooled with those of "
        "a case that differs only by its launcher: the same steps); its band runs from the "
        "fastest repeat's compute with communication wholly hidden behind it to the slowest "
        "repeat's with none hidden (one repeat: overlap alone), so where two strategies' bands "
        "overlap, the model does not tell them apart. "
    )
    if checked:
        text += (
            "Checked against the cells measured here, each predicted without its own "
            "measurement:\n\n"
            + md_table(
                [*head, "measured", "error"],
                [
                    [
                        *b,
                        _num(r["measured_samples_per_s"]),
                        f"{r['error_pct']:+.1f}%"
                        + (" (doubtful)" if predict.is_doubtful(r["error_pct"]) else ""),
                    ]
                    for b, r in zip(body, checked, strict=True)
                ],
            )
            + f"\n\n{predict.EXPOSED_KEY}"
        )
        rough = predict.rough_fits(run.path, run)
        if rough:
            text += f"\n\n{rough}"
        busy, busy_cases = predict.busy_line(run.path, checked)
        if doubtful:
            text += "\n\nDoubtful: " + "; ".join(
                predict.doubtful_line(c, w, busy_cases) for c, w in doubtful.items()
            )
            text += (
                f" ({'the what-if ones included; ' if what_if else ''}compare the case's parts "
                'at that world size with its one-process cell\'s under "Where the time goes").'
            )
        if busy:
            text += f"\n\n{busy}"
    else:
        # an oversubscribed cell finished, but its ranks share what the model gives each
        aside = (
            ", oversubscribed ones aside (their ranks share cores or GPUs, which the model "
            "does not predict)"
            if oversubscribed(counted_rows(run.runs))
            else ""
        )
        text += (
            f"No cell of a modelled strategy above one process finished ok here{aside}, so "
            "nothing checks the predictions: read them as the model's word alone."
        )
    if what_if:
        links = ", ".join(
            f"{k}: {predict.LINKS[k][0]:g} GB/s bus bandwidth, {predict.LINKS[k][1]:g} µs per hop"
            for k in predict.WHAT_IF_LINKS
        )
        text += (
            "\n\nWhat if: larger world sizes on named links, assumed (not measured): "
            f"{links}. Past this machine's devices each rank is assumed a device like the "
            "one-process cell's; efficiency is predicted samples/s over N times the same "
            "strategy's one-process samples/s, there from the whole batch's point of the "
            "compute curve the prediction reads, not from its timed steps. "
            + (
                predict.strong_scaling_line(batch, (r["world_size"] for r in what_if), "The")
                if (batch := _count(run.config.get("global_batch")))
                else ""
            )
            + "\n\n"
            + md_table(
                ["strategy", "ws", "link", "samples/s (band)", "efficiency (band)"],
                [
                    [
                        r["case"] + (" (doubtful)" if r["case"] in doubtful else ""),
                        r["world_size"],
                        r["link"],
                        _band(r),
                        f"{_num(r['efficiency'], 2)} ({_num(r['efficiency_low'], 2)}–"
                        f"{_num(r['efficiency_high'], 2)})",
                    ]
                    for r in what_if
                ],
            )
        )
        above = predict.above_linear(what_if)
        if above:
            text += f"\n\n{above}"
    if why:  # a strategy measured here but in neither table, or a world size, says why
        text += f"\n\nLeft out of the tables: {_why_none(why)}."
    return text


def not_finite_text(run: Run) -> str:
    """One sentence on runs.csv's infinite figures, which nothing counts or plots."""
    return (
        f"Not measured, so in no summary or plot: runs.csv's infinite figures, which no step "
        f"time, rate or size can be (a cell whose timed steps took no time, or a hand edit): "
        f"{'; '.join(run.not_finite)}."
    )


def report_markdown(
    run: Run,
    summary: pd.DataFrame,
    images: Sequence[tuple[str, str]],
    undrawn: Sequence[tuple[str, str]] = (),
) -> str:
    """report.md: `images` the plots written (file name, title), `undrawn` those left out
    (file name, why: plots.nothing_drawn)."""
    counted = counted_rows(run.runs)
    startup = startup_markdown(counted, run.runs)
    compiled = compile_markdown(run.runs, counted)
    growth = growth_markdown(counted)
    where = breakdown_markdown(counted)
    scaling = scaling_markdown(run) if len(summary) else ""  # no cell to predict from
    n_ok = summary["n_repeats"].max() if len(summary) else 0
    over = (
        " Rows marked (oversubscribed) ran more CPU ranks than cores, one thread each, for "
        "correctness only: their speed is not comparable, so they get no speed-up or "
        "efficiency and are left out of the throughput and scaling plots (marked in the "
        "step-time and time-split plots and under Where the time goes)."
        if "oversubscribed" in summary and (summary["oversubscribed"] == 1).any()
        else ""
    )
    over += shared_cores_markdown(counted)
    # a CPU's figure is the ranks' whole processes: it cannot show what sharding saves
    rss = any("host_rss" in str(v) for v in summary.get("mem_source", []))
    memory = (
        " On a CPU that is each rank process's peak resident memory (host RSS): mostly "
        "torch's own libraries and the data, whatever the strategy, so what sharding saves "
        "shows in the model state, not there."
        + loader_workers_note(counted)
        + malloc_free_note(summary)
        if rss
        else ""
    )
    model_parallel = model_parallel_markdown(counted, summary)
    single = baseline_row(summary) if len(summary) else None
    if single is None:
        base = " (no ok `single` run at world size 1, so no speed-up)"
    elif results.plainness(str(single.get("setting", "")))[0] == 0:
        base = ""
    else:  # no plain single in this run: say which of its settings the speed-ups are over
        base = f" (`{single['strategy']}` at `{single['setting']}`, its plainest in this run)"
    # the summary table and how to read it; where no cell finished ok, only that
    summarised = (
        [
            f"Median over repeats (up to {n_ok}); in brackets the minimum and maximum over "
            # the speed-up's and the model state's brackets hold other things: said here, a
            # reader took the speed-up's 95 % interval for its range over repeats
            "repeats, except under speed-up (its 95 % interval) and model state (parameters / "
            "gradients / optimizer state). 95% CI: "
            "the 95 % interval of the mean samples/s over repeats (– with fewer than 3); CV %: "
            "how much samples/s varies over repeats (its coefficient of variation), marked "
            f"unstable above {stats.UNSTABLE_CV_PCT:g} %. "
            "Each repeat contributes its last epoch; warm-up steps are not timed (timed epoch: the "
            "wall time of the steps after warm-up, slowest rank). Speed-up is the "
            f"median samples/s over that of `single` at world size 1{base}; efficiency is the "
            "same ratio over `single` in the row's own run options (precision, layout, compile, "
            "accumulation) where the run has that cell, divided by world size: how well the "
            f"cell scales, not what its precision gains.{strong_scaling_markdown(counted)} "
            "Memory is the peak per device (the "
            "maximum over ranks; per rank where ranks share a GPU, each with its own allocator)."
            f"{memory} "
            "Model state is what the rank holding most keeps of parameters / gradients / optimizer "
            "state after training (local shards for FSDP and ZeRO; 'least': the lightest "
            "rank where they differ; per rank in ranks.csv and the model-state plot). "
            f"The full table, with the IQR, is summary.csv.{over}{token_note(summary)}",
            summary_markdown(summary),
        ]
        if len(summary)
        else [
            "No cell finished ok, so there is nothing to summarise: the last section says "
            "what happened to each."
        ]
    )
    incomplete = run.missing_text("parabench")  # a file read elsewhere: the plain name
    parts = [
        f"# parabench report: {run.name}",
        *([f"**{incomplete[0].upper()}{incomplete[1:]}.**"] if incomplete else []),
        *(
            # in the order of the tables and plots below, not text order ([bf16] before [fp32])
            [
                f"Strategies: {', '.join(sorted(set(run.runs['strategy']), key=results.natural_key))}."
            ]
            if len(run.runs)
            else []
        ),
        *(["## Which to pick", pick] if (pick := pick_markdown(run, summary)) else []),
        "## Environment",
        environment_markdown(run),
        "## Conditions (what makes the comparison fair)",
        fairness_markdown(run, counted),
        "## Summary",
        *summarised,
        *(
            [
                "Fastest per world size, with the cells within noise of it: where the cells "
                "ran in the same rounds, those whose ratio to it has a 95 % interval reaching "
                "1 (the per-round ratios, paired: a slow round slows both); else those whose "
                "95 % interval over repeats overlaps its.\n\n" + ranking
            ]
            if (ranking := ranking_markdown(summary, run.runs) if len(summary) else "")
            else []
        ),
        *([chosen] if (chosen := precision_markdown(run.runs)) else []),
        *([resumed] if (resumed := resumed_markdown(counted)) else []),
        *(["## Model parallelism", model_parallel] if model_parallel else []),
        *(["## Where the time goes", where] if where else []),
        *(["## Scaling: predicted and measured", scaling] if scaling else []),
        *(["## Start-up per launcher", startup] if startup else []),
        *(["## Compilation", compiled] if compiled else []),
        *(["## Plots", *plots_markdown(images, undrawn)] if images or undrawn else []),
        *(["## Memory that grew step after step", growth] if growth else []),
        "## Unavailable, skipped and failed",
        problems_markdown(run.runs, summary, len(run.missing), retry_command(run)),
        *([retried] if (retried := retried_markdown(run)) else []),
        *([not_finite_text(run)] if run.not_finite else []),
    ]
    return "\n\n".join(parts) + "\n"


def plots_markdown(
    images: Sequence[tuple[str, str]], undrawn: Sequence[tuple[str, str]]
) -> list[str]:
    """The Plots section's paragraphs: each plot written, then one line for those left out,
    each with why (a plot of empty axes read as a plot whose data is missing)."""
    shown = [f"![{title}]({name})" for name, title in images]
    if undrawn:
        shown.append(" ".join(f"`{name}` is left out: {why}." for name, why in undrawn))
    return shown


# ---------------------------------------------------------------- render


def figures(
    run: Run, summary: pd.DataFrame, colours: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The report's figures by file name (matplotlib Figure objects, not yet saved);
    `colours` (plots.colour_map) for a strategy's colour across several runs."""
    from bench.analysis import plots  # here, so `parabench compare` does not pay for matplotlib

    counted = counted_rows(run.runs)
    colours = colours or plots.colour_map(run.runs["strategy"])
    timed = counted_steps(run.steps, counted)
    every_step = counted_steps(run.steps, counted, timed_only=False, all_epochs=True)
    data = {
        "throughput": summary,
        "scaling_efficiency": summary,
        "peak_memory": summary,
        "step_time_distribution": timed,
        "loss_curves": every_step,
        "time_split": timed,
        "model_state": counted_steps(run.ranks, counted, timed_only=False),
        "option_sweep": summary,
    }
    base = baseline_row(summary)
    shared = plots.oversubscribed_cells(counted)  # marked: their times are not comparable
    extra: dict[str, dict[str, Any]] = {
        "time_split": {"bubbles": bubble_pcts(counted), "oversubscribed": shared},
        "step_time_distribution": {"oversubscribed": shared},
        "scaling_efficiency": {"shares": thread_shares(counted)[1]},
        "loss_curves": {
            "departing": None if base is None else run.departing(str(base["strategy"])),
            "tolerance_pct": DEPART_PCT,
        },
    }
    plot_of = dict(PLOTS)
    if lapped(counted):
        # the step lapped: its parts stacked (a run from before the laps: compute and wait)
        plot_of["time_split.png"] = "time_parts"
        data["time_parts"] = counted
        extra["time_parts"] = extra["time_split"]
    figs = {
        name: getattr(plots, fn)(data[fn], colours=colours, **extra.get(fn, {}))
        for name, fn in plot_of.items()
    }
    for name, fn in OPTIONAL_PLOTS.items():
        fig = getattr(plots, fn)(data[fn], colours=colours)
        if fig is not None:
            figs[name] = fig
    return figs


def bubble_pcts(counted: pd.DataFrame) -> dict[tuple[str, int], float]:
    """(strategy label, world size) -> median measured pipeline bubble (%) over the counted
    repeats, for the cells that have one (pipelines)."""
    if counted.empty or "bubble_pct" not in counted:
        return {}
    rows = counted.assign(_bubble=pd.to_numeric(counted["bubble_pct"], errors="coerce"))
    med = rows.dropna(subset=["_bubble"]).groupby(KEY)["_bubble"].median()
    return {(str(s), int(w)): float(v) for (s, w), v in med.items()}


class StoppedWhole(KeyboardInterrupt):
    """Ctrl-C or SIGTERM held until the report's files were all in place (str: report.md's
    path): the report is whole, and a line saying it was cut short would send the user to
    write it again for nothing."""


def render(run_dir: str | Path) -> Path:
    """Write summary.csv, the plots and report.md into run_dir; return report.md's path."""
    run = load_run(run_dir)
    for name in ("summary.csv", "report.md", *PLOTS, *OPTIONAL_PLOTS):
        if (run.path / name).exists() and not (run.path / name).is_file():
            raise ConfigError(f"{run.path / name} is in the way of the report: not a file")
    summary = summarise(run.runs)
    out = run.path / "report.md"
    placed = False
    try:
        # each file written whole, and put in place only once the last one is written, one
        # after another (each synced first), the report last, after the plots it names: a
        # stop part-way (Ctrl-C, SIGTERM) left a plot cut short, or the earlier render's
        # report.md beside this one's summary.csv and some of its plots, each read as whole
        with contextlib.ExitStack() as held:
            with contextlib.ExitStack() as files:

                def whole(name: str, **how: Any) -> Any:
                    return files.enter_context(results.written_whole(run.path / name, **how))

                text = whole("report.md")
                summary.to_csv(whole("summary.csv", newline=""), index=False, float_format="%.6g")
                images: list[tuple[str, str]] = []
                undrawn: list[tuple[str, str]] = []
                if len(summary):
                    from bench.analysis import plots

                    for name, fig in figures(run, summary).items():
                        empty = plots.nothing_drawn(fig)
                        if empty is not None:  # left out, the report says why
                            undrawn.append((name, empty))
                            continue
                        # titles wrapped to the figure, and nothing drawn outside it cut off
                        plots.fit_titles(fig).savefig(
                            whole(name, binary=True),
                            format=Path(name).suffix[1:],
                            dpi=110,
                            bbox_inches="tight",
                        )
                        title = " ".join(fig.axes[0].get_title().split())  # (unwrapped)
                        images.append((name, title or name))
                text.write(report_markdown(run, summary, images, undrawn))
                # all written: a stop now waits until the last is in place (moments), where it
                # left some of this render's files beside the earlier one's
                held.enter_context(proc.stops_held())
            drawn = {name for name, _ in images}
            for name in (*PLOTS, *OPTIONAL_PLOTS):  # an earlier render's, this one has not drawn
                if name not in drawn:
                    (run.path / name).unlink(missing_ok=True)
            placed = True
    except KeyboardInterrupt:
        if placed:  # held until the last file was in place: the report is whole
            raise StoppedWhole(str(out)) from None
        raise
    except OSError as exc:  # read-only, no permission, disk full
        raise ConfigError(
            f"{run.path}: cannot write the report there ({exc.strerror or exc})"
        ) from None
    return out


def cmd_report(args: argparse.Namespace) -> int:
    try:
        print(render(args.run_dir))
    except StoppedWhole as stop:
        print(f"parabench: interrupted once the report was whole: {stop}", file=sys.stderr)
        return 130
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="summary.csv, plots and report.md for a run directory",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="e.g. results/20250101-120000-1234")
    p.set_defaults(func=cmd_report)
