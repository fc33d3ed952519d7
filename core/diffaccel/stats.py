"""Bootstrap confidence intervals of ``bench``'s ratios, paired with the baseline.

A bench runs every entry on the same seeds, so an entry's run of seed i and the baseline's are a
pair; resampling the pairs (not each side on its own) keeps what the seed does to both, and the
interval says how much the ratio depends on which seeds were drawn. Percentile intervals over
``RESAMPLES`` resamples from a fixed generator: the same bench gives the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def mean_ci(values: Sequence[float], *, seed: int = 0) -> tuple[float, float] | None:
    """Interval of the mean of ``values`` (one per seed) over resamples; None below 2 values."""
    v = np.asarray(values, dtype=float)
    if v.size < 2 or not np.isfinite(v).all():
        return None
    idx = np.random.default_rng(seed).integers(0, v.size, size=(RESAMPLES, v.size))
    return _percentiles(v[idx].mean(axis=1))


def _percentiles(samples: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
