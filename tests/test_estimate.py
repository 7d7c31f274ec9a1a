"""The dry run's step timing (bench.harness.estimate.per_sample_ms): the fastest of a few
steps, so one step slowed by other work on the machine does not become the estimate."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path

import pytest

from bench.config import RunConfig
from bench.harness import estimate
from bench.workload import data


class Clock:
    """perf_counter for per_sample_ms: each step (two readings) lasts the next of
    `steps` seconds."""

    def __init__(self, steps: list[float]) -> None:
        self.steps, self.now, self.reads = list(steps), 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # a step's end
            self.now += self.steps.pop(0)
        return self.now


@pytest.fixture
def mnist(data_root):
    cfg = RunConfig(dataset="mnist", data_root=str(data_root), device="cpu", limit=64)
    return cfg, data.load(cfg)


@pytest.mark.parametrize(
    "steps, timed, fastest",
    [
        # a warm-up, then a busy machine's slow steps and one at its own speed: 5 fit
        ([5.0, 0.3, 0.3, 0.004, 0.3, 0.3], 5, 0.004),
        # slow steps: two timed ones past a second, as many as before
        ([9.0, 0.8, 0.6], 2, 0.6),
        # a step of seconds: the one timed step is the figure, where two held the dry run
        # of a long --seq-len for minutes
        ([30.0, 12.0, 11.0], 1, 12.0),
    ],
)
def test_the_fastest_of_as_many_steps_as_fit_in_a_second(
    mnist, monkeypatch, steps, timed, fastest
) -> None:
    cfg, bundle = mnist
    clock = Clock(steps)
    monkeypatch.setattr(estimate.time, "perf_counter", clock)
    ms = estimate.per_sample_ms(cfg, bundle, batch=8)
    assert clock.reads == 2 * (timed + 1)  # the warm-up, then the timed steps
    assert ms == pytest.approx(1e3 * fastest / 8)


def test_the_evaluation_is_a_forward_at_its_own_batch_whatever_the_training_batch(
    mnist, monkeypatch
) -> None:
    """The evaluation runs forwards without gradients of every held-out sample at batch 256
    on one device, at any --global-batch: its part of the estimate is a forward timed at a
    batch of its own, not the training step's time at a batch of at most 8 (at
    --global-batch 1 that made a few-step run's estimate minutes of evaluation)."""
    import torch

    from bench.harness import runner

    cfg, bundle = mnist
    held = len(bundle.held_out)
    calls = []

    def stub(cfg, bundle, precision="fp32", batch=8, forward=False):
        calls.append((batch, forward))
        return 3.0 if forward else 0.0  # the training steps take no time here

    monkeypatch.setattr(estimate, "per_sample_ms", stub)
    for global_batch in (1, 8):
        calls.clear()
        run = cfg.replace(
            strategies=["single"], world_sizes=[1], global_batch=global_batch, epochs=2,
            max_steps=6, warmup_steps=1,
        )  # fmt: skip
        est = estimate.estimate(run, runner.plan(run))
        assert (estimate.EVAL_TIMED_BATCH, True) in calls, calls
        assert est.total_s - est.startup_s == pytest.approx(2 * 3.0 * held / 1e3)
    calls.clear()
    estimate.estimate(run.replace(eval_samples=0), runner.plan(run.replace(eval_samples=0)))
    assert calls == [(8, False)]  # nothing evaluated: no forward timed

    seen = []  # the forward timed: in eval mode, without gradients, on held-out samples
    build = estimate.models.build

    def recording(*a, **k):
        net = build(*a, **k)
        net.register_forward_hook(
            lambda m, i, o: seen.append((m.training, torch.is_grad_enabled(), len(i[0])))
        )
        return net

    monkeypatch.setattr(estimate.models, "build", recording)
    per_sample_ms(cfg, bundle, batch=64, forward=True)
    assert seen and set(seen) == {(False, False, min(64, held))}


per_sample_ms = estimate.per_sample_ms  # the real one, where a test stubs the module's


