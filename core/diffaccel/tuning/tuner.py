"""``diffaccel tune``: the fastest settings of a config's strategies within a quality budget, on
the user's own model, proven on seeds it did not tune on.

1. The budgets (``diffaccel.tuning.budget``) are checked against the metrics the adapter and the config's
   strategies report, and the search space is read from the strategies' plugins
   (``diffaccel_tunables``), before any model loads.
2. Trials (``diffaccel.tuning.search``) run on the tuning seeds: each measures the trial's strategies and
   the baseline on the same seeds, interleaved (speedup: the ratio of their wall times), and its
   quality beside the baseline's with the bench's own metrics (and judge).
3. The best few feasible points and the config as given are re-measured by the ordinary bench on
   held-out seeds (a disjoint range, by default many more samples), at batch 1 and at the
   configured batch. A point is accepted when its held-out quality meets every budget at the
   configured batch, read as the point estimate over all held-out samples (the bootstrap interval
   is reported beside it: at the sample sizes a CPU affords its width alone is of the order of a
   5% budget, so a bound read on its far end would refuse every point, and the point estimate is
   unbiased); the fastest accepted point is written as TUNED.toml.
4. No point passes: one line says so, nothing is written as TUNED.toml, the study and the report
   stay for the user to look at.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from tqdm.auto import tqdm

from ..bench.runner import _load_judge, judge_for, run_bench
from ..contract.adapter import JudgesSamples, ReportsQuality
from ..contract.errors import ConfigError, DiffaccelError
from ..kit.stats import finite
from ..runtime.accelerator import apply, build_strategies
from ..runtime.adapters_registry import get_adapter
from ..runtime.config import RunConfig, load_config, parse_config, read_toml
from ..runtime.placement import DeviceClock
from ..runtime.registry import Registry, call_own
from .budget import parse_all
from .model_space import apply_model, model_context, model_tunables
from .search import MODEL, Measured, Space, Tunable, feasible_front, open_study, run_trials
from .toml_out import dumps
from .tune_report import write_report

DEFAULT_HELDOUT_SEED = 100_000
"""First held-out seed: far from the seeds configs and benches use, so the ranges stay disjoint."""


@attrs.frozen
class TuneResult:
    """What ``tune`` found: the TUNED.toml written (None when no point met the budget on the
    held-out seeds), the chosen point and its held-out figures, where the study and report are."""

    path: Path | None
    point: dict[str, dict[str, Any] | None] | None
    figures: dict[str, Any]
    """Held-out figures per candidate name: speedup per batch size, quality per metric with its interval."""
    study: Path
    report: Path
    message: str


def tunable_space(config: RunConfig, registry: Registry) -> Space:
    """Strategy name -> its tunables, asked of the plugin that registered each strategy
    (``diffaccel_tunables``); ranges are checked against the strategy's config class."""
    space: dict[str, dict[str, Tunable]] = {}
    for entry in config.strategies:
        spec = registry.get(entry.name)
        plugin = registry.pm.get_plugin(spec.plugin) if spec is not None else None
        impl = getattr(plugin, "diffaccel_tunables", None)
        declared = impl(strategy=entry.name) if impl is not None else None
        fields = {f.name for f in attrs.fields(type(entry.config))}
        tunables: dict[str, Tunable] = {}
        for t in declared or ():
            if not isinstance(t, Tunable):
                raise ConfigError(f"plugin '{spec.plugin}': diffaccel_tunables for '{entry.name}' returned {t!r}, not a diffaccel.Tunable")
            if t.key not in fields:
                raise ConfigError(f"plugin '{spec.plugin}': tunable '{t.key}' is no key of strategy '{entry.name}'; "
                                  f"its keys: {', '.join(sorted(fields))}")
            tunables[t.key] = t
        space[entry.name] = tunables
    if not any(space.values()) and len(space) < 2:
        names = ", ".join(space) or "none"
        raise ConfigError(f"{config.source}: nothing to tune: its strategies ({names}) declare no tunable parameters "
                          f"(diffaccel_tunables) and there are not two to switch on and off")
    return space


