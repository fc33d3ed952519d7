"""Bootstrap confidence intervals of ``bench``'s ratios, paired with the baseline.

A bench runs every entry on the same seeds, so an entry's run of seed i and the baseline's are a
pair; resampling the pairs (not each side on its own) keeps what the seed does to both, and the
interval says how much the ratio depends on which seeds were drawn. Percentile intervals over
``RESAMPLES`` resamples from a fixed generator: the same bench gives the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float], *, seed: int = 0) -> tuple[float, float] | None:
    """Interval of ``sum(numerator) / sum(denominator)`` over paired resamples of the indices
    (speedup: the baseline's times over the entry's); None with fewer than 2 pairs or a
    non-finite value."""
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if num.shape != den.shape or num.size < 2 or not (np.isfinite(num).all() and np.isfinite(den).all()):
        return None
    idx = np.random.default_rng(seed).integers(0, num.size, size=(RESAMPLES, num.size))
    top, bottom = num[idx].sum(axis=1), den[idx].sum(axis=1)
    ok = bottom != 0
    if not ok.all():
        return None
    return _percentiles(top / bottom)


def resample(n: int, *, seed: int = 0, resamples: int = RESAMPLES) -> np.ndarray:
    """The seeds (indices below ``n``) of each resample, one row each: what ``pooled_ci`` draws,
    for a caller that wants other figures from the same resamples."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def pooled_ci(n: int, statistic: Callable[[tuple[int, ...]], dict[str, float]], *, seed: int = 0,
              resamples: int = RESAMPLES) -> dict[str, tuple[float, float]]:
    """Intervals of metrics pooled over ``n`` seeds (distinct-n over every output, a perplexity
    over every line): ``statistic(seeds)`` computes them from the outputs of ``seeds``, indices
    in ``range(n)`` that may repeat, and is called again on each resample of the seeds, so each
    interval belongs to the pooled point ``statistic(range(n))`` (a mean of per-seed values need
    not lie near it). A ratio to the baseline is paired by computing both sides in one call on
    the same seeds.

    The interval is the spread of the resamples around their median, placed on the point:
    [point - (median - q2.5), point + (q97.5 - median)]. It always contains the point. A
    resample repeats seeds, which by itself lowers a metric such as distinct-n (a repeated text
    adds n-grams but no new ones), so the resamples' own percentiles can all lie below the
    point; their spread still says how much the metric depends on which seeds were drawn.

    Pooled metrics do not depend on the order of the seeds: each distinct multiset is computed
    once. A key gets an interval only if it is finite in the point and in every resample;
    nothing below 2 seeds."""
    if n < 2:
        return {}
    memo: dict[tuple[int, ...], dict[str, float]] = {}

    def at(idx: tuple[int, ...]) -> dict[str, float]:
        key = tuple(sorted(idx))
        if key not in memo:
            memo[key] = statistic(key)
        return memo[key]

    point = at(tuple(range(n)))
    draws = resample(n, seed=seed, resamples=resamples)
    keys = [k for k, v in point.items() if finite(v)]
    values: dict[str, list[float]] = {k: [] for k in keys}
    for row in draws:
        q = at(tuple(int(i) for i in row))
        for k in list(values):
            v = q.get(k)
            if finite(v):
                values[k].append(float(v))
            else:
                del values[k]
    out = {}
    for k, v in values.items():
        lo, mid, hi = np.quantile(np.asarray(v), [(1 - LEVEL) / 2, 0.5, (1 + LEVEL) / 2])
        out[k] = (float(point[k] - (mid - lo)), float(point[k] + (hi - mid)))
    return out


def _percentiles(samples: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
