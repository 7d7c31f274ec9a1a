"""Statistics over repeats: intervals, stability, ties and significance.

A cell's repeats are the samples: its steps are not, since the step times within one run
are autocorrelated (a slow minute slows many steps in a row), so an interval over steps
would be far too narrow. Intervals are 95 % by default: Student's t over the repeats for a
mean (stated as such), a bootstrap for a ratio of two cells' means; with fewer than
`MIN_REPEATS` repeats there is no interval (nan), never an invented one. Significance of
a change between two runs: the Mann-Whitney U test on the repeats (as asv's and Google
Benchmark's compare do), one-sided in the direction of the change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MIN_REPEATS = 3
LEVEL = 0.95
#: a cell whose coefficient of variation over repeats exceeds this is marked unstable
UNSTABLE_CV_PCT = 5.0
#: significance level of compare's test
ALPHA = 0.05

NAN_PAIR = (math.nan, math.nan)


def _clean(values: Sequence[float]) -> np.ndarray:
    a = np.asarray([float(v) for v in values], dtype=float)
    return a[np.isfinite(a)]


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Student's t interval for the mean of the repeats; nan with fewer than MIN_REPEATS."""
    from scipy import stats

    a = _clean(values)
    if a.size < MIN_REPEATS:
        return NAN_PAIR
    mean, sem = float(a.mean()), float(a.std(ddof=1) / math.sqrt(a.size))
    if sem == 0:
        return mean, mean
    low, high = stats.t.interval(level, a.size - 1, loc=mean, scale=sem)
    return float(low), float(high)


def ratio_interval(
    num: Sequence[float], den: Sequence[float], level: float = LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap interval (percentile, 2,000 resamples, seeded) of mean(num) / mean(den),
    the two resampled independently; nan with fewer than MIN_REPEATS on either side."""
    from scipy import stats

    a, b = _clean(num), _clean(den)
    if a.size < MIN_REPEATS or b.size < MIN_REPEATS or not b.mean() > 0:
        return NAN_PAIR
    if a.std() == 0 and b.std() == 0:
        r = float(a.mean() / b.mean())
        return r, r
    res = stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.mean(x, axis=axis) / np.mean(y, axis=axis),
        confidence_level=level,
        n_resamples=2000,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def cv_pct(values: Sequence[float]) -> float:
    """Coefficient of variation over the repeats, in % (sample standard deviation / mean);
    nan with fewer than 2."""
    a = _clean(values)
    if a.size < 2 or a.mean() == 0:
        return math.nan
    return float(100 * a.std(ddof=1) / abs(a.mean()))


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool | None:
    """Whether two intervals overlap; None where either is unavailable."""
    if any(math.isnan(v) for v in (*a, *b)):
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def leaders(
    cells: Sequence[tuple[str, float, tuple[float, float]]], higher_is_better: bool = True
) -> tuple[list[str], str]:
    """The best cell and every cell tied with it within noise (intervals overlapping the
    best's), from (name, point estimate, interval); and how that was decided. Without
    intervals no tie can be ruled out or in: the best alone, said so."""
    if not cells:
        return [], ""
    ordered = sorted(cells, key=lambda c: c[1], reverse=higher_is_better)
    best = ordered[0]
    if math.isnan(best[2][0]):
        return [best[0]], "no interval (fewer than 3 repeats): ties cannot be told from noise"
    tied = [c[0] for c in ordered[1:] if overlap(best[2], c[2])]
    return [best[0], *tied], "95 % intervals over repeats"


def significant_change(
    before: Sequence[float], after: Sequence[float], worse_if_lower: bool = True
) -> float:
    """One-sided Mann-Whitney U p-value that `after` is worse than `before` (lower when
    `worse_if_lower`, e.g. samples/s; higher otherwise); nan with fewer than MIN_REPEATS on
    either side."""
    from scipy import stats

    a, b = _clean(before), _clean(after)
    if a.size < MIN_REPEATS or b.size < MIN_REPEATS:
        return math.nan
    alternative = "less" if worse_if_lower else "greater"
    return float(stats.mannwhitneyu(b, a, alternative=alternative, method="exact").pvalue)
