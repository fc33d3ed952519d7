"""The masked sampler's draws: inverse CDF from the softmax, and the per-position CDF cache that
lets a partial step skip the softmax of the positions it did not compute."""

import math

import pytest
import torch

from diffaccel import StepPlan, hookimpl
from diffaccel.adapters.text.sampling import logits as draws
from diffaccel.adapters.text.sampling.logits import CdfCache, TopKLogits, draw
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.testing import run_with


def test_draw_follows_the_softmax_and_never_draws_banned_tokens():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]]).repeat(20000, 1)
    conf, choice = draw(logits.clone(), [4], 1.0, torch.Generator().manual_seed(0))
    p = torch.tensor([2.0, 1.0, 0.0, -1.0, -math.inf]).softmax(-1)
    freq = torch.bincount(choice, minlength=5).float() / choice.numel()
    assert freq[4] == 0
    assert torch.allclose(freq, p, atol=0.015)
    assert torch.allclose(conf, p[choice], atol=1e-6)


@pytest.mark.parametrize("V", [64, 53, 50])  # block width divides V, does not (padded), a divisor below sqrt
def test_most_probable_is_the_softmax_maximum(V):
    logits = torch.randn(300, V, generator=torch.Generator().manual_seed(V)) * 4
    logits[7, V - 1] = 40.0  # a maximum in the last (possibly padded) block
    prob, token = draws.most_probable(logits.view(3, 100, V))
    want_p, want_t = logits.softmax(-1).max(-1)
    assert prob.shape == token.shape == (3, 100)
    assert torch.equal(token.view(-1), want_t) and torch.allclose(prob.view(-1), want_p, rtol=1e-5)


@pytest.mark.parametrize("V", [53, 64])
def test_two_level_draw_follows_the_softmax_on_any_vocabulary_size(V):
    logits = torch.randn(V, generator=torch.Generator().manual_seed(2)).repeat(40000, 1)
    banned = [0, V - 1, V - 2]  # the last (padded) block holds banned ids
    conf, choice = draw(logits.clone(), banned, 0.8, torch.Generator().manual_seed(0))
    masked = logits[0].clone()
    masked[banned] = -math.inf
    p = (masked / 0.8).softmax(-1)
    freq = torch.bincount(choice, minlength=V).float() / choice.numel()
    assert freq[banned].sum() == 0
    assert (freq - p).abs().max() < 0.01
    assert torch.allclose(conf, p[choice], rtol=1e-5)


def test_a_uniform_at_the_ends_of_the_range_draws_the_first_or_last_entry_with_mass():
    V = 53
    lg = torch.randn(V, generator=torch.Generator().manual_seed(4)).repeat(4, 1)
    lg[:, 40:] = -math.inf  # the last blocks carry no mass
    lg[:, 0] = -math.inf
    conf, choice = draws._pick(*draws._cdf(lg.clone(), 1.0), torch.tensor([[1.0], [1.0 - 2**-24], [0.0], [0.5]]))
    assert choice[:3].tolist() == [39, 39, 1]
    assert 1 <= choice[3] <= 39 and (conf > 0).all()


def test_draw_at_temperature_zero_is_the_argmax_without_banned_tokens():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    logits[:, 0] = 100.0
    _, choice = draw(logits.clone(), [0], 0.0, torch.Generator())
    logits[:, 0] = -math.inf
    assert choice.tolist() == logits.argmax(-1).tolist()


def test_draw_on_truncated_logits_returns_token_ids():
    tk = TopKLogits(values=torch.tensor([[5.0, 4.0]]).repeat(1000, 1), indices=torch.tensor([[17, 3]]).repeat(1000, 1),
                    vocab_size=20)
    conf, choice = draw(tk, [3], 1.0, torch.Generator().manual_seed(0))
    assert set(choice.tolist()) == {17} and torch.allclose(conf, torch.ones(1000))


