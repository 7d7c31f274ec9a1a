"""The rooms of bench/ keep their one-way imports (bench/__init__.py, README "Layout"):
workload <- harness <- analysis, and the strategies sit with the harness. Lazy imports
inside functions count too: they are the ones that creep back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: what a package's modules may not import (the CLI sits on top of everything)
FORBIDDEN = {
    "bench/workload": ("bench.harness", "bench.analysis", "bench.cli", "strategies"),
    "bench/harness": ("bench.analysis", "bench.cli"),
    "strategies": ("bench.analysis", "bench.cli"),
    "bench/config.py": ("bench.analysis", "bench.cli"),
    # `import bench` (every rank, every command) loads no room
    "bench/__init__.py": ("bench.workload", "bench.harness", "bench.analysis", "bench.cli"),
}


def imported(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file under `root` imports, anywhere in it; `from bench import x`
    counts as bench.x (x may be a module), and a relative import as its absolute name."""
    package = list(path.relative_to(root).parent.parts)  # an __init__.py's own, too
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def breaches(where: str, root: Path = ROOT) -> list[str]:
    base = root / where
    files = [base] if base.suffix == ".py" else sorted(base.rglob("*.py"))
    assert files, f"nothing to check under {where}"
    return [
        f"{f.relative_to(root)} imports {name}"
        for f in files
        for name in sorted(imported(f, root))
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[where])
    ]


@pytest.mark.parametrize("where", sorted(FORBIDDEN))
def test_imports_go_one_way(where: str) -> None:
    assert breaches(where) == []


def test_a_lazy_or_relative_backward_import_is_caught(tmp_path: Path) -> None:
    module = tmp_path / "bench" / "workload" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from . import models\n"
        "def f():\n"
        "    from bench.analysis import report\n"
        "    from ..harness import runner\n"
        "    import bench.cli\n"
    )
    assert breaches("bench/workload", tmp_path) == [
        "bench/workload/m.py imports bench.analysis",
        "bench/workload/m.py imports bench.analysis.report",
        "bench/workload/m.py imports bench.cli",
        "bench/workload/m.py imports bench.harness",
        "bench/workload/m.py imports bench.harness.runner",
    ]
    assert "bench.workload.models" in imported(module, tmp_path)


def test_every_module_is_in_a_room() -> None:
    top = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    assert top == ["__init__.py", "cli.py", "config.py"], top


@pytest.mark.parametrize("name", ["models", "report", "collectives"])
def test_an_old_module_name_is_the_new_module_with_a_warning(name: str, monkeypatch) -> None:
    import importlib
    import sys

    import bench

    new = importlib.import_module(f"bench.{bench.MOVED[name]}.{name}")
    monkeypatch.delitem(sys.modules, f"bench.{name}", raising=False)
    with pytest.warns(DeprecationWarning, match=f"bench.{name} is now {new.__name__}"):
        old = importlib.import_module(f"bench.{name}")
    assert old is new  # one module: its state (registries, caches) is not loaded twice


def test_every_old_name_has_its_new_module() -> None:
    import bench

    for name, room in bench.MOVED.items():
        assert (ROOT / "bench" / room / f"{name}.py").is_file(), name
        assert not (ROOT / "bench" / f"{name}.py").exists(), name


def test_an_old_module_run_with_dash_m_says_where_it_went() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "bench.collectives", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "bench.collectives is now bench.harness.collectives" in done.stderr, done.stderr


def test_nothing_here_imports_an_old_name() -> None:
    import bench

    old = {f"bench.{name}" for name in bench.MOVED}
    files = [
        p
        for d in ("bench", "strategies", "tests", "examples", "benchmarks", "scripts")
        for p in sorted((ROOT / d).rglob("*.py"))
    ]
    assert len(files) > 50
    found = [f"{f.relative_to(ROOT)}: {n}" for f in files for n in imported(f) if n in old]
    assert found == []


def test_the_old_names_finder_is_installed_once_also_after_a_reload() -> None:
    import importlib
    import sys

    import bench

    importlib.reload(bench)
    finders = [f for f in sys.meta_path if type(f).__qualname__ == "_Moved"]
    assert len(finders) == 1
