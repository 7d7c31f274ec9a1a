"""The model-state and option-sweep plots on small hand-made tables (no runs, no processes)."""

from __future__ import annotations

import math
import warnings
from itertools import pairwise

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from bench.analysis import plots

PARTS = ["param_mib", "grad_mib", "optim_mib"]


def _ranks(cells: dict[tuple[str, int], list[tuple[float, float, float]]], repeats=(0,)):
    rows = [
        {
            "strategy": name,
            "world_size": ws,
            "repeat": rep,
            "rank": r,
            **dict(zip(PARTS, state, strict=True)),
        }
        for (name, ws), per_rank in cells.items()
        for rep in repeats
        for r, state in enumerate(per_rank)
    ]
    return pd.DataFrame(rows)


def _stacks(fig: Figure) -> list[list[Rectangle]]:
    """The bar parts of each bar, left to right, each bar's parts bottom to top."""
    ax = fig.axes[0]
    bars: dict[float, list[Rectangle]] = {}
    for p in ax.patches:
        if isinstance(p, Rectangle):
            bars.setdefault(round(p.get_x() + p.get_width() / 2, 6), []).append(p)
    return [sorted(bars[x], key=lambda p: p.get_y()) for x in sorted(bars)]


def _bar_names(fig: Figure) -> list[str]:
    """'<group label> <rank label>' per bar, left to right, from the tick labels."""
    ax = fig.axes[0]
    ranks = [
        (t, lab.get_text())
        for t, lab in zip(ax.get_xticks(minor=True), ax.get_xticklabels(minor=True), strict=True)
    ]
    groups = [
        (t, lab.get_text()) for t, lab in zip(ax.get_xticks(), ax.get_xticklabels(), strict=True)
    ]
    out = []
    for x, rank in sorted(ranks):
        group = min(groups, key=lambda g: abs(g[0] - x))[1]
        out.append(f"{group.replace(chr(10), ' ')} {rank}")
    return out


# ---------------------------------------------------------------- model_state


def test_model_state_draws_a_stack_per_rank_with_the_given_heights() -> None:
    cells = {
        ("ddp_torchrun", 2): [(4.5, 4.5, 9.0), (4.5, 4.5, 9.0)],
        ("fsdp", 2): [(2.25, 2.25, 4.5), (2.25, 2.25, 4.5)],
        ("single", 1): [(4.5, 4.5, 9.0)],
    }
    fig = plots.model_state(_ranks(cells))
    ax = fig.axes[0]
    stacks = _stacks(fig)
    assert _bar_names(fig) == [
        "ddp_torchrun ws=2 r0",
        "ddp_torchrun ws=2 r1",
        "fsdp ws=2 r0",
        "fsdp ws=2 r1",
        "single ws=1 r0",
    ]
    expected = [s for key in sorted(cells) for s in cells[key]]
    assert len(stacks) == len(expected) == 5
    for bar, want in zip(stacks, expected, strict=True):
        # params at the bottom, then grads, then optimizer state, each on top of the last
        assert [p.get_height() for p in bar] == pytest.approx(list(want))
        assert [p.get_y() for p in bar] == pytest.approx([0, want[0], want[0] + want[1]])
    totals = [t.get_text() for t in ax.texts]
    assert totals == [f"{sum(s):.1f}" for s in expected]
    # FSDP's ranks hold half of DDP's state at world size 2
    assert sum(p.get_height() for p in stacks[2]) == pytest.approx(
        sum(p.get_height() for p in stacks[0]) / 2
    )
    assert ax.get_ylabel() == "model state held per rank (MiB)"
    assert ax.get_title() == (
        "Model state per rank: parameters, gradients, optimizer state (after training)"
    )


def test_model_state_colours_strategies_and_tells_the_parts_apart() -> None:
    cells = {("ddp", 2): [(1, 1, 2)] * 2, ("fsdp", 2): [(0.5, 0.5, 1)] * 2}
    colours = plots.colour_map(["ddp", "fsdp", "zero1"])
    fig = plots.model_state(_ranks(cells), colours)
    stacks = _stacks(fig)
    for bar, name in zip(stacks, ["ddp", "ddp", "fsdp", "fsdp"], strict=True):
        assert all(p.get_facecolor()[:3] == pytest.approx(colours[name][:3]) for p in bar)
        params, grads, optim = bar
        # solid params; lighter grads; optimizer state lighter still and hatched
        assert params.get_alpha() > grads.get_alpha() > optim.get_alpha()
        assert not params.get_hatch() and not grads.get_hatch() and optim.get_hatch()
    labels = plots.legend_labels(fig)
    assert labels[:3] == ["parameters (solid)", "gradients (lighter)", "optimizer state (hatched)"]
    assert labels[3:] == ["ddp", "fsdp"]


