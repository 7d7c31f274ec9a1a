"""The reporter on a real small run: summary.csv, the plots (as Figure objects) and report.md.

Every test works on its own copy of the shared run, so rendering never touches it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from bench.analysis import plots, report
from bench.cli import main

REP = ["strategy", "world_size", "repeat"]


@pytest.fixture(scope="module")
def rendered(small_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rendered copy of the small run (read-only for the tests of this module)."""
    run_dir = tmp_path_factory.mktemp("report") / small_run.name
    shutil.copytree(small_run, run_dir)
    assert report.render(run_dir) == run_dir / "report.md"
    return run_dir


@pytest.fixture(scope="module")
def runs(rendered: Path) -> pd.DataFrame:
    return pd.read_csv(rendered / "runs.csv")


@pytest.fixture(scope="module")
def summary(rendered: Path) -> pd.DataFrame:
    return pd.read_csv(rendered / "summary.csv")


@pytest.fixture(scope="module")
def figures(rendered: Path) -> dict:
    run = report.load_run(rendered)
    return report.figures(run, report.summarise(run.runs))


def _expected(runs: pd.DataFrame, metric: str) -> pd.Series:
    """Median over repeats of the last epoch of each all-ok repeat, straight from runs.csv."""
    failed = set(runs.loc[runs["status"] != "ok", REP].itertuples(index=False, name=None))
    ok = runs[runs["status"] == "ok"]
    ok = ok[[k not in failed for k in ok[REP].itertuples(index=False, name=None)]]
    last = ok[ok["epoch"] == ok.groupby(REP)["epoch"].transform("max")]
    return last.groupby(["strategy", "world_size"])[metric].median()


def _ok_names(runs: pd.DataFrame) -> list[str]:
    return sorted(runs.loc[runs["status"] == "ok", "strategy"].unique())


def _colours(runs: pd.DataFrame) -> dict:
    return plots.colour_map(runs["strategy"])


# ---------------------------------------------------------------- files


def test_render_writes_summary_plots_and_report(rendered: Path) -> None:
    for name in ["summary.csv", "report.md", *report.PLOTS]:
        path = rendered / name
        assert path.is_file() and path.stat().st_size > 0, name
    for name in report.PLOTS:
        assert (rendered / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


# ---------------------------------------------------------------- summary.csv


@pytest.mark.parametrize(
    "metric",
    ["samples_per_s", "timed_s", "step_time_ms_p50", "step_time_ms_p90", "peak_mem_mib"],
)
def test_summary_medians_are_those_of_runs_csv(runs, summary, metric: str) -> None:
    expected = _expected(runs, metric)
    got = summary.set_index(["strategy", "world_size"])[f"{metric}_median"]
    assert sorted(got.index) == sorted(expected.index)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5), key


def test_summary_spread_and_repeat_count(runs, summary) -> None:
    ok = runs[runs["status"] == "ok"]
    for (name, ws), grp in ok.groupby(["strategy", "world_size"]):
        row = summary[(summary["strategy"] == name) & (summary["world_size"] == ws)].iloc[0]
        v = grp["samples_per_s"].to_numpy(float)
        assert row["n_repeats"] == grp["repeat"].nunique() == 2
        assert row["samples_per_s_min"] == pytest.approx(v.min(), rel=1e-5)
        assert row["samples_per_s_max"] == pytest.approx(v.max(), rel=1e-5)
        iqr = np.percentile(v, 75) - np.percentile(v, 25)
        assert row["samples_per_s_iqr"] == pytest.approx(iqr, rel=1e-5, abs=1e-9)


def test_speedup_is_over_single_at_world_size_one(runs, summary) -> None:
    sps = _expected(runs, "samples_per_s")
    base = sps[("single", 1)]
    for _, row in summary.iterrows():
        up = sps[(row["strategy"], row["world_size"])] / base
        assert row["speedup_vs_single"] == pytest.approx(up, rel=1e-5)
        assert row["scaling_efficiency"] == pytest.approx(up / row["world_size"], rel=1e-5)
    single = summary[(summary["strategy"] == "single") & (summary["world_size"] == 1)]
    assert single["speedup_vs_single"].iloc[0] == pytest.approx(1.0)


def test_summary_has_only_strategies_with_an_ok_row(runs, summary) -> None:
    assert sorted(summary["strategy"].unique()) == _ok_names(runs)
    never_ok = set(runs["strategy"]) - set(_ok_names(runs))
    assert never_ok, "the small run should hold an unavailable strategy (apex on CPU)"
    assert not never_ok & set(summary["strategy"])


# ---------------------------------------------------------------- plots


def _bars_by_label(fig) -> dict[str, list]:
    ax = fig.axes[0]
    return {c.get_label(): list(c) for c in ax.containers if hasattr(c, "patches")}


@pytest.mark.parametrize(
    ("name", "metric", "unit"),
    [("throughput.png", "samples_per_s", "samples/s"), ("peak_memory.png", "peak_mem_mib", "MiB")],
)
def test_grouped_bars_hold_one_series_per_strategy(figures, runs, summary, name, metric, unit):
    fig = figures[name]
    ax = fig.axes[0]
    assert unit in ax.get_ylabel() and "world size" in ax.get_xlabel() and ax.get_title()
    bars = _bars_by_label(fig)
    assert sorted(bars) == _ok_names(runs)
    colours = _colours(runs)
    for strategy, patches in bars.items():
        rows = summary[summary["strategy"] == strategy].sort_values("world_size")
        assert [p.get_height() for p in patches] == pytest.approx(
            list(rows[f"{metric}_median"]), rel=1e-5
        )
        assert {p.get_facecolor() for p in patches} == {to_rgba(colours[strategy])}
    assert plots.legend_labels(fig) == _ok_names(runs)


def test_scaling_efficiency_lines_and_ideal(figures, runs, summary) -> None:
    ax = figures["scaling_efficiency.png"].axes[0]
    assert "world size" in ax.get_xlabel() and "efficiency" in ax.get_ylabel()
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    ideal = [ln for label, ln in lines.items() if label.startswith("ideal")]
    assert len(ideal) == 1 and set(ideal[0].get_ydata()) == {1.0}
    assert sorted(k for k in lines if not k.startswith("ideal")) == _ok_names(runs)
    colours = _colours(runs)
    for strategy in _ok_names(runs):
        rows = summary[summary["strategy"] == strategy].sort_values("world_size")
        assert list(lines[strategy].get_xdata()) == list(rows["world_size"])
        assert list(lines[strategy].get_ydata()) == pytest.approx(
            list(rows["scaling_efficiency"]), rel=1e-5
        )
        assert to_rgba(lines[strategy].get_color()) == to_rgba(colours[strategy])


def _cells(summary: pd.DataFrame) -> list[tuple[str, int]]:
    return sorted(zip(summary["strategy"], summary["world_size"].astype(int), strict=True))


def test_step_time_boxes_exclude_warmup(rendered, figures, runs, summary) -> None:
    ax = figures["step_time.png"].axes[0]
    assert "step time (ms" in ax.get_ylabel()
    boxes = [p for p in ax.patches if p.get_label() in set(runs["strategy"])]
    cells = _cells(summary)
    assert len(boxes) == len(cells)
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{s}\nws={w}" for s, w in cells]
    steps = pd.read_csv(rendered / "steps.csv")
    timed = steps[steps["warmup"] == 0]
    assert len(timed) < len(steps), "the small run has warm-up steps to exclude"
    colours = _colours(runs)
    for box, (name, ws) in zip(boxes, cells, strict=True):
        v = timed.loc[(timed["strategy"] == name) & (timed["world_size"] == ws), "step_time_ms"]
        ys = box.get_path().vertices[:, 1]
        # the box spans the quartiles of exactly the timed steps
        assert ys.min() == pytest.approx(np.percentile(v, 25), rel=1e-6)
        assert ys.max() == pytest.approx(np.percentile(v, 75), rel=1e-6)
        assert box.get_label() == name and box.get_facecolor() == to_rgba(colours[name])


def test_loss_lines_one_per_strategy_and_world_size(rendered, figures, runs, summary) -> None:
    ax = figures["loss.png"].axes[0]
    assert "loss" in ax.get_ylabel() and "step" in ax.get_xlabel()
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert sorted(lines) == sorted(f"{s} ws={w}" for s, w in _cells(summary))
    steps = pd.read_csv(rendered / "steps.csv")
    colours = _colours(runs)
    for (name, ws), label in zip(_cells(summary), sorted(lines), strict=True):
        line = lines[f"{name} ws={ws}"]
        one = steps[(steps["strategy"] == name) & (steps["world_size"] == ws)]
        expected = one.groupby("step")["loss"].median()  # one epoch: step is the x position
        assert list(line.get_ydata()) == pytest.approx(list(expected), rel=1e-6), label
        assert to_rgba(line.get_color())[:3] == to_rgba(colours[name])[:3]


def test_time_split_stacks_the_parts_of_a_step(rendered, figures, runs, summary) -> None:
    """The report's plot: per cell, forward, backward, optimizer, data wait and other,
    stacked to the cell's mean step (median over repeats); no communication part where no
    probe ran (the small run has none)."""
    ax = figures["time_split.png"].axes[0]
    assert "exposed communication" in ax.get_title()
    counted = report.counted_rows(runs.assign(epoch=runs["epoch"].astype(float)))
    steps = counted.groupby(["strategy", "world_size"])["step_time_ms_mean"].median()
    cells = sorted(steps.index)
    tops: dict[int, float] = {}
    labels = set()
    for c in ax.containers:
        for p in c.patches:
            x = round(p.get_x() + p.get_width() / 2)
            tops[x] = tops.get(x, 0.0) + p.get_height()
        labels.add(c.get_label())
    assert len(tops) == len(cells)
    for i, cell in enumerate(cells):
        assert tops[i] == pytest.approx(steps.loc[cell], rel=1e-6), cell
    assert not any("communication" in str(t) for t in labels)
    assert any(str(t).endswith("data wait") for t in labels)


def test_time_split_of_a_run_without_laps_stacks_compute_and_data_wait(
    rendered, runs, summary
) -> None:
    """Runs from before the step was lapped: compute and data wait from steps.csv."""
    run = report.load_run(rendered)
    timed = report.counted_steps(run.steps, report.counted_rows(run.runs))
    fig = plots.time_split(timed, colours=_colours(runs))
    ax = fig.axes[0]
    assert "ms" in ax.get_ylabel()
    steps = pd.read_csv(rendered / "steps.csv")
    means = steps[steps["warmup"] == 0].groupby(["strategy", "world_size"])
    means = means[["compute_ms", "data_wait_ms"]].mean()
    containers = [c for c in ax.containers if hasattr(c, "patches")]
    # per strategy: a solid compute container and a hatched data-wait one on top of it
    assert len(containers) == 2 * len(_ok_names(runs))
    cells = _cells(summary)
    heights = {}
    for c in containers:
        kind = "data_wait_ms" if c.get_label().endswith("data wait") else "compute_ms"
        for p in c.patches:
            heights[(cells[round(p.get_x() + p.get_width() / 2)], kind)] = p.get_height()
    for cell in cells:
        for kind in ("compute_ms", "data_wait_ms"):
            assert heights[(cell, kind)] == pytest.approx(means.loc[cell, kind], rel=1e-6)
    labels = plots.legend_labels(fig)
    assert labels[: len(_ok_names(runs))] == _ok_names(runs)
    assert any("data wait" in t for t in labels) and any("compute" in t for t in labels)


def test_every_plot_has_labelled_axes_and_a_title(figures) -> None:
    for name, fig in figures.items():
        ax = fig.axes[0]
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel(), name


