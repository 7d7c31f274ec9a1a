"""Real processes: every strategy launched by its own launcher (in-process, mp.spawn,
torchrun) with gloo on CPU, a few steps, and the rows that come out checked."""

from __future__ import annotations

import math

import pytest

from bench.harness import results
from bench.harness.runner import RunDir, run_matrix
from tests.conftest import small_config

pytestmark = pytest.mark.slow
FOUR = ("single", "dp", "ddp_torchrun", "ddp_spawn")


@pytest.fixture(scope="module")
def four(small_run):
    """The seed's four strategies at world sizes 1 and 2, out of the shared small run (no
    dropout there: its masks differ by rank, and the first-loss check needs equal starts)."""
    rows = [r for r in RunDir(small_run).runs.read() if r["strategy"] in FOUR]
    return small_run, rows


def _ok(rows, strategy, ws):
    found = [r for r in rows if r["strategy"] == strategy and r["world_size"] == str(ws)]
    assert found, f"no row for {strategy} ws={ws}"
    assert found[0]["status"] == "ok", found[0]["reason"]
    return found[0]


def test_a_row_for_every_pair(four):
    _, rows = four
    assert {(r["strategy"], int(r["world_size"])) for r in rows} == {
        (s, w) for s in FOUR for w in (1, 2)
    }


@pytest.mark.parametrize(
    ("strategy", "ws"),
    [
        ("single", 1),
        ("dp", 1),
        ("ddp_torchrun", 1),
        ("ddp_torchrun", 2),
        ("ddp_spawn", 1),
        ("ddp_spawn", 2),
    ],
)
def test_rows_are_complete_and_plausible(four, strategy, ws):
    _, rows = four
    r = _ok(rows, strategy, ws)
    for col in results.RUN_COLUMNS:
        assert col in r
    assert float(r["samples_per_s"]) > 0 and float(r["step_time_ms_p50"]) > 0
    assert math.isfinite(float(r["train_loss_final"])) and 0 < float(r["train_loss_final"]) < 10
    assert float(r["peak_mem_mib"]) > 0 and r["mem_source"] == "host_rss"
    assert 0 <= float(r["eval_accuracy"]) <= 1
    assert int(r["steps"]) == 6 and int(r["timed_steps"]) == 4
    assert int(r["samples"]) == 4 * 32  # timed steps x global batch, summed over ranks
    assert int(r["per_rank_batch"]) == (32 if strategy == "dp" else 32 // ws)
    from bench.harness.env import cpu_cores

    processes = ws if strategy.startswith("ddp") else 1
    assert int(r["threads_per_rank"]) == max(1, cpu_cores() // processes)
    assert r["torch_version"] and r["cpu_model"] and r["host"]
    if strategy.startswith("ddp"):
        assert r["backend"] == "gloo"


def test_impossible_cells_are_skipped_rows_with_reasons(four):
    _, rows = four
    by = {(r["strategy"], r["world_size"]): r for r in rows}
    assert by[("single", "2")]["status"] == "skipped"
    assert "world size is always 1" in by[("single", "2")]["reason"]
    assert by[("dp", "2")]["status"] == "skipped" and "one device" in by[("dp", "2")]["reason"]
    assert (
        "single" in _ok(rows, "dp", 1)["notes"] or "no parallelism" in _ok(rows, "dp", 1)["notes"]
    )


def test_every_rank_reports_and_steps_are_recorded(four):
    run_dir, _ = four
    rd = RunDir(run_dir)

    def first_repeat(r):
        return r["world_size"] == "2" and r["repeat"] == "0"

    ranks = [r for r in rd.ranks.read() if r["strategy"] == "ddp_spawn" and first_repeat(r)]
    assert sorted(r["rank"] for r in ranks) == ["0", "1"]
    assert all(float(r["peak_rss_mib"]) > 0 for r in ranks)
    steps = [s for s in rd.steps.read() if s["strategy"] == "ddp_torchrun" and first_repeat(s)]
    assert len(steps) == 6 and [s["warmup"] for s in steps[:3]] == ["1", "1", "0"]


def test_same_seed_same_start_every_strategy(four):
    """Same initial weights and the same first global batch: the first loss is the same
    for every strategy and world size (DDP ranks average their halves of the batch)."""
    _, rows = four
    first = [float(r["train_loss_first"]) for r in rows if r["status"] == "ok"]
    assert max(first) - min(first) < 1e-4, first


def test_imagenet_subset_resnet18(tmp_path, data_root):
    """The files decoded by a DataLoader in one process and, split by DistributedSampler,
    in two ranks that torchrun started (two runs: torchrun at world size 1 adds nothing)."""
    cfg = small_config(
        tmp_path,
        data_root,
        dataset="imagenet-subset",
        model="resnet18",
        image_size=64,
        max_steps=3,
        warmup_steps=1,
        global_batch=8,
        max_classes=100,
        eval_samples=10,
        limit=None,
    )
    for strategy, ws in (("single", 1), ("ddp_torchrun", 2)):
        one = cfg.replace(strategies=(strategy,), world_sizes=(ws,), run_id=strategy)
        r = _ok(run_matrix(one, echo=lambda m: None)[1], strategy, ws)
        assert "imagenet-subset" in r["data"] and float(r["samples_per_s"]) > 0
        assert r["data_path"] == "loader"  # decoded from files by the DataLoader
