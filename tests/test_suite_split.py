"""make test's two parts (tests/suite_parts.py, shared_builds): tests that share a build (a
module-scoped fixture, a session run such as small_run) go to one xdist worker and to one
part, so that it is built once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.suite_parts import shared_builds

ROOT = Path(__file__).resolve().parent.parent


class Item:
    """What shared_builds reads of a collected test: its file, its fixtures' scopes (the
    whole closure, as pytest lists it) and its marks."""

    def __init__(self, module: str, serial: bool = False, **scopes: str) -> None:
        self.nodeid = f"{module}.py::test"
        defs = {name: (SimpleNamespace(scope=scope),) for name, scope in scopes.items()}
        self._fixtureinfo = SimpleNamespace(name2fixturedefs=defs)
        self.marks = [pytest.mark.serial.mark] if serial else []

    def get_closest_marker(self, name: str):
        return next((m for m in reversed(self.marks) if m.name == name), None)

    def add_marker(self, mark) -> None:
        self.marks.append(mark.mark)

    @property
    def group(self) -> str | None:
        mark = self.get_closest_marker("xdist_group")
        return mark.args[0] if mark else None


def config(xdist: bool = True):
    return SimpleNamespace(pluginmanager=SimpleNamespace(hasplugin=lambda name: xdist))


def test_tests_sharing_a_build_share_a_group_and_the_others_are_free():
    run_a = Item("m1", run="module", tmp_path="function")
    run_b = Item("m1", run="module", data_root="session")
    free = Item("m1", tmp_path="function", data_root="session")  # a session fixture, not a run
    other_build = Item("m1", reference="module")  # another build of the file's: apart
    other_file = Item("m2", run="module")  # its own instance of a fixture of that name
    by_class = Item("m2", per_class="class")
    shared_builds(config(), [run_a, run_b, free, other_build, other_file, by_class])
    assert run_a.group == run_b.group == "m1.py::run"
    assert free.group is None
    assert other_build.group == "m1.py::reference"
    assert other_file.group == "m2.py::run"
    assert by_class.group == "m2.py::per_class"


def test_a_test_using_two_builds_joins_their_groups():
    """small_run is one build for the whole session: its users in every file, and the
    fixtures built from it, are one group."""
    report = Item("m1", small_run="session", rendered="module")
    rendered = Item("m1", rendered="module")
    compare = Item("m2", small_run="session")
    alone = Item("m3", cells="module")
    shared_builds(config(), [report, rendered, compare, alone], {"small_run"})
    assert report.group == rendered.group == compare.group
    assert alone.group == "m3.py::cells" != report.group


def test_a_group_with_a_serial_test_is_serial_whole():
    """Its build is then made once, in the serial part, not again in the parallel one."""
    timed = Item("m1", serial=True, probed="module")
    reader = Item("m1", probed="module")
    unshared = Item("m1", tmp_path="function")
    elsewhere = Item("m2", cells="module")
    shared_builds(config(xdist=False), [reader, timed, unshared, elsewhere])
    assert reader.get_closest_marker("serial") is not None
    assert unshared.get_closest_marker("serial") is None
    assert elsewhere.get_closest_marker("serial") is None
    assert reader.group is None  # no xdist (gpu-check's --no-deps install): no group marks


MODULE = """
import os
from pathlib import Path

import pytest

LOG = Path(os.environ["SPLIT_LOG"])


def note(what):
    with LOG.open("a") as f:
        f.write(f"{what} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")


@pytest.fixture(scope="module")
def built():
    note(f"built-{__name__}")


@pytest.mark.parametrize("i", range(6))
def test_shares(built, i):
    note(f"test-{__name__}")


@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    note(f"free-{__name__}")
"""


def test_under_xdist_a_modules_build_is_made_once_on_one_worker(tmp_path):
    """The groups reach xdist's scheduler: pytest 9.2 made xdist's loadgroup drop them
    silently (pytest-dev/pytest-xdist#1386), and every worker built every module fixture
    again, which is what this catches (constraints.txt pins a pytest where they hold)."""
    pytest.importorskip("xdist")
    # the suite's own hook: the groups must be marked before xdist reads them (tryfirst)
    hook = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    (tmp_path / "conftest.py").write_text(hook)
    for name in ("test_a", "test_b"):
        (tmp_path / f"{name}.py").write_text(MODULE)
    log = tmp_path / "log.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPLIT_LOG": str(log)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
    argv += ["--dist", "loadgroup", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in log.read_text().splitlines()]
    for module in ("test_a", "test_b"):
        built = [w for what, w in lines if what == f"built-{module}"]
        ran = {w for what, w in lines if what == f"test-{module}"}
        assert len(built) == 1, f"{module}'s module fixture was built on {built}"
        assert ran == set(built), (module, ran, built)
    free = {w for what, w in lines if what.startswith("free-")}
    assert free and free <= {"gw0", "gw1"}, free  # on the workers, where they fell