def test_model_state_keeps_uneven_ranks_uneven() -> None:
    # ZeRO-1: rank 0 holds the optimizer state of most parameters, rank 1 of a few
    cells = {("zero1", 2): [(4.5, 4.5, 9.0), (4.5, 4.5, 0.15)]}
    fig = plots.model_state(_ranks(cells, repeats=(0, 1)))
    (r0, r1) = _stacks(fig)
    assert r0[2].get_height() == pytest.approx(9.0)
    assert r1[2].get_height() == pytest.approx(0.15)
    assert [t.get_text() for t in fig.axes[0].texts] == ["18.0", "9.2"]


def test_model_state_takes_the_median_over_repeats() -> None:
    rows = _ranks({("ddp", 1): [(1.0, 2.0, 3.0)]}, repeats=(0, 1, 2))
    # repeat 2 is an outlier: the median ignores it, a mean would not
    rows.loc[rows["repeat"] == 1, PARTS] = [[2.0, 3.0, 4.0]]
    rows.loc[rows["repeat"] == 2, PARTS] = [[100.0, 100.0, 100.0]]
    (bar,) = _stacks(plots.model_state(rows))
    assert [p.get_height() for p in bar] == pytest.approx([2.0, 3.0, 4.0])


def test_model_state_leaves_out_rows_without_figures() -> None:
    rows = _ranks({("ddp", 2): [(1, 1, 2)] * 2, ("old", 2): [(1, 1, 2)] * 2})
    rows.loc[rows["strategy"] == "old", PARTS] = math.nan
    fig = plots.model_state(rows)
    assert _bar_names(fig) == ["ddp ws=2 r0", "ddp ws=2 r1"]
    assert "old" not in plots.legend_labels(fig)


def test_model_state_wraps_a_wide_matrix_onto_rows_of_one_scale() -> None:
    """Twenty strategies at world sizes 1 and 2 (60 bars): the groups wrap onto rows of at
    most STATE_ROW_SLOTS bars and gaps, every bar drawn once, in order, a group never split,
    every row on one y scale and one x span (one bar width)."""
    cells = {(f"s{i:02d}", ws): [(1.0, 1.0, float(i))] * ws for i in range(20) for ws in (1, 2)}
    fig = plots.model_state(_ranks(cells))
    axes = fig.axes
    assert len(axes) >= 2
    drawn = []
    for ax in axes:
        bars = [p for p in ax.patches if isinstance(p, Rectangle)]
        groups = [lab.get_text().split("\n")[0] for lab in ax.get_xticklabels()]
        assert len(bars) // 3 + len(groups) <= plots.STATE_ROW_SLOTS
        assert ax.get_xlim() == axes[0].get_xlim() and ax.get_ylim() == axes[0].get_ylim()
        drawn += [t.get_text() for t in ax.texts]
    assert drawn == [f"{2 + i:.1f}" for i in range(20) for ws in (1, 2) for _ in range(ws)]
    assert fig.get_size_inches()[0] < 20  # not a third of an inch times 60 bars and gaps


@pytest.mark.parametrize(
    "ranks",
    [
        pd.DataFrame(columns=["strategy", "world_size", "repeat", "rank", *PARTS]),
        _ranks({("ddp", 2): [(1, 1, 2)] * 2}).drop(columns=PARTS),
        _ranks({("ddp", 2): [(1, 1, 2)] * 2}).assign(
            param_mib=math.nan, grad_mib=math.nan, optim_mib=math.nan
        ),
    ],
    ids=["no rows", "no columns", "all NaN"],
)
def test_model_state_without_figures_says_so(ranks: pd.DataFrame) -> None:
    fig = plots.model_state(ranks)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["no model-state figures to show"]
    assert not ax.patches
    assert ax.get_title().startswith("Model state per rank")


# ---------------------------------------------------------------- option_sweep


def _summary(rows: list[tuple[str, str, int, float]]) -> pd.DataFrame:
    """(strategy_name, setting, world_size, median) -> summary rows; min/max = median -+ 5."""
    return pd.DataFrame(
        [
            {
                "strategy": f"{name} [{setting}]",
                "strategy_name": name,
                "setting": setting,
                "world_size": ws,
                "samples_per_s_median": med,
                "samples_per_s_min": med - 5,
                "samples_per_s_max": med + 5,
            }
            for name, setting, ws, med in rows
        ]
    )


