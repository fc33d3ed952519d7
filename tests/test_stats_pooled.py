"""Intervals of pooled metrics (``diffaccel.kit.stats.pooled_ci``): the metric is computed again on
each resample of the seeds, so its interval holds its own point, where an interval of the
per-seed mean need not."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from diffaccel.kit.stats import pooled_ci


def distinct2(texts: list[str]) -> float:
    """distinct-2 over every text at once: unique bigrams over all bigrams."""
    grams = [tuple(w[i:i + 2]) for w in (t.split() for t in texts) for i in range(len(w) - 1)]
    return len(set(grams)) / len(grams)


def per_seed_mean_ci(values: list[float]) -> tuple[float, float]:
    """The former way: a bootstrap of the mean of per-seed values (kept here to show the data
    below tells the two apart)."""
    v = np.asarray(values)
    idx = np.random.default_rng(0).integers(0, v.size, size=(2000, v.size))
    lo, hi = np.quantile(v[idx].mean(axis=1), [0.025, 0.975])
    return float(lo), float(hi)


def test_a_pooled_metric_gets_an_interval_around_its_own_point():
    """Every seed writes the same sentence: alone, each is fully distinct (1.0); pooled, the
    bigrams repeat across seeds and distinct-2 is 1/6. The per-seed mean's interval is [1, 1],
    far from the point; the pooled interval holds it."""
    texts = ["a b c d"] * 6
    point = distinct2(texts)
    assert point == pytest.approx(1 / 6)
    wrong = per_seed_mean_ci([distinct2([t]) for t in texts])
    assert not wrong[0] <= point <= wrong[1]
    lo, hi = pooled_ci(len(texts), lambda idx: {"distinct_2": distinct2([texts[i] for i in idx])})["distinct_2"]
    assert lo <= point <= hi


@pytest.mark.parametrize("seed", range(5))
def test_intervals_hold_their_points_on_random_samples(seed):
    """Random texts and per-seed (nll, tokens): distinct-2, a pooled perplexity and a paired
    ratio each lie in their interval, and the interval has width where the seeds differ."""
    rng = random.Random(seed)
    n = rng.randint(3, 9)
    texts = [" ".join(rng.choice("a b c d e f g h".split()) for _ in range(rng.randint(3, 30))) for _ in range(n)]
    nll = [rng.uniform(5, 200) for _ in range(n)]
    tok = [rng.randint(5, 60) for _ in range(n)]
    base_nll = [x * rng.uniform(0.8, 1.2) for x in nll]

    def stat(idx):
        ppl = math.exp(sum(nll[i] for i in idx) / sum(tok[i] for i in idx))
        base = math.exp(sum(base_nll[i] for i in idx) / sum(tok[i] for i in idx))
        return {"distinct_2": distinct2([texts[i] for i in idx]), "gen_ppl": ppl, "ratio": ppl / base}

    point = stat(tuple(range(n)))
    ci = pooled_ci(n, stat)
    assert set(ci) == set(point)
    for k, (lo, hi) in ci.items():
        assert lo <= point[k] <= hi, k
    assert ci["gen_ppl"][1] - ci["gen_ppl"][0] > 0


def test_a_ratio_paired_by_seed_does_not_move_when_both_sides_move_together():
    """The entry is the baseline with every perplexity doubled: paired, the ratio is 2 in every
    resample, however much the seeds differ."""
    nll, tok = [10.0, 300.0, 40.0, 900.0], [10, 100, 20, 150]

    def ppl(scale, idx):
        return math.exp(sum(nll[i] for i in idx) / sum(tok[i] for i in idx)) * scale

    ci = pooled_ci(4, lambda idx: {"ratio": ppl(2.0, idx) / ppl(1.0, idx)})
    assert ci["ratio"] == pytest.approx((2.0, 2.0))


def test_each_multiset_of_seeds_is_computed_once_and_nothing_below_two_seeds():
    calls = []

    def stat(idx):
        calls.append(idx)
        return {"x": float(sum(idx))}

    pooled_ci(3, stat)
    assert len(calls) == len(set(calls)) <= 10  # 3 seeds drawn 3 times: 10 multisets
    assert all(list(c) == sorted(c) for c in calls)
    assert pooled_ci(1, stat) == {}


def test_a_key_not_finite_in_some_resample_gets_no_interval():
    ci = pooled_ci(4, lambda idx: {"ok": float(len(set(idx))), "bad": float("nan") if len(set(idx)) == 1 else 1.0})
    assert "ok" in ci and "bad" not in ci