def test_a_model_too_big_for_one_device_is_planned_without_its_steps(mnist, monkeypatch):
    """A model only sharding can train runs out of memory in the estimate's whole-model
    step: the plan leaves the steps out and says why, instead of refusing the run; data
    that does not fit is still refused before anything starts."""
    import torch

    import strategies
    from bench.config import ConfigError
    from bench.harness import runner

    cfg, _ = mnist
    cfg = cfg.replace(strategies=["single", "ddp_spawn"], world_sizes=[1, 2], global_batch=8)
    cells = runner.plan(cfg)

    def oom(*_a, **_k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(estimate, "per_sample_ms", oom)
    est = estimate.estimate(cfg, cells)
    assert est.per_sample_ms is None and est.steps == 8 and est.train_samples == 64
    launchers = [strategies.get(c.strategy).launcher for c in cells if not c.status]
    assert sorted(launchers) == ["inprocess", "spawn", "spawn"]
    assert est.total_s == est.startup_s == sum(estimate.LAUNCH_S[x] for x in launchers)
    line = est.line()
    assert "of start-up and the steps, which could not be timed here: a step of the whole" in line
    assert "does not fit in one machine's memory (OutOfMemoryError: CUDA out of memory." in line
    assert "cells that shard it may still run" in estimate.plan_text(cfg, cells, est)

    monkeypatch.setattr(estimate.data, "load", oom)
    with pytest.raises(ConfigError, match="the run's data does not fit in this machine's memory"):
        estimate.estimate(cfg, cells)


def test_timing_in_a_child_process_as_on_a_gpu(mnist, tmp_path) -> None:
    """On a GPU the steps are timed in a child process, so the harness holds no CUDA context
    through the run (tests/test_gpu.py checks that there): the child loads the data and
    times each precision itself, and what it raises (out of memory) is raised here."""
    import os

    import torch

    cfg, bundle = mnist
    ms = estimate.timed(cfg, bundle, ["fp32", "bf16"], isolate=True)
    assert sorted(ms) == ["bf16", "fp32"], ms
    assert all(0 < v < 1e3 for pair in ms.values() for v in pair), ms  # training, evaluation
    model = tmp_path / "oom_model.py"
    model.write_text(
        "import os, torch\n"
        "class Big(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        f"        assert os.getpid() != {os.getpid()}, 'a step in the harness process'\n"
        "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 9.00 GiB')\n"
        "def build(num_classes):\n"
        "    return Big(1, num_classes)\n"
    )
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 9.00 GiB"):
        estimate.timed(cfg.replace(model=f"{model}:build"), bundle, ["fp32"], isolate=True)


def test_the_timing_child_dies_with_a_killed_harness(tmp_path, data_root) -> None:
    """The child timing the steps (on a GPU, holding its memory) asks to die with the
    harness: SIGKILLed, the harness left it timing on to its end, minutes for a large model."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    marker = tmp_path / "child.pid"
    model = tmp_path / "stuck_model.py"
    model.write_text(
        "import os, time, torch\n"
        "class Stuck(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        f"        open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "        time.sleep(300)\n"
        "def build(num_classes):\n"
        "    return Stuck(1, num_classes)\n"
    )
    harness = (
        "import os, threading, time\n"
        "from bench.config import RunConfig\n"
        "from bench.harness import estimate\n"
        f"cfg = RunConfig(dataset='mnist', data_root={str(data_root)!r}, device='cpu', limit=64,\n"
        f"                model={str(model) + ':build'!r})\n"
        "go = lambda: estimate.timed(cfg, None, ['fp32'], isolate=True)\n"
        "threading.Thread(target=go, daemon=True).start()\n"
        f"while not os.path.exists({str(marker)!r}):\n"
        "    time.sleep(0.05)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", harness], cwd=root, timeout=120, check=False)
    child = int(marker.read_text())
    try:
        gone, _ = psutil.wait_procs([psutil.Process(child)], timeout=10)
    except psutil.NoSuchProcess:
        gone = [child]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    assert gone, "the timing child outlived its harness"


def test_a_long_run_points_to_dry_run_only_outside_one(mnist) -> None:
    """Printed as a run starts, a long estimate names --dry-run for the plan; printed by
    --dry-run, under the plan itself, it does not send the reader to --dry-run again."""
    from bench.harness import runner

    cfg, _ = mnist
    cfg = cfg.replace(strategies=["single"], world_sizes=[1], global_batch=8)
    long = estimate.Estimate(
        total_s=estimate.LONG_S + 60, startup_s=4.0, per_sample_ms=1.0, steps=8,
        train_samples=64, data="mnist",
    )  # fmt: skip
    assert "that is long on this machine" in long.line()
    assert long.line().endswith("--dry-run shows the plan")
    plan = estimate.plan_text(cfg, runner.plan(cfg), long)
    assert "that is long on this machine" in plan and "--dry-run" not in plan


def _planned(mnist, tmp_path, source: str, monkeypatch, child: bool):
    """The single cell of a model written from `source`, planned at global batch 8, and
    the estimate's steps timed here or (`child`) in a child process, as on a GPU."""
    from bench.harness import runner

    model = tmp_path / "user_model.py"
    model.write_text(source)
    cfg, _ = mnist
    cfg = cfg.replace(
        model=f"{model}:build", strategies=["single"], world_sizes=[1], global_batch=8
    )
    timed = estimate.timed
    monkeypatch.setattr(estimate, "timed", lambda c, b, p, isolate: timed(c, b, p, isolate=child))
    return cfg, runner.plan(cfg)


@pytest.mark.parametrize("child", [False, True], ids=["here", "child process"])
def test_a_step_that_cannot_train_is_a_config_error_naming_model_and_data(
    mnist, tmp_path, monkeypatch, child
) -> None:
    """A training step that fails other than out of memory (here: no parameter takes a
    gradient) is the model's or the data's fault, in every cell alike: one line before
    anything starts, also where the step ran in a child process (on a GPU) and what it
    raised was raised again here."""
    from bench.config import ConfigError

    frozen = (
        "import torch\n"
        "def build(num_classes=10):\n"
        "    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, num_classes))\n"
        "    net.requires_grad_(False)\n"
        "    return net\n"
    )
    cfg, cells = _planned(mnist, tmp_path, frozen, monkeypatch, child)
    with pytest.raises(ConfigError) as err:
        estimate.estimate(cfg, cells)
    assert str(err.value) == (
        f"model {cfg.model} on data mnist: a training step (forward, loss, backward, optimizer "
        "step on a batch of its samples) fails: RuntimeError: element 0 of tensors does not "
        "require grad and does not have a grad_fn"
    )


def test_a_timing_process_that_dies_leaves_the_steps_out_not_the_run(
    mnist, tmp_path, monkeypatch
) -> None:
    """The child timing the steps (on a GPU) killed outright (the kernel's out-of-memory
    killer, a crash in a library): the plan goes on without the steps' time, saying why,
    rather than calling the model bad input."""
    import os

    dies = (
        "import os, torch\n"
        "class Dies(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        f"        if os.getpid() != {os.getpid()}:  # the child timing the steps only\n"
        "            os._exit(9)\n"
        "        return super().forward(x)\n"
        "def build(num_classes=10):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), Dies(784, num_classes))\n"
    )
    cfg, cells = _planned(mnist, tmp_path, dies, monkeypatch, child=True)
    est = estimate.estimate(cfg, cells)
    assert est.per_sample_ms is None
    assert "the process timing a step of" in est.line() and "ended abruptly" in est.line()


@pytest.mark.parametrize("child", [False, True], ids=["here", "child process"])
def test_a_training_sample_that_cannot_be_read_is_a_data_error_naming_it(
    tmp_path, data_root, monkeypatch, child
) -> None:
    """The estimate reads the first training samples: an image among them that cannot be
    decoded (or a data set's __getitem__ that raises) is the data's fault, not a training
    step's: one line naming the file and what to do, here and from the child process."""
    from bench.config import ConfigError
    from bench.harness import runner
    from tests.test_data import _image_tree

    tree = _image_tree(tmp_path, data_root)
    bad = next(sorted(tree.iterdir())[1].iterdir())
    bad.write_bytes(bad.read_bytes()[:2000])  # a truncated JPEG: PIL fails on decoding
    cfg = RunConfig(
        dataset="imagenet-subset", data_root=str(tree), model="resnet18", image_size=32,
        device="cpu", strategies=["single"], world_sizes=[1], global_batch=3, warmup_steps=0,
    )  # fmt: skip
    timed = estimate.timed
    monkeypatch.setattr(estimate, "timed", lambda c, b, p, isolate: timed(c, b, p, isolate=child))
    with pytest.raises(ConfigError) as err:
        estimate.estimate(cfg, runner.plan(cfg))
    said = str(err.value)
    assert said.startswith(
        "data imagenet-subset: training sample 1 cannot be read, and every cell would read "
        f"it: OSError: {bad} cannot be read as an image ("
    ), said
    assert said.endswith("; replace or remove the file") and "training step" not in said
    own = tmp_path / "own_data.py"
    own.write_text(
        "import torch\n"
        "class Broken(torch.utils.data.Dataset):\n"
        "    num_classes = 2\n"
        "    def __len__(self):\n"
        "        return 40\n"
        "    def __getitem__(self, i):\n"
        "        if i == 2:\n"
        "            raise ValueError(f'record {i} has no label')\n"
        "        return torch.zeros(1, 28, 28), i % 2\n"
        "def broken():\n"
        "    return Broken()\n"
    )
    cfg = cfg.replace(dataset=f"{own}:broken", model="mnist_cnn", global_batch=4)
    with pytest.raises(ConfigError) as err:
        estimate.estimate(cfg, runner.plan(cfg))
    assert str(err.value) == (
        f"data {own}:broken: training sample 2 cannot be read, and every cell would read it: "
        "ValueError: record 2 has no label; mend the data set's __getitem__"
    )


def test_the_steps_are_timed_with_the_threads_single_has(mnist, monkeypatch) -> None:
    """single at world size 1 computes with the cores this process may use (its CPU
    affinity: a SLURM job's share of a node, a container's): so does the timing, not with
    every core of the machine, whose threads would fight over the few it has."""
    import os

    import torch

    from bench.harness import env, runner

    cfg, _ = mnist
    cfg = cfg.replace(strategies=["single"], world_sizes=[1], global_batch=8)
    monkeypatch.setattr(os, "cpu_count", lambda: 64 * env.cpu_cores())
    seen = []
    timed = estimate.per_sample_ms

    def counting(*a, **k):
        seen.append(torch.get_num_threads())
        return timed(*a, **k)

    monkeypatch.setattr(estimate, "per_sample_ms", counting)
    monkeypatch.setattr(estimate, "CpuShare", Share)  # a quiet machine: timed once
    estimate.estimate(cfg, runner.plan(cfg))
    assert seen and set(seen) == {env.cpu_cores()}  # the training step's and the forward's


def test_the_estimate_says_when_other_processes_used_the_cpus_as_it_timed(mnist) -> None:
    """Steps timed beside other work run on what it leaves: the line says how much the
    other processes took, so that a figure twenty times the quiet machine's is read as
    such; on its own the machine's share is not said."""
    import subprocess
    import sys

    from bench.harness import runner
    from bench.harness.env import cpu_cores

    cfg, _ = mnist
    cfg = cfg.replace(strategies=["single"], world_sizes=[1], global_batch=8)
    spin = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpu_cores())
    ]
    try:
        busy = estimate.estimate(cfg, runner.plan(cfg))
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert busy.other_cpu_pct >= estimate.BUSY_PCT
    assert f"other processes used {busy.other_cpu_pct:.0f} % of the CPUs" in busy.line()
    quiet = dataclasses.replace(busy, other_cpu_pct=estimate.BUSY_PCT / 2)
    assert "other processes" not in quiet.line()
    assert "other processes" not in dataclasses.replace(busy, other_cpu_pct=math.nan).line()


