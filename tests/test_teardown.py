"""A rank's end: the worker releases the strategy's model, optimizer and last batch before
it leaves the process group, so the group is not freed by what held it (DDP's reducer,
FSDP's mesh). A gloo group freed by DDP's reducer is destroyed with the GIL held while one
of gloo's threads may wait for it: a rank that never exits (seen with torch 2.8)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

import strategies
from strategies.base import Setting


@pytest.mark.parametrize("name", ["ddp_spawn", "fsdp", "zero1"])
def test_release_frees_what_holds_the_group_while_the_group_lives(name, one_rank):
    import torch.distributed as dist

    strategy = strategies.get(name).create(one_rank, {}, Setting())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    strategy.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    del model  # as the worker's training function, which has returned by teardown
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    strategy.backward(nn.functional.cross_entropy(strategy.model(x), y))
    strategy.optimizer_step(strategy.optimizer)
    strategy.last_batch = (x, y)
    held = weakref.ref(strategy.model), weakref.ref(strategy.optimizer)
    gc.collect()
    assert all(ref() is not None for ref in held)  # nothing but the strategy held them
    strategy.release()
    assert [ref() for ref in held] == [None, None]
    assert strategy.model is None and strategy.optimizer is None and strategy.last_batch is None
    assert dist.is_initialized()  # the group outlives them: teardown leaves it afterwards


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fails", [False, True])
def test_the_worker_frees_the_ddp_model_before_it_leaves_the_group(
    fails, tmp_path, data_root, monkeypatch
):
    """A one-rank DDP cell run by the worker in this process (loopback rendezvous): when the
    group is left, the DDP module is already gone, whether training returned or raised (the
    traceback's frames would otherwise keep it)."""
    import dataclasses
    import json

    from bench.harness import worker
    from strategies.base import Strategy
    from strategies.ddp import TorchDistributed
    from tests.conftest import small_config

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    wrapped: list[weakref.ref] = []
    at_teardown: list[bool] = []
    attach, teardown = Strategy.attach, TorchDistributed.teardown

    def attach_(self, model, optimizer):
        attach(self, model, optimizer)
        wrapped.append(weakref.ref(self.model))

    def train_epoch_(self, loader, epoch, **kw):
        ddp = self.model  # a local of a frame the traceback holds
        ddp(next(iter(loader))[0])
        raise RuntimeError("training failed (test)")

    def teardown_(self):
        gc.collect()
        at_teardown.append(wrapped[0]() is None)
        teardown(self)

    monkeypatch.setattr(Strategy, "attach", attach_)
    monkeypatch.setattr(TorchDistributed, "teardown", teardown_)
    if fails:
        monkeypatch.setattr(Strategy, "train_epoch", train_epoch_)
    cfg = small_config(tmp_path, data_root, max_steps=2, warmup_steps=0, eval_samples=0)
    cell = tmp_path / "cell"
    cell.mkdir()
    spec = {
        "config": cfg.to_dict(),
        "strategy": "ddp_torchrun",
        "world_size": 1,
        "setting": dataclasses.asdict(Setting()),
        "options": {},
        "repeat": 0,
        "device": "cpu",
        "dir": str(cell),
        "workers_per_device": 0,
        "threads": torch.get_num_threads(),
        "shares_gpu": False,
    }
    if fails:
        with pytest.raises(RuntimeError, match="training failed"):
            worker.run(spec)
        error = json.loads((cell / "error-rank0.json").read_text())
        assert "train_epoch_" in error["traceback"]  # the lines stay, the locals go
    else:
        worker.run(spec)
        assert (cell / "epochs.jsonl").exists()
    assert at_teardown == [True]


def test_spawned_ranks_meet_at_a_file_not_a_port_another_process_may_take(tmp_path, monkeypatch):
    """mp.spawn's ranks met at a port picked free and released before rank 0 bound it: a
    process of another run could take it in between, and a rank failed with 'address
    already in use' (seen with two runs at once). They meet at a file of their own
    (PARABENCH_STORE, as the worker's _spawn_entry sets it): a port held by someone else,
    as MASTER_PORT, is no longer theirs to bind."""
    import socket

    import torch.distributed as dist

    from strategies.base import RankContext

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(taken.getsockname()[1]))
        monkeypatch.setenv("PARABENCH_STORE", str(tmp_path / "store"))
        monkeypatch.setenv("PARABENCH_PG_TIMEOUT_S", "20")
        ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
        strategy = strategies.get("ddp_spawn").create(ctx, {}, Setting())
        strategy.setup_distributed()
        try:
            t = torch.ones(3)
            dist.all_reduce(t)
            assert t.tolist() == [1.0, 1.0, 1.0]
        finally:
            strategy.teardown()
    # a harness started with one (under an enclosing launcher) gives it to no cell's ranks
    from bench.harness.runner import launcher_free

    assert launcher_free({"PARABENCH_STORE": "/stale", "PATH": "/bin"}) == {"PATH": "/bin"}
