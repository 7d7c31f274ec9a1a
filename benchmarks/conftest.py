"""Micro-benchmark session: an nccl-tests style bandwidth table after pytest-benchmark's own.

pytest-benchmark prints times only; the bus bandwidth that makes collectives comparable
lives in each benchmark's extra_info, so it is gathered here and printed once at the end.
"""

from __future__ import annotations

from typing import Any

import pytest

ROWS = pytest.StashKey[list[dict[str, Any]]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[ROWS] = []


@pytest.fixture
def bandwidth_rows(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """Append a benchmark's extra_info here to have it in the end-of-session table."""
    return request.config.stash[ROWS]


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's timing tables
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    rows = [r for r in config.stash.get(ROWS, []) if "busbw_GBps" in r]
    if not rows:
        return
    tr = terminalreporter
    tr.section("collective bandwidth (nccl-tests definitions; median time)")
    tr.write_line(
        f"{'backend':<8}{'op':<16}{'device':<7}{'ranks':>6}{'size (B)':>12}{'time (us)':>12}"
        f"{'algbw (GB/s)':>14}{'busbw (GB/s)':>14}"
    )
    for r in sorted(rows, key=lambda r: (r["backend"], r.get("op", ""), r["message_bytes"])):
        tr.write_line(
            f"{r['backend']:<8}{r.get('op', 'all_reduce'):<16}{r['device']:<7}{r['world_size']:>6}"
            f"{r['message_bytes']:>12}{r['latency_us_median']:>12.1f}"
            f"{r['algbw_GBps']:>14.3f}{r['busbw_GBps']:>14.3f}"
        )