def test_timing_slow_steps_says_so_while_it_goes_on(mnist, monkeypatch, capsys) -> None:
    """A model whose steps take minutes here says, on stderr, what the estimate is doing,
    where the dry run of a long --seq-len sat silent; a quick one says nothing."""
    from bench.harness import runner

    cfg, _ = mnist
    cfg = cfg.replace(strategies=["single"], world_sizes=[1], global_batch=4)
    timed = estimate.timed

    def slow(cfg, bundle, precisions, isolate):  # 1.5 s, past SLOW_S: a stand-in's figures
        time.sleep(1.5)  # (the notice's thread has 1.3 s to say it, on a busy machine too)
        return {p: (1.0, 0.5) for p in precisions}

    monkeypatch.setattr(estimate, "timed", slow)
    monkeypatch.setattr(estimate, "SLOW_S", 0.2)
    estimate.estimate(cfg, runner.plan(cfg))
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == (
        "the estimate is still timing a few steps of mnist_cnn at batch 4 (fp32), 0.2 s so far\n"
    )
    monkeypatch.setattr(estimate, "timed", timed)
    monkeypatch.setattr(estimate, "SLOW_S", 60.0)
    estimate.estimate(cfg, runner.plan(cfg))
    assert capsys.readouterr().err == ""


def test_an_interrupt_stops_the_timing_child_at_once(mnist, tmp_path, monkeypatch) -> None:
    """Ctrl-C or SIGTERM while the child process (on a GPU) times a slow model's steps
    stops it there and then, where leaving the process pool waited for the task: a kill
    hung until the timing ended, which is longest for exactly the slowest models."""
    import os
    import signal

    import psutil

    stepping = tmp_path / "stepping"
    slow = (
        "import os, time, torch\n"
        "class Slow(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        f"        if os.getpid() != {os.getpid()}:  # the child timing the steps only\n"
        f"            open({str(stepping)!r}, 'w').close()\n"
        "            time.sleep(120)\n"
        "        return super().forward(x)\n"
        "def build(num_classes=10):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), Slow(784, num_classes))\n"
    )
    cfg, cells = _planned(mnist, tmp_path, slow, monkeypatch, child=True)
    sent = []

    def interrupt(*args):  # once the child is in its steps (its start-up past): Ctrl-C
        if not stepping.exists() and time.monotonic() - began < 120:
            return  # (and at 120 s anyway: this timer stands in for pytest-timeout's)
        signal.setitimer(signal.ITIMER_REAL, 0)
        sent.append(time.monotonic())
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    began = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)  # looked at every 0.2 s
    try:
        with pytest.raises(KeyboardInterrupt):
            estimate.estimate(cfg, cells)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert stepping.exists(), "the timing child never reached its steps"
    assert sent and time.monotonic() - sent[0] < 45  # stopped at once, not after its 120 s
    # (the spawn context's resource tracker stays for the life of this process, as it does)
    left = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        # one that has ended is none left running: a zombie (another test's process, on
        # an xdist worker) not yet reaped failed this test as its command line was read
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline()):
                left.append(p)
    assert left == []


