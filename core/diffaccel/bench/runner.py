"""``diffaccel bench``: configs sharing one ``[model]``, against that model with no strategy.

All entries run on the same seeds, interleaved (for each repeat and seed, every entry runs once,
in an order that rotates), so machine noise hits them alike. Speedup is the baseline's total
wall time over the entry's; quality compares each entry's outputs with the baseline's for the
same seeds, with the adapter's metrics.

``[[peer]]`` tables add one entry each: another library's accelerator (e.g. DeepCache), applied
to the same pipeline through the adapter's ``peer_context`` instead of strategies, on the same
prompts and seeds, interleaved with the rest. A peer runs on the bare pipeline, so diffaccel
counts nothing for it ("computed" shows "-").

A judge (``judge``, adapters with ``load_judge``: text) scores every entry's outputs after the
timed runs: ``gen_ppl``, and ``gen_ppl_noise``, the baseline on a second, disjoint seed set.

``timed=False`` (``bench --quality-only``) runs the same entries on the same seeds without the
warm-up or any clock: quality over more seeds than a timed bench can afford, with no need for a
quiet machine. Its entries have ``speedup`` None.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import attrs

from ..contract.errors import ConfigError
from ..kit.stats import ratio_ci
from ..runtime.memory import process_peak_rss_mb
from ..runtime.registry import PluginWarning, Registry, call_own
from ..runtime.runs import Run
from .options import BenchOptions, options_from
from .plan import (BenchPlan, _peer_entries, entry_name, load_bench_configs, plan_configs, plan_entries,  # noqa: F401
                   with_batch, with_seed)
from .results import BenchMemory, BenchResult, Entry, EntryMemory, ModelFacts, Timing
from .scoring import (_judge_quality, _load_judge, _quality_intervals, _strategy_quality, add_judge_info,  # noqa: F401
                      judge_for, judge_share)
from .table import format_table  # noqa: F401
from .timing import Timed, time_entries
from .variants import vs_model

# The phases live in their own modules (``plan``, ``timing``, ``scoring``, ``table``, and the
# report's ``page``); their names stay importable from here.


def run_bench(paths: list[str], options: BenchOptions | None = None, *, registry: Registry | None = None,
              pipe: Any = None, keep_outputs: dict[str, list[Any]] | None = None, **old: Any) -> BenchResult:
    """Bench ``paths`` (configs sharing one ``[model]``) as ``options`` say (``BenchOptions``;
    the old keywords, ``seeds=3, ...``, still work with a DeprecationWarning): plan the entries,
    time them interleaved, score their quality, and write the result (``json_path``).
    ``registry``: the strategies' registry (default: the installed plugins). ``pipe``: a
    pipeline already loaded for these configs (``diffaccel.tune`` on a pipeline), used instead of
    loading the one ``[model]`` names. ``keep_outputs``: a dict that receives every entry's
    outputs (name -> one per seed), for the report."""
    o = options_from(BenchOptions, options, old, "run_bench")
    if not o.timed and o.repeats != 1:
        raise ConfigError(f"--repeats {o.repeats}: a quality-only bench runs each seed once (--repeats 1)")
    wall0 = time.perf_counter()
    registry = registry or Registry()
    plan = plan_configs(paths, o, registry)
    adapter, base = plan.adapter, plan.base
    judge_obj, judge_info = _load_judge(adapter, judge_for(adapter, base, o.judge))  # before any sampling
    run = Run(base, registry=registry, pipe=pipe)
    pipe = run.pipe
    plan_entries(plan, run)
    timed = time_entries(plan, pipe, registry, repeats=o.repeats, timed=o.timed, progress=o.progress)
    references = None
    if o.noise_floor:
        references = [adapter.reference_run(pipe, base, s) for s in plan.seeds]
        if any(r is None for r in references):  # the adapter has no noise floor
            references = None
    result = build_result(plan, timed, references, o)
    outputs = timed.outputs
    _strategy_quality(result, plan.entries, outputs, plan.seeds)
    vs_model(result, adapter, plan.alone, outputs, timed.times)
    _quality_intervals(result, adapter, outputs, references)
    if judge_obj is not None:
        _judge_quality(result, adapter, judge_obj, pipe, base, outputs, o.noise_floor if o.judge_noise is None else o.judge_noise)
    add_judge_info(result, judge_info)
    result.memory = BenchMemory.new(process_peak_rss_mb=process_peak_rss_mb(),
                                    device_peak="torch.cuda.max_memory_allocated per run" if timed.device_peaks else None)
    result.wall_s = time.perf_counter() - wall0
    if keep_outputs is not None:
        keep_outputs.update(outputs)
    judge_share(result)
    if o.json_path:
        write_json(o.json_path, result)
    return result


def build_result(plan: BenchPlan, timed: Timed, references: list[Any] | None, o: BenchOptions) -> BenchResult:
    """The result's facts and one entry per planned entry: speedup (the baseline's total wall
    time over the entry's) with its paired interval, the adapter's quality against the baseline's
    outputs of the same seeds, the fraction computed, the memory; the strategies' plots."""
    m, adapter, times, outputs = plan.base.model, plan.adapter, timed.times, timed.outputs
    result = BenchResult.new(model=ModelFacts.new(adapter=m.adapter, checkpoint=m.checkpoint, steps=m.steps, batch=m.batch,
                                                  device=m.device, dtype=m.dtype),
                             seeds=plan.seeds, repeats=o.repeats, timed=o.timed, entries=[])
    if o.timed:
        result.timing = Timing.from_dict(timed.clock.describe())
    base_time = sum(times["baseline"])
    for name, strategies in plan.entries:
        reports = [out.report for out in outputs[name]]
        peer = plan.peers.get(name)
        entry = Entry.new(
            name=name,
            speedup=base_time / sum(times[name]) if o.timed else None,
            quality=adapter.quality(outputs["baseline"], outputs[name], references),
            fraction_computed=None if peer else sum(r["counters"]["fraction_computed"] for r in reports) / len(reports),
            strategies=[s.name for s in strategies],
            reports=reports,
        )
        entry.memory = _entry_memory(reports, timed.device_peaks, name)
        if peer:
            entry.peer = {"use": peer.name, **attrs.asdict(peer.config)}
        if o.timed:
            entry.speedup_ci = ratio_ci(times["baseline"], times[name])
        result.entries.append(entry)
        if o.plot_dir:
            for s in strategies:
                _plot(s, reports, Path(o.plot_dir) / f"{name}-{s.name}.png")
    return result


