"""Figures that hold on a noisy machine (issue 15): the statistics on constructed samples
with known answers, the interleaved matrix, and compare's verdicts on real runs: an A/A
pair flags nothing, a strategy slowed on purpose is flagged.

The slowed strategy is about 2x slower, not the 20 % the issue names: on the 2-core
machines this runs on, the same cell's samples/s moved by up to 1.8x between cells a
minute apart (measured: 459 to 919 samples/s over 5 repeats), so a 20 % change across 5
repeats is within noise there, and compare says so rather than flag it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bench import compare, report, stats
from bench.cli import main
from bench.runner import plan, run_matrix
from tests.conftest import faulty_strategies, small_config

# ---------------------------------------------------------------- statistics


def test_t_interval_covers_the_mean_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(1)
    trials, hits = 2000, 0
    for _ in range(trials):
        low, high = stats.t_interval(rng.normal(10.0, 2.0, size=5))
        hits += low <= 10.0 <= high
    assert 0.93 <= hits / trials <= 0.97  # binomial sd at 2000 trials: 0.5 %


def test_ratio_interval_covers_the_true_ratio_mostly() -> None:
    rng = np.random.default_rng(2)
    trials, hits = 150, 0
    for _ in range(trials):
        a, b = rng.normal(20.0, 1.0, size=6), rng.normal(10.0, 0.5, size=6)
        low, high = stats.ratio_interval(a, b, seed=int(rng.integers(1 << 30)))
        hits += low <= 2.0 <= high
    # a percentile bootstrap on 6 samples is somewhat narrow: well above chance, near 95 %
    assert hits / trials >= 0.85


def test_no_interval_from_too_few_repeats() -> None:
    assert all(math.isnan(v) for v in stats.t_interval([1.0, 2.0]))
    assert all(math.isnan(v) for v in stats.ratio_interval([1.0, 2.0, 3.0], [1.0, 2.0]))
    assert stats.t_interval([4.0, 4.0, 4.0]) == (4.0, 4.0)
    assert math.isnan(stats.cv_pct([3.0]))
    assert stats.cv_pct([9.0, 10.0, 11.0]) == pytest.approx(10.0)


def test_u_test_on_separated_and_identical_samples() -> None:
    before = [100.0, 101.0, 102.0, 103.0]
    assert stats.significant_change(before, [80.0, 81.0, 82.0, 83.0]) == pytest.approx(1 / 70)
    assert stats.significant_change(before, before) > 0.3
    # the direction matters: faster is not a slow-down
    assert stats.significant_change(before, [120.0, 121.0, 122.0, 123.0]) > 0.9
    # a step time that grows is worse
    assert stats.significant_change(before, [120.0, 121.0, 122.0], worse_if_lower=False) < 0.05
    assert math.isnan(stats.significant_change([1.0, 2.0], [3.0, 4.0, 5.0]))


def test_leaders_tie_overlapping_intervals() -> None:
    cells = [("a", 100.0, (95.0, 105.0)), ("b", 98.0, (93.0, 103.0)), ("c", 80.0, (78.0, 82.0))]
    assert stats.leaders(cells) == (["a", "b"], "95 % intervals over repeats")
    alone, how = stats.leaders([("a", 1.0, stats.NAN_PAIR), ("b", 2.0, stats.NAN_PAIR)])
    assert alone == ["b"] and "fewer than 3" in how


# ---------------------------------------------------------------- the interleaved matrix


def test_the_matrix_runs_round_by_round_in_a_seeded_order(data_root: Path, tmp_path: Path) -> None:
    cfg = small_config(
        tmp_path,
        data_root,
        strategies=("single", "ddp_spawn", "zero1"),
        world_sizes=(1, 2),
        repeats=3,
    )
    cells = plan(cfg)
    rounds = [c.repeat for c in cells]
    assert rounds == sorted(rounds)  # every cell once per round, round after round
    per_round = [[(c.strategy, c.world_size) for c in cells if c.repeat == r] for r in range(3)]
    assert all(sorted(p) == sorted(per_round[0]) for p in per_round)
    assert len({tuple(p) for p in per_round}) > 1  # each round shuffled on its own
    assert [c.key for c in plan(cfg)] == [c.key for c in cells]  # the seed fixes it
    other = [c.key for c in plan(cfg.replace(seed=7))]
    assert other != [c.key for c in cells] and sorted(other) == sorted(c.key for c in cells)


# ---------------------------------------------------------------- A/A and A/B


def _one_setting(run: Path, setting: str, dst: Path) -> Path:
    """A copy of `run` with only the rows of one setting: a run of that variant alone."""
    import shutil

    import pandas as pd

    shutil.copytree(run, dst)
    for name in ("runs.csv", "steps.csv", "ranks.csv"):
        table = pd.read_csv(dst / name, dtype=str, keep_default_na=False)
        table[table["setting"] == setting].to_csv(dst / name, index=False)
    return dst


@pytest.fixture(scope="module")
def sleepy_runs(tmp_path_factory, data_root) -> dict[str, Path]:
    """One slowed-on-purpose strategy swept over slowdown 0 and off (the same code twice) and
    1 (about 2x slower), 4 repeats interleaved round by round, so all three see the same
    minutes of a noisy machine; split into three runs A, A2 and B."""
    out = tmp_path_factory.mktemp("noise")
    with faulty_strategies():
        cfg = small_config(
            out,
            data_root,
            strategies=("test_sleepy",),
            world_sizes=(1,),
            repeats=4,
            max_steps=25,
            warmup_steps=5,
            limit=None,
            options={"slowdown": "0,off,1"},
            run_id="sweep",
        )
        run, _ = run_matrix(cfg, echo=lambda m: None)
    return {
        name: _one_setting(run, f"fp32,slowdown={v}", out / name)
        for name, v in (("a", "0"), ("a2", "off"), ("b", "1"))
    }


def test_a_a_flags_nothing(sleepy_runs, capsys) -> None:
    assert main(["compare", str(sleepy_runs["a"]), str(sleepy_runs["a2"])]) == 0
    assert "SLOW-DOWN" not in capsys.readouterr().out.split("-\n", 1)[1].replace("SLOW-DOWN?", "")


def test_a_b_flags_the_slowed_strategy(sleepy_runs, capsys) -> None:
    assert main(["compare", str(sleepy_runs["a"]), str(sleepy_runs["b"])]) == 1
    out = capsys.readouterr().out
    assert "slow-down beyond x1.1 in samples_per_s: test_sleepy ws=1" in out
    cmp = compare.compare(report.load_run(sleepy_runs["a"]), report.load_run(sleepy_runs["b"]))
    assert cmp.table["samples_per_s_ratio"].iloc[0] < 0.8


def test_rows_say_their_round_order_and_machine_state(sleepy_runs) -> None:
    import pandas as pd

    rows = pd.read_csv(sleepy_runs["a"] / "runs.csv")
    assert list(rows["round"]) == [0, 1, 2, 3]
    every = pd.read_csv(sleepy_runs["a"].parent / "sweep" / "runs.csv")
    assert sorted(every["run_order"]) == list(range(1, 13))
    assert list(every.sort_values("run_order")["round"]) == [r for r in range(4) for _ in "abc"]
    assert (rows["load_avg_1m"] >= 0).all()
    summary = report.summarise(report.load_run(sleepy_runs["a"]).runs)
    row = summary.iloc[0]
    assert (
        row["samples_per_s_ci_low"] <= row["samples_per_s_median"] <= row["samples_per_s_ci_high"]
    )
    assert row["samples_per_s_cv_pct"] >= 0
