"""How `make test` splits the suite: on pytest-xdist workers (--dist loadgroup), then the
tests marked serial alone (they time something or wait on a fixed deadline).
tests/test_suite_split.py runs it under a real xdist."""

from __future__ import annotations

from collections.abc import Collection

import pytest

#: a fixture of these is built once for the tests of its file that use it (of a class: at most)
SCOPES = ("module", "class")


def shared_builds(config, items, shared_session: Collection[str] = ()) -> None:
    """Tests that share a build (a fixture of their module's or class's scope, or one of
    `shared_session`, such as conftest's small_run) get one xdist_group, so that it is built
    once: on one worker, and in one of the two parts (a group with a serial test is serial
    whole). A test that uses two joins their groups. (xdist hands out the groups with the
    most tests first.)"""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    shares = []
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        where = item.nodeid.split("::")[0]  # its file: an instance of such a fixture per file
        keys = [name for name in defs if name in shared_session]
        keys += [f"{where}::{name}" for name, d in defs.items() if d[-1].scope in SCOPES]
        for key in keys[1:]:
            parent[root(key)] = root(keys[0])
        if keys:
            shares.append((item, keys[0]))
    serial = {root(key) for item, key in shares if item.get_closest_marker("serial")}
    xdist = config.pluginmanager.hasplugin("xdist")  # not installed with --no-deps (gpu-check)
    for item, key in shares:
        if xdist:
            item.add_marker(pytest.mark.xdist_group(root(key)))
        if root(key) in serial:
            item.add_marker(pytest.mark.serial)
