"""benchmarks/test_collectives.py (make microbench): its peer rank and what it prints."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent

# A parent that starts the peer rank as the micro-benchmark does, at a store nobody holds,
# and dies at once: a pytest killed before its peer reached the store.
ORPHAN = f"""
import importlib.util, os, sys
sys.path.insert(0, {str(ROOT)!r})
from bench.harness.proc import free_port
spec = importlib.util.spec_from_file_location(
    "test_collectives", {str(ROOT / "benchmarks" / "test_collectives.py")!r}
)
module = sys.modules["test_collectives"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module._start_peer(free_port(), "gloo", "cpu").pid, flush=True)
os._exit(0)
"""


def test_the_peer_rank_dies_with_the_pytest_that_started_it(tmp_path):
    out = tmp_path / "out"
    # into a file, not a pipe: the peer holds what it inherits, and a pipe would wait for it
    with out.open("w") as f:
        code = subprocess.run(
            [sys.executable, "-c", ORPHAN], stdout=f, stderr=f, timeout=120, cwd=ROOT
        ).returncode
    assert code == 0, out.read_text()
    peer = psutil.Process(int(out.read_text().split()[-1]))
    try:
        # it retried the dead store for minutes (its 60 s timeout did not end it either)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error):
                if peer.status() != psutil.STATUS_ZOMBIE:
                    time.sleep(0.2)
                    continue
            break
        else:
            raise AssertionError("the peer rank outlived its parent by 40 s")
    finally:
        with contextlib.suppress(psutil.Error):
            peer.kill()
