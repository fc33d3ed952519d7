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

import json
import math
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
from tqdm.auto import tqdm

from ..contract.adapter import JudgesSamples, PeersRunOtherConfigs, PoolsQuality
from ..contract.errors import ConfigError, DiffaccelError
from ..kit.stats import finite, pooled_ci, ratio_ci
from ..runtime.accelerator import apply, build_strategies
from ..runtime.adapters_registry import get_adapter
from ..runtime.config import RunConfig, load_config
from ..runtime.memory import DevicePeak, memory_cell, process_peak_rss_mb
from ..runtime.placement import DeviceClock
from ..runtime.registry import Registry, call_own
from .grid import expand
from .variants import add_peers, check_same_model, model_differs, vs_model, vs_model_lines


def entry_name(config: RunConfig) -> str:
    return config.name or Path(config.source).stem


def with_batch(config: RunConfig, batch: int) -> RunConfig:
    """The config with ``[model] batch`` replaced (``--batch`` of ``bench`` and ``partial``)."""
    if batch < 1:
        raise ConfigError(f"--batch must be 1 or more, got {batch}")
    return attrs.evolve(config, model=attrs.evolve(config.model, batch=batch))


def load_bench_configs(paths: list[str], registry: Registry, grid: list[Any] | None = None) -> list[RunConfig]:
    """The configs of ``paths``, each config with strategies expanded over ``grid`` (``grid.Axis``
    list, ``bench --grid``), all validated; one ``ConfigError`` line for the first problem."""
    configs = [load_config(p, registry) for p in paths]
    if grid:
        configs = [g for c, p in zip(configs, paths) for g in (expand(p, grid, registry) if c.strategies else [c])]
    first = configs[0]
    for c in (c for c in configs[1:] if model_differs(first, c)):  # steps and scheduler may differ (bench_variants)
        check_same_model(first, c, get_adapter(first.model.adapter))
    names = [entry_name(c) for c in configs]
    dup = next((n for n in names if names.count(n) > 1 or n == "baseline"), None)
    if dup:
        raise ConfigError(f"bench: two entries would be named '{dup}'; give the config files distinct names (not 'baseline')")
    return configs


def with_seed(config: RunConfig, seed: int) -> RunConfig:
    """The config with ``[model] seed`` replaced (``--seed`` of ``bench``: e.g. tuning seeds)."""
    return attrs.evolve(config, model=attrs.evolve(config.model, seed=seed))


