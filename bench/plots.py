"""Comparison plots. Each function takes DataFrames and returns a matplotlib Figure.

Figures are built with the object-oriented API on an Agg canvas, never through pyplot,
so nothing depends on (or changes) the global backend: the CLI renders headless and a
notebook can display the same Figure objects. Every plot colours a strategy the same way
(`colour_map`), so a reader learns the colours once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, ScalarFormatter

Colour = tuple[float, float, float, float]
#: line style per world size, so loss curves of one strategy stay in its colour
WS_STYLES = ("-", "--", ":", "-.")
DATA_WAIT_HATCH = "///"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _palette(n: int) -> list[Colour]:
    # tab10 (tab20 past nine names) without its greys: grey is kept for reference marks
    # (the ideal line, the legend key of the stacked bars), which must not look like a strategy
    name, greys = ("tab10", {7}) if n <= 9 else ("tab20", {14, 15})
    cmap = matplotlib.colormaps[name]
    return [cmap(i) for i in range(cmap.N) if i not in greys]


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


def _cell_label(name: str, ws: int) -> str:
    return f"{name}\nws={int(ws)}"


def _cells(df: pd.DataFrame) -> list[tuple[str, int]]:
    keys = df[["strategy", "world_size"]].drop_duplicates()
    return sorted((str(s), int(w)) for s, w in keys.itertuples(index=False))


def _legend_outside(ax: Axes, **kw) -> None:
    # outside the axes, so it never hides a bar or a line
    if not ax.get_legend_handles_labels()[0]:
        return  # nothing drawn (an empty plot says so in its middle)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, **kw)


def _empty(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} to show", ha="center", va="center", transform=ax.transAxes)


# ---------------------------------------------------------------- from summary.csv


def _grouped_bars(
    ax: Axes,
    summary: pd.DataFrame,
    metric: str,
    colours: Mapping[str, Colour],
    fmt: str,
) -> None:
    """Bars grouped by world size, one BarContainer per strategy (label = strategy).

    A group holds only the strategies that have a result at that world size, so strategies
    that cannot run there leave no hole. Error bars: min to max over repeats.
    """
    sizes = sorted(int(w) for w in summary["world_size"].unique())
    names = sorted(summary["strategy"].unique())
    # at most 0.3 wide: a lone bar would otherwise fill its whole group
    width = min(0.3, 0.8 / max(1, summary.groupby("world_size").size().max()))
    pos: dict[tuple[str, int], float] = {}
    for g, ws in enumerate(sizes):
        present = sorted(summary.loc[summary["world_size"] == ws, "strategy"])
        for i, name in enumerate(present):
            pos[(name, ws)] = g + (i - (len(present) - 1) / 2) * width
    for name in names:
        rows = summary[summary["strategy"] == name].sort_values("world_size")
        x = [pos[(name, int(w))] for w in rows["world_size"]]
        med = rows[f"{metric}_median"].to_numpy(float)
        err = np.vstack(
            [
                med - rows[f"{metric}_min"].to_numpy(float),
                rows[f"{metric}_max"].to_numpy(float) - med,
            ]
        )
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
            ax.annotate(
                fmt % value,
                (xi, top),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(sizes)), [str(w) for w in sizes])
    ax.set_xlim(-0.5, len(sizes) - 0.5)
    ax.set_xlabel("world size (ranks)")
    _legend_outside(ax, title="strategy")
    ax.margins(y=0.12)


def throughput(summary: pd.DataFrame, colours: Mapping[str, Colour] | None = None) -> Figure:
    """Median samples/s per strategy and world size; error bars span the repeats."""
    fig, ax = _figure()
    if summary.empty:
        _empty(ax, "ok results")
    else:
        _grouped_bars(ax, summary, "samples_per_s", _colours(summary["strategy"], colours), "%.0f")
    ax.set_ylabel("throughput (samples/s, all ranks)")
    ax.set_title("Training throughput (median; error bars: min–max over repeats)")
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
    ax.set_title("Peak memory per device (max over ranks; median over repeats)")
    return fig


def scaling_efficiency(
    summary: pd.DataFrame, colours: Mapping[str, Colour] | None = None
) -> Figure:
    """Speed-up over `single` divided by world size, one line per strategy; ideal is 1."""
    fig, ax = _figure()
    sizes = sorted(int(w) for w in summary["world_size"].unique()) or [1]
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1, label="ideal (linear scaling)")
    data = summary.dropna(subset=["scaling_efficiency"])
    if data.empty:
        _empty(ax, "speed-up (needs an ok `single` run at world size 1)")
    cmap = _colours(summary["strategy"], colours)
    for name, rows in data.groupby("strategy", sort=True):
        rows = rows.sort_values("world_size")
        ax.plot(
            rows["world_size"], rows["scaling_efficiency"], marker="o", color=cmap[name], label=name
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(w) for w in sizes])
    ax.minorticks_off()
    ax.set_xlim(sizes[0] / 1.4, sizes[-1] * 1.4)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("scaling efficiency (speed-up over single / world size)")
    ax.set_title("Scaling efficiency (1.0 = linear scaling over single at world size 1)")
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
    steps: pd.DataFrame, colours: Mapping[str, Colour] | None = None
) -> Figure:
    """Box plot of step time per strategy and world size, warm-up steps excluded."""
    timed = _timed(steps)
    cells = _cells(timed)
    fig, ax = _figure(max(6.0, 1.2 * len(cells) + 2))
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
            tick_labels=[_cell_label(*c) for c in cells],
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


def loss_curves(steps: pd.DataFrame, colours: Mapping[str, Colour] | None = None) -> Figure:
    """Training loss vs step, median over repeats; a line per strategy and world size."""
    fig, ax = _figure()
    cells = _cells(steps)
    cmap = _colours([c[0] for c in cells], colours)
    sizes = sorted({w for _, w in cells})
    # Strategies that agree (the point of a parity check) draw the same curve; wider lines
    # underneath and markers at staggered steps keep every one of them visible.
    widths = np.linspace(5.0, 1.5, len(cells)) if len(cells) > 1 else [1.5]
    window = 1
    for i, (name, ws) in enumerate(cells):
        one = steps[(steps["strategy"] == name) & (steps["world_size"] == ws)]
        one = one.sort_values(["repeat", "epoch", "step"])
        # global step: position in the repeat across epochs
        one = one.assign(gstep=one.groupby("repeat").cumcount())
        curve = one.groupby("gstep")["loss"].median()
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
    smoothed = f", rolling mean over {window} steps" if window > 1 else ""
    ax.set_ylabel(f"training loss (median over repeats{smoothed})")
    ax.set_title("Training loss per step (coinciding curves: the strategies agree)")
    _legend_outside(ax)
    ax.grid(alpha=0.3)
    return fig


def time_split(steps: pd.DataFrame, colours: Mapping[str, Colour] | None = None) -> Figure:
    """Mean time per step split into compute and data wait (stacked), warm-up excluded.

    Means, not medians: they add up to the mean step time, and the hatched share is the
    run's data_wait_pct (waiting time over total step time).
    """
    timed = _timed(steps)
    cells = _cells(timed)
    fig, ax = _figure(max(6.0, 1.2 * len(cells) + 2))
    cmap = _colours([c[0] for c in cells], colours)
    means = timed.groupby(["strategy", "world_size"])[["compute_ms", "data_wait_ms"]].mean()
    for name in sorted({c[0] for c in cells}):
        idx = [i for i, c in enumerate(cells) if c[0] == name]
        comp = [means.loc[cells[i], "compute_ms"] for i in idx]
        wait = [means.loc[cells[i], "data_wait_ms"] for i in idx]
        ax.bar(idx, comp, 0.6, color=cmap[name], label=name)
        ax.bar(
            idx,
            wait,
            0.6,
            bottom=comp,
            color=cmap[name],
            alpha=0.45,
            hatch=DATA_WAIT_HATCH,
            edgecolor="0.25",
            label=f"_{name} data wait",
        )
        # a thin wait slice is invisible: say its share in words on top of each bar
        for i, c, w in zip(idx, comp, wait, strict=True):
            ax.annotate(
                f"{100 * w / (c + w) if c + w > 0 else 0:.1f}% wait",
                (i, c + w),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
    if not cells:
        _empty(ax, "timed steps")
    ax.set_xticks(range(len(cells)), [_cell_label(*c) for c in cells])
    ax.set_xlabel("strategy, world size")
    ax.set_ylabel("time per step (ms, mean over timed steps)")
    ax.set_title("Where a step's time goes: compute vs waiting for data")
    # two legends: the colours name strategies, the fill says which part of the bar is which
    _legend_outside(ax, title="strategy")
    parts = [
        Patch(facecolor="0.5", edgecolor="0.25", label="compute (solid)"),
        Patch(facecolor="white", edgecolor="0.25", hatch=DATA_WAIT_HATCH, label="data wait"),
    ]
    if cells:
        key = ax.get_legend()
        ax.legend(
            handles=parts,
            title="bar parts",
            loc="lower left",
            bbox_to_anchor=(1.01, 0.0),
            fontsize=8,
        )
        ax.add_artist(key)
    ax.margins(y=0.1)
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
    cells = _cells(both)
    cmap = _colours([c[0] for c in cells], colours)
    sizes = sorted({w for _, w in cells})
    # a small sideways shift per series keeps error bars at the same run apart
    shift = np.linspace(-0.12, 0.12, len(cells)) if len(cells) > 1 else [0.0]
    for i, (name, ws) in enumerate(cells):
        rows = both[(both["strategy"] == name) & (both["world_size"] == ws)].sort_values("run")
        med = rows[f"{metric}_median"].to_numpy(float)
        err = np.vstack(
            [
                med - rows[f"{metric}_min"].to_numpy(float),
                rows[f"{metric}_max"].to_numpy(float) - med,
            ]
        )
        ax.errorbar(
            rows["run"] + shift[i],
            med,
            yerr=err,
            marker="o",
            capsize=3,
            color=cmap[name],
            linestyle=WS_STYLES[sizes.index(ws) % len(WS_STYLES)],
            label=f"{name} ws={ws}",
        )
    if not cells:
        _empty(ax, "ok results")
    what = METRIC_LABELS.get(metric, metric)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("run")
    ax.set_ylabel(f"{what} ({unit}, median over repeats)")
    ax.set_title(f"{what.capitalize()} across runs (error bars: min–max over repeats)")
    _legend_outside(ax)
    ax.grid(alpha=0.3)
    return fig


def legend_labels(fig: Figure) -> list[str]:
    """The labels of every legend in a figure, in drawing order (what a reader sees)."""
    ax = fig.axes[0]
    legends = [a for a in ax.artists if isinstance(a, Legend)]
    legends += [ax.get_legend()] if ax.get_legend() is not None else []
    return [t.get_text() for legend in legends for t in legend.get_texts()]
