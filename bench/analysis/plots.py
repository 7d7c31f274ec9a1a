"""Comparison plots. Each function takes DataFrames and returns a matplotlib Figure.

Figures are built with the object-oriented API on an Agg canvas, never through pyplot,
so nothing depends on (or changes) the global backend: the CLI renders headless and a
notebook can display the same Figure objects. Every plot colours a strategy the same way
(`colour_map`), so a reader learns the colours once.
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.patches import Patch
from matplotlib.text import Annotation
from matplotlib.ticker import FuncFormatter, MaxNLocator, ScalarFormatter

from bench.harness.results import (
    case_key,
    case_labels,
    lapped_rows,
    natural_key,
    oversubscribed_rows,
)

Colour = tuple[float, float, float, float]
#: line style per world size, so loss curves of one strategy stay in its colour
WS_STYLES = ("-", "--", ":", "-.")
DATA_WAIT_HATCH = "///"
PIPELINE_BUBBLE_HATCH = ".."
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _palette(n: int) -> list[Colour]:
    # tab10 (tab20 past nine names) without its greys: grey is kept for reference marks
    # (the ideal line, the legend key of the stacked bars), which must not look like a strategy
    maps = [("tab10", {7})] if n <= 9 else [("tab20", {14, 15})]
    if n > 18:  # past tab20's 18: tab20b and tab20c too, where every 19th name had repeated
        # the first's colour (all strategies in fp32 and bf16: dp [bf16] in ddp's blue)
        maps += [("tab20b", set()), ("tab20c", {16, 17, 18, 19})]
    return [
        matplotlib.colormaps[name](i)
        for name, greys in maps
        for i in range(matplotlib.colormaps[name].N)
        if i not in greys
    ]


def colour_map(names: Iterable[str]) -> dict[str, Colour]:
    """A fixed colour per strategy, from the sorted names.

    Give it every strategy of the run(s), failed ones included, so that a strategy keeps
    its colour whether or not its neighbours produced results.
    """
    ordered = sorted({str(n) for n in names})
    palette = _palette(len(ordered))
    return {name: palette[i % len(palette)] for i, name in enumerate(ordered)}


def _colours(names: Iterable[str], colours: Mapping[str, Colour] | None) -> Mapping[str, Colour]:
    """The caller's colour map, or one made here when it lacks a name that must be drawn."""
    names = list(names)
    if colours is None or any(n not in colours for n in names):
        return colour_map([*names, *(colours or {})])
    return colours


def _figure(width: float = 8.0, height: float = 4.8) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


#: inches of figure per cell of a plot with a bar or box per (strategy, world size): room for
#: a note of two short lines over each bar; long tick labels are slanted (fit_titles)
CELL_INCHES = 0.75


#: the narrowest a plot's axes may be beside its legend (inches): a legend of long names
#: ("ddp_torchrun [bf16,channels_last,compile] ws=2") had left the loss curves 3 inches
AXES_INCHES = 4.5


def _cells_width(n: int) -> float:
    """The width (inches) of a figure with a bar or box for each of `n` cells."""
    return max(6.0, CELL_INCHES * n + 2)


def fit_titles(fig: Figure, pad: float = 4.0) -> Figure:
    """Wrap each axes title that runs past the figure's edge (a narrow figure whose axes a
    legend outside pushes aside: the title, centred on the axes, would be cut at the left)
    onto more lines until it fits, and slant x tick labels that run into each other (the
    same legend narrows the bars they stand under), turn the values over grouped bars
    upright where they now collide (_upright_values) and widen the figure where upright they
    still do (_widen_for_values), raise the y axis over notes on bars that the final layout
    leaves too little room (_headroom), make a figure taller where its legend beside the
    axes runs past its bottom (the layout had squeezed the axes to a strip above a legend
    cut off in the PNG), and wider where that legend's long names leave the axes narrower
    than AXES_INCHES; `pad`: pixels kept clear of the edge. Lays the figure out to measure;
    returns it."""
    _legend_room(fig, pad)
    for _ in range(4):  # wrapping makes a title taller, and the layout moves the axes
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        width = fig.bbox.width
        done = True
        narrow = 0.0  # how much narrower than AXES_INCHES the narrowest axes beside a legend is
        for ax in fig.axes:
            if _ticks_overlap(ax, renderer):
                _slant(ax)
                done = False
            elif _upright_values(ax, renderer):
                done = False  # the final layout narrowed the bars under their values
            elif _widen_for_values(fig, ax, renderer):
                done = False  # upright, they still ran into each other
            elif _headroom(ax, [t for t in ax.texts if isinstance(t, Annotation)], renderer):
                done = False  # the layout (slanted ticks) left a note too little room
            legend = ax.get_legend()
            short = pad - legend.get_window_extent(renderer).y0 if legend else 0.0
            if short > 0:  # the legend hangs from the axes' top: grow the figure below it
                fig.set_figheight(fig.get_figheight() + short / fig.dpi)
                done = False
            if legend and legend.get_window_extent(renderer).x0 >= ax.bbox.x1:
                narrow = max(narrow, AXES_INCHES * fig.dpi - ax.bbox.width)
            title = ax.title
            text = title.get_text()
            if not text:
                continue
            box = title.get_window_extent(renderer)
            if box.x0 >= pad and box.x1 <= width - pad:
                continue
            centre = (box.x0 + box.x1) / 2
            room = 2 * min(centre, width - centre) - 2 * pad
            longest = max(len(line) for line in text.split("\n"))
            chars = max(10, int(longest * room / box.width))
            wrapped = "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))
            if wrapped != text:
                title.set_text(wrapped)
                done = False
        if narrow > 1:  # the legend beside the axes: grow the figure by what it took from them
            # (once: stacked axes share the figure's width, each had counted it for itself)
            fig.set_figwidth(fig.get_figwidth() + narrow / fig.dpi)
            done = False
        if done:
            break
    return fig


def _legend_room(fig: Figure, pad: float = 4.0) -> None:
    """Make the figure as tall as its tallest legend beside the axes, and the title over
    them, before it is laid out (here, or by _renderer for the notes over bars): a legend
    taller than the figure left the constrained layout no room for the axes (30 strategies
    at two world sizes: matplotlib warned "constrained_layout not applied", the time
    split's axes collapsed to a line and its notes' headroom was measured on that line)."""
    renderer = fig.canvas.get_renderer()
    need = 0.0
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        title = ax.title.get_window_extent(renderer).height if ax.title.get_text() else 0.0
        need = max(need, legend.get_window_extent(renderer).height + title)
    need += 4 * pad  # the layout's margins
    if need > fig.bbox.height:  # and room for the axes' x axis below the legend's top
        fig.set_figheight(need / fig.dpi + 0.5)