def run_bench(paths: list[str], *, seeds: int = 3, repeats: int = 1, json_path: str | None = None,
              noise_floor: bool = True, progress: bool = True, registry: Registry | None = None,
              plot_dir: str | None = None, batch: int | None = None, seed: int | None = None,
              judge: str | None = None, judge_noise: bool | None = None,
              keep_outputs: dict[str, list[Any]] | None = None, timed: bool = True,
              grid: list[Any] | None = None, pipe: Any = None, solver_line: bool = False) -> dict[str, Any]:
    """``batch`` overrides every config's ``[model] batch`` (rows per call; seed k of the bench
    starts at ``seed + k * batch``, so no row is generated twice); ``seed`` their first seed.
    ``judge``: a judge the adapter's ``load_judge`` knows (text: 'smollm2', a causal LM folder or
    hub id), loaded before any sampling; "default": the adapter's default judge, if it loads (if
    not, a note in the result); None or "none": no judge. ``judge_noise`` (default: as
    ``noise_floor``): also score the baseline on as many seeds again for ``gen_ppl_noise``.
    ``keep_outputs``: a dict that receives every entry's outputs (name -> one per seed), for the report.
    ``timed``: False runs every entry once per seed with no warm-up and no timing (speedup None).
    ``grid``: ``diffaccel.bench.grid.Axis`` list (``bench --grid``): each config with strategies becomes
    one entry per combination of values. ``pipe``: a pipeline already loaded for these configs
    (``diffaccel.tune`` on a pipeline), used instead of loading the one ``[model]`` names.
    ``solver_line``: add the adapter's fewer-steps and solver peers (``bench_variants``)."""
    if not timed and repeats != 1:
        raise ConfigError(f"--repeats {repeats}: a quality-only bench runs each seed once (--repeats 1)")
    wall0 = time.perf_counter()
    registry = registry or Registry()
    configs = load_bench_configs(paths, registry, grid)
    if batch is not None:
        configs = [with_batch(c, batch) for c in configs]
    if seed is not None:
        configs = [with_seed(c, seed) for c in configs]
    adapter = get_adapter(configs[0].model.adapter)
    configs, variants, alone, homes = add_peers(configs, adapter, solver_line, entry_name)
    base = configs[0]
    judge_obj, judge_info = _load_judge(adapter, judge_for(adapter, base, judge))
    pipe = adapter.load(base) if pipe is None else pipe
    info = adapter.info(pipe)
    entries: list[tuple[str, list[Any]]] = [("baseline", [])]
    entries += [(entry_name(c), build_strategies(c, registry, info)) for c in configs if c.strategies]
    policies = {entry_name(c): c for c in configs if c.strategies}  # each entry's on_error and [guard]
    peers = _peer_entries(configs, adapter, {name for name, _ in entries})
    entries += [(name, []) for name in peers]
    # a peer may run another config than the baseline's (the text adapter's ``steps`` peer)
    peer_run = adapter.peer_run_config if isinstance(adapter, PeersRunOtherConfigs) else None
    peer_configs = {name: peer_run(homes.get(name, base), p.config) for name, p in peers.items()} if peer_run else {}
    seed_list = [base.model.seed + k * base.model.batch for k in range(seeds)]

    clock = DeviceClock(base.model.device, warmup_runs=1 if timed else 0)
    peak = DevicePeak(base.model.device)
    device_peaks: dict[str, int] = {}
    if timed:
        adapter.run(pipe, base, seed_list[0], progress=False)  # warm-up, untimed
    times: dict[str, list[float]] = {name: [] for name, _ in entries}
    outputs: dict[str, list[Any]] = {name: [] for name, _ in entries}
    total = repeats * len(seed_list) * len(entries)
    bar = tqdm(total=total, desc="bench", unit="run", disable=not progress)
    k = 0
    for rep in range(repeats):
        for seed in seed_list:
            order = entries[k % len(entries):] + entries[: k % len(entries)]
            k += 1
            for name, strategies in order:
                peer = peers.get(name)
                run_cfg = peer_configs.get(name) or (policies[name] if name in variants else base)
                with ExitStack() as stack:  # a variant's model (its scheduler) is set up before its strategies or peer
                    for ctx in ([variants[name]] if name in variants else []) + [peer.config if peer else None]:
                        stack.enter_context(adapter.peer_context(pipe, ctx) if ctx is not None else
                                            apply(pipe, policies.get(name), strategies=strategies, registry=registry))
                    peak.reset()
                    with clock.region() as r:
                        out = adapter.run(pipe, run_cfg, seed, progress=False)
                    times[name].append(r.seconds)
                    if (p := peak.read()) is not None:
                        device_peaks[name] = max(device_peaks.get(name, 0), p)
                if rep == 0:
                    outputs[name].append(out)
                bar.update(1)
    bar.close()
    references = None
    if noise_floor:
        references = [adapter.reference_run(pipe, base, s) for s in seed_list]
        if any(r is None for r in references):  # the adapter has no noise floor
            references = None

    # outputs[name][i] is the run of seed_list[i] for every entry
    result: dict[str, Any] = {"model": {"adapter": base.model.adapter, "checkpoint": base.model.checkpoint,
                                        "steps": base.model.steps, "batch": base.model.batch},
                              "seeds": seed_list, "repeats": repeats, "timed": timed, "entries": []}
    result["model"].update(device=base.model.device, dtype=base.model.dtype)
    if timed:
        result["timing"] = clock.describe()
    base_time = sum(times["baseline"])
    for name, strategies in entries:
        reports = [o.report for o in outputs[name]]
        peer = peers.get(name)
        entry = {
            "name": name,
            "speedup": base_time / sum(times[name]) if timed else None,
            "quality": adapter.quality(outputs["baseline"], outputs[name], references),
            "fraction_computed": None if peer else sum(r["counters"]["fraction_computed"] for r in reports) / len(reports),
            "strategies": [s.name for s in strategies],
            "reports": reports,
        }
        entry["memory"] = _entry_memory(reports, device_peaks, name)
        if peer:
            entry["peer"] = {"use": peer.name, **attrs.asdict(peer.config)}
        if timed:
            entry["speedup_ci"] = ratio_ci(times["baseline"], times[name])
        result["entries"].append(entry)
        if plot_dir:
            for s in strategies:
                Path(plot_dir).mkdir(parents=True, exist_ok=True)
                call_own(s, "diffaccel_bench_plot", reports=reports, path=Path(plot_dir) / f"{name}-{s.name}.png")
    _strategy_quality(result, entries, outputs, seed_list)
    vs_model(result, adapter, alone, outputs, times)
    _quality_intervals(result, adapter, outputs, references)
    if judge_obj is not None:
        _judge_quality(result, adapter, judge_obj, pipe, base, outputs, noise_floor if judge_noise is None else judge_noise)
    if judge_info:
        result["judge"] = {**judge_info, **result.get("judge", {})}
    result["memory"] = {"process_peak_rss_mb": process_peak_rss_mb(),
                        "device_peak": "torch.cuda.max_memory_allocated per run" if device_peaks else None}
    result["wall_s"] = time.perf_counter() - wall0
    if keep_outputs is not None:
        keep_outputs.update(outputs)
    if "score_s" in result.get("judge", {}):
        j = result["judge"]
        j["share_of_wall"] = (j["load_s"] + j["score_s"]) / result["wall_s"]
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(json_path).with_name(Path(json_path).name + ".partial")
        tmp.write_text(json.dumps(result, indent=2, default=float))
        tmp.replace(json_path)
    return result


