"""`make gpu-check` on a machine without a GPU: one line, exit 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _check(tmp_path, python: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=python, GPU_CHECK_OUT=str(tmp_path / "out"))
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    if torch.cuda.is_available():
        import pytest

        pytest.skip("this machine has a GPU: gpu-check would run")
    done = _check(tmp_path, sys.executable)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpu-check: torch sees no CUDA device here (torch.cuda.is_available() is False); "
        "it needs one"
    ]
    assert not (tmp_path / "out").exists()


def test_a_python_without_torch_is_named(tmp_path):
    done = _check(tmp_path, "/bin/false")
    assert done.returncode == 2 and "cannot import torch" in done.stderr
