"""make test's two parts (tests/conftest.py, shared_builds): tests that share a build (a
module-scoped fixture, a session run such as small_run) go to one xdist worker and to one
part, so that it is built once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import shared_builds


class Item:
    """What shared_builds reads of a collected test: its module, its fixtures' scopes (the
    whole closure, as pytest lists it) and its marks."""

    def __init__(self, module: str, serial: bool = False, **scopes: str) -> None:
        self.module = SimpleNamespace(__name__=module)
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
    other = Item("m2", cells="module")
    shared_builds(config(), [run_a, run_b, free, other])
    assert run_a.group == run_b.group == "m1"
    assert free.group is None
    assert other.group == "m2"


def test_a_test_using_two_builds_joins_their_groups():
    """small_run is one build for the whole session: its users in every module, and the
    module fixtures built from it, are one group."""
    report = Item("m1", small_run="session", rendered="module")
    report_only = Item("m1", reference="module")  # same module fixture instance per module
    compare = Item("m2", small_run="session")
    alone = Item("m3", cells="module")
    shared_builds(config(), [report, report_only, compare, alone])
    assert report.group == report_only.group == compare.group
    assert alone.group == "m3" != report.group


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