def _plot(strategy: Any, reports: list[dict[str, Any]], path: Path) -> None:
    """A strategy's bench plot: a plot that fails is one warning naming the strategy; the bench's
    figures, measured already, are kept (a plot once took a whole bench down with a KeyError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        call_own(strategy, "diffaccel_bench_plot", reports=reports, path=path)
    except Exception as exc:  # noqa: BLE001 - any plugin error: the figures matter more than its plot
        warnings.warn(PluginWarning(f"strategy '{strategy.name}': its bench plot failed ({type(exc).__name__}: {exc}); "
                                    f"no {path.name}, the figures are unaffected"), stacklevel=2)


def write_json(path: str | Path, result: BenchResult) -> None:
    """``bench --json``: the result, written whole or not at all."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_name(Path(path).name + ".partial")
    tmp.write_text(result.to_json())
    tmp.replace(path)


def _entry_memory(reports: list[dict[str, Any]], device_peaks: dict[str, int], name: str) -> EntryMemory:
    """An entry's memory cost: ``state_mb``, the largest over its seeds of what its strategies held
    at their last step (``RunState.memory``; 0 for the baseline), and on a CUDA device
    ``device_peak_mb`` and ``over_baseline_mb`` (the allocator's peak in its runs, less the
    baseline's)."""
    held = [sum(r.get("memory", {}).get("state_bytes", {}).values()) for r in reports]
    out = EntryMemory.new(state_mb=max(held, default=0) / 2**20)
    if name in device_peaks:
        out.device_peak_mb = device_peaks[name] / 2**20
        out.over_baseline_mb = (device_peaks[name] - device_peaks.get("baseline", 0)) / 2**20
    return out