def reported_metrics(adapter: Any, config: RunConfig, registry: Registry, judge: str | None) -> list[str]:
    """The quality keys a bench of ``config`` reports: the adapter's (``quality_keys``), gen_ppl
    when a judge runs, and what the config's strategies add (``Strategy.reports``)."""
    keys = list(adapter.quality_keys(config)) if isinstance(adapter, ReportsQuality) else []
    if judge_for(adapter, config, judge) not in (None, "none") and isinstance(adapter, JudgesSamples):
        keys.append("gen_ppl")
    for entry in config.strategies:
        spec = registry.get(entry.name)
        keys += list(getattr(spec, "reports", ()) or ())
    return keys


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


def toml_text(config_path: str | Path, point: dict[str, dict[str, Any] | None], header: list[str]) -> str:
    """The config file's text with the point applied: its ``[model]`` (and ``[guard]``) tables as
    written, its strategies' tables with the point's values, peers dropped (bench-only)."""
    raw = read_toml(config_path)
    out: dict[str, Any] = {"model": {**raw["model"], **(point.get(MODEL) or {})}}
    if "guard" in raw:
        out["guard"] = raw["guard"]
    tables = []
    for table in raw.get("strategy", []):
        params = point.get(table["use"], {})
        if params is None:
            continue
        tables.append({**table, **(params or {})})
    if tables:
        out["strategy"] = tables
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + "\n" + dumps(out)


class _Trials:
    """Measures trials on a loaded pipeline: the baseline's outputs are kept per seed (they never
    change) but the baseline is timed again beside every trial, interleaved, so each speedup is
    a ratio of one run's wall times."""

    def __init__(self, adapter: Any, pipe: Any, config: RunConfig, registry: Registry, judge: Any):
        self.adapter, self.pipe, self.config, self.registry, self.judge = adapter, pipe, config, registry, judge
        self.info = adapter.info(pipe)
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
        strategies = build_strategies(cfg, self.registry, self.info)
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


def _pipeline_config(pipe: Any, model: dict[str, Any] | None, strategies: Sequence[dict[str, Any]] | None) -> dict[str, Any]:
    """The config (as TOML tables) of a tune on a loaded pipeline: its adapter, ``model``'s keys
    and the ``strategies`` tables."""
    from ..runtime.adapters_registry import adapter_for

    if not strategies or not all(isinstance(s, dict) for s in strategies):
        raise ConfigError("diffaccel.tune(pipe, ...): give strategies=[{'use': ...}, ...], the [[strategy]] tables to tune")
    adapter = adapter_for(pipe)
    return {"model": {**dict(model or {}), "adapter": adapter.name}, "strategy": [dict(s) for s in strategies]}


def _write_heldout(path: Path, result: dict[str, Any]) -> None:
    """A held-out bench's result as JSON, without each run's own report (counters and strategy
    metrics run by run: 90% of the file, megabytes per tune, and nothing the tune's figures read)."""
    for e in result["entries"]:
        e.pop("reports", None)
    result["run_reports"] = "dropped by diffaccel tune (the same `diffaccel bench --json` keeps them)"
    path.write_text(json.dumps(result, indent=1, default=float))


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


