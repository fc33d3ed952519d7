"""Text quality metrics."""

import random

import torch

from diffaccel.adapters.text.evaluation import metrics


def test_fluency_prefers_real_text_over_shuffled_and_random():
    real = metrics.reference_lines()[:200]
    rng = random.Random(0)
    shuffled = []
    for line in real:
        w = line.split()
        rng.shuffle(w)
        shuffled.append(" ".join(w))
    p_real, p_shuf = metrics.perplexity(real), metrics.perplexity(shuffled)
    p_uni = metrics.perplexity([metrics.unigram_sample(2000, 0)])
    assert p_real < p_shuf < p_uni * 1.5
    assert p_real < 0.5 * p_shuf


def test_kneser_ney_is_a_distribution():
    lm = metrics.KneserNeyTrigram([["a", "b", "c"], ["a", "c", "b"], ["b", "a"]])
    total = sum(lm.prob("a", "b", w) for w in lm.vocab | {metrics.EOS})
    assert abs(total - 1.0) < 0.05


def test_distinct_n_catches_repetition():
    rep = ["a member of the genus a member of the genus a member of the genus"]
    varied = ["a small dog barks at the big cat while birds sing in tall trees"]
    assert metrics.distinct_n(rep, 2) < 0.5 < metrics.distinct_n(varied, 2)
    assert metrics.distinct_n([], 2) == 0.0


def test_agreement_skips_prompts():
    a = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    b = torch.tensor([[9, 2, 3, 0], [1, 2, 0, 0]])
    assert abs(metrics.agreement(a, b, [1, 0]) - 4 / 7) < 1e-12  # pooled over rows: 2 of 3, then 2 of 4
