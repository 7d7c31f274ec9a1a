"""Parity: with the same seed and global batch, every strategy's losses and weights after
K steps match the single-process baseline within the precision's stated tolerance."""

from __future__ import annotations

import os

import pytest

import strategies
from bench.verify import RECIPES, table, verify
from tests.conftest import faulty_strategies, small_config

pytestmark = pytest.mark.slow
FP32 = ("ddp_spawn", "ddp_torchrun")
HOROVOD = ("horovod", "horovod_fp16")


def _horovod_required() -> bool:
    return os.environ.get("PARABENCH_REQUIRE_HOROVOD") == "1"


@pytest.fixture(scope="module")
def parity(tmp_path_factory, data_root):
    """The multi-process strategies at world size 2 (their baseline, single, runs apart)."""
    names = (*FP32, "amp_ddp", "test_nosync")
    if strategies.get("horovod").unavailable("cpu") is None:
        names += HOROVOD
    cfg = small_config(
        tmp_path_factory.mktemp("parity"), data_root, strategies=names, world_sizes=(2,)
    )
    with faulty_strategies():
        run_dir, result = verify(cfg, steps=8, echo=lambda m: None)
    print(table(result))
    return {(p.strategy, p.world_size): p for p in result}


@pytest.mark.parametrize("name", FP32)
def test_fp32_strategies_match_the_baseline(parity, name):
    p = parity[(name, 2)]
    assert p.status == "pass", p
    assert p.loss_abs <= RECIPES["exact"].loss_abs and p.param_rel <= RECIPES["exact"].param_rel


def test_data_parallel_matches_the_baseline(tmp_path, data_root):
    """DataParallel on one CPU device (its only world size here), in a run with single."""
    cfg = small_config(tmp_path, data_root, strategies=("dp",), world_sizes=(1,))
    _, result = verify(cfg, steps=8, echo=lambda m: None)
    (p,) = result
    assert (p.strategy, p.world_size, p.status) == ("dp", 1, "pass"), p
    assert p.loss_abs <= RECIPES["exact"].loss_abs and p.param_rel <= RECIPES["exact"].param_rel


def test_amp_matches_at_its_looser_tolerance(parity):
    p = parity[("amp_ddp", 2)]
    assert p.numerics == "autocast_bf16" and p.status == "pass", p
    assert p.param_rel > 0  # bf16 really changes the numbers; the check is not vacuous


def test_a_strategy_that_skips_gradient_sync_fails_parity(parity):
    bad = parity[("test_nosync", 2)]
    assert bad.status == "FAIL" and bad.param_rel > 100 * RECIPES["exact"].param_rel


@pytest.mark.parametrize("name", HOROVOD)
def test_horovod_matches_the_baseline(parity, name):
    if (name, 2) not in parity:
        if _horovod_required():
            pytest.fail(f"Horovod is not usable: {strategies.get(name).unavailable('cpu')}")
        pytest.skip("Horovod not installed (make horovod)")
    assert parity[(name, 2)].status == "pass", parity[(name, 2)]


def _row(**kw):
    row = {"global_batch": "16", "micro_batch": "8", "world_size": "2", "launcher": "spawn"}
    return {**row, "sync_bn": "0", **kw}


def test_batch_norm_cells_are_checked_against_the_baseline_cut_into_their_shares():
    from bench.verify import baseline_label, batch_norm_layout, batch_norm_reason

    ddp = _row(per_rank_batch="8", data_ranks="2")
    assert batch_norm_layout(ddp, norms=20) == (2, 1)
    assert baseline_label((2, 1)) == "single, 2 shares"
    assert batch_norm_layout(ddp, norms=0) == (1, 1)  # no BatchNorm: the plain baseline
    assert batch_norm_layout({**ddp, "sync_bn": "1"}, norms=20) == (1, 1)  # SyncBN joins them
    acc = _row(per_rank_batch="8", micro_batch="4", data_ranks="2")
    assert batch_norm_layout(acc, norms=1) == (2, 2)
    assert baseline_label((2, 2)) == "single, 2 shares x 2 micro-batches"
    pipe = _row(per_rank_batch="16", micro_batch="4", data_ranks="1")
    assert batch_norm_layout(pipe, norms=1) == (1, 4)
    assert batch_norm_reason(ddp, norms=20) == ""  # comparable, against its own baseline
    # DataParallel's scatter over devices is the one split no baseline reproduces
    dp = _row(micro_batch="16", launcher="inprocess")
    why = batch_norm_reason(dp, norms=3)
    assert why.startswith("3 BatchNorm layers normalise over each device's 8 samples"), why


def test_verification_turns_off_every_dropout_layer():
    import torch

    from bench.models import build_model, without_dropout

    cnn = build_model("mnist_cnn", 10)
    attn = torch.nn.Sequential(torch.nn.MultiheadAttention(8, 2, dropout=0.1), torch.nn.Dropout2d())
    assert without_dropout(cnn) == 2 and without_dropout(attn) == 2
    assert without_dropout(cnn) == 0  # all off now
    assert all(m.p == 0 for m in cnn.modules() if isinstance(m, torch.nn.Dropout))
    assert attn[0].dropout == 0