def tune(config: Any, budget: Sequence[str] | str, out: str | Path, *, trials: int = 30, tune_seeds: int = 8,
         heldout: int = 32, heldout_seed: int = DEFAULT_HELDOUT_SEED, batch: int | None = None, judge: str | None = "default",
         candidates: int = 3, report: str | Path | None = None, progress: bool = True, search_seed: int = 0,
         registry: Registry | None = None, model: dict[str, Any] | None = None,
         strategies: Sequence[dict[str, Any]] | None = None, model_space: dict[str, Sequence[Any]] | None = None) -> TuneResult:
    """Tune ``config``'s strategies to ``budget`` (one expression or several) and write the
    fastest held-out-valid point to ``out`` (TUNED.toml). ``trials`` trials on ``tune_seeds``
    seeds from the config's seed; then the ``candidates`` best feasible points and the config as
    given are benched on ``heldout`` held-out samples from ``heldout_seed``, at batch 1 and at
    ``batch`` (default: the config's batch, or 8 if that is 1). ``report`` (default
    ``OUT.tune/``) keeps the study (``study.db``: rerun to resume), the held-out benches and the
    figures. Raises ``ConfigError`` before loading anything for a bad budget or config.

    ``config`` may also be a loaded pipeline: then ``strategies`` gives the ``[[strategy]]``
    tables to tune and ``model`` the ``[model]`` keys of its runs (``steps``, ``batch``, ``seed``,
    adapter options such as ``length``); the report folder keeps that config (``config.toml``),
    and TUNED.toml has no checkpoint: ``diffaccel.apply(pipe, TUNED)`` uses it on that pipeline.
    ``model_space``: ``[model]`` keys searched too, {"steps": (8, 10), "scheduler": ("dpm++2m",)}
    (``tune_model``; the diffusers adapters): each trial against the config's own model."""
    registry = registry or Registry()
    started, started_at = time.perf_counter(), time.localtime()
    pipe, source = None, None
    if not isinstance(config, (str, Path)):
        pipe, config, source = config, None, _pipeline_config(config, model, strategies)
    elif model is not None or strategies is not None:
        raise ConfigError("diffaccel.tune: model= and strategies= go with a pipeline; a config file has its own")
    out = Path(out)
    if out.suffix != ".toml":
        raise ConfigError(f"--out {out}: write the tuned config to a .toml file")
    if not out.parent.exists():
        raise ConfigError(f"--out {out}: folder {out.parent} does not exist")
    for name, v, lo in (("--trials", trials, 1), ("--tune-seeds", tune_seeds, 1), ("--heldout", heldout, 1), ("--candidates", candidates, 1)):
        if v < lo:
            raise ConfigError(f"{name} must be {lo} or more, got {v}")
    if pipe is not None:  # written into the report folder once the budget is checked, below
        config = Path(report) / "config.toml" if report is not None else out.with_name(out.stem + ".tune") / "config.toml"
        cfg = parse_config(source, source=str(config), registry=registry)
    else:
        cfg = load_config(config, registry)
    if not cfg.strategies:
        raise ConfigError(f"{config}: no [[strategy]] table: nothing to tune")
    adapter = get_adapter(cfg.model.adapter)
    budgets = parse_all([budget] if isinstance(budget, str) else list(budget), reported_metrics(adapter, cfg, registry, judge))
    space = tunable_space(cfg, registry)
    if model_space:  # [model] steps and scheduler searched with the strategies (tune_model)
        space = {**space, MODEL: model_tunables(cfg, adapter, dict(model_space))}
    tune_seed_list = [cfg.model.seed + k * cfg.model.batch for k in range(tune_seeds)]
    if tune_seed_list[-1] + cfg.model.batch > heldout_seed:
        raise ConfigError(f"--heldout-seed {heldout_seed}: the tuning seeds run up to {tune_seed_list[-1] + cfg.model.batch - 1}; "
                          "held-out seeds must start above them")
    big = batch or (cfg.model.batch if cfg.model.batch > 1 else 8)
    report = Path(report) if report is not None else out.with_name(out.stem + ".tune")
    report.mkdir(parents=True, exist_ok=True)
    if source is not None:
        Path(config).write_text(dumps(source))

    judge = judge_for(adapter, cfg, judge)
    judge_obj, _ = _load_judge(adapter, judge)
    pipe = adapter.load(cfg) if pipe is None else pipe
    measure = _Trials(adapter, pipe, cfg, registry, judge_obj)
    study = open_study(report, budgets, seed=search_seed)
    trials_before = len(study.trials)
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
        run_trials(study, space, budgets, measure, tune_seed_list, trials=trials, on_trial=on_trial)
    finally:
        if bar is not None:
            bar.close()
    front = feasible_front(study)[:candidates]
    points = {f"tune-trial-{t.number}": t.user_attrs["point"] for t in front}
    figures: dict[str, Any] = {}
    chosen = None
    if points:
        cand_dir = report / "candidates"
        cand_dir.mkdir(exist_ok=True)
        paths = [str(config)]
        for name, point in points.items():
            p = cand_dir / f"{name}.toml"
            p.write_text(toml_text(config, point, [f"tune candidate {name}"]))
            paths.append(str(p))
        batches = [1, big] if big != 1 else [1]
        for b in batches:
            seeds = max(1, math.ceil(heldout / b))
            res = run_bench(paths, seeds=seeds, seed=heldout_seed, batch=b, judge=judge, judge_noise=False, noise_floor=False,
                            progress=progress, registry=registry, pipe=pipe)
            _write_heldout(report / f"heldout-b{b}.json", res)
            base_q = next(e for e in res["entries"] if e["name"] == "baseline")["quality"]
            for e in res["entries"]:
                if e["name"] == "baseline":
                    continue
                fig = figures.setdefault(e["name"], {"speedup": {}, "quality": {}, "met": {}})
                fig["speedup"][b] = e["speedup"]
                fig.setdefault("speedup_ci", {})[b] = e.get("speedup_ci")  # the bench's paired bootstrap interval
                if b == batches[-1]:
                    fig["samples"] = seeds * b
                    for bud in budgets:
                        met, _ = bud.check(e["quality"], base_q)
                        fig["quality"][bud.metric] = {"value": e["quality"].get(bud.metric), "baseline": base_q.get(bud.metric),
                                                      "interval": (e.get("quality_ci") or {}).get(bud.metric)}
                        fig["met"][bud.text] = met
    shipped = Path(config).stem
    # the config as given competes too: re-measured beside the trials, it is kept when it is the
    # fastest point within budget (the DiT digits tune: its own settings beat every trial)
    choices = dict(points)
    if shipped in figures and shipped not in choices:
        choices[shipped] = {s.name: {} for s in cfg.strategies}
    if points:
        # a point no faster than the baseline at the configured batch is no acceleration
        accepted = [n for n in choices if all(figures[n]["met"].values()) and figures[n]["speedup"][batches[-1]] > 1.0]
        chosen = max(accepted, key=lambda n: figures[n]["speedup"][batches[-1]]) if accepted else None
    # the wall time of every session of this study (a resumed tune adds one), for "how long does a tune take"
    previous = report / "tune.json"
    sessions = json.loads(previous.read_text()).get("sessions", []) if previous.is_file() else []
    sessions.append({"started": time.strftime("%Y-%m-%dT%H:%M:%S", started_at),
                     "wall_s": round(time.perf_counter() - started, 1), "trials_before": trials_before,
                     "trials_after": len(study.trials)})
    (report / "tune.json").write_text(json.dumps({
        "sessions": sessions,
        "budgets": [b.text for b in budgets], "points": points, "figures": figures, "chosen": chosen, "shipped": shipped,
        "trials": len(study.trials), "stopped_early": sum("pruned_after" in t.user_attrs for t in study.trials),
        "tune_seeds": tune_seed_list, "batch": cfg.model.batch, "heldout": heldout, "heldout_seed": heldout_seed},
        indent=2, default=str))
    write_report(report, study, budgets, figures, chosen, shipped)
    if chosen is None:
        why = "no trial met the budget on the tuning seeds" if not points else \
            f"none of the {len(points)} best trials met the budget, faster than the baseline, on the held-out seeds"
        msg = f"tune: {why}; nothing written to {out}; study and report in {report}"
        return TuneResult(path=None, point=None, figures=figures, study=report / "study.db", report=report, message=msg)
    fig = figures[chosen]
    header = [f"Tuned by diffaccel tune from {config} to the budget {' and '.join(b.text for b in budgets)}"
              + (" (the config as given was the fastest point within it: its settings are kept)" if chosen == shipped else ""),
              f"held-out seeds from {heldout_seed}, {fig['samples']} samples; speedup "
              + ", ".join(f"{v:.2f}x at batch {b}" for b, v in fig["speedup"].items()),
              *[f"{m}: {q['value']:.4g} (baseline {q['baseline']:.4g})" + (f", 95% interval {q['interval'][0]:.4g} to {q['interval'][1]:.4g}"
                                                                          if q.get("interval") else "")
                for m, q in fig["quality"].items()],
              f"reproduce: diffaccel bench {config} {out} --seed {heldout_seed} --seeds {math.ceil(heldout / big)} --batch {big}"
              if source is None else "measured on the pipeline given to diffaccel.tune (no checkpoint: apply it to that pipeline)"]
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(toml_text(config, choices[chosen], header))
    try:
        load_config(tmp, registry)  # what we write, `diffaccel check` accepts
    except DiffaccelError:
        tmp.unlink()
        raise
    tmp.replace(out)
    msg = f"tune: wrote {out} ({', '.join(f'{v:.2f}x at batch {b}' for b, v in fig['speedup'].items())} on held-out seeds); report in {report}"
    return TuneResult(path=out, point=choices[chosen], figures=figures, study=report / "study.db", report=report, message=msg)
