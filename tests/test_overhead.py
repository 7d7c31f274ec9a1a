"""benchmarks/overhead.py's in-process measure of what the harness's loop adds to a step."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_loop_cost_reports_the_harness_step_against_a_bare_one():
    """--loop-cost-only runs the real loop (single's train_epoch) and a bare loop on a tiny
    model and prints both per-step figures and their difference, with no paired rounds."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--loop-cost-only"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    (line,) = out.strip().splitlines()
    m = re.fullmatch(
        r"loop cost \(cpu, step timing sync\): harness (\d+) us a step, bare loop (\d+) us; "
        r"the harness adds (-?\d+) us a step \(median of paired rounds\)",
        line,
    )
    assert m, line
    mine, bare, added = map(int, m.groups())
    assert mine > 0 and bare > 0 and abs(added) < max(mine, bare)
