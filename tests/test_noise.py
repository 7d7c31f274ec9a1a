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

from bench.analysis import compare, report
from bench.cli import main
from bench.harness import stats
from bench.harness.runner import plan, run_matrix
from tests.conftest import faulty_strategies, small_config

# measures run-to-run noise and flags slowdowns: alone on the CPUs
pytestmark = pytest.mark.serial

# ---------------------------------------------------------------- statistics


def test_t_interval_covers_the_mean_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(1)
    trials, hits = 2000, 0
    for _ in range(trials):
        low, high = stats.t_interval(rng.normal(10.0, 2.0, size=5))
        hits += low <= 10.0 <= high
    assert 0.93 <= hits / trials <= 0.97  # binomial sd at 2000 trials: 0.5 %


def test_ratio_interval_covers_the_true_ratio_95_percent_at_3_repeats() -> None:
    # make bench's 3 repeats a side: a percentile bootstrap's "95 %" held the ratio 77 % of
    # the time there, so a speed-up's interval excluded 1 far more often than it should
    rng = np.random.default_rng(2)
    trials, hits = 2000, 0
    for _ in range(trials):
        a, b = rng.normal(20.0, 2.0, size=3), rng.normal(10.0, 1.0, size=3)
        low, high = stats.ratio_interval(a, b)
        hits += low <= 2.0 <= high
    assert 0.93 <= hits / trials <= 0.98  # binomial sd at 2000 trials: 0.5 %
    assert stats.ratio_interval([4.0, 4.0, 4.0], [2.0, 2.0, 2.0]) == (2.0, 2.0)


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
    assert stats.leaders(cells) == (["a", "b"], [], "95 % intervals over repeats")
    alone, untold, how = stats.leaders([("a", 1.0, stats.NAN_PAIR), ("b", 2.0, stats.NAN_PAIR)])
    assert alone == ["b"] and not untold and "fewer than 3" in how
    # a cell with no interval beside others that have one: not told apart, neither tied nor
    # behind
    best, untold, how = stats.leaders([*cells, ("d", 60.0, stats.NAN_PAIR)])
    assert best == ["a", "b"] and untold == ["d"] and how == "95 % intervals over repeats"


def test_tied_is_the_one_tie_rule_either_way_round_or_behind() -> None:
    a = {0: 100.0, 1: 80.0, 2: 120.0, 3: 90.0, 4: 110.0}
    ahead = {r: 1.1 * v * (1.001 if r % 2 else 0.999) for r, v in a.items()}  # 10 % up, steady
    wide, narrow = (90.0, 130.0), (95.0, 105.0)
    # paired: a steady 10 % is told apart either way round, and by the pairs
    assert stats.tied((ahead, a), (wide, narrow)) == (False, True)
    assert stats.tied((a, ahead), (narrow, wide)) == (False, True)
    # ranked behind (leaders): only pairs that show it behind part them
    assert stats.tied((ahead, a), (wide, narrow), higher_is_better=True) == (True, True)
    assert stats.tied((ahead, a), (wide, narrow), higher_is_better=False) == (False, True)
    # fewer than 3 rounds in common: the intervals, overlapping or not
    assert stats.tied(({}, a), (wide, narrow)) == (True, False)
    assert stats.tied(({}, a), ((110.0, 120.0), narrow), higher_is_better=True) == (False, False)
    assert stats.tied(({}, {}), (stats.NAN_PAIR, narrow)) == (None, False)


def test_median_interval_from_order_statistics() -> None:
    # the binomial interval of a median: [x(k), x(n-k+1)], k = 2 for 10 values, 6 for 20
    assert stats.median_interval(list(range(10))) == (4.5, 1.0, 8.0)
    assert stats.median_interval(list(range(20))) == (9.5, 5.0, 14.0)
    med, low, high = stats.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert med == 3.0 and math.isnan(low) and math.isnan(high)  # 5 values cannot give 95 %
    rng = np.random.default_rng(3)
    hits = sum(
        low <= 0.0 <= high
        for low, high in (stats.median_interval(rng.standard_cauchy(15))[1:] for _ in range(2000))
    )
    assert 0.95 <= hits / 2000 <= 0.99  # at least 95 %, whatever the distribution's tails


def test_step_precision_over_blocks_of_steps() -> None:
    rng = np.random.default_rng(4)
    # independent steps of sd 5 %: 10 block means, half-width about t(9) * 5 / 10 = 1.13 %,
    # and the interval holds the true mean 95 % of the time
    hits, widths = 0, []
    for _ in range(1000):
        steady = rng.normal(100.0, 5.0, size=100)
        widths.append(stats.step_precision_pct(steady))
        hits += abs(steady.mean() - 100.0) <= widths[-1]  # in % of a mean near 100
    assert 0.93 <= hits / 1000 <= 0.97
    assert 0.95 < np.mean(widths) < 1.25
    assert math.isnan(stats.step_precision_pct(steady[:29]))  # fewer than 3 whole blocks
    # a machine that drifts: per-step intervals would claim far more precision than there is
    drifting = 100.0 + np.cumsum(rng.normal(0.0, 1.0, size=100))
    naive = 100 * 1.98 * drifting.std(ddof=1) / np.sqrt(drifting.size) / drifting.mean()
    assert stats.step_precision_pct(drifting) > 1.5 * naive


