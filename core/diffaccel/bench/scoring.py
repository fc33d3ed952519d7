"""The bench's third phase: quality. The strategies' own measures (``diffaccel_bench_quality``),
intervals from resampling the seeds (``quality_ci``, ``quality_ratio_ci``), and the judge's
``gen_ppl`` (adapters with ``load_judge``: text), scored after the timed runs."""

from __future__ import annotations

import math
import time
from typing import Any

from ..contract.adapter import JudgesSamples, PoolsQuality
from ..contract.errors import DiffaccelError
from ..kit.stats import finite, pooled_ci
from ..runtime.config import RunConfig
from ..runtime.registry import call_own
from .results import BenchResult, JudgeInfo


def _strategy_quality(result: BenchResult, entries: list[tuple[str, list[Any]]], outputs: dict[str, list[Any]],
                      seeds: list[int]) -> None:
    """The ``diffaccel_bench_quality`` hook of each strategy: its keys on its entry's outputs, and
    on the baseline's (the first strategy offering a key wins there)."""
    by_name = result.by_name()
    for name, strategies in entries:
        for s in strategies:
            for q in call_own(s, "diffaccel_bench_quality", outputs=outputs[name], seeds=seeds):
                by_name[name].quality.update(q)
            for q in call_own(s, "diffaccel_bench_quality", outputs=outputs["baseline"], seeds=seeds):
                for k, v in q.items():
                    by_name["baseline"].quality.setdefault(k, v)


def _quality_intervals(result: BenchResult, adapter: Any, outputs: dict[str, list[Any]], references: list[Any] | None) -> None:
    """``quality_ci``: for each key of the adapter's ``quality``, an interval from resampling the
    seeds and computing ``quality`` again on each resample's outputs (``stats.pooled_ci``: a
    metric pooled over all outputs, as distinct-n, gets an interval around its own point); and
    ``quality_ratio_ci``: of the entry's value over the baseline's, both computed on the same
    resampled seeds (paired). Nothing with fewer than 2 seeds. The judge's gen_ppl gets its
    intervals in ``_judge_quality``."""
    n = len(result.seeds)
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

    for e in result.entries:
        name = e.name
        e.quality_ci = pooled_ci(n, lambda idx: quality(name, idx))
        if name != "baseline":
            e.quality_ratio_ci = pooled_ci(n, lambda idx: _ratios(quality(name, idx), quality("baseline", idx)))


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


def _judge_quality(result: BenchResult, adapter: Any, judge: Any, pipe: Any, base: RunConfig,
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
        n, b = len(result.seeds), base.model.batch
        info["noise_seeds"] = [base.model.seed + k * b for k in range(n, 2 * n)]
        t0 = time.perf_counter()
        groups[None] = [adapter.judge_lines([adapter.run(pipe, base, s, progress=False) for s in info["noise_seeds"]])]
        info["noise_runs_s"] = time.perf_counter() - t0
    lines = [line for g in groups.values() for seed_lines in g for line in seed_lines]
    t0 = time.perf_counter()
    scores = judge.score(lines)
    info.update(score_s=time.perf_counter() - t0, lines=len(lines), tokens=sum(scores.tokens))
    by_name = result.by_name()
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
            by_name["baseline"].quality["gen_ppl_noise"] = ppl
        else:
            by_name[name].quality["gen_ppl"] = ppl
            by_name[name].judge_per_seed = {"nll": nll, "tokens": toks}
    result.judge = JudgeInfo.new(**info)
    n = len(result.seeds)
    if n < 2:
        return

    def gen_ppl(name: str, idx: tuple[int, ...]) -> float:
        nll, toks = sums[name]
        t = sum(toks[i] for i in idx)
        return math.exp(sum(nll[i] for i in idx) / t) if t else float("nan")

    for name, e in by_name.items():
        if e.quality_ci is None:
            e.quality_ci = {}
        e.quality_ci.update(pooled_ci(n, lambda idx: {"gen_ppl": gen_ppl(name, idx)}))
        if name != "baseline":
            if e.quality_ratio_ci is None:
                e.quality_ratio_ci = {}
            e.quality_ratio_ci.update(
                pooled_ci(n, lambda idx: {"gen_ppl": gen_ppl(name, idx) / gen_ppl("baseline", idx)}))


def add_judge_info(result: BenchResult, judge_info: dict[str, Any]) -> None:
    """The judge's name and load time (or note) first in ``result.judge``, then its scoring facts."""
    if judge_info:
        result.judge = JudgeInfo.new(**{**judge_info, **(result.judge.to_dict() if result.judge else {})})


def judge_share(result: BenchResult) -> None:
    """``judge.share_of_wall``: loading and scoring's share of the bench's wall time."""
    j = result.judge
    if j is not None and j.has("score_s"):
        j.share_of_wall = (j.load_s + j.score_s) / result.wall_s
