"""Horovod in one rank, where the GPU reference run uses it: its all-reduce and fp16
compression still run (hvd.DistributedOptimizer skips its hooks at size 1 unless told),
and under --channels-last its parameters stay contiguous (its collectives refuse others).
Each check runs in its own process: Horovod's background thread lives as long as it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, need_horovod

pytestmark = pytest.mark.slow

ONE_RANK = textwrap.dedent(
    """
    import torch
    from torch import nn

    import strategies
    from strategies.base import RankContext, Setting

    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    s = strategies.get("horovod_fp16").create(ctx, {}, Setting(channels_last=True))
    s.setup_distributed()
    torch.manual_seed(0)
    # two input channels: a one-channel weight is contiguous in either memory format
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))
    s.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(5, 2, 8, 8).contiguous(memory_format=torch.channels_last)
    s.backward(nn.functional.cross_entropy(s.model(x), torch.randint(0, 3, (5,))))
    raw = [p.grad.clone() for p in s.model.parameters()]
    s.optimizer.synchronize()  # waits for the hooks' all-reduces and writes their results
    after = [p.grad for p in s.model.parameters()]
    print("contiguous", all(p.is_contiguous() for p in s.model.parameters()))
    print("fp16", all(torch.equal(a, r.half().float()) for a, r in zip(after, raw)))
    print("changed", any(not torch.equal(a, r) for a, r in zip(after, raw)))
    """
)


def test_one_rank_horovod_reduces_in_fp16_with_nchw_parameters() -> None:
    need_horovod()
    proc = subprocess.run(
        [sys.executable, "-c", ONE_RANK], capture_output=True, text=True, timeout=180, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split() for line in proc.stdout.splitlines() if line.count(" ") == 1)
    # --channels-last: NHWC inputs, NCHW parameters (broadcast_parameters raised otherwise)
    assert lines["contiguous"] == "True"
    # the gradients went through Horovod's fp16 compression and back: rounded to fp16
    assert lines["fp16"] == "True" and lines["changed"] == "True", proc.stdout


def test_an_nccl_build_without_nvcc_says_so_before_building(tmp_path: Path) -> None:
    """The GPU machine's build (the nccl variant) needs the CUDA toolkit's nvcc, which
    torch's wheels do not carry: where there is none, one line says so, not a CMake error
    minutes in."""
    if any(Path(d, "nvcc").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("nvcc is in /usr/bin here: this test hides it by PATH")
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",  # cmake and g++, not the toolkit's nvcc
        "CUDA_HOME": str(tmp_path / "no-cuda"),
        "PARABENCH_HOROVOD_VARIANT": "nccl",
        "PARABENCH_CACHE": str(tmp_path / "cache"),  # no cached wheel to reuse
    }
    proc = subprocess.run(
        [str(ROOT / "scripts" / "build_horovod.sh"), sys.executable],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"ERROR: nccl variant: no nvcc in {tmp_path / 'no-cuda'}/bin or on PATH; install the "
            "CUDA toolkit or set CUDA_HOME to it"
        )
    ), proc.stderr


ADAMW = textwrap.dedent(
    """
    import torch
    from torch import nn

    import strategies
    from strategies.base import RankContext, Setting

    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    s = strategies.get("horovod").create(ctx, {}, Setting())
    s.setup_distributed()
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    before = [p.detach().clone() for p in model.parameters()]
    s.attach(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    print("moved", max((p - b).abs().max().item() for p, b in zip(model.parameters(), before)))
    """
)


def test_horovod_leaves_the_initial_weights_as_they_are_under_adamw() -> None:
    """Every strategy starts from the same weights: Horovod's broadcast_optimizer_state
    filled the new optimizer's empty state by a step on zero gradients, which AdamW's weight
    decay turned into an update of every weight before the first batch."""
    need_horovod()
    proc = subprocess.run(
        [sys.executable, "-c", ADAMW], capture_output=True, text=True, timeout=180, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "moved 0.0" in proc.stdout.splitlines(), proc.stdout


def test_a_horovod_that_does_not_import_is_listed_unavailable_with_its_first_line(
    monkeypatch, capsys
) -> None:
    """A Horovod whose extension was not built says so on two lines (horovod/common/util.py):
    the listing kept the first line and lost the parenthesis that closes it."""
    import builtins

    from bench.cli import main

    real = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "horovod.torch":
            raise ImportError(
                "Extension horovod.torch has not been built: mpi_lib_v2.so not found\n"
                "If this is not expected, reinstall Horovod with HOROVOD_WITH_PYTORCH=1"
            )
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    assert main(["list", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(out) if line.startswith("  horovod "))
    assert "unavailable" in out[row]
    assert out[row + 1].strip() == (
        "-> Horovod is not installed (ImportError: Extension horovod.torch has not been built: "
        "mpi_lib_v2.so not found); build it against this torch with `make horovod`"
    )


ABLATION = textwrap.dedent(
    """
    import warnings

    import torch
    from torch import nn

    import strategies
    from strategies.base import RankContext, Setting

    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    s = strategies.get("horovod").create(ctx, {}, Setting())
    s.setup_distributed()
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    s.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    reduced = []
    launch = s.optimizer._allreduce_grad_async
    s.optimizer._allreduce_grad_async = lambda p: reduced.append(p) or launch(p)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        s._step(x, y)
        print("synced", len(reduced))
        with s.sync_off():
            s._step(x, y)
        print("local", len(reduced))
        s._step(x, y)
        print("again", len(reduced))
    print("warnings", len(said))
    """
)


def test_a_step_without_gradient_sync_all_reduces_nothing_on_its_way_out() -> None:
    """The communication probe's steps without synchronisation (sync_off) left through
    synchronize(), which all-reduced the gradients the step had just kept local (a step's
    traffic, untimed, after each), and the next synchronised step then warned in every
    cell's log that a step after synchronize() "can cause training slowdown"."""
    need_horovod()
    proc = subprocess.run(
        [sys.executable, "-c", ABLATION], capture_output=True, text=True, timeout=180, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split() for line in proc.stdout.splitlines() if line.count(" ") == 1)
    # two parameters: two all-reduces in each synchronised step, none for the local one
    assert (lines["synced"], lines["local"], lines["again"]) == ("2", "2", "4"), proc.stdout
    assert lines["warnings"] == "0", proc.stderr[-2000:]
