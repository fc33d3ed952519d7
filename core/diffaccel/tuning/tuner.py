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

from ..bench.options import BenchOptions, options_from
from ..bench.results import BenchResult
from ..bench.runner import _load_judge, judge_for, run_bench
from ..contract.adapter import JudgesSamples, ReportsQuality
from ..contract.errors import ConfigError, DiffaccelError
from ..contract.tunable import Tunable
from ..runtime.adapters_registry import get_adapter
from ..runtime.config import RunConfig, load_config, parse_config, read_toml
from ..runtime.registry import Registry
from ..runtime.runs import Run
from .budget import parse_all
from .model_space import model_tunables
from .options import DEFAULT_HELDOUT_SEED, TuneOptions  # noqa: F401
from .search import MODEL, Space, feasible_front, open_study
from .toml_out import dumps
from .trials import _own_quality, _skipped, _Trials, search, with_point  # noqa: F401 - importable from here as before
from .tune_report import write_report


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


def _pipeline_config(pipe: Any, model: dict[str, Any] | None, strategies: Sequence[dict[str, Any]] | None) -> dict[str, Any]:
    """The config (as TOML tables) of a tune on a loaded pipeline: its adapter, ``model``'s keys
    and the ``strategies`` tables."""
    from ..runtime.adapters_registry import adapter_for

    if not strategies or not all(isinstance(s, dict) for s in strategies):
        raise ConfigError("diffaccel.tune(pipe, ...): give strategies=[{'use': ...}, ...], the [[strategy]] tables to tune")
    adapter = adapter_for(pipe)
    return {"model": {**dict(model or {}), "adapter": adapter.name}, "strategy": [dict(s) for s in strategies]}


def _write_heldout(path: Path, result: BenchResult) -> None:
    """A held-out bench's result as JSON, without each run's own report (counters and strategy
    metrics run by run: 90% of the file, megabytes per tune, and nothing the tune's figures read)."""
    for e in result.entries:
        e.drop("reports")
    result.put("run_reports", "dropped by diffaccel tune (the same `diffaccel bench --json` keeps them)")
    path.write_text(result.to_json(indent=1))