@pytest.mark.parametrize("V", [40, 53])  # blocks that tile the vocabulary, and a padded last block
def test_cache_draws_exactly_what_draw_does_and_forgets_what_it_is_told(V):
    B, N = 2, 12
    logits = torch.randn(B, N, V, generator=torch.Generator().manual_seed(3))
    cache = CdfCache((B, N, V), torch.device("cpu"))
    cand_pos = torch.tensor([1, 4, 5, 9])
    cand = torch.zeros(B, N, dtype=torch.bool)
    cand[:, cand_pos] = True
    cand[1, 0] = True  # rows may have different candidates
    gens = lambda *seeds: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    conf, choice = cache.draw(logits, cand, [2], 0.7, gens(0, 1))
    for r in range(B):
        want = draw(logits[r, cand[r]], [2], 0.7, torch.Generator().manual_seed(r))
        assert torch.equal(choice[r, cand[r]], want[1]) and torch.equal(conf[r, cand[r]], want[0])
    # a row whose logits changed keeps its cached block sums until it is invalidated (the sampler
    # invalidates every computed row; the others' logits do not change)
    logits[0, 4] = -50.0
    logits[0, 4, 7] = 50.0
    _, stale = cache.draw(logits, cand, [2], 0.7, gens(5, 6))
    cache.invalidate(torch.tensor([4, N + 4]))  # position 4 of both rows, as flat B * N indices
    _, fresh = cache.draw(logits, cand, [2], 0.7, gens(5, 6))
    assert stale[0, 4] != 7 and fresh[0, 4] == 7
    assert torch.equal(fresh[0, [1, 5, 9]], stale[0, [1, 5, 9]])  # the other rows came from the cache
    assert cache.valid[0, cand_pos].all() and not cache.valid[0, 0] and cache.valid[1, 0]


class Narrow:
    """Computes every other position on odd steps (a partial step), everything on even ones."""

    name = "narrow"

    @hookimpl
    def diffaccel_pre_step(self, run):
        if run.step % 2 == 0:
            return None
        pos = torch.zeros(run.batch_size, run.info.tokens.length, dtype=torch.bool)
        pos[:, (run.step // 2) % 2::2] = True
        return StepPlan(positions=pos)


@pytest.mark.parametrize("batch", [1, 2])
def test_partial_steps_with_the_cache_draw_what_recomputing_every_cdf_would(monkeypatch, batch):
    pipe = tiny_text_pipeline("masked")
    cached = run_with(pipe, [Narrow()], length=20, steps=20, seed=3, batch=batch)
    calls = []

    def uncached(self, logits, cand, banned, temperature, gens, counts=None):
        calls.append(len(gens))
        conf, choice = torch.zeros(cand.shape), torch.zeros(cand.shape, dtype=torch.long)
        for r, gen in enumerate(gens):
            if cand[r].any():
                conf[r, cand[r]], choice[r, cand[r]] = draw(logits[r, cand[r]], banned, temperature, gen)
        return conf, choice

    monkeypatch.setattr(draws.CdfCache, "draw", uncached)
    plain = run_with(pipe, [Narrow()], length=20, steps=20, seed=3, batch=batch)
    assert calls  # the hooked run went through the cache
    assert torch.equal(cached.tokens, plain.tokens)


class Watch:
    """Active, plans nothing: every step is full, so every cached CDF is recomputed."""

    name = "watch"

    @hookimpl
    def diffaccel_post_step(self, run, output):
        pass


def test_without_partial_steps_the_hooked_run_equals_the_plain_one():
    pipe = tiny_text_pipeline("masked")
    hooked = run_with(pipe, [Watch()], length=20, steps=20, seed=1)
    plain = pipe(length=20, steps=20, seed=1, progress=False)
    assert torch.equal(hooked.tokens, plain.tokens)


def test_commit_takes_each_rows_own_number_of_most_confident_candidates():
    from diffaccel.adapters.text.sampling.pipeline import commit_most_confident_

    x = torch.full((3, 6), 2)
    candidates = torch.tensor([[1, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    confs = torch.tensor([[0.1, 0.9, 0.5, 0.99, 0.7, 0.0], [0.3, 0.2, 0.0, 0.0, 0.0, 0.0], [0.9, 0.9, 0.2, 0.4, 0.3, 0.1]])
    choices = torch.arange(18).view(3, 6) + 100
    commit_most_confident_(x, candidates, confs, choices, [2, 0, 1])
    # row 0: the two best candidates (0.9 at 1, 0.7 at 4); position 3 (0.99) is no candidate
    assert x[0].tolist() == [2, 101, 2, 2, 104, 2]
    assert x[1].tolist() == [2] * 6  # k = 0: nothing committed
    assert x[2].tolist() == [2, 2, 2, 115, 2, 2]  # non-candidates 0 and 1 (0.9) are passed over