def _cell_label(name: str, ws: int, shared: Collection[tuple[str, int]] = ()) -> str:
    """A cell's tick label; `shared`: the cells that ran more ranks than cores
    (--oversubscribe), whose times are not comparable, marked as the report's tables mark
    them (the step-time plot drew one 4x faster than single, unmarked)."""
    mark = "\n(oversubscribed)" if (name, int(ws)) in shared else ""
    return f"{name}\nws={int(ws)}{mark}"


def oversubscribed_cells(rows: pd.DataFrame) -> set[tuple[str, int]]:
    """(strategy, world size) of the runs.csv rows that ran more ranks than cores."""
    if rows.empty:
        return set()
    over = rows[oversubscribed_rows(rows)]
    return {(str(s), int(w)) for s, w in over[["strategy", "world_size"]].itertuples(index=False)}


def _cell_ticks(ax: Axes, labels: Sequence[str]) -> None:
    """Tick labels under bars, slanted when long names would run into each other."""
    crowded = len(labels) > 6 and max((len(t.split("\n")[0]) for t in labels), default=0) > 12
    ax.set_xticks(range(len(labels)), labels)
    if crowded:
        _slant(ax)


def _slant(ax: Axes) -> None:
    ax.tick_params(axis="x", labelrotation=35)
    for t in ax.get_xticklabels():
        t.set_horizontalalignment("right")
        t.set_rotation_mode("anchor")


def _ticks_overlap(ax: Axes, renderer: Any) -> bool:
    """Whether upright x tick labels of `ax`, as laid out, run into each other."""
    shown = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    if any(t.get_rotation() for t in shown):
        return False  # slanted already
    boxes = sorted((b.x0, b.x1) for b in (t.get_window_extent(renderer) for t in shown))
    return any(nxt[0] < prev[1] for prev, nxt in pairwise(boxes))


#: the gid of the values written over grouped bars, which turn upright where they collide
BAR_VALUE = "bar value"


def _upright_values(ax: Axes, renderer: Any) -> bool:
    """Turn the values over grouped bars upright where, level as laid out, they run into each
    other (many narrow bars: turned, each fits its own bar's width); whether it turned them."""
    notes = [t for t in ax.texts if t.get_gid() == BAR_VALUE and not t.get_rotation()]
    boxes = [n.get_window_extent(renderer) for n in notes]
    if not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]):
        return False
    for n in notes:
        n.set(rotation=90, fontsize=7)
    return True


def _widen_for_values(fig: Figure, ax: Axes, renderer: Any) -> bool:
    """Widen the figure where the values over grouped bars, upright already, still run into
    each other (some 50 strategies at a world size, a legend of long names taking half the
    figure: a smear of digits), until each fits beside the next; whether it widened it."""
    notes = [t for t in ax.texts if t.get_gid() == BAR_VALUE and t.get_rotation()]
    boxes = sorted((n.get_window_extent(renderer) for n in notes), key=lambda b: b.x0)
    if not any(a.overlaps(b) for a, b in pairwise(boxes)):
        return False
    step = min(b.x0 - a.x0 for a, b in pairwise(boxes))  # the nearest neighbours' spacing
    need = max(b.width for b in boxes) + 2.0
    if step <= 0 or need <= step:
        return False
    fig.set_figwidth(fig.get_figwidth() + ax.bbox.width * (need / step - 1) / fig.dpi)
    return True


def _cells(df: pd.DataFrame) -> list[tuple[str, int]]:
    keys = df[["strategy", "world_size"]].drop_duplicates()
    # the report's order of cases: each strategy's plain setting first, numbers as numbers
    cells = ((str(s), int(w)) for s, w in keys.itertuples(index=False))
    return sorted(cells, key=lambda c: case_key(*c))


def _legend_outside(ax: Axes, **kw) -> None:
    # outside the axes, so it never hides a bar or a line
    if not ax.get_legend_handles_labels()[0]:
        return  # nothing drawn (an empty plot says so in its middle)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, **kw)


#: the gid of the note an empty plot carries in its middle (nothing_drawn)
EMPTY = "nothing to show"


def _empty(ax: Axes, what: str) -> None:
    ax.text(
        0.5, 0.5, f"no {what} to show", ha="center", va="center", transform=ax.transAxes, gid=EMPTY
    )


def nothing_drawn(fig: Figure) -> str | None:
    """Why `fig` shows nothing (its note, "no timed steps to show"), or None where it draws
    something: the report leaves such a figure out and says why, where it wrote a PNG of
    empty axes."""
    notes = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == EMPTY]
    if not notes or len(notes) < len(fig.axes):
        return None
    return notes[0]


# ---------------------------------------------------------------- from summary.csv


