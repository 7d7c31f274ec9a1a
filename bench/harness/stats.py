"""Statistics over repeats: intervals, stability, ties and significance.

A cell's repeats are the samples: its steps are not, since the step times within one run
are autocorrelated (a slow minute slows many steps in a row), so an interval over steps
would be far too narrow. Intervals are 95 % by default: Student's t over the repeats for a
mean (stated as such), and on the log of a ratio of two cells' means; with fewer than
`MIN_REPEATS` repeats there is no interval (nan), never an invented one. Significance of
a change between two runs: the Mann-Whitney U test on the repeats (as asv's and Google
Benchmark's compare do), one-sided in the direction of the change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
    num: Sequence[float], den: Sequence[float], level: float = LEVEL
) -> tuple[float, float]:
    """Interval of mean(num) / mean(den), the two cells' repeats independent: Student's t on
    the log of the ratio, its standard error from each side's (the delta method), its degrees
    of freedom Welch's; nan with fewer than MIN_REPEATS on either side. Not a bootstrap: at 3
    repeats a side a percentile bootstrap has only 10 distinct resamples each and its "95 %"
    interval held the true ratio about 77 % of the time (this one: 94-97 %)."""
    from scipy import stats

    a, b = _clean(num), _clean(den)
    if a.size < MIN_REPEATS or b.size < MIN_REPEATS or not (a.mean() > 0 and b.mean() > 0):
        return NAN_PAIR
    ratio = float(a.mean() / b.mean())
    # the squared relative standard errors of the two means: the log ratio's variance
    va = a.var(ddof=1) / a.size / a.mean() ** 2
    vb = b.var(ddof=1) / b.size / b.mean() ** 2
    if va + vb == 0:
        return ratio, ratio
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(stats.t.ppf((1 + level) / 2, df)) * math.sqrt(va + vb)
    return ratio * math.exp(-half), ratio * math.exp(half)


#: consecutive steps averaged into one block for an interval on a cell's mean step time:
#: blocks are far less correlated with each other than single steps are (batch means)
STEP_BLOCK = 10
#: --target-precision stops no earlier than this many blocks: with fewer, a t-interval over
#: 2 degrees of freedom is so wide and so unsteady that the first stretch of lucky steps
#: would end a cell (stopping at the first look that passes favours such stretches)
PRECISION_MIN_BLOCKS = 5
PRECISION_MIN_STEPS = STEP_BLOCK * PRECISION_MIN_BLOCKS


def step_precision_pct(
    step_ms: Sequence[float], block: int = STEP_BLOCK, level: float = LEVEL
) -> float:
    """How precisely a cell's timed steps fix its mean step time: the half-width of the 95 %
    t-interval over the means of consecutive blocks of `block` steps, as a % of the mean
    (the batch-means method: steps within one run are autocorrelated, so an interval over
    single steps would be too narrow). nan with fewer than MIN_REPEATS whole blocks. It says
    how well this run measured itself, not how another run will come out: that is the
    interval over repeats."""
    a = _clean(step_ms)
    n = a.size // block
    if n < MIN_REPEATS:
        return math.nan
    means = a[: n * block].reshape(n, block).mean(axis=1)
    low, high = t_interval(means, level)
    centre = float(means.mean())
    return float(100 * (high - low) / 2 / centre) if centre > 0 else math.nan


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """The median of `values` and its distribution-free interval from order statistics
    (the binomial interval for a median: no assumption about the shape of the values, so
    one odd round cannot stretch it as it stretches a mean's): (median, low, high), with
    coverage at least `level`; the interval is nan where too few values give that coverage
    (fewer than 6 at 95 %)."""
    from scipy import stats

    a = np.sort(_clean(values))
    n = a.size
    if n == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(a))
    # the largest k with P(B <= k - 1) <= (1 - level) / 2, B ~ Binomial(n, 1/2): the
    # interval [a_(k), a_(n-k+1)] (1-based) then covers the true median at least `level`
    k = int(stats.binom.ppf((1 - level) / 2, n, 0.5))
    while k >= 1 and stats.binom.cdf(k - 1, n, 0.5) > (1 - level) / 2:
        k -= 1
    if k < 1:
        return med, math.nan, math.nan
    return med, float(a[k - 1]), float(a[n - k])


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


def paired_ratio_interval(
    num: Mapping[int, float], den: Mapping[int, float], level: float = LEVEL
) -> tuple[float, float, float]:
    """Two cells that ran in the same rounds, compared round by round: the geometric mean of
    the per-round ratios num/den and its t-interval (Student's t on the log ratios). A round
    that ran slow slows both alike, so the pairs cancel what unpaired intervals keep: a
    consistent 2 % gap is told from noise that moves both by 20 %. (ratio, low, high); the
    interval is nan with fewer than MIN_REPEATS rounds in common."""
    common = sorted(
        r
        for r in set(num) & set(den)
        if math.isfinite(num[r]) and math.isfinite(den[r]) and num[r] > 0 and den[r] > 0
    )
    if not common:
        return math.nan, math.nan, math.nan
    logs = np.log([num[r] / den[r] for r in common])
    centre = float(np.exp(logs.mean()))
    if logs.size < MIN_REPEATS:
        return centre, math.nan, math.nan
    low, high = t_interval(logs, level)
    return centre, float(np.exp(low)), float(np.exp(high))


def tied(
    rounds: tuple[Mapping[int, float], Mapping[int, float]],
    intervals: tuple[tuple[float, float], tuple[float, float]],
    higher_is_better: bool | None = None,
) -> tuple[bool | None, bool]:
    """Whether cell a is not told apart from cell b, from each one's values per round and
    interval over repeats (in that order, a's first): where they share MIN_REPEATS rounds,
    the paired interval of a/b reaching 1 (paired_ratio_interval), else their intervals
    overlapping; None where either has no interval. And whether the pairs told it. Given
    `higher_is_better`, a is ranked behind b on it (leaders), and only pairs that show a
    behind part them: pairs that show it ahead of the cell ranked first do not put it back."""
    _, low, high = paired_ratio_interval(*rounds)
    if math.isnan(low):
        return overlap(*intervals), False
    if higher_is_better is None:
        return low <= 1 <= high, True
    return (high >= 1 if higher_is_better else low <= 1), True


def leaders(
    cells: Sequence[tuple[str, float, tuple[float, float]]],
    higher_is_better: bool = True,
    rounds: Mapping[str, Mapping[int, float]] | None = None,
) -> tuple[list[str], list[str], str]:
    """The best cell and every cell tied with it within noise, from (name, point estimate,
    interval); the cells not told apart from it; and how that was decided. Where `rounds`
    gives each cell's value per round (an interleaved run), a cell is tied when the paired
    interval of its ratio to the best reaches 1; otherwise, or with fewer than 3 rounds in
    common, when the two cells' intervals overlap (the rule is `tied`'s). Without intervals
    no tie can be ruled out or in: the best alone, said so; a cell with none where others
    have one is neither tied nor behind: not told apart (nothing shows it either way)."""
    if not cells:
        return [], [], ""
    ordered = sorted(cells, key=lambda c: c[1], reverse=higher_is_better)
    best = ordered[0]
    rounds = rounds or {}
    ties, untold, paired, unpaired = [], [], 0, 0
    for name, _, interval in ordered[1:]:
        pair = (rounds.get(name, {}), rounds.get(best[0], {}))
        tie, by_pairs = tied(pair, (interval, best[2]), higher_is_better)
        if tie is None:
            untold.append(name)
            continue
        paired += by_pairs
        unpaired += not by_pairs
        if tie:
            ties.append(name)
    if not paired and not unpaired:
        return [best[0]], [], "no interval (fewer than 3 repeats): ties cannot be told from noise"
    how = []
    if paired:
        how.append("95 % interval of the ratio to the fastest, paired round by round")
    if unpaired:
        how.append("95 % intervals over repeats")
    return [best[0], *ties], untold, "; ".join(how)


def untold_text(untold: Sequence[str]) -> str:
    """The clause naming cells with no interval beside cells that have one ("" if none)."""
    if not untold:
        return ""
    return f"{', '.join(untold)} without an interval (fewer than 3 repeats): not told apart"


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
