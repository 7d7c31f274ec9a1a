"""notebooks/compare.ipynb executes end to end (nbclient) on two real runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat
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


def test_notebook_runs_on_two_runs(small_run: Path, tmp_path: Path, monkeypatch) -> None:
    a = Path(shutil.copytree(small_run, tmp_path / "a"))
    b = scaled_copy(a, tmp_path / "b", speed=0.5)  # B: every cell half as fast
    # A relative run is read from the repository's root: the notebook must find that root.
    a_relative = os.path.relpath(a, ROOT)
    monkeypatch.setenv("PARABENCH_RUNS", f"{a_relative},{b}")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    # 3 across-run trends, then 6 plots for each of the 2 runs
    assert len(images) == 3 + 6 * 2
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "SLOW-DOWN" in text  # the compare table of B against A
    markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    ok = {"single", "ddp_spawn"}
    assert all(name in markdown for name in ok)
    # the env var, not the default, chose the runs
    first = nb.cells[1].outputs[0]["data"]["text/plain"]
    assert a_relative in first and str(b) in first


def test_notebook_fails_clearly_without_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PARABENCH_RUNS", str(tmp_path / "nope"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.raises(Exception, match="no such run directory"):
        NotebookClient(
            nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