def test_colour_map_is_stable_and_distinct() -> None:
    a = plots.colour_map(["single", "ddp_spawn", "dp"])
    assert a == plots.colour_map(["dp", "single", "ddp_spawn", "dp"])
    assert len(set(a.values())) == 3
    many = plots.colour_map([f"s{i:02d}" for i in range(15)])
    assert len(set(many.values())) == 15


def test_colour_map_keeps_forty_strategies_apart_and_off_grey() -> None:
    """Every strategy in fp32 and bf16 is some 40 names: past tab20's 18 colours every 19th
    name took the colour of one before it, and a plot's legend could not tell their bars
    apart. Each keeps a colour of its own, none the grey of the reference marks."""
    names = [f"{s} [{p}]" for s in (f"s{i:02d}" for i in range(20)) for p in ("fp32", "bf16")]
    colours = plots.colour_map(names)
    assert len(set(colours.values())) == len(names) == 40
    assert not [n for n, (r, g, b, _) in colours.items() if max(r, g, b) - min(r, g, b) < 0.02]


# ---------------------------------------------------------------- report.md


def test_report_names_every_strategy_and_its_conditions(rendered, runs) -> None:
    text = (rendered / "report.md").read_text()
    for name in runs["strategy"].unique():
        assert name in text, name
    for heading in ("## Environment", "## Conditions", "## Summary", "## Plots", "## Unavailable"):
        assert heading in text
    first = runs.iloc[0]
    assert str(first["torch_version"]) in text and str(first["host"]) in text
    assert (
        "global batch (the same for every strategy and at every world size, whose data-parallel "
        f"ranks share it: strong scaling): {first['global_batch']}" in text
    )
    assert f"warm-up steps excluded from timing, per epoch: {first['warmup_steps']}" in text
    for name in report.PLOTS:
        assert f"]({name})" in text


def test_report_lists_every_non_ok_cell_with_its_reason(rendered, runs) -> None:
    text = (rendered / "report.md").read_text()
    problems = text.split("## Unavailable, skipped and failed", 1)[1]
    bad = runs[runs["status"] != "ok"]
    assert len(bad), "the small run should hold skipped and unavailable cells"
    for row in bad.itertuples():
        assert f"| {row.strategy} | {row.world_size} | {row.status} |" in problems
        assert str(row.reason) in problems
    for name in set(runs["strategy"]) - set(_ok_names(runs)):
        assert name in problems.split("\n\n")[1]  # "Strategies with no ok result: ..."


def _add_rows(run_dir: Path, rows: list[dict]) -> None:
    """Append status rows to a copied runs.csv, as the runner would have written them."""
    runs = pd.read_csv(run_dir / "runs.csv", dtype=str, keep_default_na=False)
    template = runs.iloc[0].copy()
    template[:] = ""
    new = [template.to_dict() | {k: str(v) for k, v in r.items()} for r in rows]
    pd.concat([runs, pd.DataFrame(new)]).to_csv(run_dir / "runs.csv", index=False)


def test_failed_repeats_leave_the_summary_and_appear_with_their_reason(small_run, tmp_path):
    run_dir = tmp_path / "with-failures"
    shutil.copytree(small_run, run_dir)
    _add_rows(run_dir, [
        # repeat 1 of ddp_spawn ws=2 finished its epoch, then the cell failed
        {"strategy": "ddp_spawn", "world_size": 2, "repeat": 1, "status": "failed",
         "reason": "rank 1: RuntimeError: Connection reset by peer"},
        {"strategy": "ghost", "world_size": 1, "repeat": 0, "status": "timeout",
         "reason": "no result within 240 s (hang?)"},
        {"strategy": "ghost", "world_size": 2, "repeat": 0, "status": "oom",
         "reason": "rank 0: OutOfMemoryError: CUDA out of memory"},
    ])  # fmt: skip
    text = report.render(run_dir).read_text()
    summary = pd.read_csv(run_dir / "summary.csv")
    row = summary[(summary["strategy"] == "ddp_spawn") & (summary["world_size"] == 2)].iloc[0]
    runs = pd.read_csv(small_run / "runs.csv")
    kept = runs[(runs["strategy"] == "ddp_spawn") & (runs["world_size"] == 2)]
    kept = kept[(kept["repeat"] == 0) & (kept["status"] == "ok")]
    assert row["n_repeats"] == 1
    assert row["samples_per_s_median"] == pytest.approx(kept["samples_per_s"].iloc[-1], rel=1e-5)
    assert "ghost" not in set(summary["strategy"])
    problems = text.split("## Unavailable, skipped and failed", 1)[1]
    assert "| ddp_spawn | 2 | failed | r1 | rank 1: RuntimeError: Connection reset by peer |" in (
        problems
    )
    assert "| ghost | 1 | timeout | r0 | no result within 240 s (hang?) |" in problems
    assert "| ghost | 2 | oom | r0 |" in problems
    assert "ghost" in problems.split("\n\n")[1]
    # what runs them again; not for a verify's run, whose resume would give no verdict
    assert f"again: `parabench run --resume {run_dir} --retry-failed`" in problems
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "save_params": True}))
    run = report.load_run(run_dir)
    assert "--retry-failed" not in report.report_markdown(run, report.summarise(run.runs), [])


def test_median_and_spread_over_three_repeats(small_run, tmp_path) -> None:
    """An odd number of repeats, one of them far off: the median is not the mean."""
    run_dir = tmp_path / "three"
    shutil.copytree(small_run, run_dir)
    runs = pd.read_csv(run_dir / "runs.csv", dtype=str, keep_default_na=False)
    single = runs[(runs["strategy"] == "single") & (runs["status"] == "ok")]
    extra = single.iloc[[0]].copy()
    extra["repeat"] = "2"
    extra["samples_per_s"] = repr(float(extra["samples_per_s"].iloc[0]) * 10)
    pd.concat([runs, extra]).to_csv(run_dir / "runs.csv", index=False)
    report.render(run_dir)
    row = pd.read_csv(run_dir / "summary.csv").set_index(["strategy", "world_size"])
    row = row.loc[("single", 1)]
    v = np.array([*single["samples_per_s"].astype(float), float(extra["samples_per_s"].iloc[0])])
    assert row["n_repeats"] == 3
    assert row["samples_per_s_median"] == pytest.approx(np.median(v), rel=1e-5)
    assert row["samples_per_s_median"] != pytest.approx(v.mean(), rel=1e-3)
    iqr = np.percentile(v, 75) - np.percentile(v, 25)
    assert row["samples_per_s_iqr"] == pytest.approx(iqr, rel=1e-5)
    assert row["samples_per_s_max"] == pytest.approx(v.max(), rel=1e-5)


def test_step_plots_leave_out_warmup_steps_they_are_given(rendered) -> None:
    """The plot functions drop warm-up rows themselves, whatever the caller passes."""
    steps = pd.read_csv(rendered / "steps.csv")
    steps = steps[steps["strategy"] == "single"]
    slow_warmup = steps.assign(
        step_time_ms=np.where(steps["warmup"] == 1, 1e6, steps["step_time_ms"]),
        data_wait_ms=np.where(steps["warmup"] == 1, 1e6, steps["data_wait_ms"]),
    )
    timed = steps[steps["warmup"] == 0]
    box = plots.step_time_distribution(slow_warmup).axes[0]
    drawn = [np.asarray(ln.get_ydata(), float) for ln in box.get_lines()]
    assert max(y.max() for y in drawn if y.size) == pytest.approx(timed["step_time_ms"].max())
    split = plots.time_split(slow_warmup).axes[0]
    tops = [p.get_y() + p.get_height() for p in split.patches]
    assert max(tops) == pytest.approx(timed["step_time_ms"].mean(), rel=1e-6)


def test_render_needs_only_runs_csv(small_run, tmp_path) -> None:
    """Results from another machine may come without steps.csv and the json files."""
    (tmp_path / "bare").mkdir()
    shutil.copy(small_run / "runs.csv", tmp_path / "bare" / "runs.csv")
    out = report.render(tmp_path / "bare")
    assert out.is_file() and (tmp_path / "bare" / "throughput.png").is_file()
    assert "## Summary" in out.read_text()


def test_a_run_with_no_rows_yet_states_its_conditions_from_its_config(small_run, tmp_path):
    """A run stopped before its first row (runs.csv is its header): the report states what
    was asked from config.json, not blanks, and no empty plots section."""
    run_dir = tmp_path / "none"
    run_dir.mkdir()
    shutil.copy(small_run / "config.json", run_dir / "config.json")
    header = (small_run / "runs.csv").read_text().splitlines()[0]
    (run_dir / "runs.csv").write_text(header + "\n")
    text = report.render(run_dir).read_text()
    cfg = json.loads((small_run / "config.json").read_text())
    assert f"- model: mnist_cnn with dropout=0.0; device: {cfg['device']}" in text
    assert (
        "global batch (the same for every strategy and at every world size, whose data-parallel "
        f"ranks share it: strong scaling): {cfg['global_batch']}" in text
    )
    assert f"- seed: {cfg['seed']}; learning rate: {cfg['lr']}; optimizer: adam" in text
    assert f"max steps per epoch: {cfg['max_steps']};" in text
    assert "## Plots" not in text and "Every cell finished ok" not in text
    assert "No cell has a row yet" in text
    # stopped before runs.csv was made: the same report, and its plan says what is left
    (run_dir / "runs.csv").unlink()
    shutil.copy(small_run / "plan.csv", run_dir / "plan.csv")
    planned = len(pd.read_csv(small_run / "plan.csv"))
    text = report.render(run_dir).read_text()
    assert "No cell has a row yet" in text
    assert f"**Incomplete: {planned} of {planned} planned cells have no row" in text


def test_a_finished_run_planned_every_row_it_has(small_run) -> None:
    """plan.csv: the cells the run set out to run, each with its rows in runs.csv."""
    run = report.load_run(small_run)
    assert len(run.planned) == len(run.runs.drop_duplicates(["strategy", "world_size", "repeat"]))
    assert run.missing == [] and run.missing_text("parabench") == ""


@pytest.mark.parametrize(
    "table, column, value, says",
    [
        ("ranks.csv", "rank", "", "column rank is empty (row 2)"),
        ("ranks.csv", "param_mib", "abc", "column param_mib holds 'abc', not a number (row 2)"),
        ("steps.csv", "loss", "lots", "column loss holds 'lots', not a number (row 2)"),
        ("steps.csv", "step", "1.5", "column step holds '1.5', not a whole number (row 2)"),
    ],
)
def test_a_garbled_value_in_steps_or_ranks_is_one_line_and_changes_nothing(
    small_run, tmp_path, capsys, table, column, value, says
) -> None:
    """A value edited into steps.csv or ranks.csv that the report cannot use is bad input:
    one line, exit 2, and the report files as they were (not half rewritten)."""
    run_dir = Path(shutil.copytree(small_run, tmp_path / "garbled"))
    assert main(["report", str(run_dir)]) == 0
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    df = pd.read_csv(run_dir / table, dtype=str, keep_default_na=False)
    df.loc[0, column] = value
    df.to_csv(run_dir / table, index=False)
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run_dir / table}: {says}" in err, err
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert {k: v for k, v in after.items() if k != table} == {
        k: v for k, v in before.items() if k != table
    }


def test_plots_a_render_no_longer_draws_are_removed(small_run, tmp_path) -> None:
    """runs.csv edited so no cell is ok: the report has no plots, and the folder keeps none
    of the earlier render's beside it."""
    run_dir = Path(shutil.copytree(small_run, tmp_path / "none-ok"))
    report.render(run_dir)
    assert (run_dir / "throughput.png").is_file()
    runs = pd.read_csv(run_dir / "runs.csv", dtype=str, keep_default_na=False)
    runs["status"], runs["reason"] = "failed", "edited"
    runs.to_csv(run_dir / "runs.csv", index=False)
    text = report.render(run_dir).read_text()
    assert "## Plots" not in text
    assert not [p.name for p in run_dir.glob("*.png")]


