"""`parabench compare A B`: how run B differs from run A, cell by cell.

A cell is a strategy, its setting (precision, accumulation, swept options) and a world
size; a cell of A is matched with the same cell of B, whatever names the two reports give
them. Two runs that did not train the same work (data set, model, global batch, optimizer)
are refused (exit 2) unless --unlike is given, which shows the ratios without verdicts;
runs on different machines (device, CPU, GPUs, nodes, torch) are compared as asked, with the
differences named above the table.

For every cell with an ok result in both runs: the ratio B/A of the
medians over repeats of samples/s, step time p50 and peak memory per device. The metric
chosen with --metric decides the verdict: a change for the worse by more than --factor
that is also significant over the repeats (one-sided Mann-Whitney U at 5 %, bench.harness.stats)
is flagged (exit code 1); one beyond the factor but not significant is "within noise",
and with fewer than 3 repeats a side "too few repeats to tell": neither is flagged (a
last line names the slow-downs so left unjudged).
`--no-stats` flags on the factor alone (the behaviour before). A change for the better
is noted the same way. Cells with
a result in only one run are listed as such, and those broken in both with both reasons
(no regression); one that was ok in A and failed, ran out of
memory or timed out in B is flagged too (exit code 1), and so is a cell with more broken
repeats in B than in A. A cell oversubscribed in either run (more CPU ranks than cores) has
no speed verdict, timed_s over other timed step counts none, and peak memory measured two
different ways (host RSS, the CUDA allocator) no memory ratio. Medians come from the same
selection as the report (bench.analysis.report.summarise), so the two never disagree.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench import program
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
#: shown for every cell, whatever the verdict metric (and that metric beside them)
SHOWN = ("samples_per_s", "step_time_ms_p50", "peak_mem_mib")
LABELS = {
    "samples_per_s": "samples/s (median)",
    "step_time_ms_p50": "step p50 (ms)",
    "peak_mem_mib": "peak mem/device (MiB)",
    "step_time_ms_p90": "step p90 (ms)",
    "timed_s": "timed steps' time (s)",
}
EXIT_SAME, EXIT_WORSE = 0, 1
#: a cell: the registry's strategy, its setting (results.setting_key: "" and "fp32" are one)
#: and the world size
CELL = ["strategy_name", "key", "world_size"]
#: what one sample and one step are: runs differing in one of these did not measure the
#: same work, and a ratio of their speeds is no verdict on either
WORK = {
    "dataset": "data set",
    "model": "model",
    "global_batch": "global batch",
    "optimizer": "optimizer",
    "model_kwargs": "model arguments",
    "dataset_kwargs": "data set arguments",
    "max_classes": "classes",
    "image_size": "image size",  # not MNIST's (28 px whatever it says): see conditions
    "seq_len": "sequence length",  # the language model's alone
}
#: the machine and how it was measured: a comparison across them is what a user asks for
#: ("my machine against the reference"), named so that no one reads it as a regression
MACHINE = {
    "device_type": "device",
    "device_names": "devices",
    "cpu_model": "CPU",
    "cpu_cores": "CPU cores",
    # ranks on other hosts talk over the network: a world size on one machine and the same
    # world size across nodes are other layouts, though the cells match
    "nodes": "nodes",
    "torch_version": "torch",
}
HOW = {
    "data_path": "data path",
    "step_timing": "step timing",
    "loader_workers": "loader workers per device",  # --workers: what feeds the steps
    "epochs": "epochs",
    "max_steps": "max steps",
    "warmup_steps": "warm-up steps",
    "limit": "training samples (--limit)",  # the steps per epoch, where --max-steps allows
    "target_precision": "--target-precision",  # the timed steps: until the step time is known
    "lr": "learning rate",
    # the initial weights and the sample order; and the cores a node gives its ranks,
    # whose threads per rank follow from it
    "seed": "seed",
    "cores_per_node": "--cores-per-node",
}
#: a cell ok in A and broken in B (failed, oom, timeout, diverged) is the worst regression
BROKEN = results.BROKEN


@dataclass(frozen=True)
class Comparison:
    table: pd.DataFrame  # one row per cell present in both runs; `strategy`: its label
    only_a: list[tuple[str, int, str]]  # (label, world size, what B has instead)
    only_b: list[tuple[str, int, str]]
    metric: str
    factor: float
    stats: bool = True
    #: cells in both whose B broke in more repeats than A's: (label, world size, what)
    partly: list[tuple[str, int, str]] = field(default_factory=list)
    #: cells with no ok repeat in either run, broken in both: (label, world size, what)
    still_broken: list[tuple[str, int, str]] = field(default_factory=list)
    #: (what, A's value, B's value) for each condition that differs, by kind
    unlike: list[tuple[str, str, str]] = field(default_factory=list)
    machine: list[tuple[str, str, str]] = field(default_factory=list)
    how: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def regressions(self) -> pd.DataFrame:
        return self.table[self.table["verdict"] == worse_word(self.metric)]

    @property
    def broken(self) -> list[tuple[str, int, str]]:
        """Cells ok in A that crashed, ran out of memory, hung or diverged in B (in every
        repeat, or in more repeats than in A): the worst regression. (Skipped or unavailable
        in B is a different machine, not a regression.) None between unlike runs."""
        if self.unlike:
            return []
        gone = [c for c in self.only_a if c[2].split(":")[0].split(";")[0] in BROKEN]
        return gone + self.partly


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


def _cells(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with the cell's key columns as the matching needs them: a run from before
    `setting` gets it from its precision column (`amp_bf16` then, `bf16` now)."""
    out = runs.copy()  # load_run's: strategy_name, and setting as text ("" where unsaid)
    setting = out["setting"]
    if "precision" in out:
        legacy = out["precision"].astype(object).fillna("").astype(str).map(_legacy_setting)
        setting = setting.where(setting != "", legacy)
    out["setting"] = setting
    out["key"] = setting.map(results.setting_key)
    out["world_size"] = pd.to_numeric(out["world_size"], errors="coerce")
    return out


