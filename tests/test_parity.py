"""Parity: with the same seed and global batch, every strategy's losses and weights after
K steps match the single-process baseline within the precision's stated tolerance."""

from __future__ import annotations

import os

import pytest

import strategies
from bench.verify import RECIPES, table, verify
from tests.conftest import small_config

pytestmark = pytest.mark.slow
FP32 = ("dp", "ddp_spawn", "ddp_torchrun")
HOROVOD = ("horovod", "horovod_fp16")


def _horovod_required() -> bool:
    return os.environ.get("PARABENCH_REQUIRE_HOROVOD") == "1"


@pytest.fixture(scope="module")
def parity(tmp_path_factory, data_root):
    mp = pytest.MonkeyPatch()
    mp.setenv("PARABENCH_STRATEGIES", "tests.plugins.faulty_strategies")
    strategies.registry.cache_clear()
    names = ("single", *FP32, "amp_ddp", "test_nosync")
    if strategies.get("horovod").unavailable("cpu") is None:
        names += HOROVOD
    cfg = small_config(
        tmp_path_factory.mktemp("parity"), data_root, strategies=names, world_sizes=(1, 2)
    )
    try:
        run_dir, result = verify(cfg, steps=8, echo=lambda m: None)
    finally:
        mp.undo()
        strategies.registry.cache_clear()
    print(table(result))
    return {(p.strategy, p.world_size): p for p in result}


@pytest.mark.parametrize("name", FP32)
def test_fp32_strategies_match_the_baseline(parity, name):
    for ws in (1, 2):
        p = parity[(name, ws)]
        if name == "dp" and ws == 2:
            assert p.status == "skipped"  # one CPU device
            continue
        assert p.status == "pass", p
        assert p.loss_abs <= RECIPES["exact"].loss_abs and p.param_rel <= RECIPES["exact"].param_rel


def test_amp_matches_at_its_looser_tolerance(parity):
    for ws in (1, 2):
        p = parity[("amp_ddp", ws)]
        assert p.numerics == "autocast_bf16" and p.status == "pass", p
        assert p.param_rel > 0  # bf16 really changes the numbers; the check is not vacuous


def test_a_strategy_that_skips_gradient_sync_fails_parity(parity):
    assert parity[("test_nosync", 1)].status == "pass"  # one rank: nothing to sync
    bad = parity[("test_nosync", 2)]
    assert bad.status == "FAIL" and bad.param_rel > 100 * RECIPES["exact"].param_rel


@pytest.mark.parametrize("name", HOROVOD)
def test_horovod_matches_the_baseline(parity, name):
    if (name, 2) not in parity:
        if _horovod_required():
            pytest.fail(f"Horovod is not usable: {strategies.get(name).unavailable('cpu')}")
        pytest.skip("Horovod not installed (make horovod)")
    for ws in (1, 2):
        assert parity[(name, ws)].status == "pass", parity[(name, ws)]
