"""Shared fixtures. Tests point the harness at ../shared/data (real MNIST test split and
ImageNet sample); PARABENCH_TEST_DATA overrides that."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
import torch

import strategies
from bench.config import RunConfig
from bench.harness.runner import run_matrix
from tests.suite_parts import shared_builds

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("PARABENCH_TEST_DATA", ROOT.parent / "shared" / "data"))


#: session fixtures that run cells: their users go to one xdist worker (suite_parts)
SHARED_SESSION = frozenset({"small_run"})


@pytest.hookimpl(tryfirst=True)  # before -m reads the serial marks and xdist the groups
def pytest_collection_modifyitems(config, items):
    shared_builds(config, items, SHARED_SESSION)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if SHARED_SESSION.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)  # small_run runs the whole matrix
        if item.get_closest_marker("requires_cuda") and gpus == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        m = item.get_closest_marker("requires_gpus")
        if m and gpus < m.args[0]:
            item.add_marker(pytest.mark.skip(reason=f"needs {m.args[0]} GPUs, found {gpus}"))


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo group in this process (a FileStore, no network); its RankContext."""
    import torch.distributed as dist

    from strategies.base import RankContext

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", rank=0, world_size=1, store=store)
    try:
        yield RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    finally:
        dist.destroy_process_group()


def need_horovod() -> None:
    """Skip where Horovod is not built here; under `make test` (PARABENCH_REQUIRE_HOROVOD=1),
    which builds it first, fail instead."""
    import strategies

    why = strategies.get("horovod").unavailable("cpu")
    if why:
        if os.environ.get("PARABENCH_REQUIRE_HOROVOD") == "1":
            pytest.fail(f"Horovod should have been built by `make horovod`: {why}")
        pytest.skip(why)


@pytest.fixture
def sigint_raises():
    """SIGINT as Python's own (KeyboardInterrupt), for a test that sends it to itself: a
    suite started in the background of a non-interactive shell (and its xdist workers)
    inherits it ignored, and a Ctrl-C sent to the test went unseen."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture(scope="session")
def data_root() -> Path:
    if not (DATA / "mnist").is_dir():
        pytest.fail(
            f"test data not found at {DATA}: set PARABENCH_TEST_DATA to the shared data folder"
        )
    return DATA


@contextlib.contextmanager
def faulty_strategies():
    """The strategies of tests/plugins/faulty_strategies.py registered (wrong on purpose:
    crash, hang, no gradient sync, ...), for the span of the block."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PARABENCH_STRATEGIES", "tests.plugins.faulty_strategies")
    strategies.registry.cache_clear()
    try:
        yield
    finally:
        mp.undo()
        strategies.registry.cache_clear()


def single_epoch(steps: int, warmup: int, by_loader: bool = False):
    """One epoch of single's training loop (Strategy.train_epoch) in this process, on a
    tiny model (Linear(4, 2), batch 8, SGD), `steps` steps of which `warmup` warm-up:
    --max-steps `steps` of a loader one batch longer, or (`by_loader`) a loader of `steps`
    batches and no --max-steps."""
    import torch

    from strategies.base import RankContext, Setting
    from strategies.single import Single

    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    strategy = Single(ctx, {}, Setting())
    model = torch.nn.Linear(4, 2)
    strategy.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    if by_loader:
        return strategy.train_epoch([(x, y)] * steps, 0, max_steps=None, warmup_steps=warmup)
    return strategy.train_epoch([(x, y)] * (steps + 1), 0, max_steps=steps, warmup_steps=warmup)


def fake_cuda_events(monkeypatch, reached) -> list:
    """A fake CUDA for timing tests: each torch.cuda.Event's time (ms) is `reached()` when
    it is recorded (when the stream reaches it), on stream "s0"; reading one before any
    wait for the device fails. Returns the devices waited for, in order."""
    synced: list = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self, stream=None):
            self.t = float(reached())

        def elapsed_time(self, end):
            assert synced, "read before the device was waited for"
            return end.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: "s0")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synced.append(d))
    return synced


def small_config(tmp: Path, data_root: Path, **kw) -> RunConfig:
    """A real run of a few steps: MNIST CNN on the real MNIST files, CPU, gloo."""
    base = dict(
        dataset="mnist",
        data_root=str(data_root),
        max_steps=6,
        warmup_steps=2,
        global_batch=32,
        eval_samples=200,
        limit=2048,
        device="cpu",
        out_dir=str(tmp),
        timeout_s=240,
        # the probes and the scaling model cost seconds per cell and run: tests of them ask
        probe_pairs=0,
        profile_steps=0,
        scaling_model=False,
    )
    base.update(kw)
    return RunConfig(**base)


#: left out of the shared small run (to keep `make test` short): tests/test_modern.py and
#: tests/test_model_parallel.py run them
NOT_IN_SMALL_RUN = ("fsdp", "fsdp_zero2", "zero1", "ddp_fp16_hook", "ddp_bf16_hook", "ddp_powersgd")
NOT_IN_SMALL_RUN += ("model_split", "pipeline_gpipe", "pipeline_1f1b", "pipeline_interleaved")
NOT_IN_SMALL_RUN += ("tp", "fsdp_tp")
#: run by tests/test_integration.py and tests/test_parity.py
NOT_IN_SMALL_RUN += ("amp_ddp", "horovod", "horovod_fp16")


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, data_root) -> Path:
    """Every registered strategy but those of NOT_IN_SMALL_RUN, at world sizes 1 and 2, a few
    steps each, two repeats, with Adam.

    Unavailable strategies and impossible cells appear as rows with their reasons. No
    dropout, so every world size starts from the same first loss. Shared by the reporter
    and integration tests; read-only for its users. (The strategies left out run in the
    test modules NOT_IN_SMALL_RUN names.)
    """
    out = tmp_path_factory.mktemp("runs")
    cfg = small_config(
        out,
        data_root,
        exclude=NOT_IN_SMALL_RUN,
        world_sizes=(1, 2),
        repeats=2,
        run_id="small",
        optimizer="adam",
        lr=0.001,
        model_kwargs={"dropout": 0.0},  # equal starts at every world size
    )
    run_dir, _ = run_matrix(cfg, echo=lambda m: None)
    return run_dir
