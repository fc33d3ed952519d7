"""The search behind ``diffaccel tune``: optuna over the strategies' tunable parameters.

The space is each strategy of a config switched on or off (composition is part of the search)
and, when on, its tunable parameters (``diffaccel.Tunable``: declared by the strategy's plugin through the
``diffaccel_tunables`` hook). A trial is measured by ``evaluate(params, seeds)``, which returns its
speedup and its quality beside the baseline's on those seeds; the study is multi-objective
(speedup, and each budgeted metric in the budget's direction) with the budgets as optuna
constraints, so the Pareto front it keeps is the feasible trade-off. A trial is measured on the
tuning seeds in chunks: one that is far over a budget after its first chunk stops there (pruned),
so hopeless settings cost a fraction of a full trial.

The study lives in ``OUT/study.db`` (SQLite): an interrupted search resumes where it stopped when
the same command runs again; an interrupt leaves the finished trials and marks the running one
failed. optuna (pinned in pyproject.toml) is a maintained library for exactly this: samplers for
mixed integer/float/categorical spaces with constraints, storage and resumption.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .._moved import moved_names
from ..contract.tunable import Tunable as _Tunable
from .budget import Budget

__getattr__ = moved_names(__name__, {"Tunable": "diffaccel.contract.tunable"})
"""``Tunable`` lived here until 0.2 (``diffaccel.contract.tunable`` now, or ``diffaccel.Tunable``): the old
path gives it, with a DeprecationWarning, until 0.3."""

STUDY = "tune"
"""The study's name inside ``study.db``."""


Space = Mapping[str, Mapping[str, _Tunable]]
"""Strategy name (config order) -> its tunables by key; ``MODEL``: the ``[model]`` keys searched."""
MODEL = "[model]"
"""The space's and a point's entry for ``[model]`` keys (``tune --model-space``): never switched off."""


def suggest(trial: Any, space: Space, optional: bool = True) -> dict[str, dict[str, Any] | None]:
    """One point of ``space``: strategy -> its parameters, or None where the trial switches it off
    (``optional``); a trial with every strategy off is not worth measuring (it is the baseline)."""
    point: dict[str, dict[str, Any] | None] = {}
    several = sum(name != MODEL for name in space) > 1
    for name, tunables in space.items():
        on = trial.suggest_categorical(f"{name}.on", [True, False]) if optional and several and name != MODEL else True
        point[name] = {k: t.suggest(trial, f"{name}.{k}") for k, t in tunables.items()} if on else None
    return point


@attrs.frozen
class Measured:
    """What ``evaluate`` returns for a trial on some seeds."""

    speedup: float
    quality: Mapping[str, float]
    baseline: Mapping[str, float]
    """The baseline's quality on the same seeds (what relative budgets read)."""
    skipped: bool = True
    """Whether the strategies saved any work the core counts (a layer, a position or a step);
    False with a speedup near 1: the trial is the baseline's run under other settings."""


# a trial that skipped nothing is stopped after its first chunk unless it is this much faster
# anyway (a strategy that saves time some way the core does not count)
IDLE_SPEEDUP = 1.05

Evaluate = Callable[[dict[str, dict[str, Any] | None], Sequence[int]], Measured]


def far_over(budgets: Sequence[Budget], m: Measured, slack: float = 2.0, noise: Mapping[str, float] | None = None) -> bool:
    """Whether a partial measurement is over some budget by more than ``slack`` times what the
    budget allows (a relative or difference bound: its distance from the baseline, e.g. 5% of the
    baseline's gen_ppl; an absolute bound: a tenth of its size, e.g. 3 dB of psnr>=30), plus
    twice the metric's ``noise`` on that many seeds (how far the baseline alone moves between two
    disjoint sets of them: a sampled text's gen_ppl moves ~20% between two sets of 8, so without
    it every text trial looked hopeless after its first batch). Such a trial will not come back
    on more seeds, so it stops."""
    for b in budgets:
        value, base = m.quality.get(b.metric), m.baseline.get(b.metric)
        if value is None:
            continue
        if b.kind == "absolute":
            allowed = 0.1 * abs(b.value)
        else:
            allowed = abs(b.limit(base) - base)
        spread = (noise or {}).get(b.metric, 0.0)
        if b.margin(value, base) < -(slack * max(allowed, 1e-12) + 2 * (spread if math.isfinite(spread) else 0.0)):
            return True
    return False


def objectives(budgets: Sequence[Budget], m: Measured) -> list[float]:
    """The trial's values: speedup, then each budgeted metric (as measured)."""
    values = [m.speedup, *[float(m.quality.get(b.metric, math.nan)) for b in budgets]]
    return [max(-1e6, min(1e6, v)) if not math.isnan(v) else v for v in values]  # psnr of an identical run: inf


def directions(budgets: Sequence[Budget]) -> list[str]:
    return ["maximize", *["minimize" if b.lower_is_better else "maximize" for b in budgets]]