def tune(config: Any, budget: Sequence[str] | str, out: str | Path, options: TuneOptions | None = None, *,
         registry: Registry | None = None, model: dict[str, Any] | None = None,
         strategies: Sequence[dict[str, Any]] | None = None, **old: Any) -> TuneResult:
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
    (``tune_model``; the diffusers adapters): each trial against the config's own model.

    The settings above are ``options`` (``TuneOptions``); the old keywords still work with a
    DeprecationWarning."""
    o = options_from(TuneOptions, options, old, "tune")
    registry = registry or Registry()
    started, started_at = time.perf_counter(), time.localtime()
    t = _space(config, budget, out, o, registry, model, strategies)  # 1. checked before anything loads
    judge_obj, _ = _load_judge(t.adapter, t.judge)
    pipe = Run(t.cfg, registry=registry, pipe=t.pipe).pipe
    study = open_study(t.report, t.budgets, seed=o.search_seed)  # 2. the trials
    trials_before = len(study.trials)
    search(study, t.space, t.budgets, _Trials(t.adapter, pipe, t.cfg, registry, judge_obj), t.tune_seeds,
           trials=o.trials, progress=o.progress)
    points = {f"tune-trial-{tr.number}": tr.user_attrs["point"] for tr in feasible_front(study)[:o.candidates]}
    figures, batches = _validate(t, o, points, pipe, registry) if points else ({}, [])  # 3. held-out seeds
    shipped = Path(t.config).stem
    # the config as given competes too: re-measured beside the trials, it is kept when it is the
    # fastest point within budget (the DiT digits tune: its own settings beat every trial)
    choices = dict(points)
    if shipped in figures and shipped not in choices:
        choices[shipped] = {s.name: {} for s in t.cfg.strategies}
    chosen = None
    if points:
        # a point no faster than the baseline at the configured batch is no acceleration
        accepted = [n for n in choices if all(figures[n]["met"].values()) and figures[n]["speedup"][batches[-1]] > 1.0]
        chosen = max(accepted, key=lambda n: figures[n]["speedup"][batches[-1]]) if accepted else None
    _write_study(t, o, study, points, figures, chosen, shipped, started, started_at, trials_before)  # 4. the report
    write_report(t.report, study, t.budgets, figures, chosen, shipped)
    if chosen is None:
        why = "no trial met the budget on the tuning seeds" if not points else \
            f"none of the {len(points)} best trials met the budget, faster than the baseline, on the held-out seeds"
        msg = f"tune: {why}; nothing written to {t.out}; study and report in {t.report}"
        return TuneResult(path=None, point=None, figures=figures, study=t.report / "study.db", report=t.report, message=msg)
    _write_tuned(t, o, figures[chosen], choices[chosen], chosen == shipped, registry)
    fig = figures[chosen]
    msg = (f"tune: wrote {t.out} ({', '.join(f'{v:.2f}x at batch {b}' for b, v in fig['speedup'].items())} on held-out seeds); "
           f"report in {t.report}")
    return TuneResult(path=t.out, point=choices[chosen], figures=figures, study=t.report / "study.db", report=t.report, message=msg)


@attrs.define
class _Tune:
    """A tune's inputs, checked: the config (its path, parsed), adapter, budgets, search space,
    tuning seeds, the larger held-out batch, the report folder, and a pipeline given instead of
    a config (``source``: the config written for it)."""

    config: Any
    cfg: RunConfig
    adapter: Any
    budgets: list[Any]
    space: Space
    tune_seeds: list[int]
    big: int
    report: Path
    out: Path
    judge: str | None
    pipe: Any = None
    source: dict[str, Any] | None = None


def _space(config: Any, budget: Sequence[str] | str, out: str | Path, o: TuneOptions, registry: Registry,
           model: dict[str, Any] | None, strategies: Sequence[dict[str, Any]] | None) -> _Tune:
    """Phase 1: the budgets checked against the metrics the bench reports, the search space read
    from the strategies' plugins (and ``model_space``); ``ConfigError`` before anything loads."""
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
    o.check()
    if pipe is not None:  # written into the report folder once the budget is checked, below
        config = Path(o.report) / "config.toml" if o.report is not None else out.with_name(out.stem + ".tune") / "config.toml"
        cfg = parse_config(source, source=str(config), registry=registry)
    else:
        cfg = load_config(config, registry)
    if not cfg.strategies:
        raise ConfigError(f"{config}: no [[strategy]] table: nothing to tune")
    adapter = get_adapter(cfg.model.adapter)
    budgets = parse_all([budget] if isinstance(budget, str) else list(budget), reported_metrics(adapter, cfg, registry, o.judge))
    space = tunable_space(cfg, registry)
    if o.model_space:  # [model] steps and scheduler searched with the strategies (tune_model)
        space = {**space, MODEL: model_tunables(cfg, adapter, dict(o.model_space))}
    seeds = [cfg.model.seed + k * cfg.model.batch for k in range(o.tune_seeds)]
    if seeds[-1] + cfg.model.batch > o.heldout_seed:
        raise ConfigError(f"--heldout-seed {o.heldout_seed}: the tuning seeds run up to {seeds[-1] + cfg.model.batch - 1}; "
                          "held-out seeds must start above them")
    big = o.batch or (cfg.model.batch if cfg.model.batch > 1 else 8)
    report = Path(o.report) if o.report is not None else out.with_name(out.stem + ".tune")
    report.mkdir(parents=True, exist_ok=True)
    if source is not None:
        Path(config).write_text(dumps(source))
    return _Tune(config=config, cfg=cfg, adapter=adapter, budgets=budgets, space=space, tune_seeds=seeds, big=big,
                 report=report, out=out, judge=judge_for(adapter, cfg, o.judge), pipe=pipe, source=source)


