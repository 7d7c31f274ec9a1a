"""notebooks/compare.ipynb executes end to end (nbclient) on two real runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient

from bench import ROOT
from tests.test_compare import scaled_copy

NOTEBOOK = ROOT / "notebooks" / "compare.ipynb"


def test_committed_notebook_has_no_outputs() -> None:
    nb = json.loads(NOTEBOOK.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


def _outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def test_notebook_fails_clearly_without_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PARABENCH_RUNS", str(tmp_path / "nope"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.raises(Exception, match="no such run directory"):
        NotebookClient(
            nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()


def _header() -> str:
    return "".join(nbformat.read(NOTEBOOK, as_version=4).cells[0].source)


def test_the_command_in_the_header_runs_the_notebook_on_two_runs(
    small_run: Path, tmp_path: Path
) -> None:
    """The header's shell command uses `jupyter execute` (nbclient, in the dev extra), not
    nbconvert, which nothing installs; run as written, on a copy, it executes end to end on
    the two runs PARABENCH_RUNS names and writes the outputs."""
    import re
    import subprocess
    import sys

    header = _header()
    assert "nbconvert" not in header
    (command,) = re.findall(r"`(PARABENCH_RUNS=\S+ [^`]+)`", header)
    env_part, exe, *args = command.split()
    assert env_part.startswith("PARABENCH_RUNS=")
    assert exe == ".venv/bin/jupyter" and args[0] == "execute"
    jupyter = Path(sys.executable).parent / "jupyter"  # this venv's, as .venv/bin/jupyter
    assert (Path(sys.executable).parent / "jupyter-execute").exists()

    a = Path(shutil.copytree(small_run, tmp_path / "a"))
    b = scaled_copy(a, tmp_path / "b", speed=0.5)  # B: every cell half as fast
    # A relative run is read from the repository's root: the notebook must find that root.
    a_relative = os.path.relpath(a, ROOT)
    copy = tmp_path / "notebooks" / NOTEBOOK.name
    copy.parent.mkdir()
    shutil.copy(NOTEBOOK, copy)
    env = os.environ | {"PARABENCH_RUNS": f"{a_relative},{b}"}
    args = [str(copy) if arg == "notebooks/compare.ipynb" else arg for arg in args]
    done = subprocess.run(
        [str(jupyter), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    nb = nbformat.read(copy.parent / "compare-run.ipynb", as_version=4)
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    # 3 across-run trends, then the 7 figures of each run's report (no option sweep)
    assert len(images) == 3 + 7 * 2
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "SLOW-DOWN" in text  # the compare table of B against A
    markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    ok = {"single", "ddp_spawn"}
    assert all(name in markdown for name in ok)
    # the env var, not the default, chose the runs
    first = nb.cells[1].outputs[0]["data"]["text/plain"]
    assert a_relative in first and str(b) in first


def test_without_runs_named_the_two_written_last_are_compared(tmp_path: Path, monkeypatch):
    """The default is the two newest runs by when their runs.csv was written, not the last
    two names in sorted order (a run named with --run-id sorts anywhere)."""
    import bench

    monkeypatch.delenv("PARABENCH_RUNS", raising=False)
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    for age, name in enumerate(["zz-oldest", "mm-middle", "aa-newest"]):
        runs_csv = tmp_path / "results" / name / "runs.csv"
        runs_csv.parent.mkdir(parents=True)
        runs_csv.write_text("strategy\n")
        os.utime(runs_csv, (1_000_000 + age * 100, 1_000_000 + age * 100))
    scope: dict = {}
    exec(nbformat.read(NOTEBOOK, as_version=4).cells[1].source, scope)  # the RUNS cell
    assert [Path(r).name for r in scope["RUNS"]] == ["mm-middle", "aa-newest"]


def _shown(monkeypatch, runs: str, marker: str) -> list:
    """What the notebook's code cell holding `marker` displays, run in this process (after
    the cells that choose and load `runs`; %magic lines aside)."""
    import IPython.display

    monkeypatch.setenv("PARABENCH_RUNS", runs)
    shown: list = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    cells = [c for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    scope: dict = {}
    for cell in cells[:2]:
        exec("\n".join(x for x in cell.source.splitlines() if not x.startswith("%")), scope)
    shown.clear()
    exec(next(c for c in cells if marker in c.source).source, scope)
    return shown


REFERENCE_RUN = ROOT / "results" / "reference" / "cpu-2core-mnist-20261126"


def test_each_runs_plots_are_the_figures_of_its_report(monkeypatch) -> None:
    """The notebook's "Each run's plots" says they are the figures of the run's report.md; it drew
    six of its own instead: no model state, the time split of a run from before the laps
    where the report stacks a step's parts, the loss and efficiency plots without what the
    report marks on them (the loss curves off single's, the cores the ranks shared)."""
    from matplotlib.figure import Figure

    from bench.analysis import report

    if not (REFERENCE_RUN / "runs.csv").exists():
        pytest.skip("the CPU reference run is not in this checkout")
    shown = _shown(monkeypatch, str(REFERENCE_RUN), "report.figures")

    def titles(figs) -> list[str]:
        return [" ".join(f.axes[0].get_title().split()) for f in figs if isinstance(f, Figure)]

    run = report.load_run(REFERENCE_RUN)
    expected = titles(report.figures(run, report.summarise(run.runs)).values())
    assert len(expected) == 7 and titles(shown) == expected


def test_a_run_with_planned_cells_missing_says_so(monkeypatch, tmp_path) -> None:
    """A run still going or stopped, its plan.csv holding cells runs.csv has no row for: the
    notebook's last section said nothing of them (report.md opens with them), and where no
    cell had failed it said every cell finished ok. A cell --retry-failed ran again is
    listed with its earlier attempt, as report.md lists it."""
    from bench.harness.runner import RunDir

    if not (REFERENCE_RUN / "runs.csv").exists():
        pytest.skip("the CPU reference run is not in this checkout")
    run_dir = Path(shutil.copytree(REFERENCE_RUN, tmp_path / "stopped"))
    runs = pd.read_csv(run_dir / "runs.csv", dtype=str, keep_default_na=False)
    stopped = runs[(runs["status"] == "ok") & (runs["round"] == runs["round"].min())]
    stopped.to_csv(run_dir / "runs.csv", index=False)  # only its first round's ok cells ran
    # and one of them ran again by --retry-failed: its first attempt ran out of memory
    first = {**stopped.iloc[0].to_dict(), "status": "oom", "reason": "CUDA out of memory"}
    (run_dir / "retried").mkdir()
    RunDir(run_dir).retried.append([{**first, "attempt": 1, "attempt_dir": "retried/x-attempt1"}])
    (text,) = [m.data for m in _shown(monkeypatch, str(run_dir), "problems_markdown")]
    planned = len(pd.read_csv(run_dir / "plan.csv"))
    assert f"**Incomplete: {planned - len(stopped)} of {planned} planned cells have no row" in text
    assert "Every cell finished ok." not in text
    assert f"{planned - len(stopped)} planned cell(s) did not run" in text
    (row,) = [line for line in text.splitlines() if "retried/x-attempt1/" in line]
    assert "oom: CUDA out of memory" in row and "| ok |" in row


def _summary(cells: list[tuple[str, str, int, float]]) -> pd.DataFrame:
    """A summary (report.summarise's columns the trend reads) of one repeat per cell:
    (strategy, setting, world size, samples/s), labelled as load_run labels one run."""
    from bench.harness.results import case_labels

    labels = case_labels((n, s) for n, s, _, _ in cells)
    return pd.DataFrame(
        [
            {
                "strategy": labels[(n, s)],
                "strategy_name": n,
                "setting": s,
                "world_size": ws,
                "n_repeats": 1,
                **{f"samples_per_s_{k}": v for k in ("median", "min", "max")},
            }
            for n, s, ws, v in cells
        ]
    )


def test_the_trend_draws_one_line_per_cell_whatever_each_run_calls_it() -> None:
    """A run that swept precision names plain DDP `ddp_spawn [fp32]`, one that did not
    `ddp_spawn`: the trend across them drew two series of one point each, in two colours,
    as two cells, where `parabench compare` matches them as one."""
    from bench.analysis import plots

    plain = _summary([("ddp_spawn", "", 2, 800.0), ("single", "", 1, 900.0)])
    swept = _summary(
        [("ddp_spawn", "fp32", 2, 400.0), ("ddp_spawn", "bf16", 2, 600.0)]
        + [("single", "fp32", 1, 450.0)]
    )
    colours = plots.colour_map([*plain["strategy"], *swept["strategy"]])
    fig = plots.runs_trend({"a": plain, "b": swept}, colours=colours)
    assert plots.legend_labels(fig) == [
        "ddp_spawn [fp32] ws=2",
        "ddp_spawn [bf16] ws=2",
        "single ws=1",  # single ran in fp32 alone in both
    ]
    lines = {c.get_label(): c.lines[0] for c in fig.axes[0].containers}
    assert list(lines["ddp_spawn [fp32] ws=2"].get_ydata()) == [800.0, 400.0]
    assert list(lines["single ws=1"].get_ydata()) == [900.0, 450.0]
    # in the colour the notebook's other plots give it (in the first run, by its name there)
    assert lines["single ws=1"].get_color() == colours["single"]


def test_the_trends_across_runs_fit_their_legends(monkeypatch) -> None:
    """Two full matrices name some 30 cells, a legend line each: the trends were shown as
    drawn, the legend beside the axes longer than the figure, so the layout squeezed the
    axes to a strip and the last cells' names fell off the bottom; fitted (plots.fit_titles)
    as each run's plots are, the figure grows to hold it."""
    runs = [
        ROOT / "results" / "reference" / r for r in ("cpu-2core-mnist", "cpu-2core-mnist-3rounds")
    ]
    if not all((r / "runs.csv").exists() for r in runs):
        pytest.skip("the CPU reference runs are not in this checkout")
    shown = _shown(monkeypatch, ",".join(map(str, runs)), "runs_trend")
    assert len(shown) == 3
    for fig in shown:
        fig.draw_without_rendering()
        legend = fig.axes[0].get_legend().get_window_extent()
        assert len(fig.axes[0].get_legend().get_texts()) > 25
        assert legend.y0 >= 0 and legend.y1 <= fig.bbox.height