def _lines(ax) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            line = c.lines[0]
            out[c.get_label()] = (
                np.asarray(line.get_xdata(), float),
                np.asarray(line.get_ydata(), float),
            )
    return out


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [("ddp", "fp32", 2, 100.0), ("ddp", "bf16", 2, 120.0), ("fsdp", "fp32", 2, 90.0)],
        # one value per strategy: a fixed option, even if two strategies differ
        [("ddp", "fp32,bucket_cap_mb=25", 2, 100.0), ("ddp2", "fp32,bucket_cap_mb=5", 2, 90.0)],
        # more than one value, but not numbers
        [("ddp", "fp32,hook=fp16", 2, 100.0), ("ddp", "fp32,hook=bf16", 2, 101.0)],
    ],
    ids=["empty", "no options", "one value each", "not numeric"],
)
def test_option_sweep_is_none_when_nothing_is_swept(rows) -> None:
    summary = (
        _summary(rows)
        if rows
        else pd.DataFrame(columns=["strategy", "strategy_name", "setting", "world_size"])
    )
    assert plots.option_sweep(summary) is None


def test_option_sweep_draws_a_line_per_strategy_and_world_size() -> None:
    rows = [
        ("ddp_torchrun", f"fp32,bucket_cap_mb={b}", ws, 100.0 * ws + b)
        for b in (25, 1, 100, 5)  # out of order on purpose
        for ws in (2, 4)
    ]
    rows += [("ddp_spawn", f"fp32,bucket_cap_mb={b}", 2, 50.0 + b) for b in (5, 25)]
    rows += [("single", "fp32", 1, 80.0)]  # no option: not in the sweep
    fig = plots.option_sweep(_summary(rows))
    assert fig is not None and len(fig.axes) == 1
    ax = fig.axes[0]
    lines = _lines(ax)
    assert sorted(lines) == ["ddp_spawn ws=2", "ddp_torchrun ws=2", "ddp_torchrun ws=4"]
    x, y = lines["ddp_torchrun ws=4"]
    assert x.tolist() == [1, 5, 25, 100]
    assert y.tolist() == [401, 405, 425, 500]
    assert lines["ddp_spawn ws=2"][0].tolist() == [5, 25]
    assert lines["ddp_spawn ws=2"][1].tolist() == [55, 75]
    # error bars span min..max
    (bars,) = [c for c in ax.containers if c.get_label() == "ddp_spawn ws=2"][0].lines[2]
    ends = np.concatenate([seg[:, 1] for seg in bars.get_segments()])
    assert sorted(ends.tolist()) == [50, 60, 70, 80]
    assert ax.get_xscale() == "log"  # 1 to 100
    assert ax.get_xlabel() == "bucket_cap_mb"
    assert ax.get_ylabel() == "samples/s (median over repeats)"
    assert ax.get_title() == f"Sweep of bucket_cap_mb: throughput ({plots.ERROR_BARS})"
    assert "ddp_torchrun ws=2" in plots.legend_labels(fig)


def test_error_bars_are_the_95_percent_interval_where_there_is_one() -> None:
    summary = _summary([("ddp", "fp32", 2, 100.0), ("fsdp", "fp32", 2, 90.0)])
    # ddp has an interval (3+ repeats); fsdp's is nan (fewer): min to max
    summary["samples_per_s_ci_low"] = [97.0, np.nan]
    summary["samples_per_s_ci_high"] = [104.0, np.nan]
    ax = plots.throughput(summary).axes[0]
    spans = {}
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            (segs,) = c.lines[2]
            spans[round(float(segs.get_segments()[0][0, 0]), 3)] = sorted(
                segs.get_segments()[0][:, 1].tolist()
            )
    assert sorted(spans.values()) == [[85.0, 95.0], [97.0, 104.0]]
    assert plots.ERROR_BARS in ax.get_title()


def test_a_cell_of_one_repeat_gets_no_error_bar() -> None:
    """One repeat has no spread: a bar of width 0 with its caps reads as a spread measured
    to be none (README: no interval is invented); two repeats span min to max."""
    summary = _summary([("ddp", "fp32", 2, 100.0), ("fsdp", "fp32", 2, 90.0)])
    summary["n_repeats"] = [1, 2]
    summary.loc[0, ["samples_per_s_min", "samples_per_s_max"]] = 100.0
    ax = plots.throughput(summary).axes[0]
    spans, caps = [], 0
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            (segs,) = c.lines[2]
            spans += [sorted(seg[:, 1].tolist()) for seg in segs.get_segments() if len(seg)]
            caps += sum(np.isfinite(np.asarray(cap.get_ydata(), float)).sum() for cap in c.lines[1])
    assert spans == [[85.0, 95.0]] and caps == 2


def test_option_sweep_colours_by_strategy_and_styles_by_world_size() -> None:
    rows = [
        (name, f"fp32,bucket_cap_mb={b}", ws, 100.0)
        for name in ("ddp_spawn", "ddp_torchrun")
        for b in (10, 20)
        for ws in (2, 4)
    ]
    colours = plots.colour_map(["ddp_spawn", "ddp_torchrun", "single"])
    ax = plots.option_sweep(_summary(rows), colours).axes[0]
    drawn = {c.get_label(): c.lines[0] for c in ax.containers}
    for label, line in drawn.items():
        name, ws = label.split(" ws=")
        assert line.get_color()[:3] == pytest.approx(colours[name][:3])
        assert line.get_linestyle() == ("-" if ws == "2" else "--")
    assert ax.get_xscale() == "linear"  # 10 to 20: no need for a log axis


