"""How `make test` splits the suite: on pytest-xdist workers (--dist loadgroup), then the
tests marked serial alone (they time something or wait on a fixed deadline). Imports no
torch: tests/test_suite_split.py runs it under a real xdist."""

from __future__ import annotations

from collections.abc import Collection

import pytest


def shared_builds(config, items, shared_session: Collection[str] = ()) -> None:
    """Tests that share a build (a module-scoped fixture of their module, or one of
    `shared_session`, such as conftest's small_run) get one xdist_group, so that it is built
    once: on one worker, and in one of the two parts (a group with a serial test is serial
    whole). A test that uses two joins their groups."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    shares = []
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        keys = [name for name in defs if name in shared_session]
        if any(d[-1].scope == "module" for d in defs.values()):
            keys.append(item.module.__name__)
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
    if getattr(config.option, "loadgroup", False):  # an xdist worker's collection
        # the groups first, as xdist hands out work in this order: the long ones start at
        # once and single tests fill the end, where one group left would keep a worker idle
        grouped = {id(item) for item, _ in shares}
        items.sort(key=lambda item: id(item) not in grouped)