def _epoch(precision: float | None, steps: int = 80, others_agree: bool = True) -> int:
    """The steps one in-process `single` epoch ran with this precision target; with
    `others_agree` False, as one rank of two whose other rank has not reached it."""
    import torch
    from torch import nn

    from strategies.base import RankContext
    from strategies.single import Single

    class OneOfTwo(Single):
        def all_mean(self, t):  # the other rank's flag is 0: the mean is half this one's
            return t if others_agree else t / 2

    torch.manual_seed(0)
    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    net = nn.Linear(8, 2)
    single = OneOfTwo(ctx, {})
    single.attach(net, torch.optim.SGD(net.parameters(), lr=0.1))
    batches = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(steps)]
    return single.train_epoch(batches, 0, warmup_steps=3, precision=precision).steps


def test_target_precision_stops_at_the_first_block_that_reaches_it(monkeypatch) -> None:
    # the steps' own spread fixed at 1 %, whatever this machine's timing does
    monkeypatch.setattr(stats, "step_precision_pct", lambda steps: 1.0)
    assert _epoch(None) == 80
    assert _epoch(2.0) == 3 + stats.PRECISION_MIN_STEPS  # reached at the first check
    assert _epoch(0.5) == 80  # never reached: the bound (here the epoch's end)
    # every rank must have reached it: one that has not keeps all of them going
    assert _epoch(2.0, others_agree=False) == 80


def test_pairing_by_round_tells_a_steady_gap_from_noise() -> None:
    # rounds that move both cells by +-20 %, b 2 % behind a in every one of them
    a = {0: 100.0, 1: 80.0, 2: 120.0, 3: 90.0, 4: 110.0}
    b = {r: 0.98 * v for r, v in a.items()}
    b[3] *= 1.005  # not exactly constant
    ratio, low, high = stats.paired_ratio_interval(b, a)
    assert low < ratio < high < 1.0 and ratio == pytest.approx(0.981, abs=0.001)
    cells = [
        (n, float(np.mean(list(v.values()))), stats.t_interval(list(v.values())))
        for n, v in (("a", a), ("b", b))
    ]
    assert stats.leaders(cells) == (["a", "b"], [], "95 % intervals over repeats")  # unpaired
    best, _, how = stats.leaders(cells, rounds={"a": a, "b": b})
    assert best == ["a"] and "paired round by round" in how  # paired: b is behind
    # a gap that flips sign from round to round stays within noise, paired or not
    c = {r: v * (1.03 if r % 2 else 0.97) for r, v in a.items()}
    assert stats.paired_ratio_interval(c, a)[2] >= 1.0
    # fewer than 3 rounds in common: no paired interval
    assert math.isnan(stats.paired_ratio_interval({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0, 2: 3.0})[1])


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
            max_steps=18,
            warmup_steps=3,
            global_batch=8,  # a small compute, under the strategy's fixed sleep
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
    # the same strategy in another setting in each run: one cell, named with both
    assert (
        "slow-down beyond x1.1 in samples_per_s: test_sleepy [slowdown=0 -> slowdown=1] ws=1" in out
    )
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


def test_target_precision_across_ranks(data_root: Path, tmp_path: Path) -> None:
    """Two ranks stop at the same step (they agree through a collective; a rank that
    stopped alone would hang the other), and the rows say how many steps and how precise."""
    import pandas as pd

    cfg = small_config(
        tmp_path,
        data_root,
        strategies=("ddp_spawn",),
        world_sizes=(2,),
        max_steps=100,
        warmup_steps=2,
        eval_samples=0,
        target_precision=99.0,
    )
    run, rows = run_matrix(cfg, echo=lambda m: None)
    assert [r["status"] for r in rows] == ["ok"]
    row = pd.read_csv(run / "runs.csv").iloc[0]
    # stopped where a block ends, from the 50th timed step on, before the bound
    assert row["timed_steps"] % 10 == 0 and 50 <= row["timed_steps"] < 98
    assert row["steps"] == row["timed_steps"] + 2
    ranks = pd.read_csv(run / "ranks.csv")
    assert ranks["samples"].nunique() == 1  # both ranks trained the same steps
    assert 0 < row["step_precision_pct"] <= 99 and row["target_precision_pct"] == 99
    assert 0 <= row["other_cpu_pct"] <= 100 and 0 <= row["cpu_steal_pct"] <= 100


def test_cpu_share_counts_what_the_cell_did_not_use(monkeypatch) -> None:
    """Other processes' share is the cores' busy time less the cell's own CPU time; steal is
    the hypervisor's (fields of /proc/stat: user nice system idle iowait irq softirq steal)."""
    import os

    from bench.harness.env import CpuShare

    tick = os.sysconf("SC_CLK_TCK")
    reads = iter(
        [
            ([100, 0, 50, 800, 0, 0, 0, 10], 1.0),  # at the start: own CPU 1 s
            ([300, 0, 100, 900, 0, 0, 0, 30], 1.0 + 100 / tick),  # the cell used 100 ticks
        ]
    )
    monkeypatch.setattr(CpuShare, "_read", staticmethod(lambda: next(reads)))
    share = CpuShare().stop()
    # 370 ticks in all: 250 busy, 100 of them the cell's; 20 stolen
    assert share["other_cpu_pct"] == pytest.approx(100 * 150 / 370, abs=0.01)
    assert share["cpu_steal_pct"] == pytest.approx(100 * 20 / 370, abs=0.01)
    monkeypatch.setattr(CpuShare, "_read", staticmethod(lambda: None))  # no /proc/stat
    assert all(math.isnan(v) for v in CpuShare().stop().values())
