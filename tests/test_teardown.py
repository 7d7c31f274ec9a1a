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