def comparable(summary: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The summary rows whose speed can be ranked, and "<strategy> ws=<n>" for those left
    out: cells that ran more CPU ranks than cores (`oversubscribed`), for correctness only."""
    if summary.empty:
        return summary, []
    over = oversubscribed_rows(summary)
    out = _cells(summary[over])
    return summary[~over], [f"{name} ws={ws}" for name, ws in out]


def _note_left_out(ax: Axes, left_out: list[str]) -> None:
    # under the axis label, where constrained layout makes room for it; wrapped to the axes
    if left_out:
        note = "not shown, more ranks than cores (oversubscribed, not comparable): " + ", ".join(
            left_out
        )
        ax.set_xlabel(f"{ax.get_xlabel()}\n" + textwrap.fill(note, 80), fontsize=9)


def _error_bars(rows: pd.DataFrame, metric: str, med: np.ndarray) -> np.ndarray:
    """Below and above each median: its 95 % interval over repeats where the summary has
    one (3 repeats or more, bench.harness.stats), else min to max (nan, drawn as no bar,
    with one repeat); never negative (a t-interval is
    centred on the mean, which a skewed set of repeats puts beside the median)."""
    low, high = rows[f"{metric}_min"].to_numpy(float), rows[f"{metric}_max"].to_numpy(float)
    if f"{metric}_ci_low" in rows:
        ci_low = rows[f"{metric}_ci_low"].to_numpy(float)
        ci_high = rows[f"{metric}_ci_high"].to_numpy(float)
        has = np.isfinite(ci_low) & np.isfinite(ci_high)
        low, high = np.where(has, ci_low, low), np.where(has, ci_high, high)
    err = np.fmax(np.vstack([med - low, high - med]), 0)
    if "n_repeats" in rows:  # one repeat has no spread: no bar, not one of width 0
        err[:, pd.to_numeric(rows["n_repeats"], errors="coerce").to_numpy(float) < 2] = np.nan
    return err


ERROR_BARS = "error bars: 95 % interval over repeats, min–max with fewer than 3"


def _grouped_bars(
    ax: Axes,
    summary: pd.DataFrame,
    metric: str,
    colours: Mapping[str, Colour],
    fmt: str,
) -> None:
    """Bars grouped by world size, one BarContainer per strategy (label = strategy).

    A group holds only the strategies that have a result at that world size, so strategies
    that cannot run there leave no hole. Error bars: `_error_bars`. A cell whose metric was
    not measured (no value in runs.csv: a run edited by hand, one from before the column, or
    an infinite figure the report reads as not measured) has no bar and is named under the
    axis, not drawn as a hole or a legend entry with no bar.
    """
    measured = summary[f"{metric}_median"].notna()
    unmeasured = [f"{name} ws={ws}" for name, ws in _cells(summary[~measured])]
    summary = summary[measured]
    if unmeasured:
        note = "not shown, not measured (no value in runs.csv): " + ", ".join(unmeasured)
        ax.set_xlabel("world size (ranks)\n" + textwrap.fill(note, 80), fontsize=9)
    if summary.empty:
        _empty(ax, "measured values")
        ax.set_xticks([])  # no world size drawn: not the 0 to 1 of an empty axis
        return
    sizes = sorted(int(w) for w in summary["world_size"].unique())
    names = sorted(summary["strategy"].unique(), key=natural_key)
    # at most 0.3 wide: a lone bar would otherwise fill its whole group
    width = min(0.3, 0.8 / max(1, summary.groupby("world_size").size().max()))
    pos: dict[tuple[str, int], float] = {}
    notes: list[Annotation] = []
    for g, ws in enumerate(sizes):
        present = sorted(summary.loc[summary["world_size"] == ws, "strategy"], key=natural_key)
        for i, name in enumerate(present):
            pos[(name, ws)] = g + (i - (len(present) - 1) / 2) * width
    for name in names:
        rows = summary[summary["strategy"] == name].sort_values("world_size")
        x = [pos[(name, int(w))] for w in rows["world_size"]]
        med = rows[f"{metric}_median"].to_numpy(float)
        err = _error_bars(rows, metric, med)
        ax.bar(
            x,
            med,
            width * 0.95,
            yerr=err,
            capsize=3,
            color=colours[name],
            label=name,
            error_kw={"elinewidth": 1, "ecolor": "0.2"},
        )
        # the value sits above the error bar, where a bar label would be crossed by it
        for xi, top, value in zip(x, np.fmax(med + err[1], med), med, strict=True):
            notes.append(_note_above(ax, xi, top, fmt % value))
    ax.set_xticks(range(len(sizes)), [str(w) for w in sizes])
    ax.set_xlim(-0.5, len(sizes) - 0.5)
    if not unmeasured:
        ax.set_xlabel("world size (ranks)")
    _legend_outside(ax, title="strategy")
    ax.margins(y=0.12)
    for n in notes:
        n.set_gid(BAR_VALUE)
    renderer = _renderer(ax)
    _upright_values(ax, renderer)  # again in fit_titles, once the labels narrow the axes
    _headroom(ax, notes)


def throughput(summary: pd.DataFrame, colours: Mapping[str, Colour] | None = None) -> Figure:
    """Median samples/s per strategy and world size; error bars span the repeats.

    Oversubscribed cells (more CPU ranks than cores) are left out, named under the axis.
    """
    fig, ax = _figure()
    kept, left_out = comparable(summary)
    if summary.empty:
        _empty(ax, "ok results")
    elif kept.empty:
        _empty(ax, "results that are not oversubscribed")
        ax.set_xlabel("world size (ranks)")
    else:
        _grouped_bars(ax, kept, "samples_per_s", _colours(summary["strategy"], colours), "%.0f")
    _note_left_out(ax, left_out)
    ax.set_ylabel("throughput (samples/s, all ranks)")
    ax.set_title(f"Training throughput (median; {ERROR_BARS})", fontsize=10)
    return fig


def peak_memory(summary: pd.DataFrame, colours: Mapping[str, Colour] | None = None) -> Figure:
    """Median peak memory per device; the source (CUDA allocator / host RSS) in the label."""
    fig, ax = _figure()
    if summary.empty:
        _empty(ax, "ok results")
    else:
        _grouped_bars(ax, summary, "peak_mem_mib", _colours(summary["strategy"], colours), "%.0f")
    sources = sorted({s for v in summary.get("mem_source", []) for s in str(v).split(",") if s})
    what = {"cuda_allocator": "CUDA allocator peak", "host_rss": "host RSS peak"}
    ax.set_ylabel(f"peak memory per device (MiB; {', '.join(what.get(s, s) for s in sources)})")
    # the summary has no interval of memory: its bars span the repeats' min to max (those of
    # the report's table), which a title silent on them let read as throughput's 95 % interval
    ax.set_title(
        "Peak memory per device (max over ranks; median over repeats; error bars: min–max)"
    )
    # ranks sharing a GPU each have their own allocator: such a bar is one rank's, and would
    # read as less memory per device than one rank on its own GPU takes
    on_gpu = summary.get("mem_source", pd.Series("", index=summary.index)).astype(str)
    _, shared = comparable(summary[on_gpu.str.contains("cuda_allocator")])
    if shared:
        note = (
            "ranks sharing a GPU (oversubscribed), each with its own allocator: the bar is one "
            "rank's peak, and the GPU held about that times its ranks: " + ", ".join(shared)
        )
        ax.set_xlabel(f"{ax.get_xlabel()}\n" + textwrap.fill(note, 80), fontsize=9)
    return fig


def scaling_efficiency(
    summary: pd.DataFrame,
    colours: Mapping[str, Colour] | None = None,
    shares: Mapping[int, float] | None = None,
) -> Figure:
    """Speed-up over `single` divided by world size, one line per strategy; ideal is 1.

    Oversubscribed cells (more CPU ranks than cores) are left out, named under the axis.
    `shares` (bench.analysis.report.thread_shares): per world size N whose ranks split
    single's threads on one host, 1/N, drawn as the efficiency of a cell exactly as fast as
    single (0.5 for 2 ranks on single's cores), since 1.0 cannot be reached on cores the
    ranks share.
    """
    fig, ax = _figure()
    kept, left_out = comparable(summary)
    sizes = sorted(int(w) for w in kept["world_size"].unique()) or [1]
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1, label="ideal (linear scaling)")
    shared = sorted(w for w in (shares or {}) if w in sizes)
    for i, w in enumerate(shared):  # a bar across each such world size, over the lines
        ax.hlines(
            shares[w],  # type: ignore[index]
            w / 1.25,
            w * 1.25,
            colors="0.15",
            linestyles=":",
            linewidth=2.5,
            zorder=4,
            label="" if i else "as fast as single on its cores\n(threads per rank / single's)",
        )
    data = kept.dropna(subset=["scaling_efficiency"])
    if data.empty and len(summary) and kept.empty:
        _empty(ax, "speed-up for cells that are not oversubscribed")
    elif data.empty:
        _empty(ax, "speed-up (needs an ok `single` run at world size 1)")
    cmap = _colours(summary["strategy"], colours)
    from bench.analysis.report import over_other_single  # (report imports this module)

    # a cell with no single in its own run options scales over plain single, which adds what
    # its options change (the table's †): hollow, where it read as a like-for-like ratio
    data = data.assign(_other=[over_other_single(summary, r) for _, r in data.iterrows()])
    # in the order of the throughput plot's legend (natural_key), not groupby's text order,
    # which put ddp [bf16] before ddp [fp32] and bucket_cap_mb=100 before 25
    for name in sorted(data["strategy"].unique(), key=natural_key):
        rows = data[data["strategy"] == name].sort_values("world_size")
        ax.plot(
            rows["world_size"], rows["scaling_efficiency"], marker="o", color=cmap[name], label=name
        )
        hollow = rows[rows["_other"].astype(bool)]
        if len(hollow):
            ax.plot(
                hollow["world_size"],
                hollow["scaling_efficiency"],
                linestyle="",
                marker="o",
                markerfacecolor="white",
                markeredgecolor=cmap[name],
                label=f"_{name} over plain single",
            )
    if data["_other"].any():
        ax.plot(
            [],
            [],
            linestyle="",
            marker="o",
            markerfacecolor="white",
            markeredgecolor="0.3",
            label="hollow: over plain single\n(none in the cell's run options)",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(w) for w in sizes])
    ax.minorticks_off()
    ax.set_xlim(sizes[0] / 1.4, sizes[-1] * 1.4)
    ax.set_ylim(bottom=0)
    # the global batch is fixed: each rank's share shrinks as ranks are added
    ax.set_xlabel("world size (ranks; the same global batch at each: strong scaling)")
    _note_left_out(ax, left_out)
    ax.set_ylabel("scaling efficiency (speed-up over single / world size)")
    # each cell scales over single in its own run options (report.summarise): a bf16 cell
    # over single [bf16], which the title names where it is not plain single
    overs = sorted(set(data.get("efficiency_over", pd.Series(dtype=str)).dropna()) - {""})
    over = overs[0] if len(overs) == 1 else "single"
    if len(overs) > 1:
        over += " in each cell's own run options"
    title = f"Scaling efficiency (1.0 = linear scaling over {over} at world size 1"
    if shared:
        title += "; dotted: as fast as single, where the ranks shared its cores"
    ax.set_title(title + ")")
    _legend_outside(ax)
    return fig


# ---------------------------------------------------------------- from steps.csv


def _timed(steps: pd.DataFrame) -> pd.DataFrame:
    return steps[steps["warmup"] == 0] if "warmup" in steps else steps


@FuncFormatter
def _minor_log_labels(value: float, _pos: int) -> str:
    # label 2x and 5x of each decade, so a log axis reads without counting grid lines
    lead = value / 10 ** np.floor(np.log10(value))
    return f"{value:g}" if round(lead) in (2, 5) else ""


def step_time_distribution(
    steps: pd.DataFrame,
    colours: Mapping[str, Colour] | None = None,
    oversubscribed: Collection[tuple[str, int]] = (),
) -> Figure:
    """Box plot of step time per strategy and world size, warm-up steps excluded;
    `oversubscribed` cells (oversubscribed_cells) marked under their box."""
    timed = _timed(steps)
    cells = _cells(timed)
    fig, ax = _figure(_cells_width(len(cells)))
    if not cells:
        _empty(ax, "timed steps")
    else:
        cmap = _colours([c[0] for c in cells], colours)
        data = [
            timed.loc[
                (timed["strategy"] == s) & (timed["world_size"] == w), "step_time_ms"
            ].to_numpy(float)
            for s, w in cells
        ]
        box = ax.boxplot(
            data,
            patch_artist=True,
            widths=0.6,
            tick_labels=[_cell_label(*c, oversubscribed) for c in cells],
            medianprops={"color": "black"},
            flierprops={"markersize": 3},
        )
        for patch, (name, _) in zip(box["boxes"], cells, strict=True):
            patch.set_facecolor(cmap[name])
            patch.set_label(name)
        if max(map(np.max, data)) > 10 * min(map(np.min, data)):
            # strategies an order of magnitude apart stay readable; plain numbers, not 10^n
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(_minor_log_labels)
    log = ax.get_yscale() == "log"
    ax.set_ylabel("step time (ms, log scale)" if log else "step time (ms)")
    ax.set_xlabel("strategy, world size")
    ax.set_title("Step time per strategy (timed steps of every repeat; warm-up excluded)")
    ax.grid(axis="y", which="both", alpha=0.3)
    return fig


#: curves at least this long are drawn as a rolling mean (see loss_curves)
SMOOTH_FROM = 50


def loss_curves(
    steps: pd.DataFrame,
    colours: Mapping[str, Colour] | None = None,
    departing: Sequence[str] | None = None,
    tolerance_pct: float = 10.0,
) -> Figure:
    """Training loss vs step, median over repeats; a line per strategy and world size. The
    title names the `departing` curves (more than `tolerance_pct` off single's, as the report
    decides: bench.analysis.report.loss_departures), or says none does; None: not compared."""
    from bench.analysis.report import median_loss_by_step

    fig, ax = _figure()
    cells = _cells(steps)
    curves = median_loss_by_step(steps)
    cmap = _colours([c[0] for c in cells], colours)
    sizes = sorted({w for _, w in cells})
    # Strategies that agree (the point of a parity check) draw the same curve; wider lines
    # underneath and markers at staggered steps keep every one of them visible.
    widths = np.linspace(5.0, 1.5, len(cells)) if len(cells) > 1 else [1.5]
    window = 1
    for i, (name, ws) in enumerate(cells):
        curve = curves[(name, ws)]
        # Per-step losses of a long run are noise around the trend, and a dozen noisy
        # curves hide each other: past SMOOTH_FROM steps, draw a centred rolling mean.
        if len(curve) >= SMOOTH_FROM:
            window = max(window, len(curve) // 25)
            curve = curve.rolling(window, center=True, min_periods=1).mean()
        every = max(1, len(curve) // 8)
        ax.plot(
            curve.index,
            curve.to_numpy(float),
            color=cmap[name],
            linewidth=widths[i],
            linestyle=WS_STYLES[sizes.index(ws) % len(WS_STYLES)],
            marker=MARKERS[i % len(MARKERS)],
            markevery=(i % every, every),
            markersize=5,
            alpha=0.85,
            label=f"{name} ws={ws}",
        )
    if not cells:
        _empty(ax, "steps")
    ax.set_xlabel("training step (across epochs, warm-up included)")
    # a step is a whole number: a short run's axis read 0.0, 0.5, 1.0 (no step 0.5 ran)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    smoothed = f", rolling mean over {window} steps" if window > 1 else ""
    ax.set_ylabel(f"training loss (median over repeats{smoothed})")
    off = f"more than {tolerance_pct:g} % off single's, mean over the steps"
    if departing is None:
        ax.set_title("Training loss per step")
    elif departing:
        ax.set_title(f"Training loss per step ({off}: {', '.join(departing)})")
    else:
        ax.set_title(f"Training loss per step (none {off})")
    _legend_outside(ax)
    ax.grid(alpha=0.3)
    return fig


def _note_above(ax: Axes, x: float, y: float, text: str) -> Annotation:
    """Small text just above a bar's top."""
    return ax.annotate(
        text,
        (x, y),
        xytext=(0, 2),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=8,
    )


def _renderer(ax: Axes) -> Any:
    """A renderer for ax's figure, laid out (on an Agg canvas if it had none)."""
    fig = ax.get_figure()
    assert fig is not None
    if not isinstance(fig.canvas, FigureCanvasAgg):  # a bare Figure(): what _figure gives
        FigureCanvasAgg(fig)
    _legend_room(fig)
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()  # type: ignore[attr-defined]


def _headroom(ax: Axes, notes: Sequence[Annotation], renderer: Any = None) -> bool:
    """Raise the y axis' top so every note over a bar (_note_above) stays inside the axes,
    where a fixed margin let a tall note (three or four lines) run into the title; whether
    it was raised. `renderer`: of the figure as laid out (else it is laid out here)."""
    notes = [n for n in notes if n.xycoords == "data" and n.get_text()]
    if not notes:
        return False
    renderer = renderer or _renderer(ax)
    bottom, top = ax.get_ylim()
    need = top
    for n in notes:
        # the note keeps its height in pixels: its bar's top y needs y + h/H * span <= top
        share = (n.get_window_extent(renderer).height + 4) / ax.bbox.height
        if share < 0.8:
            need = max(need, bottom + (n.xy[1] - bottom) / (1 - share))
    if need <= top * (1 + 1e-9):
        return False
    ax.set_ylim(bottom, need)
    return True


def _step_axes(
    ax: Axes, cells: Sequence[tuple[str, int]], shared: Collection[tuple[str, int]] = ()
) -> None:
    """The time-split plots' axes: a tick per (strategy, world size), time per step;
    `shared`: the oversubscribed cells, marked."""
    if not cells:
        _empty(ax, "timed steps")
    else:  # matplotlib's 5 % margins are a wide empty band beside many bars
        ax.set_xlim(-0.6, len(cells) - 0.4)
    _cell_ticks(ax, [_cell_label(*c, shared) for c in cells])
    ax.set_xlabel("strategy, world size")
    ax.set_ylabel("time per step (ms, mean over timed steps)")


def _parts_legend(
    ax: Axes, parts: list[Patch], heading: str, handles: list[Patch] | None = None
) -> None:
    """One legend, so a long list of strategies cannot run into the key of the bar parts:
    the colours name strategies (`handles`, else the bars labelled with a strategy), the fill
    says which part of the bar is which."""
    handles = ax.get_legend_handles_labels()[0] if handles is None else handles
    title = Patch(facecolor="none", edgecolor="none", label=heading)
    ax.legend(
        handles=[*handles, title, *parts],
        title="strategy",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )


def time_split(
    steps: pd.DataFrame,
    colours: Mapping[str, Colour] | None = None,
    bubbles: Mapping[tuple[str, int], float] | None = None,
    oversubscribed: Collection[tuple[str, int]] = (),
) -> Figure:
    """Mean time per step split into compute and data wait (stacked), warm-up excluded;
    `oversubscribed` cells (oversubscribed_cells) marked under their bar.

    Means, not medians: they add up to the mean step time, and the hatched share is the
    run's data_wait_pct (waiting time over total step time).

    `bubbles`: (strategy, world size) -> measured pipeline bubble (%, the median over
    repeats of runs.csv's bubble_pct). For those cells the compute bar is split into the
    ranks' own compute and, on top of it (dotted), the bubble: mean compute_ms x bubble/100.
    An estimate: the bubble is measured over the pipeline's forward and backward, and here
    applied to all of the step's compute (which holds the optimizer step too).
    """
    timed = _timed(steps)
    cells = _cells(timed)
    fig, ax = _figure(_cells_width(len(cells)))
    cmap = _colours([c[0] for c in cells], colours)
    means = timed.groupby(["strategy", "world_size"])[["compute_ms", "data_wait_ms"]].mean()
    bubble_pct = {
        (str(s), int(w)): float(v)
        for (s, w), v in (bubbles or {}).items()
        if v is not None and np.isfinite(float(v))
    }
    drew_bubble = False
    notes: list[Annotation] = []
    for name in sorted({c[0] for c in cells}, key=natural_key):
        idx = [i for i, c in enumerate(cells) if c[0] == name]
        comp = [means.loc[cells[i], "compute_ms"] for i in idx]
        wait = [means.loc[cells[i], "data_wait_ms"] for i in idx]
        bub = [c * bubble_pct.get(cells[i], 0.0) / 100 for i, c in zip(idx, comp, strict=True)]
        own = [c - b for c, b in zip(comp, bub, strict=True)]
        ax.bar(idx, own, 0.6, color=cmap[name], label=name)
        # on it, hatched and paler: the bubble (on the ranks' own compute) and the data wait
        # (on all of compute); a label that starts "_" keeps each out of the legend
        hatched = [(wait, comp, 0.45, DATA_WAIT_HATCH, "data wait")]
        if any(cells[i] in bubble_pct for i in idx):
            drew_bubble = True
            hatched.insert(0, (bub, own, 0.7, PIPELINE_BUBBLE_HATCH, "pipeline bubble"))
        for height, bottom, alpha, hatch, part in hatched:
            ax.bar(
                idx,
                height,
                0.6,
                bottom=bottom,
                color=cmap[name],
                alpha=alpha,
                hatch=hatch,
                edgecolor="0.25",
                label=f"_{name} {part}",
            )
        # a thin wait slice is invisible: say its share in words on top of each bar
        for i, c, w, b in zip(idx, comp, wait, bub, strict=True):
            pct = 100 / (c + w) if c + w > 0 else 0.0  # percent of the step per ms
            said = f"{pct * b:.1f}% bubble\n" if cells[i] in bubble_pct else ""
            notes.append(_note_above(ax, i, c + w, f"{said}{pct * w:.1f}% wait"))
    _step_axes(ax, cells, oversubscribed)
    ax.set_title(
        "Where a step's time goes: compute, pipeline bubble, waiting for data"
        if drew_bubble
        else "Where a step's time goes: compute vs waiting for data"
    )
    # one legend, so a long list of strategies cannot run into the key of the bar parts:
    # the colours name strategies, the fill says which part of the bar is which
    parts = [
        Patch(facecolor="0.5", edgecolor="0.25", label="compute (solid)"),
        Patch(facecolor="white", edgecolor="0.25", hatch=DATA_WAIT_HATCH, label="data wait"),
    ]
    if drew_bubble:
        bubble = "pipeline bubble (part of compute: idle between stages)"
        parts.insert(
            1,
            Patch(facecolor="white", edgecolor="0.25", hatch=PIPELINE_BUBBLE_HATCH, label=bubble),
        )
    if cells:
        _parts_legend(ax, parts, "bar parts:")
    ax.margins(y=0.1)
    _headroom(ax, notes)
    return fig


# ---------------------------------------------------------------- several runs


#: readable names for the metrics of summary.csv
METRIC_LABELS = {
    "samples_per_s": "throughput",
    "step_time_ms_p50": "step time p50",
    "step_time_ms_p90": "step time p90",
    "peak_mem_mib": "peak memory per device",
    "timed_s": "epoch time",
    "data_wait_pct": "data wait",
}


def _across_runs(rows: pd.DataFrame) -> list[str]:
    """Each summary row's case named over all the runs at once, as `parabench compare` names
    them (results.case_labels, per strategy): a run that swept precision calls plain DDP
    `ddp_spawn [fp32]` and one that did not `ddp_spawn`, which named run by run would be two
    series of a point each, not one line across them. Rows without the registry name and
    setting (a summary from before them) keep theirs."""
    if rows.empty or not {"strategy_name", "setting"} <= set(rows.columns):
        return list(rows["strategy"].astype(str))
    pairs = list(
        zip(
            rows["strategy_name"].astype(str),
            rows["setting"].astype(object).fillna("").astype(str),
            strict=True,
        )
    )
    named = case_labels(pairs, per_strategy=True)
    return [named[p] for p in pairs]


def runs_trend(
    summaries: Mapping[str, pd.DataFrame],
    metric: str = "samples_per_s",
    colours: Mapping[str, Colour] | None = None,
    unit: str = "samples/s",
) -> Figure:
    """One metric's median across runs (in the given order); a line per strategy/world size."""
    labels = list(summaries)
    fig, ax = _figure(max(7.5, 1.5 * len(labels) + 4.5))
    frames = [s.assign(run=i) for i, s in enumerate(summaries.values()) if len(s)]
    both = pd.concat(frames) if frames else pd.DataFrame(columns=["strategy", "world_size"])
    # the colours are the runs' own names'; a series is named across the runs
    cmap = _colours(both["strategy"].astype(str), colours)
    both = both.assign(run_label=both["strategy"].astype(str), strategy=_across_runs(both))
    cells = _cells(both)
    sizes = sorted({w for _, w in cells})
    # a small sideways shift per series keeps error bars at the same run apart
    shift = np.linspace(-0.12, 0.12, len(cells)) if len(cells) > 1 else [0.0]
    for i, (name, ws) in enumerate(cells):
        rows = both[(both["strategy"] == name) & (both["world_size"] == ws)].sort_values("run")
        med = rows[f"{metric}_median"].to_numpy(float)
        err = _error_bars(rows, metric, med)
        ax.errorbar(
            rows["run"] + shift[i],
            med,
            yerr=err,
            marker="o",
            capsize=3,
            color=cmap[rows["run_label"].iloc[0]],
            linestyle=WS_STYLES[sizes.index(ws) % len(WS_STYLES)],
            label=f"{name} ws={ws}",
        )
    if not cells:
        _empty(ax, "ok results")
    what = METRIC_LABELS.get(metric, metric)
    _cell_ticks(ax, labels)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("run")
    ax.set_ylabel(f"{what} ({unit}, median over repeats)")
    ax.set_title(f"{what.capitalize()} across runs ({ERROR_BARS})", fontsize=10)
    _legend_outside(ax)
    ax.grid(alpha=0.3)
    return fig


# ---------------------------------------------------------------- from ranks.csv

#: the three parts of a rank's model state: column, legend label, how the bar part is drawn
STATE_PARTS = (
    ("param_mib", "parameters (solid)", {"alpha": 1.0, "hatch": None}),
    ("grad_mib", "gradients (lighter)", {"alpha": 0.5, "hatch": None}),
    ("optim_mib", "optimizer state (hatched)", {"alpha": 0.25, "hatch": "xx"}),
)


#: bar slots (a rank's bar, or the empty slot after each group) in one row of model_state:
#: past it the groups go on in a row below (about 18 inches wide with the legend)
STATE_ROW_SLOTS = 44


def model_state(ranks: pd.DataFrame, colours: Mapping[str, Colour] | None = None) -> Figure:
    """What each rank holds of the training state: a bar per rank of every strategy and world
    size, stacked parameters / gradients / optimizer state (MiB, median over repeats).

    Every rank gets its own bar, never a mean over ranks: sharding that leaves the ranks
    uneven (ZeRO-1's optimizer partition) must show as uneven bars. The total is written on
    top of each bar, so a thin part still adds up in words. Past STATE_ROW_SLOTS bars the
    groups wrap onto rows below, on one y scale, so a matrix of every strategy stays as
    wide as a page rather than a bar's third of an inch times all of them.
    """
    cols = [c for c, _, _ in STATE_PARTS]
    have = all(c in ranks for c in cols)
    data = ranks.dropna(subset=cols, how="all") if have else ranks.iloc[0:0]
    cells = _cells(data) if len(data) else []
    title = "Model state per rank: parameters, gradients, optimizer state (after training)"
    if not cells:
        fig, ax = _figure(8.0, 5.2)
        ax.set_ylabel("model state held per rank (MiB)")
        ax.set_title(title)
        _empty(ax, "model-state figures")
        return fig
    med = (
        data.assign(rank=data["rank"].astype(int), world_size=data["world_size"].astype(int))
        .groupby(["strategy", "world_size", "rank"])[cols]
        .median()
        .fillna(0.0)  # a part one old run did not record draws as nothing, not as a hole
    )
    rows: list[list[tuple[str, int]]] = [[]]
    used = 0
    for cell in cells:
        slots = len(med.loc[cell]) + 1  # its ranks' bars and the empty slot after them
        if rows[-1] and used + slots > STATE_ROW_SLOTS:
            rows.append([])
            used = 0
        rows[-1].append(cell)
        used += slots
    widest = max(sum(len(med.loc[c]) + 1 for c in row) for row in rows)
    # about a third of an inch per bar and per gap between groups, plus the legend
    fig = Figure(
        figsize=(max(8.0, 0.32 * widest + 3.5), 1.0 + 4.2 * len(rows)), layout="constrained"
    )
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rows), 1, sharey=True, squeeze=False)[:, 0]
    cmap = _colours([c[0] for c in cells], colours)
    ends = [_state_row(ax, row, med, cmap) for ax, row in zip(axes, rows, strict=True)]
    for ax in axes:  # one bar width on every row: the widest row's span
        ax.set_xlim(-0.7, max(ends) - 1.3)
        ax.set_ylabel("model state held per rank (MiB)")
    axes[0].set_title(title)
    axes[-1].set_xlabel("rank (r0, r1, …), grouped by strategy and world size")
    # one key: grey swatches say which part of a bar is which, colours name the strategies
    parts = [
        Patch(facecolor="0.5", alpha=s["alpha"], hatch=s["hatch"], edgecolor="0.25", label=lab)
        for _, lab, s in STATE_PARTS
    ]
    names = sorted({c[0] for c in cells}, key=natural_key)
    strategies = [Patch(facecolor=cmap[n], edgecolor="0.25", label=n) for n in names]
    axes[0].legend(
        handles=parts + strategies,
        title="bar parts; colour: strategy",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )
    return fig


