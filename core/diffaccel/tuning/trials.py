"""``diffaccel tune``'s trials: each point of the search measured on the tuning seeds against
the baseline, interleaved (speedup: the ratio of their wall times), its quality beside the
baseline's with the bench's own metrics (and judge); the search itself (``search.run_trials``)
with its progress bar."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import attrs
from tqdm.auto import tqdm

from ..contract.errors import ConfigError
from ..kit.stats import finite
from ..runtime.accelerator import apply
from ..runtime.config import RunConfig
from ..runtime.placement import DeviceClock
from ..runtime.registry import Registry, call_own
from ..runtime.runs import Run
from .model_space import apply_model, model_context
from .search import MODEL, Measured, Space, feasible_front, run_trials


def with_point(config: RunConfig, point: dict[str, dict[str, Any] | None], source: str) -> RunConfig:
    """``config`` with each strategy's parameters replaced by the point's (validated by the
    strategy's config class) and the strategies the point switches off dropped."""
    entries = []
    for e in config.strategies:
        params = point.get(e.name, {})
        if params is None:
            continue
        try:
            entries.append(attrs.evolve(e, config=attrs.evolve(e.config, **params)))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: [[strategy]] {e.name}: {exc}") from None
    return apply_model(attrs.evolve(config, strategies=tuple(entries), source=source, peers=()), point.get(MODEL))


class _Trials:
    """Measures trials on a loaded pipeline: the baseline's outputs are kept per seed (they never
    change) but the baseline is timed again beside every trial, interleaved, so each speedup is
    a ratio of one run's wall times."""

    def __init__(self, adapter: Any, pipe: Any, config: RunConfig, registry: Registry, judge: Any):
        self.adapter, self.pipe, self.config, self.registry, self.judge = adapter, pipe, config, registry, judge
        self.setup = Run(config, registry=registry, pipe=pipe)  # the model's facts, the trials' strategies
        self.info = self.setup.info
        self.base_out: dict[int, Any] = {}
        self.base_quality: dict[tuple[int, ...], dict[str, float]] = {}
        self.count = 0
        # the bench's clock: on an accelerator it synchronises the device around each timed run
        self.clock = DeviceClock(config.model.device)
        # the last point's runs, seed by seed (base time, trial time, output, skipped anything):
        # a trial measured on its first chunk, then on every seed, runs the first chunk once
        self.runs: tuple[str, dict[int, tuple[float, float, Any, bool]]] = ("", {})

    def __call__(self, point: dict[str, dict[str, Any] | None], seeds: Sequence[int]) -> Measured:
        self.count += 1
        key = json.dumps(point, sort_keys=True)
        if self.runs[0] != key:
            self.runs = (key, {})
        done = self.runs[1]
        cfg = with_point(self.config, point, f"tune trial {self.count}")
        strategies = self.setup.build(cfg)
        for i, seed in enumerate(s for s in seeds if s not in done):
            for which in (("base", "trial") if i % 2 == 0 else ("trial", "base")):
                if which == "base":
                    with self.clock.region() as r:
                        out = self.adapter.run(self.pipe, self.config.without_strategies(), seed, progress=False)
                    t_base = r.seconds
                    self.base_out.setdefault(seed, out)
                else:
                    handle = apply(self.pipe, cfg, strategies=strategies, registry=self.registry)
                    with model_context(self.adapter, self.pipe, self.config, cfg), handle:
                        with self.clock.region() as r:
                            trial_out = self.adapter.run(self.pipe, cfg, seed, progress=False)
                        t_trial = r.seconds
            done[seed] = (t_base, t_trial, trial_out, _skipped(handle.last_report))
        t_base = sum(done[s][0] for s in seeds)
        t_trial = sum(done[s][1] for s in seeds)
        outs = [done[s][2] for s in seeds]
        base = [self.base_out[s] for s in seeds]
        quality = dict(self.adapter.quality(base, outs))
        baseline = dict(self._baseline(tuple(seeds)))
        for s in strategies:  # what the strategies measure themselves (bert-cond's recall, ...)
            quality.update(_own_quality(s, outs, list(seeds)))
            for k, v in _own_quality(s, base, list(seeds)).items():
                baseline.setdefault(k, v)
        if self.judge is not None:
            quality["gen_ppl"] = self._ppl(outs)
        return Measured(speedup=t_base / t_trial, quality=quality, baseline=baseline,
                        skipped=any(done[s][3] for s in seeds))

    def baseline_spread(self, first: Sequence[int], second: Sequence[int]) -> dict[str, float]:
        """How far each quality key of the baseline moves between two disjoint sets of seeds
        (``search.run_trials``' noise for stopping hopeless trials early); runs the baseline
        untimed on seeds it has not run yet (every trial that is not stopped needs them anyway)."""
        for seed in [*first, *second]:
            if seed not in self.base_out:
                self.base_out[seed] = self.adapter.run(self.pipe, self.config.without_strategies(), seed, progress=False)
        a, b = self._baseline(tuple(first)), self._baseline(tuple(second))
        return {k: abs(a[k] - b[k]) for k in a if k in b and finite(a[k]) and finite(b[k])}

    def _baseline(self, seeds: tuple[int, ...]) -> dict[str, float]:
        """The baseline's quality on ``seeds`` (its outputs never change, so scored once per set
        of seeds, not once per trial): the adapter's keys and, with a judge, gen_ppl."""
        if seeds not in self.base_quality:
            base = [self.base_out[s] for s in seeds]
            q = dict(self.adapter.quality(base, base))
            if self.judge is not None:
                q["gen_ppl"] = self._ppl(base)
            self.base_quality[seeds] = q
        return self.base_quality[seeds]

    def _ppl(self, outputs: list[Any]) -> float:
        scores = self.judge.score(self.adapter.judge_lines(outputs))
        toks = sum(scores.tokens)
        return math.exp(sum(scores.nll) / toks) if toks else float("nan")


def _skipped(report: dict[str, Any] | None) -> bool:
    """Whether a run's report shows work saved: a layer or position not computed, or fewer steps."""
    if not report:
        return True  # nothing to read: assume it did (never stop a trial on a missing report)
    c = report.get("counters", {})
    return bool(c.get("layers_skipped", 0) or c.get("steps_reused", 0) or c.get("fraction_computed", 1.0) < 1.0
                or report.get("steps_run", report.get("steps", 0)) < report.get("steps", 0))


def _own_quality(strategy: Any, outputs: list[Any], seeds: list[int]) -> dict[str, float]:
    merged: dict[str, float] = {}
    for q in call_own(strategy, "diffaccel_bench_quality", outputs=outputs, seeds=seeds):
        merged.update(q)
    return merged


def search(study: Any, space: Space, budgets: list[Any], measure: _Trials, seeds: list[int], *, trials: int,
           progress: bool) -> None:
    """Run the study's trials (``search.run_trials``; a resumed study counts its finished ones),
    the best speedup within budget so far on the progress bar."""
    bar = None
    if progress:
        done = len([t for t in study.trials if t.state.is_finished()])
        bar = tqdm(total=trials, initial=min(done, trials), desc="tune", unit="trial")

    def on_trial(_: Any) -> None:
        if bar is not None:
            bar.update(1)
            front = feasible_front(study)
            bar.set_postfix_str(f"best within budget {front[0].values[0]:.2f}x" if front else "none within budget yet")

    try:
        run_trials(study, space, budgets, measure, seeds, trials=trials, on_trial=on_trial)
    finally:
        if bar is not None:
            bar.close()