def _keyed(summary: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """A run's summary with its cells' settings and keys as `_cells` made them."""
    out = summary.copy()
    by_label = dict(zip(runs["strategy"], runs["setting"], strict=True))
    # text even with no row (a run begun that has none yet), as B's are: merged on in compare
    out["setting"] = out["strategy"].map(by_label).fillna("").astype(str)
    out["key"] = out["setting"].map(results.setting_key)
    return out


def _legacy_setting(precision: str) -> str:
    """The setting a run from before the column would have written, from its precision."""
    word = precision.split(" ", 1)[0]
    word = word.removeprefix("amp_")
    return "apex" if word.startswith("apex") else word


def _lone_pairs(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> dict[tuple, str]:
    """B's cell key -> A's, for each strategy and world size that each run ran (ok or
    broken) in one setting only, the two different: one strategy run in another setting
    (`--set bucket_cap_mb=25`, then 100), compared as asked."""

    def lone(runs: pd.DataFrame) -> dict[tuple[str, int], str]:
        ran = runs[runs["status"].isin({results.OK, *BROKEN})]
        keys = ran.groupby(["strategy_name", "world_size"])["key"].unique()
        return {(n, int(w)): k[0] for (n, w), k in keys.items() if len(k) == 1}

    la, lb = lone(runs_a), lone(runs_b)
    return {(n, lb[(n, w)], w): ka for (n, w), ka in la.items() if lb.get((n, w), ka) != ka}


def _status(runs: pd.DataFrame, key: tuple[str, str, int]) -> str:
    """What a run has for a cell without an ok result: its status and reason, or nothing."""
    name, setting, ws = key
    rows = runs[
        (runs["strategy_name"] == name)
        & (runs["key"] == setting)
        & (runs["world_size"] == ws)
        & (runs["status"] != "ok")
    ]
    if rows.empty:
        return "not run"
    return _said_status(rows.iloc[0])


def _said_status(row: pd.Series) -> str:
    """`status: reason`, or the status alone where the row gives no reason."""
    reason = row.get("reason")
    reason = "" if reason is None or reason != reason else str(reason)
    return f"{row['status']}: {reason}" if reason else str(row["status"])


def _broken_repeats(runs: pd.DataFrame) -> dict[tuple[str, str, int], tuple[int, int, str]]:
    """Per cell: (repeats that broke, repeats in all, the first broken one's status and
    reason)."""
    out = {}
    for (name, setting, ws), grp in runs.groupby(CELL):
        bad = grp[grp["status"].isin(BROKEN)]
        what = _said_status(bad.iloc[0]) if len(bad) else ""
        out[(str(name), str(setting), int(ws))] = (
            bad["repeat"].nunique(),
            grp["repeat"].nunique(),
            what,
        )
    return out


def _repeats(runs: pd.DataFrame, metric: str) -> dict[tuple[str, str, int], list[float]]:
    """Per cell, the metric of every counted repeat (the report's selection)."""
    counted = report.counted_rows(runs)
    out: dict[tuple[str, str, int], list[float]] = {}
    for (name, setting, ws), grp in counted.groupby(CELL):
        values = pd.to_numeric(grp[metric], errors="coerce").dropna()
        out[(str(name), str(setting), int(ws))] = [float(v) for v in values]
    return out


def _values(run: report.Run, col: str, source: dict[str, Any]) -> str:
    """A run's value of a condition: the distinct values of its rows that ran (all rows if
    none ran), else `source`'s (environment.json, config.json); "" where nothing says."""
    ran = run.runs[run.runs["status"] == "ok"]
    found = report._distinct(ran, col) or report._distinct(run.runs, col)
    if found or col not in source:
        return found
    value = source[col]  # said, and None: not set (--max-steps: every step), not unknown
    if isinstance(value, dict):  # --model-arg, --dataset-arg
        value = report.factory_args(value) or None
    return "none" if value is None else report._plain(value)


def conditions(a: report.Run, b: report.Run) -> dict[str, list[tuple[str, str, str]]]:
    """The conditions on which A and B differ, by kind (`work`, `machine`, `how`): each as
    (what, A's value, B's value). A condition neither run states is not a difference."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    both = {_values(r, c, r.config) for r in (a, b) for c in ("dataset", "model")}
    ignored = set()
    # python-source cuts its text into --seq-len bytes whatever the model (a user's token
    # model too); the lm takes --seq-len on synthetic data as well
    if not both & {"lm", "python-source"}:
        ignored.add("seq_len")  # a built-in image model's runs: --seq-len is not read
    if "mnist" in both or both & {"lm", "mnist_cnn"}:
        ignored.add("image_size")  # MNIST's images are 28 px whatever it says
    for kind, names in (("work", WORK), ("machine", MACHINE), ("how", HOW)):
        found = []
        for col, what in names.items():
            if col in ignored:
                continue
            va = _values(a, col, a.environment if kind == "machine" else a.config)
            vb = _values(b, col, b.environment if kind == "machine" else b.config)
            if va and vb and va != vb:
                found.append((what, va, vb))
        out[kind] = found
    out["how"] += _moved_files(out["work"])
    # a model file edited between the runs (the same path), or one of the same name in
    # another folder: what its parameters were, where both runs' model.json say
    shape_a, shape_b = _model_shape(a), _model_shape(b)
    said = {what for what, _, _ in out["work"]}
    if shape_a and shape_b and shape_a != shape_b and not said & {"model", "model arguments"}:
        out["work"].append(("model's parameters (its model.json)", shape_a, shape_b))
    return out


def _moved_files(work: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """A `file.py:factory` model or data set is recorded by its absolute path (ranks may
    start elsewhere), so the same example run from two checkouts, or on two machines, read
    as other work. One of the same file name and factory in another folder is taken as the
    same work, and moved from `work` to how it was measured, named there (the model's
    parameters are compared apart: `conditions`)."""
    kept, moved = [], []
    for what, va, vb in work:
        if (
            what in ("model", "data set")
            and _by_name(va) is not None
            and _by_name(va) == _by_name(vb)
        ):
            moved.append((f"{what} file's folder", va, vb))
        else:
            kept.append((what, va, vb))
    work[:] = kept
    return moved


def _model_shape(run: report.Run) -> str:
    """The model's parameters as the run's model.json records them; "" where it does not."""
    shape = report._read_json(run.path / "model.json").get("shape") or {}
    if not isinstance(shape, dict) or "param_bytes" not in shape:
        return ""
    return f"{shape['param_bytes']} bytes in {shape.get('tensors', '?')} tensors"


def _by_name(spec: str) -> str | None:
    """`name.py:factory` of a file factory's recorded spec; None for any other."""
    where, sep, attr = spec.rpartition(":")
    return f"{Path(where).name}:{attr}" if sep and where.endswith(".py") else None


def _said(diffs: list[tuple[str, str, str]]) -> str:
    return "; ".join(f"{what} {va} -> {vb}" for what, va, vb in diffs)


#: a verdict's words where either run has fewer than stats.MIN_REPEATS counted repeats
TOO_FEW = "too few repeats to tell"


def noise_verdict(flag: str, before: list[float], after: list[float], metric: str) -> str:
    """A factor verdict kept only where the repeats say the change is real."""
    if not flag:
        return ""
    worse = flag == worse_word(metric)
    lower_is_worse = METRICS[metric]
    # the direction tested: worse, or better (the opposite)
    p = stats.significant_change(before, after, worse_if_lower=lower_is_worse == worse)
    if math.isnan(p):
        return f"{flag}? {TOO_FEW}"
    return flag if p <= stats.ALPHA else f"{flag}? within noise (p={p:.2f})"


def compare(
    a: report.Run,
    b: report.Run,
    metric: str = "samples_per_s",
    factor: float = 1.1,
    use_stats: bool = True,
    unlike: bool = False,
) -> Comparison:
    """B against A, cell by cell. ConfigError where A and B trained different work (see
    WORK) unless `unlike`, which compares them without verdicts."""
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if not (factor >= 1 and math.isfinite(factor)):  # NaN fails both; inf would flag nothing
        raise ConfigError(
            f"--factor must be a finite number of at least 1 (1.1 flags changes over 10%), "
            f"got {factor}"
        )
    differ = conditions(a, b)
    if differ["work"] and not unlike:
        raise ConfigError(
            f"{a.path} and {b.path} did not measure the same work ({_said(differ['work'])}); "
            "--unlike shows their ratios anyway, without verdicts"
        )
    runs_a, runs_b = _cells(a.runs), _cells(b.runs)
    sa, sb = (_keyed(report.summarise(r.runs), runs) for r, runs in ((a, runs_a), (b, runs_b)))
    for s, r in ((sa, a), (sb, b)):  # the CPU others took while the cell ran, where 20 % or more
        s["busy"] = report.busy_share(s, r.runs)
    # a strategy each run ran in one setting of its own: B's cell stands for A's
    paired = _lone_pairs(runs_a, runs_b)
    b_cells = list(runs_b[CELL].itertuples(index=False, name=None))
    b_setting = {  # A's cell -> B's own setting, for the pairs' names
        (n, paired[(n, k, w)], w): s
        for (n, k, w), s in zip(b_cells, runs_b["setting"], strict=True)
        if (n, k, w) in paired
    }
    for frame in (runs_b, sb):
        keys = [paired.get(c, c[1]) for c in frame[CELL].itertuples(index=False, name=None)]
        # text even with no row (a run with no ok cell), as A's keys are: merged on below
        frame["key"] = pd.Series(keys, index=frame.index, dtype=str)
    cols = CELL + ["setting", "oversubscribed", "mem_source", "busy"]
    cols += [f"{m}_median" for m in METRICS]
    both = sa[cols].merge(sb[cols], on=CELL, suffixes=("_a", "_b"), how="outer", indicator=True)
    both["setting"] = both["setting_a"].where(both["setting_a"].notna(), both["setting_b"])
    # one name per cell for both runs: a strategy's name, with the axes on which its
    # settings differ across the two, or for a pair, how B's differs from A's
    labels = results.case_labels(
        zip(both["strategy_name"], both["setting"], strict=True), per_strategy=True
    )
    both["strategy"] = [
        f"{n} [{results.setting_change(s, b_setting[(n, k, int(w))])}]"
        if (n, k, int(w)) in b_setting
        else labels[(n, s)]
        for n, k, w, s in both[[*CELL, "setting"]].itertuples(index=False)
    ]
    table = both[both["_merge"] == "both"].copy()
    for m in METRICS:
        table[f"{m}_ratio"] = table[f"{m}_median_b"] / table[f"{m}_median_a"]
    # memory measured two ways (host RSS, the CUDA allocator) is no ratio
    mem_a, mem_b = (table[f"mem_source_{x}"].fillna("").astype(str) for x in "ab")
    other_mem = (mem_a != mem_b) & (mem_a != "") & (mem_b != "")  # "": not said
    table.loc[other_mem, "peak_mem_mib_ratio"] = math.nan
    over = (table["oversubscribed_a"].fillna(0) > 0) | (table["oversubscribed_b"].fillna(0) > 0)
    table["oversubscribed"] = over.astype(int)
    ra, rb = (_repeats(r, metric) for r in (runs_a, runs_b)) if use_stats else ({}, {})
    # timed_s is the wall time of the timed steps: over other step counts (--max-steps,
    # --limit, --target-precision) its ratio is theirs, not a change in speed
    steps_a, steps_b = (
        (_repeats(r, "timed_steps") for r in (runs_a, runs_b)) if metric == "timed_s" else ({}, {})
    )
    bad_a, bad_b = _broken_repeats(runs_a), _broken_repeats(runs_b)
    verdicts, partly = [], []
    for _, r in table.iterrows():
        key = (r["strategy_name"], r["key"], int(r["world_size"]))
        na, nb = bad_a.get(key, (0, 1, "")), bad_b.get(key, (0, 1, ""))
        if nb[0] / nb[1] > na[0] / na[1]:  # a larger share of its repeats broke
            what = f"{nb[2].split(':')[0]} in {nb[0]} of {nb[1]} repeats"
            if na[0]:  # A broke in some repeats too: not "ok in A"
                what += f", {na[0]} of {na[1]} in A"
            what += f" ({nb[2]})"
            partly.append((r["strategy"], int(r["world_size"]), what))
        if differ["work"]:
            verdicts.append("")  # unlike runs: ratios only
        elif r["oversubscribed"] and metric != "peak_mem_mib":
            verdicts.append("oversubscribed: no speed verdict")
        elif steps_a.get(key) and steps_b.get(key) and set(steps_a[key]) != set(steps_b[key]):
            verdicts.append("other timed steps: no timed_s verdict")
        elif metric == "peak_mem_mib" and math.isnan(r["peak_mem_mib_ratio"]):
            verdicts.append("memory measured differently" if other_mem[r.name] else "")
        else:
            flag = verdict(r[f"{metric}_ratio"], metric, factor)
            verdicts.append(
                noise_verdict(flag, ra.get(key, []), rb.get(key, []), metric) if use_stats else flag
            )
    table["verdict"] = verdicts
    table = report.in_case_order(table.drop(columns="_merge")).reset_index(drop=True)

    def only(side: str, other: pd.DataFrame) -> list[tuple[str, int, str]]:
        rows = report.in_case_order(both[both["_merge"] == side])
        out = []
        for label, n, s, w in rows[["strategy", *CELL]].itertuples(index=False):
            said = _status(other, (n, s, int(w)))
            # the same strategy at the same world size in another setting, in the other run
            there = both[
                (both["_merge"] == ("right_only" if side == "left_only" else "left_only"))
                & (both["strategy_name"] == n)
                & (both["world_size"] == w)
            ]
            if len(there):
                said += f"; it has {', '.join(sorted(there['strategy'], key=results.natural_key))}"
            out.append((label, int(w), said))
        return out

    # a cell broken in every repeat of both runs is in neither summary: named, or a strategy
    # still failing after a change read as one compared and found unchanged
    listed = {(n, k, int(w)) for n, k, w in both[CELL].itertuples(index=False, name=None)}
    still = []
    for key in sorted(set(bad_a) & set(bad_b) - listed):
        if bad_a[key][0] and bad_b[key][0]:
            name, setting, ws = key
            label = runs_a.loc[
                (runs_a["strategy_name"] == name)
                & (runs_a["key"] == setting)
                & (runs_a["world_size"] == ws),
                "strategy",
            ].iloc[0]
            still.append((str(label), ws, f"A: {bad_a[key][2]}; B: {bad_b[key][2]}"))

    return Comparison(
        table,
        only("left_only", runs_b),
        only("right_only", runs_a),
        metric,
        factor,
        use_stats,
        partly=sorted(partly, key=lambda p: results.case_key(p[0], p[1])),  # the table's order
        still_broken=sorted(still, key=lambda p: results.case_key(p[0], p[1])),
        unlike=differ["work"],
        machine=differ["machine"],
        how=differ["how"],
    )


def _fmt(v: float, digits: int) -> str:
    return "–" if math.isnan(v) else f"{v:.{digits}f}"


def _name(row: pd.Series) -> str:
    return f"{row['strategy']} (oversubscribed)" if row["oversubscribed"] else str(row["strategy"])


def busy_mark(row: pd.Series) -> str:
    """A cell measured while other processes used BUSY_PCT % of the CPUs or more, in either
    run: which and how much ("" where neither was)."""
    took = {side: v for side in "AB" if (v := row.get(f"busy_{side.lower()}", math.nan)) == v}
    if not took:
        return ""
    pct = " and ".join(f"{v:.0f} %" for v in took.values())
    return f"[{' and '.join(took)} busy: others used {pct} of the CPUs]"


def busy_line(cmp: Comparison) -> str:
    """The line above the table where some cell ran beside other load (busy_mark): its speed
    ratios are that load's as much as the code's. "" where none did."""
    from bench.harness.env import BUSY_PCT

    if cmp.table.empty or not cmp.table.apply(busy_mark, axis=1).str.len().any():
        return ""
    return (
        f"busy: cells marked [... busy] ran while other processes used {BUSY_PCT:g} % of the "
        "CPUs or more, so their speed ratios compare the load as much as the code: rerun them "
        "on a quiet machine"
    )


def format_table(cmp: Comparison, a_name: str, b_name: str) -> str:
    """A fixed-width text table for the terminal: per metric A, B and B/A."""
    names = [_name(r) for _, r in cmp.table.iterrows()]
    names += [c[0] for c in (*cmp.only_a, *cmp.only_b, *cmp.partly, *cmp.still_broken)]
    wide = max([16, *(len(n) + 1 for n in names)])
    # the metric judged is shown too: a verdict on step p90 beside columns that all read
    # 1.00 gave no figure to check it by
    shown = SHOWN if cmp.metric in SHOWN else (*SHOWN, cmp.metric)
    group = f"{'':<{wide + 3}}" + "".join(f"  {LABELS[m]:^25}" for m in shown)
    head = f"{'strategy':<{wide}}{'ws':>3}" + f"  {'A':>9}{'B':>9}{'B/A':>7}" * len(shown)
    test = ", U test at 5 %" if cmp.stats else ", factor alone"
    if not cmp.unlike:  # unlike runs: ratios only, no column of verdicts
        head += f"  verdict ({cmp.metric}, factor {cmp.factor:g}{test})"
    lines = [f"A: {a_name}", f"B: {b_name}"]
    if cmp.unlike:
        lines.append(f"UNLIKE RUNS, no verdicts: they measured other work: {_said(cmp.unlike)}")
    if cmp.machine:
        lines.append(
            f"other machines, so B/A is the machine's as much as the code's: {_said(cmp.machine)}"
        )
    if cmp.how:
        lines.append(f"measured otherwise: {_said(cmp.how)}")
    if busy := busy_line(cmp):
        lines.append(busy)
    lines += [group, head, "-" * len(head)]
    for _, r in cmp.table.iterrows():
        line = f"{_name(r):<{wide}}{int(r['world_size']):>3}"
        for m in shown:
            line += (
                f"  {_fmt(r[f'{m}_median_a'], 1):>9}{_fmt(r[f'{m}_median_b'], 1):>9}"
                f"{_fmt(r[f'{m}_ratio'], 2):>7}"
            )
        said = "  ".join(t for t in (r["verdict"], busy_mark(r)) if t)
        lines.append(f"{line}  {said}".rstrip())
    if cmp.table.empty:
        lines.append("(no strategy and world size has an ok result in both runs)")
    for label, cells in (("only in A", cmp.only_a), ("only in B", cmp.only_b)):
        for name, ws, other in cells:
            lines.append(f"{name:<{wide}}{ws:>3}  {label} (the other run: {other})")
    for name, ws, what in cmp.partly:
        lines.append(f"{name:<{wide}}{ws:>3}  broke in B: {what}")
    for name, ws, what in cmp.still_broken:
        lines.append(f"{name:<{wide}}{ws:>3}  broken in both ({what})")
    return "\n".join(line.rstrip() for line in lines)


def cmd_compare(args: argparse.Namespace) -> int:
    from bench.harness.env import BUSY_PCT

    a, b = report.load_run(args.a), report.load_run(args.b)
    cmp = compare(a, b, args.metric, args.factor, use_stats=not args.no_stats, unlike=args.unlike)
    print(format_table(cmp, str(a.path), str(b.path)))
    beyond = f"{worse_word(cmp.metric).lower()} beyond x{cmp.factor:g} in {cmp.metric}"

    def cells(rows: pd.DataFrame) -> str:
        return ", ".join(f"{s} ws={w}" for s, w in rows[report.KEY].itertuples(index=False))

    worse = cmp.regressions
    if len(worse):
        print(f"{beyond}: {cells(worse)}")
        # a CI log's last lines: where the load, not the code, may have slowed a flagged cell
        loaded = worse[worse.apply(busy_mark, axis=1).str.len() > 0]
        if len(loaded) and cmp.metric != "peak_mem_mib":
            print(
                f"of those, measured while other processes used {BUSY_PCT:g} % of the CPUs or "
                f"more ([... busy]): {cells(loaded)}; rerun them on a quiet machine"
            )
    # beyond the factor but untested (exit 0): said last, where an exit 0 on a run of
    # --repeats 1 read as "no slow-down" with only the table's column saying otherwise
    untold = cmp.table[cmp.table["verdict"] == f"{worse_word(cmp.metric)}? {TOO_FEW}"]
    if len(untold):
        print(
            f"{beyond}, not judged (fewer than {stats.MIN_REPEATS} repeats a side; --no-stats "
            f"judges the factor alone): {cells(untold)}"
        )
    for name, ws, what in cmp.broken:
        said = what.split(" (")[0].split(":")[0]
        if said.endswith(" in A"):  # broke in fewer of A's repeats: say how many
            in_b, in_a = said.rsplit(", ", 1)
            print(f"{in_b} in B, {in_a}: {name} ws={ws}")
        else:
            print(f"ok in A, {said} in B: {name} ws={ws}")
    for label, run in (("A", a), ("B", b)):  # a cell it lacks is "not run" above: say why
        if run.missing:
            print(f"{label} is {run.missing_text(program())}")
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
    p.add_argument(
        "--unlike",
        action="store_true",
        help="compare runs that trained other work (data set, model, global batch, "
        "optimizer): ratios only, no verdicts, exit 0",
    )
    p.set_defaults(func=cmd_compare)