def _state_row(
    ax: Axes, cells: list[tuple[str, int]], med: pd.DataFrame, cmap: Mapping[str, Colour]
) -> float:
    """model_state's bars for `cells`, left to right on `ax`; where the next group would start."""
    x, ranks_at, centres = 0.0, [], []
    for name, ws in cells:
        one = med.loc[(name, ws)].sort_index()
        xs = x + np.arange(len(one), dtype=float)
        bottom = np.zeros(len(one))
        for col, _, style in STATE_PARTS:
            height = one[col].to_numpy(float)
            ax.bar(
                xs,
                height,
                0.8,
                bottom=bottom,
                color=cmap[name],
                alpha=style["alpha"],
                hatch=style["hatch"],
                edgecolor="0.25",
                linewidth=0.5,
                label=f"_{name} {col}",
            )
            bottom = bottom + height
        for xi, total in zip(xs, bottom, strict=True):
            ax.annotate(
                f"{total:.1f}",
                (xi, total),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ranks_at += [(xi, f"r{r}") for xi, r in zip(xs, one.index, strict=True)]
        # a long label ("ddp_torchrun [bf16, bucket_cap_mb=25]") over a few lines, so that it
        # stays under its own bars
        wrapped = name.replace(" [", "\n[").replace(", ", ",\n")
        centres.append((xs.mean(), _cell_label(wrapped, ws)))
        x = xs[-1] + 2.0  # one empty slot between groups
    # rank numbers under each bar (minor ticks), the group's name under its ranks (major)
    ax.xaxis.remove_overlapping_locs = False
    ax.set_xticks([p for p, _ in ranks_at], [t for _, t in ranks_at], minor=True)
    ax.set_xticks([p for p, _ in centres], [t for _, t in centres])
    ax.tick_params(axis="x", which="minor", labelsize=7, length=2)
    ax.tick_params(axis="x", which="major", labelsize=7, length=0, pad=12)
    ax.margins(y=0.1)
    ax.grid(axis="y", alpha=0.3)
    return x


# ---------------------------------------------------------------- option sweeps


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if np.isfinite(value) else None


def _options(setting: object) -> dict[str, str]:
    """The `key=value` tokens of a setting label ("fp32,compile,bucket_cap_mb=25")."""
    tokens = str(setting).split(",") if isinstance(setting, str) else []
    return dict(t.split("=", 1) for t in tokens if "=" in t)


def _without(setting: object, key: str) -> str:
    tokens = str(setting).split(",") if isinstance(setting, str) else []
    return ",".join(t for t in tokens if t and t.split("=", 1)[0] != key)


def swept_keys(summary: pd.DataFrame) -> list[str]:
    """Option keys with numeric values that take more than one value within one strategy."""
    if summary.empty or not {"setting", "strategy_name"} <= set(summary.columns):
        return []
    seen: dict[tuple[str, str], set[float]] = {}
    for name, setting in zip(summary["strategy_name"], summary["setting"], strict=True):
        for key, value in _options(setting).items():
            number = _number(value)
            if number is not None:
                seen.setdefault((str(name), key), set()).add(number)
    return sorted({key for (_, key), values in seen.items() if len(values) > 1})


def _sweep_colours(
    summary: pd.DataFrame, colours: Mapping[str, Colour] | None
) -> dict[str, Colour]:
    # a strategy keeps the colour the other plots gave its bare name, where they did
    names = sorted(summary["strategy_name"].astype(str).unique())
    if colours is None:
        return colour_map(names)
    # a swept strategy has no bare-name colour (each of its settings is a display label of
    # its own): it takes the one the other plots gave its first case, never a palette of its
    # own, which gave pipeline_interleaved the brown the throughput plot gave
    # pipeline_gpipe [microbatches=8]: one colour, two strategies, in one report
    cases = zip(summary["strategy"], summary["strategy_name"], summary["world_size"], strict=True)
    picked: dict[str, Colour] = {}
    for label, name, _ in sorted(cases, key=lambda c: case_key(str(c[0]), int(c[2]))):
        if str(label) in colours:
            picked.setdefault(str(name), colours[str(label)])
    picked.update({n: colours[n] for n in names if n in colours})
    return picked if all(n in picked for n in names) else colour_map(names)


def _sweep_axes(ax: Axes, summary: pd.DataFrame, key: str, cmap: Mapping[str, Colour]) -> None:
    """One line per (strategy, world size, rest of the setting) against the values of key."""
    rows = summary.assign(
        _value=[_number(_options(s).get(key, "")) for s in summary["setting"]],
        _rest=[_without(s, key) for s in summary["setting"]],
    )
    rows = rows[rows["_value"].notna()].dropna(subset=["samples_per_s_median"])
    # only strategies that sweep the key: one value of it is a fixed option, not a sweep
    counts = rows.groupby("strategy_name")["_value"].nunique()
    rows = rows[rows["strategy_name"].isin(counts[counts > 1].index)]
    sizes = sorted(int(w) for w in rows["world_size"].unique())
    rests = sorted(rows["_rest"].unique())
    for (name, ws, rest), line in rows.groupby(["strategy_name", "world_size", "_rest"]):
        line = line.sort_values("_value")
        med = line["samples_per_s_median"].to_numpy(float)
        err = _error_bars(line, "samples_per_s", med)
        label = f"{name} ws={int(ws)}" + (f" [{rest}]" if len(rests) > 1 else "")
        # colour: strategy, line style: world size, marker: the rest of the setting
        ax.errorbar(
            line["_value"].to_numpy(float),
            med,
            yerr=err,
            marker=MARKERS[rests.index(rest) % len(MARKERS)],
            capsize=3,
            color=cmap[str(name)],
            linestyle=WS_STYLES[sizes.index(int(ws)) % len(WS_STYLES)],
            label=label,
        )
    values = sorted(rows["_value"].unique())
    if values and values[0] > 0 and values[-1] / values[0] > 10:
        ax.set_xscale("log")
    if values:
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel(key)
    ax.set_ylabel("samples/s (median over repeats)")
    ax.set_title(f"Sweep of {key}: throughput ({ERROR_BARS})", fontsize=10)
    ax.grid(alpha=0.3)
    # the rest of the setting, when every line shares it, is said once in the legend title
    _legend_outside(ax, title=f"setting: {rests[0]}" if len(rests) == 1 and rests[0] else None)


def option_sweep(
    summary: pd.DataFrame, colours: Mapping[str, Colour] | None = None
) -> Figure | None:
    """Throughput against each swept numeric strategy option (e.g. bucket_cap_mb), or None
    when the run swept none.

    A subplot per swept key (stacked); in each, a line per strategy, world size and rest of
    the setting, through the medians over repeats, with error bars as `_error_bars`. Colour: the
    strategy; line style: the world size. A log x axis when the values span more than 10x.
    Oversubscribed cells (more CPU ranks than cores) are left out, named under the axis.
    """
    keys = swept_keys(summary)
    if not keys:
        return None
    fig = Figure(figsize=(8.0, 4.4 * len(keys) + 0.4), layout="constrained")
    FigureCanvasAgg(fig)
    cmap = _sweep_colours(summary, colours)
    for key, ax in zip(keys, fig.subplots(len(keys), 1, squeeze=False)[:, 0], strict=True):
        # a throughput plot too: cells with more CPU ranks than cores are left out and named,
        # as in `throughput` (their speed is not comparable)
        takes = summary[[key in _options(s) for s in summary["setting"]]]
        kept, left_out = comparable(takes)
        _sweep_axes(ax, kept, key, cmap)
        _note_left_out(ax, left_out)
    return fig


def legend_labels(fig: Figure) -> list[str]:
    """The labels of every legend in a figure, in drawing order (what a reader sees)."""
    ax = fig.axes[0]
    legends = [a for a in ax.artists if isinstance(a, Legend)]
    legends += [ax.get_legend()] if ax.get_legend() is not None else []
    return [t.get_text() for legend in legends for t in legend.get_texts()]


#: the stacked parts of a step (bench.harness.breakdown.PARTS) as drawn: label, alpha, hatch
STEP_PARTS = {
    "part_forward_ms": ("forward", 1.0, ""),
    "part_backward_ms": ("backward", 0.75, ""),
    "part_optimizer_ms": ("optimizer step", 0.5, ""),
    "part_comm_exposed_ms": ("communication, exposed", 0.9, "xx"),
    "part_data_wait_ms": ("data wait", 0.45, DATA_WAIT_HATCH),
    "part_other_ms": ("other", 0.15, ""),
}


def time_parts(
    counted: pd.DataFrame,
    colours: Mapping[str, Colour] | None = None,
    bubbles: Mapping[tuple[str, int], float] | None = None,
    oversubscribed: Collection[tuple[str, int]] = (),
) -> Figure:
    """A mean step per strategy and world size, stacked: forward, backward and optimizer
    compute, exposed communication (bench.harness.breakdown), data wait and what the laps miss;
    medians over repeats, so the bar's height is the cell's mean step (on a GPU, of its lapped
    steps: the step the parts split, as the report's table gives it). A pipeline's
    measured bubble is said in words over its bar (it lies inside its backward bar: the
    schedule runs forward and backward as one). Oversubscribed cells (their rows', or
    `oversubscribed`) are marked under their bar."""
    rows = counted[lapped_rows(counted)].copy()
    for col in STEP_PARTS:
        rows[col] = pd.to_numeric(rows.get(col), errors="coerce")
    med = rows.groupby(["strategy", "world_size"])[list(STEP_PARTS)].median()
    # in the order of every other plot and table (case_key), not groupby's text order, which
    # put bf16 before fp32 and bucket_cap_mb=100 before 25
    med = med.loc[sorted(med.index, key=lambda c: case_key(*c))]
    cells = [(str(s), int(w)) for s, w in med.index]
    fig, ax = _figure(_cells_width(len(cells)))
    cmap = _colours([c[0] for c in cells], colours)
    notes: list[Annotation] = []
    for i, cell in enumerate(cells):
        values = med.iloc[i]
        bottom = 0.0
        for col, (label, alpha, hatch) in STEP_PARTS.items():
            v = float(values[col])
            if not np.isfinite(v) or v <= 0:
                continue
            ax.bar(
                i,
                v,
                0.6,
                bottom=bottom,
                color=cmap[cell[0]],
                alpha=alpha,
                hatch=hatch,
                edgecolor="0.25" if hatch else None,
                label=f"_{cell[0]} {label}",
            )
            bottom += v
        # the share of the step the parts split (their medians' sum): on a GPU the lapped
        # steps' mean, which the timed steps' (step_time_ms_mean) is not
        step = float(np.nansum([float(values[col]) for col in STEP_PARTS]))
        comm = float(values["part_comm_exposed_ms"])
        if np.isfinite(comm) and step > 0:
            said = [f"{100 * comm / step:.0f}% comm\nexposed"]
        else:  # one rank has no one to talk to; several without an ablation: not measured
            # (a profiler may still have timed the whole of it: the report's comm total)
            said = ["no comm" if cell[1] == 1 else "exposed\ncomm not\nmeasured"]
        bubble = (bubbles or {}).get(cell)
        if bubble is not None and np.isfinite(bubble):
            said.append(f"{bubble:.0f}% bubble")
        notes.append(_note_above(ax, i, bottom, "\n".join(said)))
    _step_axes(ax, cells, {*oversubscribed, *oversubscribed_cells(rows)})
    ax.set_title("Where a step's time goes: compute, exposed communication, data wait")
    parts = [
        Patch(facecolor="0.3", alpha=alpha, hatch=hatch, edgecolor="0.25", label=label)
        for label, alpha, hatch in STEP_PARTS.values()
    ]
    # each strategy in its full colour: its first part drawn may be a pale one (a pipeline
    # has no forward, its backward is at alpha 0.75)
    names = [Patch(facecolor=cmap[n], label=n) for n in dict.fromkeys(c[0] for c in cells)]
    if cells:
        _parts_legend(ax, parts, "bar parts, bottom up:", names)
    ax.margins(y=0.12)
    _headroom(ax, notes)
    return fig