def test_steps_a_cpu_would_take_hours_on_are_not_timed(tmp_path, monkeypatch) -> None:
    """An lm at --seq-len 500000: the estimate timed its step in this process, one torch
    op after another for hours that no Ctrl-C stopped, filling tens of GiB, and said nothing
    past "still timing". Its FLOPs (counted on the meta device, in a second) bound the step
    first: past TIMING_BOUND_S even at CPU_CORE_CEILING, it is not timed, and the estimate
    says why with the figures. A step of the usual length is timed as before."""
    from bench.harness import runner

    cfg = RunConfig(
        model="lm",
        dataset="synthetic",
        seq_len=500_000,
        limit=16,
        eval_samples=8,
        global_batch=8,
        warmup_steps=1,
        strategies=("single",),
        world_sizes=(1,),
        device="cpu",
        out_dir=str(tmp_path),
    )
    timings = []
    monkeypatch.setattr(estimate, "per_sample_ms", lambda *a, **k: timings.append(a) or 1.0)
    est = estimate.estimate(cfg, runner.plan(cfg))
    assert timings == [] and est.per_sample_ms is None
    line = est.line()
    assert "the steps, which could not be timed here: a step of lm at batch 8 and the " in line
    assert "evaluation's forward are 7.41e+16 FLOPs, at least " in line, line
    assert " min on this machine's " in line and "even at 250 GFLOP/s each" in line, line

    short = dataclasses.replace(cfg, seq_len=128)
    # a quiet machine: timed once (a busy one times again on one thread, 4 calls)
    monkeypatch.setattr(estimate, "CpuShare", Share)
    est = estimate.estimate(short, runner.plan(short))
    assert len(timings) == 2 and est.per_sample_ms == 1.0  # a training step, a forward