def _entry_memory(reports: list[dict[str, Any]], device_peaks: dict[str, int], name: str) -> dict[str, Any]:
    """An entry's memory cost: ``state_mb``, the largest over its seeds of what its strategies held
    at their last step (``RunState.memory``; 0 for the baseline), and on a CUDA device
    ``device_peak_mb`` and ``over_baseline_mb`` (the allocator's peak in its runs, less the
    baseline's)."""
    held = [sum(r.get("memory", {}).get("state_bytes", {}).values()) for r in reports]
    out: dict[str, Any] = {"state_mb": max(held, default=0) / 2**20}
    if name in device_peaks:
        out["device_peak_mb"] = device_peaks[name] / 2**20
        out["over_baseline_mb"] = (device_peaks[name] - device_peaks.get("baseline", 0)) / 2**20
    return out


def _strategy_quality(result: dict[str, Any], entries: list[tuple[str, list[Any]]], outputs: dict[str, list[Any]],
                      seeds: list[int]) -> None:
    """The ``diffaccel_bench_quality`` hook of each strategy: its keys on its entry's outputs, and
    on the baseline's (the first strategy offering a key wins there)."""
    by_name = {e["name"]: e for e in result["entries"]}
    for name, strategies in entries:
        for s in strategies:
            for q in call_own(s, "diffaccel_bench_quality", outputs=outputs[name], seeds=seeds):
                by_name[name]["quality"].update(q)
            for q in call_own(s, "diffaccel_bench_quality", outputs=outputs["baseline"], seeds=seeds):
                for k, v in q.items():
                    by_name["baseline"]["quality"].setdefault(k, v)