def _validate(t: _Tune, o: TuneOptions, points: dict[str, Any], pipe: Any, registry: Registry) -> tuple[dict[str, Any], list[int]]:
    """Phase 3: the config as given and the candidate points benched on the held-out seeds, at
    batch 1 and at the larger batch; their figures (speedup per batch, quality per budget metric
    with its interval, which budgets they met), and the batches."""
    figures: dict[str, Any] = {}
    cand_dir = t.report / "candidates"
    cand_dir.mkdir(exist_ok=True)
    paths = [str(t.config)]
    for name, point in points.items():
        p = cand_dir / f"{name}.toml"
        p.write_text(toml_text(t.config, point, [f"tune candidate {name}"]))
        paths.append(str(p))
    batches = [1, t.big] if t.big != 1 else [1]
    for b in batches:
        seeds = max(1, math.ceil(o.heldout / b))
        res = run_bench(paths, BenchOptions(seeds=seeds, seed=o.heldout_seed, batch=b, judge=t.judge, judge_noise=False,
                                            noise_floor=False, progress=o.progress), registry=registry, pipe=pipe)
        _write_heldout(t.report / f"heldout-b{b}.json", res)
        base_q = res.baseline.quality
        for e in res.entries:
            if e.name == "baseline":
                continue
            fig = figures.setdefault(e.name, {"speedup": {}, "quality": {}, "met": {}})
            fig["speedup"][b] = e.speedup
            fig.setdefault("speedup_ci", {})[b] = e.speedup_ci  # the bench's paired bootstrap interval
            if b == batches[-1]:
                fig["samples"] = seeds * b
                for bud in t.budgets:
                    met, _ = bud.check(e.quality, base_q)
                    fig["quality"][bud.metric] = {"value": e.quality.get(bud.metric), "baseline": base_q.get(bud.metric),
                                                  "interval": (e.quality_ci or {}).get(bud.metric)}
                    fig["met"][bud.text] = met
    return figures, batches


def _write_study(t: _Tune, o: TuneOptions, study: Any, points: dict[str, Any], figures: dict[str, Any], chosen: str | None,
                 shipped: str, started: float, started_at: Any, trials_before: int) -> None:
    """``tune.json``: the study's figures, and the wall time of every session of this study (a
    resumed tune adds one), for "how long does a tune take"."""
    previous = t.report / "tune.json"
    sessions = json.loads(previous.read_text()).get("sessions", []) if previous.is_file() else []
    sessions.append({"started": time.strftime("%Y-%m-%dT%H:%M:%S", started_at),
                     "wall_s": round(time.perf_counter() - started, 1), "trials_before": trials_before,
                     "trials_after": len(study.trials)})
    previous.write_text(json.dumps({
        "sessions": sessions,
        "budgets": [b.text for b in t.budgets], "points": points, "figures": figures, "chosen": chosen, "shipped": shipped,
        "trials": len(study.trials), "stopped_early": sum("pruned_after" in tr.user_attrs for tr in study.trials),
        "tune_seeds": t.tune_seeds, "batch": t.cfg.model.batch, "heldout": o.heldout, "heldout_seed": o.heldout_seed},
        indent=2, default=str))


def _write_tuned(t: _Tune, o: TuneOptions, fig: dict[str, Any], point: dict[str, Any], shipped: bool, registry: Registry) -> None:
    """TUNED.toml: the chosen point in the config's text, a header saying how it was measured;
    checked by ``load_config`` (what we write, ``diffaccel check`` accepts) before it replaces ``out``."""
    header = [f"Tuned by diffaccel tune from {t.config} to the budget {' and '.join(b.text for b in t.budgets)}"
              + (" (the config as given was the fastest point within it: its settings are kept)" if shipped else ""),
              f"held-out seeds from {o.heldout_seed}, {fig['samples']} samples; speedup "
              + ", ".join(f"{v:.2f}x at batch {b}" for b, v in fig["speedup"].items()),
              *[f"{m}: {q['value']:.4g} (baseline {q['baseline']:.4g})" + (f", 95% interval {q['interval'][0]:.4g} to {q['interval'][1]:.4g}"
                                                                          if q.get("interval") else "")
                for m, q in fig["quality"].items()],
              f"reproduce: diffaccel bench {t.config} {t.out} --seed {o.heldout_seed} --seeds {math.ceil(o.heldout / t.big)} --batch {t.big}"
              if t.source is None else "measured on the pipeline given to diffaccel.tune (no checkpoint: apply it to that pipeline)"]
    tmp = t.out.with_name(t.out.name + ".partial")
    tmp.write_text(toml_text(t.config, point, header))
    try:
        load_config(tmp, registry)
    except DiffaccelError:
        tmp.unlink()
        raise
    tmp.replace(t.out)