def test_the_bound_counts_on_the_meta_device_alone(monkeypatch) -> None:
    """The FLOPs bounding the estimate's steps are counted on the meta device alone: where
    an op has no meta kernel, counting falls back to the CPU, which runs the model for real
    at its size, the uninterruptible work the bound is there to avoid. Such a model is timed
    as before; without an evaluation the line does not speak of one."""
    from bench.workload import data, flops

    cfg = RunConfig(
        model="lm", dataset="synthetic", seq_len=64, limit=16, global_batch=8, device="cpu"
    )
    bundle = data.load(cfg)
    devices = []

    def no_meta_kernel(cfg, classes, spec, device="meta"):
        devices.append(device)
        raise NotImplementedError("no meta kernel")

    monkeypatch.setattr(flops, "step_flop_counts", no_meta_kernel)
    assert estimate.beyond_timing(cfg, bundle) == "" and devices == ["meta"]

    monkeypatch.undo()
    monkeypatch.setattr(estimate, "TIMING_BOUND_S", 0.0)  # every step past the bound
    assert " at batch 8 and the evaluation's forward are " in estimate.beyond_timing(cfg, bundle)
    line = estimate.beyond_timing(dataclasses.replace(cfg, eval_samples=0), bundle)
    assert " at batch 8 is " in line and "evaluation" not in line, line


class Share:
    """CpuShare for timed(): other processes took `pct` % of the CPUs while it timed."""

    pct = 0.0

    def stop(self) -> dict[str, float]:
        return {"other_cpu_pct": self.pct, "cpu_steal_pct": 0.0}