def _quality_intervals(result: dict[str, Any], adapter: Any, outputs: dict[str, list[Any]], references: list[Any] | None) -> None:
    """``quality_ci``: for each key of the adapter's ``quality``, an interval from resampling the
    seeds and computing ``quality`` again on each resample's outputs (``stats.pooled_ci``: a
    metric pooled over all outputs, as distinct-n, gets an interval around its own point); and
    ``quality_ratio_ci``: of the entry's value over the baseline's, both computed on the same
    resampled seeds (paired). Nothing with fewer than 2 seeds. The judge's gen_ppl gets its
    intervals in ``_judge_quality``."""
    n = len(result["seeds"])
    if n < 2:
        return
    memo: dict[tuple[str, tuple[int, ...]], dict[str, float]] = {}
    parts = ({name: adapter.quality_parts(outputs["baseline"], outs, references) for name, outs in outputs.items()}
             if isinstance(adapter, PoolsQuality) else None)  # each seed's own work once

    def quality(name: str, idx: tuple[int, ...]) -> dict[str, float]:
        if (name, idx) not in memo:  # the baseline's is shared by every entry's ratio
            pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
            memo[name, idx] = (adapter.quality_of_parts(pick(parts[name])) if parts is not None else
                               adapter.quality(pick(outputs["baseline"]), pick(outputs[name]),
                                           pick(references) if references else None))
        return memo[name, idx]

    for e in result["entries"]:
        name = e["name"]
        e["quality_ci"] = pooled_ci(n, lambda idx: quality(name, idx))
        if name != "baseline":
            e["quality_ratio_ci"] = pooled_ci(n, lambda idx: _ratios(quality(name, idx), quality("baseline", idx)))