def test_a_swept_strategy_takes_a_colour_of_its_own_cases_not_another_strategys() -> None:
    """The transformer reference swept microbatches: no strategy had a bare name, and the
    sweep coloured them from a palette of its own, where pipeline_interleaved's line was the
    brown the throughput plot gave pipeline_gpipe [microbatches=8]. Each line now has the
    colour the report's other plots gave its strategy's first case."""
    rows = [
        (name, f"fp32,microbatches={m}", 2, 100.0)
        for name in ("pipeline_1f1b", "pipeline_gpipe", "pipeline_interleaved")
        for m in (1, 2, 4, 8)
    ]
    rows += [("single", "fp32", 1, 80.0), ("tp", "fp32", 2, 50.0)]
    summary = _summary(rows)
    summary.loc[summary["setting"] == "fp32", "strategy"] = summary["strategy_name"]
    colours = plots.colour_map(summary["strategy"])  # as report.figures gives every plot
    drawn = {
        c.get_label(): to_rgba(c.lines[0].get_color())
        for c in plots.option_sweep(summary, colours).axes[0].containers
    }
    assert set(drawn) == {
        f"{n} ws=2" for n in ("pipeline_1f1b", "pipeline_gpipe", "pipeline_interleaved")
    }
    for label, colour in drawn.items():
        name = label.removesuffix(" ws=2")
        assert colour == to_rgba(colours[f"{name} [fp32,microbatches=1]"]), name


def test_option_sweep_keeps_other_settings_apart() -> None:
    rows = [
        ("ddp", f"{prec},bucket_cap_mb={b}", 2, med + b)
        for prec, med in (("fp32", 100.0), ("bf16", 150.0))
        for b in (1, 4)
    ]
    lines = _lines(plots.option_sweep(_summary(rows)).axes[0])
    assert lines.keys() == {"ddp ws=2 [fp32]", "ddp ws=2 [bf16]"}
    assert lines["ddp ws=2 [bf16]"][1].tolist() == [151, 154]
    assert lines["ddp ws=2 [fp32]"][1].tolist() == [101, 104]


def test_option_sweep_has_a_subplot_per_swept_key() -> None:
    rows = [("ddp", f"fp32,bucket_cap_mb={b}", 2, 100.0 + b) for b in (1, 25)]
    rows += [("ddp_powersgd", f"fp32,rank={r}", 2, 200.0 + r) for r in (1, 2, 4)]
    rows += [("ddp", "fp32,bucket_cap_mb=5,rank=3", 2, 0.0)]  # lone rank value for ddp
    fig = plots.option_sweep(_summary(rows))
    assert [ax.get_title() for ax in fig.axes] == [
        f"Sweep of bucket_cap_mb: throughput ({plots.ERROR_BARS})",
        f"Sweep of rank: throughput ({plots.ERROR_BARS})",
    ]
    bucket, rank = fig.axes
    assert bucket.get_xlabel() == "bucket_cap_mb" and rank.get_xlabel() == "rank"
    assert rank.get_xscale() == "linear"  # 1 to 4
    assert {k: v[0].tolist() for k, v in _lines(rank).items()} == {"ddp_powersgd ws=2": [1, 2, 4]}
    # ddp's bucket sweep: one line per rest of the setting ("fp32" and "fp32,rank=3")
    assert sorted(x.tolist() for x, _ in _lines(bucket).values()) == [[1, 25], [5]]
    # stacked vertically
    assert bucket.get_position().y0 > rank.get_position().y0


def _title_boxes(fig: Figure) -> list[tuple[float, float, float]]:
    """(left, right, figure width) in pixels of each titled axes' title, as laid out."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    return [
        (box.x0, box.x1, fig.bbox.width)
        for ax in fig.axes
        if ax.get_title()
        for box in [ax.title.get_window_extent(renderer)]
    ]


def test_a_long_title_on_a_narrow_figure_is_wrapped_to_fit_it() -> None:
    """A legend of long labels outside the axes narrows them; the title, centred on the
    axes, then ran past the figure's left edge (cut off in the PNG): fit_titles wraps it."""
    rest = "fp32,channels_last=1,compile=max-autotune,accumulate=4,layout=ddp-over-everything"
    rows = [("ddp_torchrun", f"{rest},bucket_cap_mb={b}", 2, 100.0 + b) for b in (1, 25)]
    rows += [("ddp_torchrun", f"bf16,bucket_cap_mb={b}", 2, 90.0 + b) for b in (1, 25)]
    fig = plots.option_sweep(_summary(rows))
    title = fig.axes[0].get_title()
    (before,) = _title_boxes(fig)
    assert before[0] < 0 or before[1] > before[2], "the case should clip without the fix"
    plots.fit_titles(fig)
    ((left, right, width),) = _title_boxes(fig)
    assert 0 <= left and right <= width
    assert "\n" in fig.axes[0].get_title()
    assert " ".join(fig.axes[0].get_title().split()) == title  # wrapped, not cut