@pytest.mark.parametrize("busy", [True, False])
def test_a_busy_machine_times_the_steps_no_slower_than_on_one_thread(
    mnist, monkeypatch, busy
) -> None:
    """Beside other work a step on all the cores waits at each op for the thread whose core
    another process holds: on a loaded 2-core machine the MNIST CNN timed 89.5 ms a sample
    on 2 threads, the estimate said 28.1 min, and the run took 50 s (its ranks of one thread
    each were hardly slowed). A busy machine's steps are timed on one thread too, and the
    faster figure is the estimate's; a quiet machine's are timed once, on all the cores."""
    import torch

    cfg, bundle = mnist
    monkeypatch.setattr(estimate, "CpuShare", type("Busy", (Share,), {"pct": 90.0 * busy}))
    seen = []

    def stub(cfg, bundle, precision="fp32", batch=8, forward=False):
        seen.append(torch.get_num_threads())
        slow = torch.get_num_threads() > 1  # the busy machine's threads waiting on each other
        return (30.0 if slow else 1.0) if forward else (89.5 if slow else 2.6)

    monkeypatch.setattr(estimate, "per_sample_ms", stub)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ms = estimate.timed(cfg, bundle, ["fp32"], isolate=False)
        assert torch.get_num_threads() == 2  # the threads it was given, after
    finally:
        torch.set_num_threads(threads)
    if busy:
        assert ms == {"fp32": (2.6, 1.0)} and seen == [2, 2, 1, 1]
    else:
        assert ms == {"fp32": (89.5, 30.0)} and seen == [2, 2]


def test_a_busy_machine_times_a_long_step_once(mnist, monkeypatch) -> None:
    """One thread may take as many times as long as all the cores: a step whose timing on
    one thread could take past SLOW_S is not timed again there (minutes of torch ops no
    Ctrl-C stops, the bound beyond_timing keeps), and its figure on all the cores stands."""
    import torch

    cfg, bundle = mnist
    monkeypatch.setattr(estimate, "CpuShare", type("Busy", (Share,), {"pct": 90.0}))
    monkeypatch.setattr(estimate, "SLOW_S", 0.0)  # every timing counts as long
    seen = []

    def stub(cfg, bundle, precision="fp32", batch=8, forward=False):
        seen.append(torch.get_num_threads())
        return 30.0 if forward else 89.5

    monkeypatch.setattr(estimate, "per_sample_ms", stub)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert estimate.timed(cfg, bundle, ["fp32"], isolate=False) == {"fp32": (89.5, 30.0)}
    finally:
        torch.set_num_threads(threads)
    assert seen == [2, 2]


@pytest.mark.parametrize("eval_ms, alone", [(30.0, (2.6, 1.0)), (150.0, (2.6, 150.0))])
def test_a_busy_machine_whose_timing_took_long_still_times_on_one_thread(
    mnist, monkeypatch, eval_ms, alone
) -> None:
    """The load the one-thread timing escapes is what made the timing on all the cores long:
    on a loaded 2-core machine the MNIST CNN's took 20 s (fp32 and bf16), 40 s over its
    threads, past SLOW_S, so the one thread's 4 s never ran and `make bench` was estimated at
    84 min (140 ms a sample; 10 on one thread). Each figure is timed again where one thread,
    even as many times slower as there are threads than its fastest step, fits in SLOW_S:
    a forward of 64 samples at 150 ms a sample (9.6 s a step, up to 19.2 on one) does not."""
    import torch

    cfg, bundle = mnist
    monkeypatch.setattr(estimate, "CpuShare", type("Busy", (Share,), {"pct": 90.0}))
    clock = [0.0]
    monkeypatch.setattr(estimate.time, "perf_counter", lambda: clock[0])
    seen = []

    def stub(cfg, bundle, precision="fp32", batch=8, forward=False):
        seen.append(torch.get_num_threads())
        slow = torch.get_num_threads() > 1
        clock[0] += 10.0 if slow else 0.5  # each timing on both threads takes 10 s
        return (eval_ms if slow else 1.0) if forward else (89.5 if slow else 2.6)

    monkeypatch.setattr(estimate, "per_sample_ms", stub)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert estimate.timed(cfg, bundle, ["fp32"], isolate=False) == {"fp32": alone}
    finally:
        torch.set_num_threads(threads)
    assert seen == ([2, 2, 1, 1] if alone[1] == 1.0 else [2, 2, 1])
