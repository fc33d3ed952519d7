"""``diffaccel bench CONFIGS --prompts FILE``: the bench over the items of a prompts file.

Every item (one row: its prompt, its seed, as ``generate --prompts`` reads them, ``diffaccel.runtime.jobs``)
runs in every entry (the baseline, each config's strategies, each ``[[peer]]``), interleaved in
an order that rotates with the item's line, so the order does not depend on which process runs
it. Under ``accelerate launch`` each process takes its share of the items
(``PartialState.split_between_processes``) and times them; the main process gathers the times
and outputs (``accelerate.utils.gather_object``) and reports, over all items, the speedup (the
baseline's summed time over the entry's) and the quality columns of the seed bench.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from ..contract.errors import DiffaccelError
from .options import BenchOptions, options_from
from .results import BenchResult, Entry, ModelFacts, Timing


@attrs.define
class _Shared:
    """What every process holds: its state (``PartialState``), the configs, the items, the loaded
    model, the entries (name, strategies) and peers, and on the main process the judge."""

    state: Any
    base: Any
    adapter: Any
    items: list[Any]
    pipe: Any = None
    entries: list[tuple[str, list[Any]]] = attrs.Factory(list)
    peers: dict[str, Any] = attrs.Factory(dict)
    judge: Any = None
    judge_info: dict[str, Any] = attrs.Factory(dict)

    def run_config(self, name: str, item: Any) -> Any:
        from ..contract.adapter import PeersRunOtherConfigs
        from ..runtime.jobs import item_config

        cfg = item_config(self.base, item)
        if name in self.peers and isinstance(self.adapter, PeersRunOtherConfigs):
            return self.adapter.peer_run_config(cfg, self.peers[name].config)
        return cfg


def run_prompt_bench(paths: list[str], prompts: str, options: BenchOptions | None = None, **old: Any) -> BenchResult | None:
    """The bench result (as ``run_bench``'s, plus ``items`` and ``processes``) on the main
    process; None on the others. Of ``options`` (``BenchOptions``; the old keywords still work
    with a DeprecationWarning) it reads ``noise_floor``, ``progress``, ``seed`` and ``judge``.
    Phases: set up (every process, failing together), time this process's share of the items,
    gather, then on the main process score and build the result."""
    from accelerate.utils import gather_object

    from .scoring import _judge_quality, _strategy_quality, add_judge_info, judge_share

    o = options_from(BenchOptions, options, old, "run_prompt_bench")
    wall0 = time.perf_counter()
    shared = _set_up(paths, prompts, o)
    state, entries = shared.state, shared.entries
    share, clock = _time_items(shared, o)
    shares = gather_object([share]) if state.num_processes > 1 else [share]
    if not state.is_main_process:
        return None
    ordered, references, total = _merge(shares, entries, shared.items, o.noise_floor)
    result = _result(shared, prompts, clock, ordered, references, total)
    _strategy_quality(result, entries, ordered, result.seeds)
    if shared.judge is not None:
        _judge_quality(result, shared.adapter, shared.judge, shared.pipe, shared.base, ordered, False)
    add_judge_info(result, shared.judge_info)
    result.wall_s = time.perf_counter() - wall0
    judge_share(result)
    return result


def _set_up(paths: list[str], prompts: str, o: BenchOptions) -> _Shared:
    """The configs, items and model on every process (``diffaccel.Run``); bad input or a load
    failure raises the same line on every process together (``jobs.raise_if_any``)."""
    from ..runtime.adapters_registry import get_adapter
    from ..runtime.jobs import check_job_config, load_problem, on_own_device, process_state, raise_if_any, read_items
    from ..runtime.registry import Registry
    from ..runtime.runs import Run
    from .plan import _peer_entries, entry_name, load_bench_configs
    from .scoring import _load_judge

    base = problem = configs = items = adapter = None
    try:  # bad input: every process raises the same line together (jobs.raise_if_any)
        registry = Registry()
        configs = load_bench_configs(paths, registry, seed=o.seed)
        base = configs[0]
        items = read_items(prompts, base.model.seed)
        empty = [it.line + 1 for it in items if not it.prompt.strip()]
        if empty:
            raise DiffaccelError(f"{prompts}: line {empty[0]}: empty prompt; bench needs a prompt on every line")
        adapter = get_adapter(base.model.adapter)
        check_job_config(base, adapter)
    except DiffaccelError as exc:
        problem = str(exc)
    state = process_state(base)
    raise_if_any(state, problem)
    shared = _Shared(state=state, base=on_own_device(base, state), adapter=adapter, items=items)
    problem = None
    try:
        if state.is_main_process:  # the judge scores on the main process only
            shared.judge, shared.judge_info = _load_judge(adapter, o.judge)
        run = Run(shared.base, registry=registry)
        shared.pipe = run.pipe
        shared.entries = [("baseline", [])] + [(entry_name(c), run.build(c)) for c in configs if c.strategies]
        shared.peers = _peer_entries(configs, adapter, {name for name, _ in shared.entries})
    except Exception as exc:  # noqa: BLE001 - any load failure must reach the other processes
        problem = load_problem(exc, shared.base.model.checkpoint)
    raise_if_any(state, problem)
    shared.entries += [(name, []) for name in shared.peers]
    return shared


def _time_items(shared: _Shared, o: BenchOptions) -> tuple[tuple[dict, dict, dict], Any]:
    """This process's share of the items, every entry on each, interleaved in an order that
    rotates with the item's line: (times, outputs by line, references by line), and the clock."""
    from tqdm.auto import tqdm

    from ..runtime.accelerator import apply
    from ..runtime.jobs import item_config
    from ..runtime.placement import DeviceClock

    adapter, pipe, base, state, entries = shared.adapter, shared.pipe, shared.base, shared.state, shared.entries
    times: dict[str, float] = {name: 0.0 for name, _ in entries}
    outputs: dict[str, dict[int, Any]] = {name: {} for name, _ in entries}
    refs: dict[int, Any] = {}
    clock = DeviceClock(base.model.device, warmup_runs=1)
    with state.split_between_processes(shared.items) as mine:
        if mine:
            adapter.run(pipe, item_config(base, mine[0]), mine[0].seed, progress=False)  # warm-up, untimed
        bar = tqdm(total=len(mine) * len(entries), desc=f"bench ({state.num_processes} proc)", unit="run",
                   disable=not (o.progress and state.is_main_process))
        for item in mine:
            k = item.line % len(entries)
            for name, strategies in entries[k:] + entries[:k]:
                peer = shared.peers.get(name)
                cfg = shared.run_config(name, item)
                with (adapter.peer_context(pipe, peer.config) if peer else apply(pipe, strategies=strategies)):
                    with clock.region() as r:
                        out = adapter.run(pipe, cfg, item.seed, progress=False)
                    times[name] += r.seconds
                outputs[name][item.line] = out
                bar.update(1)
            if o.noise_floor:
                refs[item.line] = adapter.reference_run(pipe, item_config(base, item), item.seed)
        bar.close()
    return (times, outputs, refs), clock


def _merge(shares: list[tuple[dict, dict, dict]], entries: list[tuple[str, list[Any]]], items: list[Any],
           noise_floor: bool) -> tuple[dict[str, list[Any]], list[Any] | None, dict[str, float]]:
    """Every process's share as one: each entry's outputs in the items' order, the references
    (None unless every item has one), each entry's summed time."""
    total = {name: sum(s[0][name] for s in shares) for name, _ in entries}
    merged: dict[str, dict[int, Any]] = {name: {} for name, _ in entries}
    all_refs: dict[int, Any] = {}
    for _, outs, rs in shares:
        for name in merged:
            merged[name].update(outs[name])
        all_refs.update(rs)
    lines = [it.line for it in items]
    ordered = {name: [merged[name][ln] for ln in lines] for name in merged}
    references = [all_refs[ln] for ln in lines] if noise_floor and all(all_refs.get(ln) is not None for ln in lines) else None
    return ordered, references, total


def _result(shared: _Shared, prompts: str, clock: Any, ordered: dict[str, list[Any]], references: list[Any] | None,
            total: dict[str, float]) -> BenchResult:
    m, adapter = shared.base.model, shared.adapter
    result = BenchResult.new(model=ModelFacts.new(adapter=m.adapter, checkpoint=m.checkpoint, steps=m.steps, batch=1),
                             seeds=[it.seed for it in shared.items], repeats=1, items=len(shared.items), prompts=str(prompts),
                             processes=shared.state.num_processes, entries=[], timing=Timing.from_dict(clock.describe()))
    for name, strategies in shared.entries:
        reports = [o.report for o in ordered[name]]
        peer = shared.peers.get(name)
        entry = Entry.new(name=name, speedup=total["baseline"] / total[name],
                          quality=adapter.quality(ordered["baseline"], ordered[name], references),
                          fraction_computed=None if peer else sum(r["counters"]["fraction_computed"] for r in reports) / len(reports),
                          strategies=[s.name for s in strategies], reports=reports)
        if peer:
            entry.peer = {"use": peer.name, **attrs.asdict(peer.config)}
        result.entries.append(entry)
    return result


def main_bench(args) -> int:
    """The CLI's ``bench --prompts``: the table on the main process (and ``--json``)."""
    from .runner import format_table, write_json

    if args.batch is not None or args.repeats != 1:
        raise DiffaccelError("bench --prompts runs every item once, one row per call: --batch and --repeats do not apply")
    from ..runtime.jobs import exit_together

    try:
        result = run_prompt_bench(args.configs, args.prompts, BenchOptions(
            noise_floor=not args.no_noise_floor, progress=not args.no_progress, seed=args.seed, judge=args.judge))
    except DiffaccelError as exc:
        return exit_together(exc)
    if result is None:
        return 0
    head = f"{result.items} items of {result.prompts} on {result.processes} process(es)"
    table = format_table(result).split("\n")
    table[0] = f"{result.model.adapter} model {result.model.checkpoint}, {head}, interleaved"
    print("\n".join(table))
    if args.json_path:
        write_json(args.json_path, result)
        print(f"wrote {args.json_path}")
    return 0