def _ratios(entry: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """entry / baseline for each key both have, finite, with a non-zero baseline."""
    return {k: v / base[k] for k, v in entry.items() if finite(v) and finite(base.get(k)) and base[k] != 0}


def judge_for(adapter: Any, config: RunConfig, spec: str | None) -> str | None:
    """``spec``, or "none" where the adapter's ``judged(config)`` says no judge scores these
    samples (the text adapter's task models: their scores are exact, a judge would add nothing)."""
    judged = getattr(adapter, "judged", None)
    return spec if judged is None or judged(config) else "none"


def _load_judge(adapter: Any, spec: str | None) -> tuple[Any, dict[str, Any]]:
    """(judge or None, what the result's "judge" key starts with). A judge named explicitly that
    does not load is the adapter's one-line error (``ModelLoadError``); the default one is a note."""
    if spec in (None, "none") or not isinstance(adapter, JudgesSamples):
        return None, {}
    t0 = time.perf_counter()
    try:
        judge = adapter.load_judge(None if spec == "default" else spec)
    except DiffaccelError as exc:
        if spec != "default":
            raise
        return None, {"name": None, "note": str(exc)}
    return judge, {"name": judge.name, "load_s": time.perf_counter() - t0}


def _judge_quality(result: dict[str, Any], adapter: Any, judge: Any, pipe: Any, base: RunConfig,
                   outputs: dict[str, list[Any]], noise: bool) -> None:
    """``gen_ppl`` of every entry (exp of the judge's summed nll over its summed tokens, over
    every line), scored in one batched call; with ``noise``, the baseline also runs (untimed) on
    as many seeds again, disjoint from the bench's, for ``gen_ppl_noise``. Each entry keeps its
    per-seed sums (``judge_per_seed``: nll and tokens, seed by seed) and, with 2 seeds or more,
    gets gen_ppl intervals resampling the seeds (``quality_ci``, and ``quality_ratio_ci`` paired
    with the baseline's)."""
    groups = {name: [adapter.judge_lines([o]) for o in outs] for name, outs in outputs.items()}  # per seed
    info: dict[str, Any] = {}
    if noise:
        n, b = len(result["seeds"]), base.model.batch
        info["noise_seeds"] = [base.model.seed + k * b for k in range(n, 2 * n)]
        t0 = time.perf_counter()
        groups[None] = [adapter.judge_lines([adapter.run(pipe, base, s, progress=False) for s in info["noise_seeds"]])]
        info["noise_runs_s"] = time.perf_counter() - t0
    lines = [line for g in groups.values() for seed_lines in g for line in seed_lines]
    t0 = time.perf_counter()
    scores = judge.score(lines)
    info.update(score_s=time.perf_counter() - t0, lines=len(lines), tokens=sum(scores.tokens))
    by_name = {e["name"]: e for e in result["entries"]}
    sums: dict[Any, tuple[list[float], list[int]]] = {}
    k = 0
    for name, g in groups.items():
        nll, toks = [], []
        for seed_lines in g:
            nll.append(float(sum(scores.nll[k : k + len(seed_lines)])))
            toks.append(int(sum(scores.tokens[k : k + len(seed_lines)])))
            k += len(seed_lines)
        sums[name] = (nll, toks)
        ppl = math.exp(sum(nll) / sum(toks)) if sum(toks) else float("nan")
        if name is None:
            by_name["baseline"]["quality"]["gen_ppl_noise"] = ppl
        else:
            by_name[name]["quality"]["gen_ppl"] = ppl
            by_name[name]["judge_per_seed"] = {"nll": nll, "tokens": toks}
    result["judge"] = info
    n = len(result["seeds"])
    if n < 2:
        return

    def gen_ppl(name: str, idx: tuple[int, ...]) -> float:
        nll, toks = sums[name]
        t = sum(toks[i] for i in idx)
        return math.exp(sum(nll[i] for i in idx) / t) if t else float("nan")

    for name, e in by_name.items():
        e.setdefault("quality_ci", {}).update(pooled_ci(n, lambda idx: {"gen_ppl": gen_ppl(name, idx)}))
        if name != "baseline":
            e.setdefault("quality_ratio_ci", {}).update(
                pooled_ci(n, lambda idx: {"gen_ppl": gen_ppl(name, idx) / gen_ppl("baseline", idx)}))


def _peer_entries(configs: list[RunConfig], adapter: Any, taken: set[str]) -> dict[str, Any]:
    """Entry name -> ``PeerEntry`` over every config's ``[[peer]]`` tables (the same peer listed
    in several configs runs once)."""
    peers: dict[str, Any] = {}
    for c in configs:
        for p in c.peers:
            name = adapter.peer_name(p)
            if name in peers and (peers[name].name, peers[name].config) == (p.name, p.config):
                continue
            if name in peers or name in taken:
                raise ConfigError(f"{c.source}: [[peer]] #{p.index}: a bench entry is already named '{name}'; set the peer's name key")
            peers[name] = p
    return peers


def format_table(result: dict[str, Any]) -> str:
    keys: list[str] = []
    for e in result["entries"]:
        keys += [k for k in e["quality"] if k not in keys]
    measured = any("memory" in e for e in result["entries"])  # benches before issue 39 have no memory
    head = ["entry", "speedup", "computed", *(["state MB"] if measured else []), *keys]
    rows = [head]
    for e in result["entries"]:
        computed = "-" if e["fraction_computed"] is None else f"{e['fraction_computed']:.0%}"
        speed = "-" if e["speedup"] is None else f"{e['speedup']:.2f}x" + _ci(e.get("speedup_ci"), "{:.2f}")
        qci = e.get("quality_ci") or {}
        rows.append([e["name"], speed, computed, *([memory_cell(e.get("memory"))] if measured else []),
                     *[_fmt(e["quality"].get(k)) + _ci(qci.get(k)) for k in keys]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    m = result["model"]
    how = f"{result['repeats']} repeat(s), interleaved" if result.get("timed", True) else "quality only (not timed)"
    lines.insert(0, f"{m['adapter']} model {m['checkpoint']}, seeds {result['seeds']}, {how}")
    lines.insert(2, "  ".join("-" * w for w in widths))
    if any(e.get("speedup_ci") or e.get("quality_ci") for e in result["entries"]):
        lines.append("[lo-hi]: 95% bootstrap interval over the seeds, paired with the baseline's (JSON: speedup_ci, "
                     "quality_ci, quality_ratio_ci)")
    lines += vs_model_lines(result)
    j = result.get("judge")
    if j and j.get("note"):
        lines.append(f"gen_ppl: not reported: {j['note']}")
    elif j:
        noise = f"; gen_ppl_noise: the baseline on seeds {j['noise_seeds']}" if "noise_seeds" in j else ""
        lines.append(f"gen_ppl: judge {j['name']}, {j['lines']} lines, {j['tokens']} tokens, loading and scoring "
                     f"{j['share_of_wall']:.0%} of the bench's wall time{noise}")
    return "\n".join(lines)


def _ci(ci: Any, fmt: str | None = None) -> str:
    if not ci:
        return ""
    lo, hi = ci
    return f" [{fmt.format(lo)}-{fmt.format(hi)}]" if fmt else f" [{_fmt(lo)}-{_fmt(hi)}]"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)