def test_fit_titles_leaves_a_title_that_fits_alone() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    fig.add_subplot().set_title(title := "Throughput\n(two lines of my own)")
    (box,) = _title_boxes(fig)
    assert 0 <= box[0] and box[1] <= box[2]
    assert plots.fit_titles(fig).axes[0].get_title() == title


def _tick_boxes(fig: Figure) -> list[tuple[float, float]]:
    """(left, right) in pixels of the first axes' x tick labels, as laid out, left to right."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]
    return sorted((b.x0, b.x1) for b in (t.get_window_extent(renderer) for t in labels))


def test_tick_labels_that_run_into_each_other_are_slanted() -> None:
    """Six cells of a precision sweep: the legend outside narrows the bars, and the names
    under them ran into each other (unreadable in the PNG): fit_titles slants them."""
    cells = [(f"ddp_spawn [{p}]", ws) for p in ("bf16", "fp32") for ws in (1, 2)]
    cells += [("single [bf16]", 1), ("single [fp32]", 1)]
    rows = pd.DataFrame(
        [
            {"strategy": s, "world_size": ws, "step_time_ms_mean": 10.0}
            | {col: 2.0 for col in plots.STEP_PARTS}
            for s, ws in cells
        ]
    )
    fig = plots.time_parts(rows)
    before = _tick_boxes(fig)
    assert any(b[0] < a[1] for a, b in pairwise(before)), "the case should overlap"
    plots.fit_titles(fig)
    assert all(t.get_rotation() for t in fig.axes[0].get_xticklabels())
    after = _tick_boxes(fig)
    assert len(after) == len(cells) and after[-1][1] <= fig.bbox.width


def test_time_parts_names_a_pipeline_that_has_no_forward_part() -> None:
    """A pipeline's schedule laps forward and backward as one (forward 0): its strategy
    was drawn but missing from the legend, which named only strategies with a forward."""
    parts = {col: 2.0 for col in plots.STEP_PARTS}
    rows = pd.DataFrame(
        [
            {"strategy": "ddp_spawn", "world_size": 2, "step_time_ms_mean": 12.0} | parts,
            {"strategy": "pipeline_gpipe", "world_size": 2, "step_time_ms_mean": 10.0}
            | parts
            | {"part_forward_ms": 0.0, "part_comm_exposed_ms": math.nan},
        ]
    )
    fig = plots.time_parts(rows)
    labels = plots.legend_labels(fig)
    assert labels[:2] == ["ddp_spawn", "pipeline_gpipe"]
    # each key in its strategy's full colour: the pipeline's took its pale backward's alpha
    keys = fig.axes[0].get_legend().legend_handles[:2]
    for key, name in zip(keys, labels[:2], strict=True):
        (bar, *_) = (c for c in fig.axes[0].containers if c.get_label().startswith(f"_{name} "))
        assert key.get_facecolor() == (*bar[0].get_facecolor()[:3], 1.0), name


def test_time_parts_draws_a_pipeline_whose_forward_is_empty() -> None:
    """runs.csv leaves a pipeline's forward part empty (lapped inside its backward), where
    it had written 0: the plot kept only rows with a forward part and dropped the
    pipeline's bar, its measured backward, optimizer and data wait with it."""
    parts = {col: 2.0 for col in plots.STEP_PARTS}
    rows = pd.DataFrame(
        [
            {"strategy": "ddp_spawn", "world_size": 2} | parts,
            {"strategy": "pipeline_gpipe", "world_size": 2}
            | parts
            | {"part_forward_ms": math.nan, "part_comm_exposed_ms": math.nan},
            # a row not lapped (a run from before the laps beside it): left out
            {"strategy": "ddp_torchrun", "world_size": 2}
            | dict.fromkeys(plots.STEP_PARTS, math.nan),
        ]
    )
    fig = plots.time_parts(rows)
    ticks = [t.get_text().split("\n")[0] for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["ddp_spawn", "pipeline_gpipe"]
    drawn = {c.get_label() for c in fig.axes[0].containers}
    assert "_pipeline_gpipe backward" in drawn and "_pipeline_gpipe forward" not in drawn


def _notes(fig: Figure) -> list[str]:
    """The words written over the bars, left to right."""
    texts = [t for t in fig.axes[0].texts if t.get_text()]
    return [t.get_text() for t in sorted(texts, key=lambda t: t.xy[0])]


def test_time_parts_says_which_communication_was_not_measured() -> None:
    """Over a pipeline's bar the plot said "comm not measured" beside a table whose comm
    total (the profiler's) it had measured: only the exposed part, an ablation's, is not."""
    parts = {col: 2.0 for col in plots.STEP_PARTS}
    rows = pd.DataFrame(
        [
            {"strategy": "ddp_spawn", "world_size": 2, "step_time_ms_mean": 12.0} | parts,
            {"strategy": "pipeline_gpipe", "world_size": 2, "step_time_ms_mean": 10.0}
            | parts
            | {"part_comm_exposed_ms": math.nan, "comm_total_ms": 4.0},
        ]
    )
    ddp, pipe = _notes(plots.time_parts(rows))
    assert ddp == "17% comm\nexposed"
    assert pipe == "exposed\ncomm not\nmeasured"


def test_time_parts_says_the_exposed_share_of_the_step_its_parts_split() -> None:
    """On a GPU the parts split the mean of the lapped steps (at least 20 ms apart, each
    carrying its laps' cost), here 2.0 ms against 1.6 for every timed step: the share over
    the bar read 25 %, the exposed part over a step the bar is not."""
    parts = {col: 0.0 for col in plots.STEP_PARTS}
    parts |= {"part_forward_ms": 0.5, "part_backward_ms": 1.0, "part_comm_exposed_ms": 0.4}
    parts |= {"part_optimizer_ms": 0.1}
    rows = pd.DataFrame([{"strategy": "ddp", "world_size": 2, "step_time_ms_mean": 1.6} | parts])
    (note,) = _notes(plots.time_parts(rows))
    assert note == "20% comm\nexposed"  # 0.4 of the bar's 2.0 ms


def test_the_loss_plots_steps_are_whole_numbers() -> None:
    """Four steps (a short run, --max-steps 4): the loss plot's step axis read 0.0, 0.5, 1.0
    ... 3.0, steps no run has; its ticks are whole steps."""
    steps = pd.DataFrame(
        [
            {"strategy": "single", "world_size": 1, "repeat": 0, "epoch": 0, "step": k}
            | {"loss": 2.0 / (k + 1)}
            for k in range(4)
        ]
    )
    ax = plots.fit_titles(plots.loss_curves(steps)).axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks == [0, 1, 2, 3]


def test_a_legend_taller_than_the_figure_makes_the_figure_taller() -> None:
    """Thirty loss curves (every strategy of make bench at two world sizes): their legend
    beside the axes ran past the figure's bottom, cut off in the PNG, with the axes
    squeezed to a strip above it; fit_titles grows the figure until the legend fits."""
    steps = pd.DataFrame(
        [
            {"strategy": f"s{i:02d}", "world_size": ws, "repeat": 0, "epoch": 0, "step": k}
            | {"loss": 2.0 / (k + 1)}
            for i in range(15)
            for ws in (1, 2)
            for k in range(10)
        ]
    )
    fig = plots.loss_curves(steps)
    height = fig.get_figheight()
    plots.fit_titles(fig)
    fig.draw_without_rendering()
    box = fig.axes[0].get_legend().get_window_extent(fig.canvas.get_renderer())
    assert fig.get_figheight() > height
    assert box.y0 >= 0 and box.y1 <= fig.bbox.height


def test_a_legend_of_long_names_leaves_the_loss_curves_their_axes() -> None:
    """Forty cells with run options in their names (every strategy in fp32 and bf16, with
    channels-last and compile): the legend beside the loss curves took half the figure's
    8 inches and left the curves 3.5 (2.7 with bucket sizes in the names); the figure grows
    wider, the legend still inside it."""
    steps = pd.DataFrame(
        [
            {"strategy": f"ddp_torchrun_{i:02d} [{p},channels_last,compile,acc4]", "world_size": ws}
            | {"repeat": 0, "epoch": 0, "step": k, "loss": 2.0 / (k + 1)}
            for i in range(10)
            for p in ("fp32", "bf16")
            for ws in (1, 2)
            for k in range(10)
        ]
    )
    fig = plots.fit_titles(plots.loss_curves(steps))
    fig.draw_without_rendering()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert ax.bbox.width >= 4.4 * fig.dpi  # inches
    assert ax.bbox.x1 <= legend.x0 and legend.x1 <= fig.bbox.width


def test_a_legend_of_thirty_strategies_leaves_the_time_split_its_axes() -> None:
    """32 strategies at two world sizes (make bench's and as many more): the legend beside
    the time split was taller than the figure, matplotlib warned "constrained_layout not
    applied" and the axes collapsed to a line under their bars' notes, in report.md's PNG
    and the notebook alike; growing the figure after that first layout came too late."""
    parts = {col: 10.0 for col in plots.STEP_PARTS}
    rows = pd.DataFrame(
        [
            {"strategy": f"strategy_{i:02d}", "world_size": ws, "step_time_ms_mean": 60.0} | parts
            for i in range(32)
            for ws in (1, 2)
        ]
    )
    fig = plots.time_parts(rows)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        plots.fit_titles(fig)
    assert not [w for w in said if "constrained_layout" in str(w.message)]
    ax = fig.axes[0]
    assert ax.bbox.height > fig.dpi  # an inch at least for the bars
    box = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert box.y0 >= 0 and box.y1 <= fig.bbox.height


def test_a_tall_note_over_the_tallest_bar_stays_inside_the_axes() -> None:
    """A pipeline's four-line note (comm not measured, its bubble) over the tallest of many
    bars ran out of the axes' top, past a fixed 12 % margin, towards the title."""
    parts = {col: 10.0 for col in plots.STEP_PARTS}
    rows = pd.DataFrame(
        [
            {"strategy": f"ddp{i:02d}", "world_size": 2, "step_time_ms_mean": 60.0} | parts
            for i in range(20)
        ]
        + [
            {"strategy": "pipeline_gpipe", "world_size": 2, "step_time_ms_mean": 120.0}
            | {col: 20.0 for col in plots.STEP_PARTS}
            | {"part_comm_exposed_ms": math.nan}
        ]
    )
    fig = plots.time_parts(rows, bubbles={("pipeline_gpipe", 2): 40.0})
    plots.fit_titles(fig)
    ax = fig.axes[0]
    (pipe,) = [t for t in ax.texts if "bubble" in t.get_text()]
    assert pipe.get_text().count("\n") == 3
    assert pipe.get_window_extent().y1 <= ax.bbox.y1


def test_option_sweep_leaves_out_oversubscribed_cells_and_names_them() -> None:
    """A sweep is a throughput plot: cells that ran more CPU ranks than cores (their speed
    not comparable, left out of the throughput and scaling plots) were drawn there as lines
    like any other, unmarked."""
    rows = [
        ("ddp", f"fp32,bucket_cap_mb={b}", ws, 100.0 * ws + b) for b in (1, 25) for ws in (2, 4)
    ]
    rows += [("fsdp", "fp32", 4, 70.0)]  # oversubscribed too, but takes no bucket_cap_mb
    summary = _summary(rows)
    summary["oversubscribed"] = (summary["world_size"] == 4).astype(int)
    ax = plots.option_sweep(summary).axes[0]
    assert sorted(_lines(ax)) == ["ddp ws=2"]
    assert "ddp [fp32,bucket_cap_mb=1] ws=4" in ax.get_xlabel().replace("\n", " ")
    assert "oversubscribed" in ax.get_xlabel() and "fsdp" not in ax.get_xlabel()


def test_time_parts_draws_the_cells_in_the_order_of_every_other_plot() -> None:
    """The stacked step plot drew its bars in text order (bf16 before fp32, a bucket of 100
    before 25) beside a summary table, loss and step-time plots in the report's case order."""
    names = [
        "ddp [fp32, bucket_cap_mb=100]",
        "ddp [fp32, bucket_cap_mb=25]",
        "ddp [bf16, bucket_cap_mb=25]",
    ]
    rows = pd.DataFrame(
        [
            {"strategy": s, "world_size": 2, "step_time_ms_mean": 12.0}
            | {col: 2.0 for col in plots.STEP_PARTS}
            for s in names
        ]
    )
    ticks = [t.get_text() for t in plots.time_parts(rows).axes[0].get_xticklabels()]
    expected = [plots._cell_label(s, 2) for s in sorted(names, key=lambda s: plots.case_key(s, 2))]
    assert ticks == expected
    assert ticks == [plots._cell_label(s, 2) for s in (names[1], names[0], names[2])]


def _memory_summary(source: str) -> pd.DataFrame:
    """ddp_spawn alone on one GPU, then two ranks sharing it (--oversubscribe): each rank has
    its own allocator, so the shared cell's peak is one rank's, below the lone rank's."""
    return pd.DataFrame(
        {
            "strategy": ["ddp_spawn", "ddp_spawn"],
            "world_size": [1, 2],
            "oversubscribed": [0, 1],
            "mem_source": [source, source],
            "n_repeats": [1, 1],
            **{f"peak_mem_mib_{s}": [157.0, 133.0] for s in ("median", "min", "max")},
        }
    )


def test_the_memory_plot_says_a_bar_of_ranks_sharing_a_gpu_is_one_ranks():
    """A bar of 133 MiB at world size 2 beside 157 at 1 reads as less memory per device;
    the GPU held about twice it: the axis says so, naming the cell."""
    label = plots.peak_memory(_memory_summary("cuda_allocator")).axes[0].get_xlabel()
    said = " ".join(label.split())
    assert "the bar is one rank's peak, and the GPU held about that times its ranks" in said
    assert said.endswith(": ddp_spawn ws=2")
    # a CPU rank's resident memory is its process's, oversubscribed or not: nothing to say
    assert plots.peak_memory(_memory_summary("host_rss")).axes[0].get_xlabel() == (
        "world size (ranks)"
    )


def test_the_memory_plots_error_bars_span_the_repeats_and_its_title_says_so():
    """Three repeats of 120, 100 and 200 MiB: the bar's error bar runs from the least to the
    most, as the report's table brackets them, and the title says so (it named no error
    bars, beside a throughput plot whose bars are a 95 % interval)."""
    summary = (
        _memory_summary("host_rss")
        .iloc[:1]
        .assign(
            n_repeats=3, peak_mem_mib_median=120.0, peak_mem_mib_min=100.0, peak_mem_mib_max=200.0
        )
    )
    ax = plots.peak_memory(summary).axes[0]
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar")]
    (segment,) = bars.errorbar.lines[2][0].get_segments()
    assert sorted(segment[:, 1]) == pytest.approx([100.0, 200.0])
    assert "error bars: min–max" in ax.get_title()


def test_the_efficiency_legend_lists_the_cases_in_the_throughput_legends_order() -> None:
    """The efficiency plot listed its lines in text order (ddp [bf16] before ddp [fp32],
    bucket_cap_mb=100 before 25), the throughput plot beside it in the report's order:
    a reader matching colours between the two met the names in another order."""
    cases = ["ddp [fp32]", "ddp [bf16]", "ddp [bucket_cap_mb=100]", "ddp [bucket_cap_mb=25]"]
    summary = pd.DataFrame(
        [
            {"strategy": s, "world_size": ws, "n_repeats": 1, "scaling_efficiency": 0.9}
            | {f"samples_per_s_{m}": 100.0 for m in ("median", "min", "max")}
            for s in cases
            for ws in (1, 2)
        ]
    )
    order = plots.legend_labels(plots.throughput(summary))
    assert order == [
        "ddp [fp32]",
        "ddp [bf16]",
        "ddp [bucket_cap_mb=25]",
        "ddp [bucket_cap_mb=100]",
    ]
    lines = plots.legend_labels(plots.scaling_efficiency(summary))
    assert lines == ["ideal (linear scaling)", *order]


def test_efficiency_over_plain_single_is_drawn_hollow_and_said_in_the_legend() -> None:
    """bf16 channels-last DDP with no single in bf16 channels-last: its efficiency is over
    plain single (the table marks it †), and the plot drew it as a like-for-like point
    beside bf16 DDP's, over single [bf16]; it is hollow, and the legend says why."""
    cells = [
        ("single [fp32]", "fp32", 1, "single [fp32]", 1.0),
        ("single [bf16]", "bf16", 1, "single [bf16]", 1.0),
        ("ddp [bf16]", "bf16", 2, "single [bf16]", 0.8),
        ("ddp [bf16,channels_last]", "bf16,channels_last", 2, "single [fp32]", 1.6),
    ]
    summary = pd.DataFrame(
        [
            {"strategy": s, "setting": st, "world_size": ws, "efficiency_over": over}
            | {"scaling_efficiency": eff, "n_repeats": 1}
            for s, st, ws, over, eff in cells
        ]
    )
    ax = plots.scaling_efficiency(summary).axes[0]
    hollow = [
        (ln.get_xdata()[0], ln.get_ydata()[0])
        for ln in ax.get_lines()
        if len(ln.get_xdata()) and ln.get_markerfacecolor() in ("white", (1.0, 1.0, 1.0, 1.0))
    ]
    assert hollow == [(2, 1.6)]
    assert "hollow: over plain single\n(none in the cell's run options)" in plots.legend_labels(
        ax.get_figure()
    )


def test_stacked_sweeps_beside_a_legend_of_long_names_widen_the_figure_once() -> None:
    """Two swept options, so two stacked axes, each with a legend of long names: each axes
    counted what the legend took from it and the figure grew by twice that, the axes far
    wider than the 4.5 inches asked for."""
    rows = [
        (f"my_plugin_strategy_{i:02d}", f"bf16,channels_last,compile,acc4,sync_bn,{k}={v}", 2, 1.0)
        for i in range(6)
        for k in ("bucket_cap_mb", "microbatches")
        for v in (1, 2)
    ]
    fig = plots.fit_titles(plots.option_sweep(_summary(rows)))
    fig.draw_without_rendering()
    widths = [ax.bbox.width / fig.dpi for ax in fig.axes]
    assert len(widths) == 2 and all(4.4 <= w <= 4.6 for w in widths), widths