def test_a_render_stopped_part_way_leaves_the_earlier_one_whole(tmp_path, monkeypatch) -> None:
    """Ctrl-C or SIGTERM as the report is written (`parabench report`, or a run's own at its
    end): the files are those of the render before, none cut short and no temporary one left
    (a plot half written, or the earlier report.md beside this render's summary and plots,
    read as whole)."""
    run_dir = tmp_path / "stopped"
    run_dir.mkdir()
    shutil.copy(REFERENCE / "runs.csv", run_dir / "runs.csv")
    report.render(run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    runs = pd.read_csv(run_dir / "runs.csv", dtype=str, keep_default_na=False)
    runs.iloc[1:].to_csv(run_dir / "runs.csv", index=False)  # a row fewer: another summary
    before["runs.csv"] = (run_dir / "runs.csv").read_bytes()
    drawn: list[str] = []
    real = plots.fit_titles

    def half(target, **kw):  # stopped as it is written, half of it there
        if isinstance(target, Path | str):
            Path(target).write_bytes(b"\x89PNG half")
        else:
            target.write(b"\x89PNG half")
        raise KeyboardInterrupt

    def stopped(fig):  # the third plot's
        if len(drawn) == 2:
            fig.savefig = half
        drawn.append(fig)
        return real(fig)

    monkeypatch.setattr(plots, "fit_titles", stopped)
    with pytest.raises(KeyboardInterrupt):
        report.render(run_dir)
    assert len(drawn) == 3
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_a_stop_as_the_files_are_put_in_place_waits_until_all_are(
    tmp_path, monkeypatch, capsys, sigint_raises
) -> None:
    """Every file written whole, they are put in place one after another: Ctrl-C there
    left this render's last plots beside the earlier render's report.md and summary.csv,
    each read as whole. The stop now waits for the last of them (moments), then stops,
    saying the report is whole: "interrupted while writing" sent the user to write it
    again."""
    import os
    import signal

    from bench.harness import results

    run_dir = tmp_path / "swap"
    run_dir.mkdir()
    shutil.copy(REFERENCE / "runs.csv", run_dir / "runs.csv")
    report.render(run_dir)
    before = {name: (run_dir / name).read_bytes() for name in ("report.md", "summary.csv")}
    runs = pd.read_csv(run_dir / "runs.csv", dtype=str, keep_default_na=False)
    runs.iloc[1:].to_csv(run_dir / "runs.csv", index=False)  # a row fewer: another summary
    real, placed = os.replace, []

    def replace(src, dst):
        real(src, dst)
        placed.append(Path(dst).name)
        if len(placed) == 1:  # Ctrl-C once the first file is in place
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(results.os, "replace", replace)
    with pytest.raises(report.StoppedWhole):
        report.render(run_dir)
    assert placed[-1] == "report.md" and "summary.csv" in placed, placed
    for name, old in before.items():
        assert (run_dir / name).read_bytes() != old, f"{name} is the earlier render's"
    placed.clear()
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 130
    err = capsys.readouterr().err
    assert f"interrupted once the report was whole: {run_dir / 'report.md'}" in err, err


# ---------------------------------------------------------------- CLI


def test_cli_report_prints_the_report_path(small_run, tmp_path, capsys) -> None:
    run_dir = tmp_path / "cli"
    shutil.copytree(small_run, run_dir)
    assert main(["report", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report.md")


@pytest.mark.parametrize("what", ["missing", "no-runs-csv"])
def test_cli_report_bad_input_is_one_line_and_exit_2(tmp_path, capsys, what: str) -> None:
    target = tmp_path / what
    if what == "no-runs-csv":
        target.mkdir()
    assert main(["report", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("parabench: error:") and err.count("\n") == 1


def test_start_up_is_split_into_phases_and_tabled_per_launcher(rendered, runs) -> None:
    ok = runs[runs["status"] == "ok"]
    phases = ok[["startup_launch_s", "startup_rendezvous_s", "startup_setup_s"]]
    assert (phases >= 0).all().all() and (ok["teardown_s"] >= 0).all()
    assert np.allclose(phases.sum(axis=1), ok["startup_s"])
    # the phases, the timed steps and the teardown all fit in the cell's wall time
    assert (ok["startup_s"] + ok["timed_s"] + ok["teardown_s"] <= ok["cell_wall_s"] + 0.01).all()
    text = (rendered / "report.md").read_text()
    section = text.split("## Start-up per launcher")[1].split("##")[0]
    for launcher in set(ok["launcher"]):
        assert f"| {launcher} |" in section
    assert "Timed training is" in section


# ---------------------------------------------------------------- on a reference run
# results/reference/cpu-2core-mnist-3rounds: a real run of every strategy, three repeats,
# kept without its cells/ folder (read from a copy, never rendered in place)
REFERENCE = Path(__file__).resolve().parent.parent / "results/reference/cpu-2core-mnist-3rounds"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> report.Run:
    if not (REFERENCE / "runs.csv").exists():
        pytest.skip(f"{REFERENCE} is not in this checkout")
    copy = tmp_path_factory.mktemp("reference") / REFERENCE.name
    shutil.copytree(REFERENCE, copy)
    return report.load_run(copy)


def test_every_reference_run_has_its_row_in_the_results_readme() -> None:
    """results/README.md's table is where a user looks up what each committed reference is
    (its hardware, what ran): a folder missing there (as cpu-2core-transformer-20261127,
    which README.md's "Which to choose" cites) is a run nobody can place."""
    folders = sorted(p.name for p in REFERENCE.parent.iterdir() if p.is_dir())
    table = (REFERENCE.parent.parent / "README.md").read_text()
    assert folders and [f for f in folders if f"| `reference/{f}` |" not in table] == []


def test_the_results_readme_says_where_a_gpu_checks_runs_are() -> None:
    """results/README.md: `parabench compare results/reference/<run> ...`, each with its
    report.md; but a GPU check's folder holds no run (compare on it: no runs.csv there):
    its runs are its parts, each named in its README.md."""
    text = " ".join((REFERENCE.parent.parent / "README.md").read_text().split())
    assert "A GPU check (`nvidia-*`) is no run itself but a folder of them, one a part" in text
    checks = 0
    for folder in sorted(p for p in REFERENCE.parent.iterdir() if p.is_dir()):
        if (folder / "runs.csv").exists():
            assert (folder / "report.md").exists(), folder
            continue
        checks += 1
        parts = sorted(p.parent.name for p in folder.glob("*/runs.csv"))
        assert parts and folder.name.startswith("nvidia-"), folder
        readme = (folder / "README.md").read_text()
        assert [p for p in parts if p not in readme] == [], folder
    assert checks


@pytest.mark.parametrize("command", ["report", "compare", "predict"])
def test_a_folder_of_runs_named_as_one_names_its_runs(tmp_path, capsys, command) -> None:
    """`parabench compare results/reference/nvidia-h200-20261126 ...` (a GPU check's folder,
    whose runs are its parts) or `report results` said only "no runs.csv there; is it a
    parabench run directory?": the runs in its folders are named, in one line, exit 2."""
    from bench.cli import main

    for name in ["resnet50", "mnist", "horovod", "apex"]:
        (tmp_path / "check" / name).mkdir(parents=True)
        (tmp_path / "check" / name / "runs.csv").write_text("strategy\n")
        (tmp_path / "check" / name / "config.json").write_text("{}")
    check = tmp_path / "check"
    args = {"report": [check], "compare": [check, check / "mnist"], "predict": [check]}
    assert main([command, *map(str, args[command])]) == 2
    err = capsys.readouterr().err
    lacks = "config.json" if command == "predict" else "runs.csv"
    assert err == (
        f"parabench: error: {check}: no {lacks} there, but runs in its folders (apex, "
        f"horovod, mnist and 1 more): name one, as {check / 'apex'}\n"
    )
    (tmp_path / "empty").mkdir()
    assert main([command, str(tmp_path / "empty"), *map(str, args[command][1:])]) == 2
    assert "is it a parabench run directory?" in capsys.readouterr().err


def _one_process_copy(tmp_path: Path) -> Path:
    """The reference run as a run of world size 1 alone would be (no collectives measured)."""
    run_dir = Path(shutil.copytree(REFERENCE, tmp_path / "one-process"))
    (run_dir / "collectives.json").unlink(missing_ok=True)
    for name in ("runs.csv", "steps.csv", "ranks.csv"):
        rows = pd.read_csv(run_dir / name, dtype=str, keep_default_na=False)
        rows[rows["world_size"] == "1"].to_csv(run_dir / name, index=False)
    return run_dir


@pytest.mark.parametrize("command", ["--help", "report", "compare"])
def test_the_read_only_commands_import_no_torch(tmp_path, command: str) -> None:
    """torch takes seconds to import, and reading CSVs needs none of it: the parser imported
    verify (the runner, torch) for every command, and the report the probes for their
    phases' names. A report that asks a strategy's own words (its ablation, its predicted
    collectives) still imports the strategies, and torch with them."""
    if not (REFERENCE / "runs.csv").exists():
        pytest.skip(f"{REFERENCE} is not in this checkout")
    args = {
        "--help": ["--help"],
        "report": [str(_one_process_copy(tmp_path))],
        "compare": [str(shutil.copytree(REFERENCE, tmp_path / name)) for name in "ab"],
    }[command]
    if command != "--help":
        args = [command, *args]
    code = (
        "import sys\n"
        "from bench.cli import main\n"
        "try:\n"
        f"    code = main({args!r})\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "print('torch imported' if 'torch' in sys.modules else 'no torch', code, file=sys.stderr)\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.stderr.splitlines()[-1] == "no torch 0", done.stderr[-2000:]


def test_an_infinite_figure_is_not_plotted_and_its_row_is_named(tmp_path) -> None:
    """samples/s `inf` in runs.csv (a hand edit, or timed steps that took no time) made the
    throughput plot's axis limits inf, and the report stopped with a traceback: it is read as
    not measured, every plot is drawn, and the report names the row."""
    if not (REFERENCE / "runs.csv").exists():
        pytest.skip(f"{REFERENCE} is not in this checkout")
    run_dir = Path(shutil.copytree(REFERENCE, tmp_path / "inf"))
    runs = pd.read_csv(run_dir / "runs.csv")
    row = runs.index[(runs["strategy"] == "ddp_spawn") & (runs["world_size"] == 2)][0]
    runs.loc[row, "samples_per_s"] = np.inf
    runs.loc[row, "train_loss_final"] = np.inf  # a diverged run's loss: a measurement
    runs.to_csv(run_dir / "runs.csv", index=False)
    for png in run_dir.glob("*.png"):
        png.unlink()
    text = report.render(run_dir).read_text()
    assert {p.name for p in run_dir.glob("*.png")} >= set(report.PLOTS)
    repeat = runs.loc[row, "repeat"]
    said = f"row {row + 2} (ddp_spawn ws=2 repeat {repeat}): samples_per_s inf."
    assert said in _section(text, "Unavailable, skipped and failed"), text
    others = runs[(runs["strategy"] == "ddp_spawn") & (runs["world_size"] == 2)].drop(row)
    summary = pd.read_csv(run_dir / "summary.csv")
    cell = summary[(summary["strategy"] == "ddp_spawn") & (summary["world_size"] == 2)].iloc[0]
    assert cell["samples_per_s_median"] == pytest.approx(others["samples_per_s"].median(), 1e-5)


def test_versions_and_the_commit_are_reported_as_written(tmp_path) -> None:
    """pandas read a version or commit that looks like a number as one: the report said
    CUDA 13 for 13.0, torchvision 0.3 for 0.30, and git commit inf for 1234567e8901."""
    if not (REFERENCE / "runs.csv").exists():
        pytest.skip(f"{REFERENCE} is not in this checkout")
    run_dir = Path(shutil.copytree(REFERENCE, tmp_path / "versions"))
    runs = pd.read_csv(run_dir / "runs.csv", dtype=str, keep_default_na=False)
    written = {"cuda_version": "13.0", "torchvision_version": "0.30", "git_commit": "1234567e8901"}
    for col, value in written.items():
        runs[col] = value
    runs.to_csv(run_dir / "runs.csv", index=False)
    environment = _section(report.render(run_dir).read_text(), "Environment")
    for label, value in (("CUDA", "13.0"), ("torchvision", "0.30"), ("git commit", "1234567e8901")):
        assert f"| {label} | {value} |" in environment, environment


def _section(text: str, heading: str) -> str:
    return text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_a_plot_with_nothing_to_show_is_left_out_and_the_report_says_why(tmp_path) -> None:
    """A run with no `single` at world size 1 has no speed-up: the report wrote a
    scaling_efficiency.png of empty axes (and kept an earlier render's), read as a plot
    whose points went missing. It is left out, the Plots section says why, the rest drawn."""
    if not (REFERENCE / "runs.csv").exists():
        pytest.skip(f"{REFERENCE} is not in this checkout")
    run_dir = Path(shutil.copytree(REFERENCE, tmp_path / "no-single"))
    assert (run_dir / "scaling_efficiency.png").is_file()  # the reference's own render
    runs = pd.read_csv(run_dir / "runs.csv", dtype=str, keep_default_na=False)
    runs[runs["strategy"] != "single"].to_csv(run_dir / "runs.csv", index=False)
    text = report.render(run_dir).read_text()
    assert {p.name for p in run_dir.glob("*.png")} == set(report.PLOTS) - {"scaling_efficiency.png"}
    section = _section(text, "Plots")
    assert "(scaling_efficiency.png)" not in section
    assert section.count("](") == len(report.PLOTS) - 1
    assert (
        "`scaling_efficiency.png` is left out: no speed-up (needs an ok `single` run at "
        "world size 1) to show." in section
    ), section


def test_a_run_without_cells_keeps_the_scaling_section_and_says_why(reference) -> None:
    """No cells/ (the CPU references leave it out): nothing to predict from, and the
    section says so, with predict's reasons, instead of vanishing."""
    assert (
        not (reference.path / "cells").exists() and (reference.path / "collectives.json").exists()
    )
    text = report.report_markdown(reference, report.summarise(reference.runs), [])
    section = _section(text, "Scaling: predicted and measured").strip()
    assert section.startswith("No prediction: ") and "\n" not in section
    assert "no cells/ folder here to read its compute curve from" in section
    assert "(dp, single)" in section  # one process: each reason once, with its cases


def test_the_lightest_rank_is_not_named_as_a_spread_over_repeats(reference) -> None:
    """runs.csv's lightest rank's model state, `model_state_mib_min` in a run of an older
    parabench (as this reference), is read as model_state_mib_lightest: summary.csv's
    `model_state_mib_min` is then the least repeat of model_state_mib, as every `_min` is."""
    assert "model_state_mib_min" in pd.read_csv(REFERENCE / "runs.csv", nrows=0)
    table = report.summarise(reference.runs)
    assert not [c for c in table.columns if c.startswith("model_state_mib_min_")]
    zero1 = table.set_index(["strategy", "world_size"]).loc[("zero1", 2)]
    assert zero1["model_state_mib_lightest_median"] == pytest.approx(9.23156)
    assert zero1["model_state_mib_min"] == pytest.approx(13.654373)  # the heaviest rank's
    assert report.model_state_text(zero1).endswith("; least 9.2")


def test_the_problems_table_names_repeats_by_index(reference) -> None:
    problems = report.problems_markdown(reference.runs, report.summarise(reference.runs))
    assert "| strategy | world size | status | repeat(s) | reason |" in problems
    assert "| model_split | 1 | skipped | r0, r1, r2 |" in problems


def test_a_reason_with_carriage_returns_stays_on_its_table_row(reference) -> None:
    """A rank's error message may hold CR LF or a lone CR (a Windows-written file, a
    progress bar): Markdown ends a line at either, so the row would break off mid-reason
    and the rest would read as text under the table."""
    runs = reference.runs.copy()
    cell = (runs["strategy"] == "fsdp") & (pd.to_numeric(runs["world_size"]) == 2)
    runs.loc[cell, ["status", "reason"]] = ["failed", "rank 1: ValueError: a\r\nb\rc\nd"]
    problems = report.problems_markdown(runs, report.summarise(report.counted_rows(runs)))
    lines = re.split(r"\r\n|\r|\n", problems)  # CommonMark's line endings
    assert "| fsdp | 2 | failed | r0, r1, r2 | rank 1: ValueError: a b c d |" in lines


def test_a_pipeline_row_shows_no_forward_of_its_own(reference) -> None:
    """The schedule runs forward and backward in one call, lapped as backward: its forward
    is not 0.00 but not measured apart."""
    where = report.breakdown_markdown(report.counted_rows(reference.runs))
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in where.splitlines()}
    for name in ("pipeline_gpipe", "pipeline_1f1b", "model_split"):
        assert rows[name][4] == "–" and float(rows[name][5]) > 0, rows[name]
    assert float(rows["single"][4]) > 0
    assert "counts both under backward (forward+backward)" in where


def test_the_baseline_over_itself_has_an_interval_only_with_enough_repeats(reference) -> None:
    """README: with fewer than 3 repeats the interval is –/nan, never invented; the
    baseline's speed-up is exactly 1 but its interval follows the same rule. One repeat has
    no IQR either."""

    def single(runs: pd.DataFrame) -> pd.Series:
        s = report.summarise(runs)
        return s[(s["strategy"] == "single") & (s["world_size"] == 1)].iloc[0]

    three = single(reference.runs)
    assert three["n_repeats"] == 3 and three["speedup_vs_single"] == 1.0
    assert (three["speedup_ci_low"], three["speedup_ci_high"]) == (1.0, 1.0)
    one = single(reference.runs[pd.to_numeric(reference.runs["repeat"]) == 0])
    assert one["n_repeats"] == 1 and one["speedup_vs_single"] == 1.0
    # nor a spread: one repeat's IQR read 0, as steady as a cell can be, beside a CV of nan
    assert three["samples_per_s_iqr"] > 0 and three["step_time_ms_p50_iqr"] > 0
    assert np.isnan(one["samples_per_s_iqr"]) and np.isnan(one["samples_per_s_cv_pct"])
    assert one["samples_per_s_min"] == one["samples_per_s_max"] == one["samples_per_s_median"]
    assert one["scaling_efficiency"] == 1.0
    for col in ("speedup", "scaling_efficiency"):
        assert np.isnan(one[f"{col}_ci_low"]) and np.isnan(one[f"{col}_ci_high"]), col


def test_an_interval_of_noisy_repeats_never_reads_below_zero(reference) -> None:
    """single's three repeats at 20, 100 and 180 samples/s: the t-interval of their mean
    ran from -99 to 299, a negative samples/s in the summary's 95 % CI column; a speed or a
    step time is never below 0, so its interval stops there."""
    runs = reference.runs.copy()
    cell = (runs["strategy"] == "single") & (pd.to_numeric(runs["world_size"]) == 1)
    repeat = pd.to_numeric(runs.loc[cell, "repeat"])
    runs.loc[cell, "samples_per_s"] = 20.0 + 80.0 * repeat
    runs.loc[cell, "step_time_ms_p50"] = 3200.0 / (20.0 + 80.0 * repeat)
    s = report.summarise(runs)
    single = s[(s["strategy"] == "single") & (s["world_size"] == 1)].iloc[0]
    assert single["samples_per_s_ci_low"] == 0.0
    assert single["samples_per_s_ci_high"] == pytest.approx(298.7, abs=0.1)
    assert single["step_time_ms_p50_ci_low"] == 0.0
    assert "| 0.0–298.7 |" in report.summary_markdown(s)
    # a quiet cell's interval is as it was
    spawn = s[(s["strategy"] == "ddp_spawn") & (s["world_size"] == 2)].iloc[0]
    assert 0 < spawn["samples_per_s_ci_low"] < spawn["samples_per_s_median"]


def test_a_baseline_with_no_speed_gets_no_speed_up_of_one(reference) -> None:
    """An ok `single` row whose samples/s is empty (a hand-edited or damaged runs.csv) has
    no speed: its speed-up over itself is not 1.00x, since nothing was measured to be 1."""
    runs = reference.runs.copy()
    base = (runs["strategy"] == "single") & (pd.to_numeric(runs["world_size"]) == 1)
    runs.loc[base, "samples_per_s"] = np.nan
    s = report.summarise(runs)
    single = s[(s["strategy"] == "single") & (s["world_size"] == 1)].iloc[0]
    assert np.isnan(single["speedup_vs_single"]) and np.isnan(single["scaling_efficiency"])


def test_the_reports_first_line_names_the_cases_in_the_tables_order(reference) -> None:
    """A run in fp32 and bf16 opened with "Strategies: ddp_spawn [bf16], ddp_spawn [fp32],
    ..." in text order, above tables and plots that give fp32 first, then bf16."""
    rows = reference.runs[reference.runs["strategy"].isin(["single", "ddp_spawn"])]
    both = pd.concat(
        [
            rows.assign(strategy=rows["strategy"] + f" [{p}]", precision=p, setting=p)
            for p in ("fp32", "bf16")
        ]
    )
    run = dataclasses.replace(reference, runs=both)
    text = report.report_markdown(run, report.summarise(both), [])
    first = "Strategies: ddp_spawn [fp32], ddp_spawn [bf16], single [fp32], single [bf16]."
    assert first in text.splitlines(), text[:400]


def test_a_run_where_no_cell_finished_ok_says_so_and_nothing_else(reference) -> None:
    """Every row failed: the summary says no cell finished ok, with no "median over repeats
    (up to 0)" to read and no prediction section blaming the strategies' models."""
    runs = reference.runs.assign(status="failed", reason="boom")
    run = dataclasses.replace(reference, runs=runs)
    summary = report.summarise(report.counted_rows(runs))
    assert summary.empty
    text = report.report_markdown(run, summary, [])
    assert _section(text, "Summary").strip().startswith("No cell finished ok")
    assert "up to 0" not in text and "## Scaling" not in text
    assert "boom" in _section(text, "Unavailable, skipped and failed")


def test_efficiency_on_a_cpu_says_the_ranks_shared_the_cores_single_had(reference) -> None:
    """single at world size 1 ran on both cores, each rank of a world size 2 cell on one:
    efficiency divides by the world size regardless, which the summary must say."""
    text = report.report_markdown(reference, report.summarise(reference.runs), [])
    summary = _section(text, "Summary")
    assert "On this CPU `single` at world size 1 computed with 2 thread(s)" in summary
    assert "speed-up 1 and efficiency 1/2" in summary
    # each rank with as many threads as single (--threads-per-rank), or a GPU: nothing to say
    counted = report.counted_rows(reference.runs)
    assert report.shared_cores_markdown(counted.assign(threads_per_rank=2)) == ""
    assert report.shared_cores_markdown(counted.assign(device="cuda")) == ""


def test_a_row_whose_collectives_the_profiler_cannot_see_says_why_its_total_is_empty(
    reference,
) -> None:
    """Horovod's collectives run on its own thread, out of torch.profiler's sight: its row
    read `ablation+profiler` beside a comm total of –, as if the profiler had run and found
    nothing, and nowhere said why (Horovod.comm_unseen was written but never shown)."""
    where = report.breakdown_markdown(report.counted_rows(reference.runs))
    rows = {tuple(line.split(" | ")[:2]): line for line in where.splitlines()}
    horovod = rows[("| horovod", "2")]
    assert horovod.split(" | ")[8] == "–"  # comm total
    assert "ablation+profiler; no comm total (nor hidden): Horovod runs its collectives" in (
        horovod
    )
    assert "no comm total" not in rows[("| ddp_spawn", "2")]  # gloo's are seen
    assert "no comm total" not in rows[("| horovod", "1")]  # one rank: no profiler ran
    # a row measured now says it in runs.csv's comm_method too (for compare, for the CSV's
    # readers), and the report does not say it twice
    from bench.harness import results

    unseen = report.comm_unseen(reference.runs[reference.runs["strategy"] == "horovod"])
    said = results.comm_method({"comm_method": "ablation+profiler", "comm_unseen": unseen})
    assert said == f"ablation+profiler; no comm total (nor hidden): {unseen}"
    runs = reference.runs.copy()
    runs.loc[runs["strategy"] == "horovod", "comm_method"] = said
    again = report.breakdown_markdown(report.counted_rows(runs))
    line = next(ln for ln in again.splitlines() if ln.startswith("| horovod | 2 |"))
    assert line.count("no comm total") == 1, line


def test_the_summary_says_what_each_columns_brackets_hold(reference) -> None:
    """The summary said its brackets hold the minimum and maximum over repeats, but the
    speed-up's hold its 95 % interval (wider: 1.27–1.65 for amp_ddp, whose repeats ran
    1.35–1.53x single) and the model state's its parts; 95% CI and CV % were not explained."""
    summary = report.summarise(reference.runs)
    text = _section(report.report_markdown(reference, summary, []), "Summary")
    spawn = summary.set_index(["strategy", "world_size"]).loc[("ddp_spawn", 2)]
    interval = f"{spawn['speedup_ci_low']:.2f}–{spawn['speedup_ci_high']:.2f}"
    assert f"x ({interval}) |" in text  # the speed-up's brackets are its interval...
    assert "except under speed-up (its 95 % interval)" in text  # ...and the text says so
    assert "model state (parameters / gradients / optimizer state)" in text
    assert "95% CI: the 95 % interval of the mean samples/s over repeats" in text
    assert "CV %: how much samples/s varies over repeats" in text and "above 5 %" in text


def test_the_conditions_say_how_batches_were_fed(reference) -> None:
    # MNIST indexed on the device has no DataLoader: its "0 loader workers" says so beside it
    conditions = report.fairness_markdown(reference, reference.runs)
    assert (
        "| launcher | backend | precision | numerics | data path | loader workers |" in conditions
    )
    assert "| exact | device | 0 |" in conditions


def test_the_conditions_name_a_set_option_the_case_names_leave_out(tmp_path) -> None:
    """`--set bucket_cap_mb=1` on ddp_spawn alone varies nothing, so its case is named
    `ddp_spawn`: the report said nothing of the option, read as DDP's default buckets. A
    swept option is in the names, and goes unsaid again."""
    if not (REFERENCE / "runs.csv").exists():
        pytest.skip(f"{REFERENCE} is not in this checkout")
    copy = tmp_path / REFERENCE.name
    shutil.copytree(REFERENCE, copy)
    path = copy / "runs.csv"
    runs = pd.read_csv(path, dtype={"setting": str}, keep_default_na=False)
    spawn = runs["strategy"] == "ddp_spawn"
    runs.loc[spawn, "setting"] = runs.loc[spawn, "setting"] + ",bucket_cap_mb=1"
    runs.to_csv(path, index=False)
    run = report.load_run(copy)
    assert "ddp_spawn" in set(run.runs["strategy"])
    conditions = report.fairness_markdown(run, report.counted_rows(run.runs))
    assert (
        "- strategy options (--set) beyond those in the case names: ddp_spawn "
        "(bucket_cap_mb=1); none for the other cases\n"
    ) in conditions
    swept = pd.concat(
        [runs, runs[spawn].assign(setting=runs.loc[spawn, "setting"].str.replace("=1", "=25"))]
    )
    swept.to_csv(path, index=False)
    run = report.load_run(copy)
    assert "ddp_spawn [bucket_cap_mb=25]" in set(run.runs["strategy"])
    assert "(--set)" not in report.fairness_markdown(run, report.counted_rows(run.runs))
    # on every case: none is left to be "the other cases"
    runs["setting"] = runs["setting"] + ",seed_offset=0"
    runs.to_csv(path, index=False)
    run = report.load_run(copy)
    conditions = report.fairness_markdown(run, report.counted_rows(run.runs))
    said = conditions.split("beyond those in the case names: ")[1].split("\n")[0]
    assert "(seed_offset=0)" in said and "none for the other cases" not in said, said


def test_target_precision_is_summarised_over_the_epochs_the_summary_counts() -> None:
    """Every epoch stops by precision, and the summary counts each repeat's last: the first
    epoch was named beside it as the same "single ws=1 round 0", and its steps counted."""
    runs = pd.DataFrame(
        {
            "strategy": ["single", "single"],
            "world_size": [1, 1],
            "repeat": [0, 0],
            "round": [0, 0],
            "epoch": [0, 1],
            "status": ["ok", "ok"],
            "target_precision_pct": [2.0, 2.0],
            "timed_steps": [100, 60],
            "step_precision_pct": [3.5, 1.5],
        }
    )
    text = report.precision_markdown(runs)
    assert "60–60 timed steps, median 60" in text and "Every cell reached it" in text


def test_target_precision_names_a_cell_short_of_it_with_whole_steps() -> None:
    """A skipped row leaves timed_steps empty, so the column reads back as float: the cell
    short of the target read "in 95.0 steps"."""
    runs = pd.DataFrame(
        {
            "strategy": ["single", "single"],
            "world_size": [1, 2],
            "repeat": [0, 0],
            "round": [0, 0],
            "epoch": [0, 0],
            "status": ["ok", "skipped"],
            "target_precision_pct": [2.0, None],
            "timed_steps": [95, None],
            "step_precision_pct": [3.5, None],
        }
    )
    text = report.precision_markdown(runs)
    assert "single ws=1 round 0 (±3.5 % in 95 steps)" in text


def test_timed_share_of_wall_time_counts_every_epoch_of_a_cell() -> None:
    """A cell's wall time holds all its epochs: measured against the last epoch's timed
    steps alone, three epochs of 10 s in a 60 s cell read as 17 %, not 50 %."""
    runs = pd.DataFrame(
        {
            "strategy": ["single"] * 3,
            "world_size": [1] * 3,
            "repeat": [0] * 3,
            "epoch": [0, 1, 2],
            "status": ["ok"] * 3,
            "launcher": ["inprocess"] * 3,
            "timed_s": [10.0] * 3,
            "cell_wall_s": [60.0] * 3,
            **{c: [1.0] * 3 for c in ("startup_s", "startup_launch_s", "teardown_s")},
            **{c: [0.0] * 3 for c in ("startup_rendezvous_s", "startup_setup_s")},
        }
    )
    text = report.startup_markdown(report.counted_rows(runs), runs)
    assert "Timed training is 50% of the cells' wall time" in text


def _spawn_in_two_precisions(runs: pd.DataFrame) -> pd.DataFrame:
    """The reference's runs with ddp_spawn's rows as two cases, `[fp32]` and `[bf16]`."""
    spawn = runs[runs["strategy"] == "ddp_spawn"]
    return pd.concat(
        [
            runs[runs["strategy"] != "ddp_spawn"],
            spawn.assign(strategy="ddp_spawn [fp32]"),
            spawn.assign(strategy="ddp_spawn [bf16]"),
        ],
        ignore_index=True,
    )


def test_every_table_lists_a_strategys_plain_setting_first(reference) -> None:
    """The summary lists `ddp_spawn [fp32]` before `ddp_spawn [bf16]` (natural_key): the
    conditions, time-split and problems tables follow the same order, not text order."""
    both = _spawn_in_two_precisions(reference.runs)
    counted = report.counted_rows(both)
    tables = {
        "conditions": report.fairness_markdown(reference, counted),
        "time split": report.breakdown_markdown(counted),
    }
    for name, text in tables.items():
        assert text.index("ddp_spawn [fp32]") < text.index("ddp_spawn [bf16]"), name
    failed = both.assign(status="failed", reason="boom")
    problems = report.problems_markdown(failed, report.summarise(report.counted_rows(failed)))
    assert problems.index("ddp_spawn [fp32]") < problems.index("ddp_spawn [bf16]")


def test_the_plots_draw_cases_in_the_tables_order(reference) -> None:
    """The bars and time splits list `ddp_spawn [fp32]` before `[bf16]`, as the tables do,
    where text order drew bf16 first beside tables that list fp32 first."""
    from matplotlib.figure import Figure

    both = _spawn_in_two_precisions(reference.runs)
    summary = report.summarise(report.counted_rows(both))
    ax = Figure().subplots()
    plots._grouped_bars(ax, summary, "samples_per_s", plots.colour_map(both["strategy"]), "{:.0f}")
    labels = [c.get_label() for c in ax.containers]
    assert labels.index("ddp_spawn [fp32]") < labels.index("ddp_spawn [bf16]"), labels
    cells = plots._cells(summary)
    assert cells.index(("ddp_spawn [fp32]", 1)) < cells.index(("ddp_spawn [bf16]", 1))


def _pick(run: report.Run) -> str:
    text = report.report_markdown(run, report.summarise(run.runs), [])
    return _section(text, "Which to pick") if "## Which to pick" in text else ""


def _lines(run: report.Run) -> dict[str, str]:
    """Which to pick's lines by what comes before their first colon."""
    return {line.split(":")[0]: line for line in _pick(run).splitlines()}


def _faster(runs: pd.DataFrame, name: str, ws: int, factor: float) -> pd.DataFrame:
    cell = (runs["strategy"] == name) & (runs["world_size"] == ws)
    runs = runs.copy()
    runs.loc[cell, "samples_per_s"] = pd.to_numeric(runs.loc[cell, "samples_per_s"]) * factor
    return runs


def test_a_run_from_before_rounds_is_not_paired_round_by_round(reference) -> None:
    """A runs.csv without `round` ran each cell's repeats back to back, so two cells' repeat
    r ran minutes apart: the ranking paired them by repeat all the same and said "paired
    round by round", which README keeps for cells that ran in the same rounds."""
    paired = report.ranking_markdown(report.summarise(reference.runs), reference.runs)
    assert "(by 95 % interval of the ratio to the fastest, paired round by round)" in paired
    old = reference.runs.assign(round=np.nan)
    assert report.per_round(old) == {}
    ranking = report.ranking_markdown(report.summarise(old), old)
    ws = [line for line in ranking.splitlines() if line.startswith("- world size")]
    assert ws and all(line.endswith("(by 95 % intervals over repeats)") for line in ws), ws
    # a round edited to text names no round either (it raised a traceback from pandas)
    assert report.per_round(reference.runs.assign(round="x")) == {}


def test_a_cell_without_an_interval_is_not_ranked_outside_noise(reference) -> None:
    """A cell whose other repeats failed has one counted repeat and no interval: the ranking
    left it out of those within noise of the fastest, as if shown slower ("no other within
    noise" where it was the only other), though nothing showed it either way."""
    runs = reference.runs.copy()
    hit = (runs["strategy"] == "model_split") & (runs["world_size"] == 2) & (runs["repeat"] > 0)
    runs.loc[hit, "status"] = "failed"
    ranking = report.ranking_markdown(report.summarise(runs), runs)
    ws2 = next(line for line in ranking.splitlines() if line.startswith("- world size 2"))
    assert "model_split" not in ws2.split("; ")[1]  # neither within noise nor behind:
    assert ws2.endswith("; model_split without an interval (fewer than 3 repeats): not told apart")
    # "Which to pick" says so too, where it listed the cell within noise without a word,
    # and names the slowest, which it left out as if within noise
    run = dataclasses.replace(reference, runs=runs)
    pick = next(line for line in _pick(run).splitlines() if line.startswith("- world size 2, w"))
    assert "model_split without an interval (fewer than 3 repeats): not told apart" in pick
    assert "model_split" not in pick.split("within noise of it: ")[1].split(";")[0]
    assert pick.endswith("; slowest model_split, 0.50x single")


def test_which_to_pick_says_a_cell_it_names_is_unstable() -> None:
    """ddp_spawn, the fastest at world size 1 of the committed MNIST reference, varies 9.8 %
    over its repeats, which the summary marks unstable: named as the leader without a word of
    it, it read as a steady one."""
    ref = REFERENCE.parent / "cpu-2core-mnist-20261126"
    if not (ref / "runs.csv").exists():
        pytest.skip(f"{ref} is not in this checkout")
    lines = _lines(report.load_run(ref))
    assert (
        "fastest ddp_spawn, 1.00x single (0.77–1.19), unstable (samples/s CV 9.8 % over "
        in (lines["- world size 1, with single's numerics (`exact`)"])
    )
    steady = lines["- world size 2, with single's numerics (`exact`)"]
    assert "slowest model_split, 0.48x single (0.44–0.53)" in steady
    assert "model_split, 0.48x single (0.44–0.53), unstable" not in steady


def test_which_to_pick_ranks_singles_numerics_apart_from_the_fastest_of_all(reference) -> None:
    """A cell with compressed gradients (fp16) made fastest of all is named as such, with its
    recipe and its accuracy beside single's, while the fastest with single's exact fp32
    numerics is named apart: the ranking alone named the fp16 cell fastest."""
    run = dataclasses.replace(reference, runs=_faster(reference.runs, "ddp_fp16_hook", 2, 3.0))
    lines = {line.split(":")[0]: line for line in _pick(run).splitlines() if line.startswith("-")}
    exact = lines["- world size 2, with single's numerics (`exact`)"]
    assert "ddp_fp16_hook" not in exact and "fastest ddp_spawn, 0.86x single (0.73–1.08)" in exact
    assert "within noise of it: ddp_torchrun" in exact and "slowest model_split" in exact
    top = lines["- world size 2, fastest of all"]
    assert "ddp_fp16_hook (`grad_fp16`)" in top and "eval accuracy" in top and "(single " in top
    # where the fastest of all trains as single does, it is not named twice
    assert "- world size 2, fastest of all" not in _pick(reference)


def test_which_to_pick_says_where_the_fastest_of_all_is_within_noise_of_singles_numerics(
    reference,
) -> None:
    """ddp_fp16_hook made 1 % faster than ddp_spawn at world size 2, well inside the noise,
    was named the fastest of all beside its accuracy cost, as if its compressed gradients
    bought speed: the line says the fastest with single's numerics is within noise of it."""
    summary = report.summarise(reference.runs).set_index(["strategy", "world_size"])
    ratio = (
        summary.loc[("ddp_spawn", 2), "samples_per_s_median"]
        / summary.loc[("ddp_fp16_hook", 2), "samples_per_s_median"]
    )
    runs = _faster(reference.runs, "ddp_fp16_hook", 2, 1.01 * ratio)
    top = _lines(dataclasses.replace(reference, runs=runs))["- world size 2, fastest of all"]
    assert "ddp_fp16_hook (`grad_fp16`)" in top
    assert "; within noise of it: ddp_spawn, with single's numerics (`exact`);" in top
    # ddp_spawn with one counted repeat: nothing shows it within noise or behind either
    hit = (runs["strategy"] == "ddp_spawn") & (runs["world_size"] == 2) & (runs["repeat"] > 0)
    runs.loc[hit, "status"] = "failed"
    top = _lines(dataclasses.replace(reference, runs=runs))["- world size 2, fastest of all"]
    assert "; ddp_spawn without an interval (fewer than 3 repeats): not told apart;" in top
    # shown faster than every exact cell (3x, as above): no such clause
    runs = _faster(reference.runs, "ddp_fp16_hook", 2, 3.0)
    top = _lines(dataclasses.replace(reference, runs=runs))["- world size 2, fastest of all"]
    assert "within noise" not in top


def test_which_to_pick_says_no_cell_beats_single_on_shared_cores_as_the_data_says(
    reference,
) -> None:
    """On 2 cores shared by 2 ranks no exact cell at world size 2 is faster than single at
    world size 1, and the section says why; a cell made faster removes the sentence."""
    said = "world size 2: no cell with single's numerics is shown faster than single"
    pick = _pick(reference)
    assert said in pick and "their ranks share the 2 thread(s) single computed with" in pick
    assert said not in _pick(
        dataclasses.replace(reference, runs=_faster(reference.runs, "zero1", 2, 3.0))
    )


def test_which_to_pick_names_the_lightest_state_and_the_departing_losses(reference) -> None:
    """FSDP holds half the model state on its heaviest rank, ZeRO-1's uneven split saves
    nothing there, and PowerSGD's loss departs from single's while the exact cells' does not."""
    pick = _pick(reference)
    state = next(t for t in pick.splitlines() if "lightest model state" in t)
    assert state.startswith("- world size 2,") and "fsdp, fsdp_zero2 (6.9 MiB" in state
    assert "saving nothing on the heaviest: zero1 (least 9.2)" in state
    loss = next(t for t in pick.splitlines() if "training loss more than 10 %" in t)
    assert "ddp_powersgd ws=1 (+32 %)" in loss and "ddp_powersgd ws=2" in loss
    assert "ddp_spawn" not in loss and "zero1" not in loss


def test_which_to_pick_gives_the_range_of_the_lightest_states_it_names_together(
    reference,
) -> None:
    """The transformer reference named fsdp (6.14 MiB) and the pipelines (6.18) together as
    the lightest, "(6.1 MiB, ...)", beside a summary that shows the pipelines at 6.2."""
    runs = reference.runs.copy()
    for name, mib in (("fsdp", 6.14), ("fsdp_zero2", 6.18)):
        runs.loc[(runs["strategy"] == name) & (runs["world_size"] == 2), "model_state_mib"] = mib
    state = next(
        t for t in _pick(dataclasses.replace(reference, runs=runs)).splitlines() if "lightest" in t
    )
    assert "fsdp, fsdp_zero2 (6.1–6.2 MiB, against up to 13.7)" in state
    # where they round alike, one figure, as before
    assert "fsdp, fsdp_zero2 (6.9 MiB, against up to 13.7)" in _pick(reference)


def test_which_to_pick_holds_with_one_cell_one_world_size_and_no_single(reference) -> None:
    runs = reference.runs
    only_single = _pick(dataclasses.replace(reference, runs=runs[runs["strategy"] == "single"]))
    assert "only single, 1.00x single" in only_single and "within noise of" not in only_single
    ws1 = _pick(dataclasses.replace(reference, runs=runs[runs["world_size"] == 1]))
    assert "world size 2" not in ws1 and "world size 1, with single's numerics" in ws1
    # no single: samples/s, not speed-ups over a baseline that is not there
    none = _pick(dataclasses.replace(reference, runs=runs[runs["strategy"] != "single"]))
    assert "samples/s" in none and "x single" not in none and "shown faster" not in none
    assert "no `single` at world size 1 to compare with" in none and "speed-up over" not in none
    assert "- world size 2, with numerics `exact`: fastest ddp_spawn, 824.0 samples/s" in none
    assert "single's" not in none
    assert "training loss more than" not in none
    failed = runs.assign(status="failed", reason="boom")
    assert _pick(dataclasses.replace(reference, runs=failed)) == ""


def test_which_to_pick_ranks_a_world_size_once_where_every_cell_trains_as_single_does(
    reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where every timed cell has single's numerics, the fastest of all is the fastest of
    those: one ranking per world size, not a second over the same rows."""
    runs = reference.runs
    exact = runs[runs["numerics"] == "exact"]
    run = dataclasses.replace(reference, runs=exact)
    summary = report.summarise(exact)
    calls = []
    leaders = report._leaders
    monkeypatch.setattr(report, "_leaders", lambda *a: calls.append(1) or leaders(*a))
    assert "world size 2, with single's numerics" in report.pick_markdown(run, summary)
    assert len(calls) == summary["world_size"].nunique()


def test_which_to_pick_is_left_out_where_it_has_nothing_to_say(reference) -> None:
    """Only oversubscribed cells and no single (--world-sizes 4 on a 2-core machine): no speed
    to rank, no state or loss to compare. The section had its heading and intro over no line."""
    runs = reference.runs
    over = runs[(runs["world_size"] == 2) & (runs["strategy"] == "ddp_spawn")]
    run = dataclasses.replace(reference, runs=over.assign(oversubscribed=1))
    assert report.pick_markdown(run, report.summarise(run.runs)) == ""
    assert "## Which to pick" not in report.report_markdown(run, report.summarise(run.runs), [])


def test_which_to_pick_of_a_run_from_before_the_numerics_column() -> None:
    """An older runs.csv has precision but no numerics: cells are told apart by precision and
    the section says so (horovod_fp16's compressed gradients cannot be seen there)."""
    old = Path(__file__).resolve().parent.parent / "results/reference/cpu-2core-mnist"
    if not (old / "runs.csv").exists():
        pytest.skip(f"{old} is not in this checkout")
    pick = _pick(report.load_run(old))
    assert "fastest of all: amp_ddp (`amp_bf16`)" in pick
    assert "predates the `numerics` column" in pick


def test_the_loss_plot_title_names_the_curves_that_depart_from_singles(reference) -> None:
    """make bench's loss plot read "coinciding curves: the strategies agree" above PowerSGD's
    curve, 32-35 % above single's: the title names the departing curves, says none departs
    where none does, and claims nothing where there is no single to compare with."""
    summary = report.summarise(reference.runs)
    title = report.figures(reference, summary)["loss.png"].axes[0].get_title()
    assert "more than 10 % off single's" in title and "agree" not in title
    assert "ddp_powersgd ws=1 (+32 %)" in title and "ddp_powersgd ws=2" in title
    assert "ddp_spawn" not in title
    counted = report.counted_rows(reference.runs)
    steps = report.counted_steps(reference.steps, counted, timed_only=False, all_epochs=True)
    exact = steps[steps["strategy"] != "ddp_powersgd"]
    gone = report.departing(report.loss_departures(exact, "single"))
    assert (
        plots.loss_curves(exact, departing=gone)
        .axes[0]
        .get_title()
        .startswith("Training loss per step (none more than 10 % off single's")
    )
    assert report.loss_departures(steps[steps["strategy"] != "single"], "single") is None
    assert plots.loss_curves(steps).axes[0].get_title() == "Training loss per step"


def test_the_loss_departures_are_worked_out_once_per_render(
    reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss plot's title and "Which to pick" name the same departing curves: one
    computation over every step of every cell serves both."""
    run = dataclasses.replace(reference)  # a Run of its own: nothing worked out yet
    summary = report.summarise(run.runs)
    calls = []
    departures = report.loss_departures
    monkeypatch.setattr(report, "loss_departures", lambda *a: calls.append(1) or departures(*a))
    title = report.figures(run, summary)["loss.png"].axes[0].get_title()
    pick = report.pick_markdown(run, summary)
    assert "ddp_powersgd ws=1 (+32 %)" in title and "ddp_powersgd ws=1 (+32 %)" in pick
    assert len(calls) == 1


def test_the_efficiency_plot_marks_as_fast_as_single_where_ranks_shared_its_cores(
    reference,
) -> None:
    """Two ranks on single's 2 cores, one thread each: a cell exactly as fast as single has
    efficiency 0.5, which the plot marks at world size 2 beside the ideal 1.0 no cell there
    can reach; where every rank had single's threads it marks nothing."""
    summary = report.summarise(reference.runs)
    ax = report.figures(reference, summary)["scaling_efficiency.png"].axes[0]
    (bar,) = [c for c in ax.collections if c.get_label().startswith("as fast as single")]
    (seg,) = bar.get_segments()
    assert list(seg[:, 1]) == [0.5, 0.5] and seg[0, 0] < 2 < seg[1, 0]
    assert "dotted: as fast as single, where the ranks shared its cores" in ax.get_title()
    counted = report.counted_rows(reference.runs)
    assert report.thread_shares(counted) == (2.0, {2: 0.5})
    assert report.thread_shares(counted.assign(threads_per_rank=2)) == (None, {})
    plain = plots.scaling_efficiency(summary, shares={}).axes[0]
    assert not plain.collections and "dotted" not in plain.get_title()


def test_as_fast_as_single_is_marked_only_where_the_ranks_split_singles_threads(
    reference,
) -> None:
    """1/N is as fast as single only where N ranks together had single's threads on one
    host: 3 cores at world size 2 (one thread each) or 2 nodes x 2 cores at world size 4
    (single on 2 threads) put the ranks at threads per rank / single's = 0.33 and 0.5, where
    a cell as fast as single is at 0.5 and 0.25: neither the plot nor the text may say so."""
    counted = report.counted_rows(reference.runs)
    single = (counted["strategy"] == "single") | (counted["world_size"] == 1)
    three = counted.assign(threads_per_rank=counted["threads_per_rank"].where(~single, 3))
    assert report.thread_shares(three) == (3.0, {})
    nodes = counted.assign(world_size=counted["world_size"].where(single, 4), nodes=2, hosts="a,b")
    nodes.loc[single, ["nodes", "hosts"]] = (1, "a")
    assert report.thread_shares(nodes) == (2.0, {})
    for rows in (three, nodes):
        text = report.shared_cores_markdown(rows)
        assert "falls short of 1" in text and "the cores single had" not in text
        summary = report.summarise(rows)
        ax = plots.scaling_efficiency(summary, shares=report.thread_shares(rows)[1]).axes[0]
        assert not ax.collections and "dotted" not in ax.get_title()
    # two ranks on one host's 2 cores, as the reference ran: marked at 1/2
    one = counted.assign(nodes=1, hosts="a")
    assert report.thread_shares(one) == (2.0, {2: 0.5})
    assert "At world size 2 the ranks split single's 2 thread(s)" in (
        report.shared_cores_markdown(one)
    )


def test_bar_values_turn_upright_only_where_they_would_run_into_each_other(reference) -> None:
    """make bench's 17 bars per world size printed their values level, one over the next;
    a few bars keep them level."""
    summary = report.summarise(reference.runs)

    def notes(rows: pd.DataFrame) -> list:
        fig = plots.throughput(rows)
        fig.draw_without_rendering()
        return [t for t in fig.axes[0].texts if t.get_text().isdigit()]

    many = notes(summary)
    assert len(many) == len(summary) and {t.get_rotation() for t in many} == {90.0}
    boxes = [t.get_window_extent() for t in many]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    few = notes(summary[summary["strategy"].isin(["single", "ddp_spawn", "fsdp"])])
    assert len(few) == 5 and {t.get_rotation() for t in few} == {0.0}


def test_bar_values_that_collide_only_in_the_final_layout_turn_upright() -> None:
    """14 bars of 5-digit values with one long name in the legend: level, the values just
    clear each other until the y label and title narrow the axes, after which they ran into
    each other in the saved PNG; fit_titles, which lays out the final figure, turns them."""
    names = [f"s{i:02d}" for i in range(13)] + ["s99" + "i" * 11]
    summary = pd.DataFrame(
        [
            {"strategy": s, "world_size": 2}
            | {f"samples_per_s_{m}": 99999.0 for m in ("median", "min", "max")}
            for s in names
        ]
    )
    fig = plots.fit_titles(plots.throughput(summary))
    fig.draw_without_rendering()
    values = [t for t in fig.axes[0].texts if t.get_text() == "99999"]
    boxes = [t.get_window_extent() for t in values]
    assert len(boxes) == 14
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_bar_values_still_colliding_upright_widen_the_figure() -> None:
    """48 strategies (every one in fp32 and bf16, with options) at two world sizes, their
    long names a legend half the figure wide: upright, the values of neighbouring bars lay
    over each other, a smear of digits; the figure widens until each fits beside the next."""
    names = [f"ddp_s{i:02d} [channels_last,acc2,bucket_cap_mb=25]" for i in range(48)]
    summary = pd.DataFrame(
        [
            {"strategy": s, "world_size": ws}
            | {f"samples_per_s_{m}": 9999.0 for m in ("median", "min", "max")}
            for s in names
            for ws in (1, 2)
        ]
    )
    fig = plots.throughput(summary)
    width = fig.get_figwidth()
    fig = plots.fit_titles(fig)
    fig.draw_without_rendering()
    values = [t for t in fig.axes[0].texts if t.get_text() == "9999"]
    assert len(values) == 96 and {t.get_rotation() for t in values} == {90.0}
    boxes = [t.get_window_extent() for t in values]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert fig.get_figwidth() > width


def test_the_per_cell_plots_are_no_wider_than_their_bars_and_notes_need(reference) -> None:
    """make bench's 28 cells made 36-inch (3,928 px) time-split and step-time PNGs, with a
    band of 5 % margin either side: now 0.75 inch a cell, the x axis ending at the bars, and
    the notes over the bars neither running into each other nor out of the axes."""
    summary = report.summarise(reference.runs)
    figs = report.figures(reference, summary)
    n = len(summary)
    for name in ("time_split.png", "step_time.png"):
        fig = plots.fit_titles(figs[name])
        assert fig.get_figwidth() <= 0.75 * n + 2, name
    ax = figs["time_split.png"].axes[0]
    assert ax.get_xlim() == (-0.6, n - 0.4)
    notes = [t for t in ax.texts if t.get_text()]
    assert len(notes) == n
    boxes = [t.get_window_extent() for t in notes]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert max(b.y1 for b in boxes) <= ax.bbox.y1


def test_compilation_is_reported_from_the_first_epochs_first_step_beside_eager() -> None:
    """torch.compile's cost lands in epoch 0's first (warm-up) step, which the summary never
    times: the report gives it beside the eager case's, and the steps that repay it. Epoch
    1's first step (no compilation) must not stand for it."""
    rows = []
    for setting, first, step in (("fp32", 400.0, 20.0), ("fp32,compile", 30_400.0, 10.0)):
        for repeat in (0, 1):
            for epoch in (0, 1):
                rows.append(
                    {
                        "strategy": "single",
                        "setting": setting,
                        "world_size": 1,
                        "repeat": repeat,
                        "epoch": epoch,
                        "status": "ok",
                        "first_step_ms": first if epoch == 0 else step,
                        "step_time_ms_p50": step,
                    }
                )
    (runs,) = report._labelled([pd.DataFrame(rows)])
    text = report.compile_markdown(runs, report.counted_rows(runs))
    row = next(line for line in text.splitlines() if line.startswith("| single [compile]"))
    # 30 s more in the first step, 10 ms saved a step after it: 3,000 steps to repay
    assert row == "| single [compile] | 1 | 30.40 | 0.40 | 10.00 | 20.00 | 3,000 steps |"
    # repaid from the cold compile, the slowest first step (repeat 1 found the cache warm);
    # a compiled step no faster never repays, however cheap its first step
    cases = (((1,), 40_400.0, 10.0, "4,000 steps"), ((0, 1), 300.0, 30.0, "never"))
    for repeats, first, step, repaid in cases:
        slow = runs.copy()
        cell = (slow["setting"] == "fp32,compile") & (slow["epoch"] == 0)
        slow.loc[cell & slow["repeat"].isin(repeats), "first_step_ms"] = first
        slow.loc[slow["setting"] == "fp32,compile", "step_time_ms_p50"] = step
        text = report.compile_markdown(slow, report.counted_rows(slow))
        row = next(line for line in text.splitlines() if line.startswith("| single [compile]"))
        assert row.split(" | ")[-1].startswith(repaid), row
    # a run without a compiled cell has no such section
    eager = runs[runs["setting"] == "fp32"]
    assert report.compile_markdown(eager, report.counted_rows(eager)) == ""


def test_compilation_repaid_only_where_the_steps_show_a_saving_beyond_noise() -> None:
    """Three rounds in which the compiled step is 25 % faster in one and slower in two: its
    median 2 ms under eager's was read as a saving, 'repaid after 15,000 steps', though the
    repeats show none. The same 2 ms in every round is a saving, repaid as before."""

    def runs(compiled: tuple[float, ...]) -> pd.DataFrame:
        rows = []
        for setting, first, steps in (
            ("fp32", 400.0, (20.0, 24.0, 16.0)),
            ("fp32,compile", 30_400.0, compiled),
        ):
            for repeat, step in enumerate(steps):
                rows.append(
                    {
                        "strategy": "single",
                        "setting": setting,
                        "world_size": 1,
                        "repeat": repeat,
                        "round": repeat,
                        "epoch": 0,
                        "status": "ok",
                        "first_step_ms": first,
                        "step_time_ms_p50": step,
                    }
                )
        return report._labelled([pd.DataFrame(rows)])[0]

    def repaid(compiled: tuple[float, ...]) -> str:
        one = runs(compiled)
        text = report.compile_markdown(one, report.counted_rows(one))
        row = next(line for line in text.splitlines() if line.startswith("| single [compile]"))
        return row.split(" | ")[-1].rstrip(" |")

    assert repaid((15.0, 26.0, 18.0)) == "not shown (steps within noise of eager's)"
    assert repaid((18.0, 22.0, 14.0)) == "15,000 steps"  # 2 ms less in every round
    # a median slower by noise alone (slower in two rounds, faster in one) was "never":
    # the repeats show no loss either; 10 % slower in every round is one
    assert repaid((22.0, 26.0, 15.0)) == "not shown (steps within noise of eager's)"
    assert repaid((22.0, 26.4, 17.6)) == "never (no faster a step)"


@pytest.mark.parametrize(
    "table, column",
    [("steps.csv", "strategy"), ("steps.csv", "warmup"), ("steps.csv", "world_size")]
    + [("ranks.csv", "strategy"), ("ranks.csv", "rank")],
)
def test_a_column_gone_from_steps_or_ranks_is_named_in_one_line(
    reference, tmp_path, capsys, table, column
) -> None:
    """A steps.csv or ranks.csv edited by hand without a column the report selects by: one
    line naming it, exit 2. Without `strategy` or `warmup` the report was written with blank
    step plots (the steps matched no cell, or none was timed) and no word why; without
    `world_size` it said the column 'is empty (row 2)'."""
    run_dir = Path(shutil.copytree(reference.path, tmp_path / "edited"))
    df = pd.read_csv(run_dir / table, dtype=str, keep_default_na=False)
    df.drop(columns=[column]).to_csv(run_dir / table, index=False)
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{run_dir / table}: not a parabench {table} (no column {column})" in err


def _swept(reference, tmp_path) -> Path:
    """A copy of the reference run whose cells of ddp_spawn ran in two settings, fp32 and
    bf16, as a --precision fp32,bf16 run writes them (the bf16 rows a copy of the fp32's)."""
    run_dir = Path(shutil.copytree(reference.path, tmp_path / "swept"))
    for name in ("runs.csv", "steps.csv", "ranks.csv"):
        df = pd.read_csv(run_dir / name, dtype=str, keep_default_na=False)
        bf16 = df[df["strategy"] == "ddp_spawn"].assign(setting="bf16")
        if "precision" in bf16:
            bf16["precision"] = "bf16"
        pd.concat([df, bf16]).to_csv(run_dir / name, index=False)
    return run_dir


@pytest.mark.parametrize("table", ["runs.csv", "steps.csv", "ranks.csv"])
def test_a_sweep_whose_setting_column_is_gone_is_refused_not_merged(
    reference, tmp_path, capsys, table
) -> None:
    """A run that swept --precision, its setting column deleted by hand: the rows of one cell
    in two settings read as one cell written twice (a resumed cell), and all but the last
    were dropped, the rest reported under the other setting's name (runs.csv); steps or ranks
    without it matched no cell. One line naming the column, exit 2."""
    run_dir = _swept(reference, tmp_path)
    if table == "runs.csv":  # as written, it renders whole (seconds: once is enough)
        assert main(["report", str(run_dir)]) == 0
    assert {"ddp_spawn [fp32]", "ddp_spawn [bf16]"} <= set(  # both settings read
        report.load_run(run_dir).runs["strategy"]
    )
    df = pd.read_csv(run_dir / table, dtype=str, keep_default_na=False)
    df.drop(columns=["setting"]).to_csv(run_dir / table, index=False)
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run_dir / table}: " in err and "column setting" in err, err


def test_a_repeat_measured_by_a_resume_is_named_in_the_summary(reference) -> None:
    """A repeat that a --resume ran (one stopped part-way, or whose row was removed to run
    it again) read in runs.csv and the report as any other, though it ran after the stop,
    apart in time from its cell's other repeats: the summary names it, by its round past
    its repeat (Runner.run), and nothing for a run whose rounds are its repeats, or a
    runs.csv from before rounds."""

    def summary(runs: pd.DataFrame) -> str:
        run = dataclasses.replace(reference, runs=runs)
        return _section(report.report_markdown(run, report.summarise(runs), []), "Summary")

    assert "--resume" not in summary(reference.runs)
    assert "--resume" not in summary(reference.runs.drop(columns="round"))
    runs = reference.runs.copy()
    hit = (runs["strategy"] == "ddp_spawn") & (runs["world_size"] == 2) & (runs["repeat"] == 1)
    assert hit.sum() == 1
    runs.loc[hit, "round"] = 1 + runs["round"].max()
    stamp = runs.loc[hit, "timestamp"].iloc[0]
    said = summary(runs)
    assert "Repeats measured by a `--resume`, after the run had stopped" in said, said
    assert f": ddp_spawn ws=2 repeat 1 (round {runs['round'].max()}, {stamp})." in said, said
    # a cell whose repeats all ran in one resume (stopped before its round 0) is apart from
    # none of its own: the line said they were apart from "their repeats before the stop"
    runs = reference.runs.copy()
    cell = (runs["strategy"] == "ddp_spawn") & (runs["world_size"] == 2)
    runs.loc[cell, "round"] = runs.loc[cell, "repeat"] + 1 + runs["round"].max()
    assert "--resume" not in summary(runs)


def test_cells_measured_while_other_processes_took_the_cpus_are_named(reference) -> None:
    """Every row records the share of the CPUs other processes used while its cell ran, but
    the report named it only beside a cell unstable over its repeats: cells that all ran
    while neighbours took most of a CPU machine (one repeat, or a steady load) ranked each
    other by what those left them, and the report's pick and ranking read as the
    strategies'. On a CPU, a cell measured so is named, with what the others took."""
    quiet = report.report_markdown(reference, report.summarise(reference.runs), [])
    assert "other processes used" not in quiet  # the reference's cells: under 7 %
    runs = reference.runs.copy()
    ddp = (runs["strategy"] == "ddp_spawn") & (runs["world_size"] == 2)
    runs.loc[ddp, "other_cpu_pct"] = [12.0, 68.5, 40.0]
    busy = dataclasses.replace(reference, runs=runs)
    summary = report.summarise(runs)
    line = (
        "measured while other processes used 20 % of the CPUs or more: ddp_spawn ws=2 "
        "(at most 68.5 %)"
    )
    assert f"\n- {line}" in report.ranking_markdown(summary, runs)
    assert f"\n- {line}" in _pick(busy)
    loaded = runs.assign(other_cpu_pct=55.0)
    assert "20 % of the CPUs or more: every cell (at most 55.0 %)" in report.ranking_markdown(
        report.summarise(loaded), loaded
    )
    # on a GPU the steps compute on the device: the host's neighbours are not named
    gpu = runs.assign(device="cuda")
    assert "other processes used" not in report.ranking_markdown(summary, gpu)


#: a process that holds the run's lock (argv[1]) as a parabench running it does, until its
#: stdin closes
_HOLDS = (
    "import fcntl, os, sys\n"
    "f = open(sys.argv[1], 'a+')\n"
    "fcntl.flock(f, fcntl.LOCK_EX)\n"
    "f.truncate(0); f.write(f'{os.getpid()}\\n'); f.flush()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_a_run_still_going_is_reported_as_going_not_stopped(
    tmp_path, data_root, capsys, monkeypatch
) -> None:
    """`parabench report` (or `compare`) in a second terminal while the run is going said
    "the run is still going, or it stopped; to finish it, parabench run --resume DIR", and
    that --resume is refused while the run holds its lock. Where a parabench holds it, the
    report says the run is going, by its pid, and offers no --resume; once it has let go,
    the --resume."""
    import subprocess
    import sys

    from bench.harness import runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, going, _ = runner.open_run(cfg.replace(run_id="going"), None)
    going.unlock()
    # another process holds it as a parabench running it does (this one's own hold is `run`
    # writing the report of the run it ended: not one going)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDS, str(going.path / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        text = report.render(going.path).read_text()
        assert "**Incomplete: 1 of 1 planned cells have no row yet (single ws=1 " in text
        said = f"the run is still going (parabench pid {holder.pid} holds it); these are its"
        assert said in text, text[:600]
        assert "--resume" not in text and "it stopped" not in text
        assert main(["compare", str(going.path), str(going.path), "--no-stats"]) == 0
        out = capsys.readouterr().out
        assert said in out and "--resume" not in out, out
    finally:
        holder.communicate(timeout=30)  # its stdin closed: it ends, and lets go
    text = report.render(going.path).read_text()
    assert f"it stopped; to finish it, parabench run --resume {going.path}.**" in text
    # report.md, read elsewhere, names parabench plainly; the terminal as it was called
    # (README's .venv/bin/parabench)
    from bench.analysis import compare
    from bench.harness import results

    for module in (results, compare):
        monkeypatch.setattr(module, "program", lambda: ".venv/bin/parabench")
    text = report.render(going.path).read_text()
    assert f"it stopped; to finish it, parabench run --resume {going.path}.**" in text
    assert main(["compare", str(going.path), str(going.path), "--no-stats"]) == 0
    assert f"to finish it, .venv/bin/parabench run --resume {going.path}" in capsys.readouterr().out
    # a verify's run (its weights kept): its resume would give no verdict, as status says
    config = json.loads((going.path / "config.json").read_text())
    (going.path / "config.json").write_text(json.dumps({**config, "save_params": True}))
    text = report.render(going.path).read_text()
    assert "--resume " not in text and "run the same verify again" in text


def test_growth_on_a_cpu_says_what_of_it_malloc_held_free():
    """A CPU rank's resident set climbs where malloc keeps freed memory in fragmented
    arenas: the report called every growth a leak of tensors. Where malloc held most of it
    free it says so, and a growth it did not hold is memory in use; a GPU's rows (no such
    figure) keep the table they had."""
    rows = pd.DataFrame(
        {
            "strategy": ["model_split", "test_leaky", "single"],
            "world_size": [2, 1, 1],
            "repeat": [0, 0, 0],
            "held_growth_mib": [351.0, 200.0, 1.0],
            "peak_mem_mib": [1446.0, 900.0, 800.0],
            "malloc_free_growth_mib": [420.0, 3.0, 0.0],
        }
    )
    text = report.growth_markdown(rows)
    table = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    assert "malloc free grew (MiB)" in text and "single" not in table
    assert table["model_split"].endswith("| 420 | malloc's free memory |")
    assert table["test_leaky"].endswith("| 3 | memory in use |")
    gpu = report.growth_markdown(rows.drop(columns="malloc_free_growth_mib"))
    assert "malloc" not in gpu and "| model_split | 2 | 0 | 351 | 1,446 |" in gpu


def test_a_cpu_ranks_memory_is_said_to_leave_out_its_loader_workers():
    """A rank's peak resident set is its own process's: with --workers on a CPU the report
    read as if it held the loader too. Said where a CPU cell had workers, not elsewhere."""
    rows = pd.DataFrame(
        {"mem_source": ["host_rss", "host_rss", "cuda_allocator"], "loader_workers": [0, 2, 4]}
    )
    assert "DataLoader workers" in report.loader_workers_note(rows)
    assert report.loader_workers_note(rows.iloc[[0, 2]]) == ""


def test_a_cpu_peak_much_of_it_free_in_malloc_is_said_to_be():
    """FSDP's rank at the peak on a CPU (lm base, world size 2) ended its steps with 1,334
    of its 2,711 MiB resident free in malloc (its gathered blocks, freed, kept for the next
    step), ddp_torchrun's 36 of 2,265: the report read FSDP as needing more memory than DDP
    with nothing said. It names such cells, not the others, nor a GPU's."""
    summary = pd.DataFrame(
        {
            "strategy": ["fsdp", "ddp_torchrun", "fsdp"],
            "world_size": [2, 2, 4],
            "mem_source": ["host_rss", "host_rss", "cuda_allocator"],
            "peak_mem_mib_median": [2711.0, 2265.0, 9000.0],
            "malloc_free_mib_median": [1334.0, 36.0, math.nan],
        }
    )
    text = report.malloc_free_note(summary)
    assert text.endswith("fsdp at world size 2, 1,334 of 2,711 MiB.") and "ddp" not in text
    assert report.malloc_free_note(summary.iloc[[1, 2]]) == ""
    assert report.malloc_free_note(summary.drop(columns="malloc_free_mib_median")) == ""


@pytest.mark.parametrize(
    "text, says",
    [
        ("strategy,status\nddp,failed\n", "no column repeat, world_size"),
        (
            "attempt,strategy,world_size,setting,repeat,status\n1,ddp,two,fp32,0,failed\n",
            "column world_size holds 'two', not a whole number (row 2)",
        ),
        ("attempt,strategy,world_size\n1,ddp,2,9,9\n", "more fields than its header"),
    ],
)
def test_a_damaged_retried_runs_csv_is_said_in_the_report_not_its_end(tmp_path, text, says) -> None:
    """retried/runs.csv holds the earlier attempts of retried cells, none of which the report
    ranks: one damaged (edited, cut short) stopped every command that reads the run (report,
    compare, predict), the report with a traceback; now the run is read, and the report's
    section on retried cells names the file and what is wrong with it. An attempt number or
    folder missing reads as –, not nan."""
    run_dir = tmp_path / "run"
    (run_dir / "retried").mkdir(parents=True)
    shutil.copy(REFERENCE / "runs.csv", run_dir / "runs.csv")
    (run_dir / "retried" / "runs.csv").write_text(text)
    run = report.load_run(run_dir)  # as report, compare and predict read it
    assert run.retried.empty
    text = report.retried_markdown(run)  # the report's section (it raised)
    assert str(run_dir / "retried" / "runs.csv") in text and says in text, text[-600:]

    (run_dir / "retried" / "runs.csv").write_text(
        "attempt,strategy,world_size,setting,repeat,status,reason\n,ddp,2,fp32,0,oom,\n"
    )
    text = report.retried_markdown(report.load_run(run_dir))
    assert "| ddp | 2 | r0 | – | oom: – | no row yet | – |" in text