def open_study(out: Path, budgets: Sequence[Budget], seed: int = 0) -> Any:
    """The study in ``out/study.db``, created or resumed. The sampler (TPE, multi-objective, with
    the budgets as constraints) is seeded, so a search is reproducible."""
    import optuna  # deferred: importing optuna (and SQLAlchemy) costs ~1 s, which no other command should pay

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out.mkdir(parents=True, exist_ok=True)
    sampler = lambda s: optuna.samplers.TPESampler(seed=s, n_startup_trials=8, multivariate=True)  # noqa: E731
    study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{out / 'study.db'}", load_if_exists=True,
                                directions=directions(budgets), sampler=sampler(seed))
    if study.trials:
        # a resumed study: a sampler seeded as at the start would propose its first points again
        # (the startup trials are random draws from that seed), wasting the trials on repeats
        study.sampler = sampler(seed + len(study.trials))
    return study


def _constrain(trial: Any, budgets: Sequence[Budget], margins: Sequence[float]) -> None:
    """The budgets as optuna constraints (<= 0 is feasible: each budget's margin, negated)."""
    for b, margin in zip(budgets, margins):
        # an infinite margin: identical to the baseline (psnr inf) is inside, a missing metric outside
        trial.set_constraint(b.text, -margin if math.isfinite(margin) else (-1e9 if margin > 0 else 1e9))


def feasible(trial: Any) -> bool:
    """Whether a finished trial met every budget on the seeds it was measured on."""
    c = trial.constraints
    return bool(c) and all(v <= 0 for v in c.values())


def run_trials(study: Any, space: Space, budgets: Sequence[Budget], evaluate: Evaluate, seeds: Sequence[int], *,
               trials: int, chunk: int | None = None, optional: bool = True,
               on_trial: Callable[[Any], None] | None = None) -> int:
    """Run trials until the study holds ``trials`` finished ones (complete or pruned): a resumed
    study runs only the rest. Returns how many ran now. KeyboardInterrupt propagates after
    optuna marks the running trial failed (the finished ones stay in the study)."""
    import optuna  # deferred, as in open_study

    done = sum(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in study.trials)
    chunk = chunk or max(1, len(seeds) // 4)
    # the baseline's own spread between two disjoint chunks of seeds, when the evaluator can say
    # (``baseline_spread``): the noise a first chunk's figures carry
    spread = getattr(evaluate, "baseline_spread", None)
    noise: dict[str, float] = {}

    def objective(trial: Any) -> list[float]:
        point = suggest(trial, space, optional)
        trial.set_user_attr("point", point)
        if all(p is None for n, p in point.items() if n != MODEL) and not point.get(MODEL):
            raise optuna.TrialPruned("every strategy off: the baseline itself")
        m = evaluate(point, list(seeds[:chunk]))
        if not m.skipped and m.speedup < IDLE_SPEEDUP:
            # e.g. thresholds so tight that nothing is ever reused: the baseline again, at full cost
            trial.set_user_attr("pruned_after", chunk)
            raise optuna.TrialPruned(f"skipped nothing after {chunk} seeds")
        if len(seeds) > chunk:
            if spread is not None and not noise and len(seeds) >= 2 * chunk:
                noise.update(spread(list(seeds[:chunk]), list(seeds[chunk:2 * chunk])))
            if far_over(budgets, m, noise=noise):
                _constrain(trial, budgets, [b.check(m.quality, m.baseline)[1] for b in budgets])
                trial.set_user_attr("pruned_after", chunk)
                raise optuna.TrialPruned(f"far over budget after {chunk} seeds")
            # over all seeds: pooled metrics (perplexity over every sample, distinct-n) cannot be
            # merged from two partial measurements; the evaluator may reuse the first chunk's runs
            m = evaluate(point, list(seeds))
        margins = [b.check(m.quality, m.baseline)[1] for b in budgets]
        _constrain(trial, budgets, margins)
        trial.set_user_attr("quality", dict(m.quality))
        trial.set_user_attr("baseline", dict(m.baseline))
        return objectives(budgets, m)

    left = max(0, trials - done)
    if left:
        callbacks = [lambda s, t: on_trial(t)] if on_trial else None
        study.optimize(objective, n_trials=left, callbacks=callbacks, catch=())
    return left


def feasible_front(study: Any) -> list[Any]:
    """The complete trials that met every budget on the tuning seeds and that no other such
    trial beats on every objective, fastest first."""
    import optuna  # deferred, as in open_study

    ok = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and feasible(t)]
    signs = [1 if d == optuna.study.StudyDirection.MAXIMIZE else -1 for d in study.directions]

    def dominates(a: Any, b: Any) -> bool:
        va = [s * v for s, v in zip(signs, a.values)]
        vb = [s * v for s, v in zip(signs, b.values)]
        return all(x >= y for x, y in zip(va, vb)) and any(x > y for x, y in zip(va, vb))

    front = [t for t in ok if not any(dominates(o, t) for o in ok if o is not t)]
    return sorted(front, key=lambda t: -t.values[0])
