"""The tune search (``diffaccel.tuning.search``) on a synthetic trade-off: no model, so it runs in seconds."""

import math

import pytest

from diffaccel.tuning.budget import parse
from diffaccel.tuning.search import Measured, Tunable, feasible_front, far_over, open_study, run_trials

# a strategy whose speed grows with its threshold and whose quality cost grows faster past 0.3;
# a second one that only costs quality (switching it off is the right answer)
SPACE = {"fast": {"threshold": Tunable(key="threshold", low=0.01, high=1.0, log=True)},
         "useless": {"level": Tunable(key="level", low=1, high=4, integer=True)}}
BASE = {"gen_ppl": 100.0}


def evaluate(point, seeds, calls=None):
    if calls is not None:
        calls.append((point, len(seeds)))
    speed, ppl = 1.0, 100.0
    if point["fast"] is not None:
        t = point["fast"]["threshold"]
        speed += 4 * t
        ppl += 100 * max(0.0, t - 0.3) + 2 * t
    if point["useless"] is not None:
        ppl += 3 * point["useless"]["level"]
    return Measured(speedup=speed, quality={"gen_ppl": ppl}, baseline=BASE)


def test_search_finds_the_fastest_point_within_budget_and_switches_off_what_only_costs(tmp_path):
    budgets = [parse("gen_ppl<=+5%")]
    study = open_study(tmp_path, budgets, seed=1)
    ran = run_trials(study, SPACE, budgets, evaluate, seeds=list(range(8)), trials=40)
    assert ran == 40
    best = feasible_front(study)[0]
    point = best.user_attrs["point"]
    assert point["useless"] is None
    # within budget: 100 + 100*(t - 0.3) + 2t <= 105  ->  t <= 0.3392; the search gets close to it
    t = point["fast"]["threshold"]
    assert 0.25 < t <= 0.34
    assert best.values[1] <= 105.0


def test_a_far_over_budget_trial_stops_after_its_first_seeds(tmp_path):
    budgets = [parse("gen_ppl<=+5%")]
    calls = []
    study = open_study(tmp_path, budgets, seed=0)
    run_trials(study, SPACE, budgets, lambda p, s: evaluate(p, s, calls), seeds=list(range(8)), trials=12, chunk=2)
    pruned = [t for t in study.trials if t.state.name == "PRUNED" and "pruned_after" in t.user_attrs]
    assert pruned, "some sampled trial must be far over budget"
    for t in pruned:  # measured on 2 seeds only, and really far over
        assert t.constraints["gen_ppl<=+5%"] > 2 * 5.0
    assert all(n in (2, 8) for _, n in calls)
    assert sum(n == 8 for _, n in calls) == sum(t.state.name == "COMPLETE" for t in study.trials)


def test_far_over_reads_each_kind_of_bound():
    m = Measured(speedup=2.0, quality={"gen_ppl": 116.0, "psnr": 26.0}, baseline={"gen_ppl": 100.0, "psnr": math.inf})
    assert far_over([parse("gen_ppl<=+5%")], m)  # 11 over a 5-point allowance: more than twice
    assert not far_over([parse("gen_ppl<=+10%")], m)  # 6 over a 10-point allowance
    assert not far_over([parse("psnr>=30")], m)  # 4 dB under 30: within 2 x 3 dB
    assert far_over([parse("psnr>=33")], m)  # 7 dB under 33: past 2 x 3.3 dB


def test_an_interrupted_search_resumes_with_the_trials_it_had(tmp_path):
    budgets = [parse("gen_ppl<=+5%")]
    seen = []

    def interrupting(point, seeds):
        seen.append(point)
        if len(seen) == 4:
            raise KeyboardInterrupt
        return evaluate(point, seeds)

    study = open_study(tmp_path, budgets, seed=2)
    with pytest.raises(KeyboardInterrupt):
        run_trials(study, SPACE, budgets, interrupting, seeds=[0], trials=10)
    again = open_study(tmp_path, budgets, seed=2)  # the same command run again
    states = [t.state.name for t in again.trials]
    assert states.count("FAIL") == 1  # the trial running at the interrupt; the others are kept
    finished = sum(s in ("COMPLETE", "PRUNED") for s in states)
    assert finished >= 3
    ran = run_trials(again, SPACE, budgets, evaluate, seeds=[0], trials=10)
    assert ran == 10 - finished
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in again.trials) == 10
    # the resumed search explores on: it does not propose the first session's points again
    first = [t.params for t in again.trials[:4]]
    assert not any(t.params in first for t in again.trials[4:])


def test_tunable_needs_a_range_or_choices():
    with pytest.raises(ValueError, match="give choices, or low <= high"):
        Tunable(key="k", low=2, high=1)
    with pytest.raises(ValueError, match="log scale needs low > 0"):
        Tunable(key="k", low=0.0, high=1.0, log=True)


class _Noisy:
    """A baseline whose gen_ppl moves 20% between two sets of seeds (a sampled text's, judged on
    a few samples), and a trial 18% over on its first chunk: within the noise, so it is measured
    on every seed; a trial 60% over stops after its first chunk all the same."""

    def __init__(self, first_chunk_ppl):
        self.first_chunk_ppl, self.calls = first_chunk_ppl, []

    def __call__(self, point, seeds):
        self.calls.append(len(seeds))
        ppl = self.first_chunk_ppl if len(seeds) == 2 else 104.0
        return Measured(speedup=2.0, quality={"gen_ppl": ppl}, baseline=BASE)

    def baseline_spread(self, first, second):
        assert not set(first) & set(second)
        return {"gen_ppl": 20.0}


@pytest.mark.parametrize("first_chunk_ppl, stopped", [(118.0, False), (160.0, True)])
def test_the_baselines_own_spread_keeps_noisy_trials_from_stopping_early(tmp_path, first_chunk_ppl, stopped):
    budgets = [parse("gen_ppl<=+5%")]
    space = {"fast": SPACE["fast"]}
    evaluate = _Noisy(first_chunk_ppl)
    study = open_study(tmp_path, budgets, seed=0)
    run_trials(study, space, budgets, evaluate, seeds=list(range(8)), trials=3, chunk=2, optional=False)
    assert ("pruned_after" in study.trials[0].user_attrs) is stopped
    assert (8 in evaluate.calls) is not stopped
    # without the spread, 18% over: 13 past a bound that allows 5, more than twice that: stopped
    assert far_over(budgets, Measured(2.0, {"gen_ppl": 118.0}, BASE))


@pytest.mark.parametrize("skipped, speedup, stopped", [(False, 1.0, True), (False, 1.3, False), (True, 1.0, False)])
def test_a_trial_that_skipped_nothing_stops_after_its_first_chunk(tmp_path, skipped, speedup, stopped):
    budgets = [parse("gen_ppl<=+5%")]
    calls = []

    def evaluate(point, seeds):
        calls.append(len(seeds))
        return Measured(speedup=speedup, quality={"gen_ppl": 100.0}, baseline=BASE, skipped=skipped)

    study = open_study(tmp_path, budgets, seed=0)
    run_trials(study, {"fast": SPACE["fast"]}, budgets, evaluate, seeds=list(range(8)), trials=1, chunk=2, optional=False)
    assert ("pruned_after" in study.trials[0].user_attrs) is stopped
    # a strategy that saves time the core does not count (speedup 1.3) is measured in full
    assert calls == ([2] if stopped else [2, 8])
