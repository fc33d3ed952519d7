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


def run_prompt_bench(paths: list[str], prompts: str, *, noise_floor: bool = True, progress: bool = True,
                     seed: int | None = None, judge: str | None = None) -> dict[str, Any] | None:
    """The bench result (as ``run_bench``'s, plus ``items`` and ``processes``) on the main
    process; None on the others."""
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    from ..runtime.accelerator import apply, build_strategies
    from ..contract.adapter import PeersRunOtherConfigs
    from ..runtime.adapters_registry import get_adapter
    from .runner import _judge_quality, _load_judge, _peer_entries, _strategy_quality, entry_name, load_bench_configs, with_seed
    from ..runtime.jobs import check_job_config, on_own_device, process_state, item_config, load_problem, raise_if_any, read_items
    from ..runtime.placement import DeviceClock
    from ..runtime.registry import Registry

    wall0 = time.perf_counter()
    base = problem = None
    try:  # bad input: every process raises the same line together (jobs.raise_if_any)
        registry = Registry()
        configs = load_bench_configs(paths, registry)
        if seed is not None:
            configs = [with_seed(c, seed) for c in configs]
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
    base = on_own_device(base, state)
    judge_obj, judge_info = (None, {})
    problem = None
    try:
        if state.is_main_process:  # the judge scores on the main process only
            judge_obj, judge_info = _load_judge(adapter, judge)
        pipe = adapter.load(base)
        info = adapter.info(pipe)
        entries: list[tuple[str, list[Any]]] = [("baseline", [])]
        entries += [(entry_name(c), build_strategies(c, registry, info)) for c in configs if c.strategies]
        peers = _peer_entries(configs, adapter, {name for name, _ in entries})
    except Exception as exc:  # noqa: BLE001 - any load failure must reach the other processes
        problem = load_problem(exc, base.model.checkpoint)
    raise_if_any(state, problem)
    entries += [(name, []) for name in peers]
    peer_run = adapter.peer_run_config if isinstance(adapter, PeersRunOtherConfigs) else None

    def run_config(name: str, item) -> Any:
        cfg = item_config(base, item)
        return peer_run(cfg, peers[name].config) if name in peers and peer_run else cfg

    times: dict[str, float] = {name: 0.0 for name, _ in entries}
    outputs: dict[str, dict[int, Any]] = {name: {} for name, _ in entries}
    refs: dict[int, Any] = {}
    clock = DeviceClock(base.model.device, warmup_runs=1)
    with state.split_between_processes(items) as mine:
        if mine:
            adapter.run(pipe, item_config(base, mine[0]), mine[0].seed, progress=False)  # warm-up, untimed
        bar = tqdm(total=len(mine) * len(entries), desc=f"bench ({state.num_processes} proc)", unit="run",
                   disable=not (progress and state.is_main_process))
        for item in mine:
            k = item.line % len(entries)
            for name, strategies in entries[k:] + entries[:k]:
                peer = peers.get(name)
                cfg = run_config(name, item)
                with (adapter.peer_context(pipe, peer.config) if peer else apply(pipe, strategies=strategies)):
                    with clock.region() as r:
                        out = adapter.run(pipe, cfg, item.seed, progress=False)
                    times[name] += r.seconds
                outputs[name][item.line] = out
                bar.update(1)
            if noise_floor:
                refs[item.line] = adapter.reference_run(pipe, item_config(base, item), item.seed)
        bar.close()
    shares = gather_object([(times, outputs, refs)]) if state.num_processes > 1 else [(times, outputs, refs)]
    if not state.is_main_process:
        return None

    total = {name: sum(s[0][name] for s in shares) for name, _ in entries}
    merged = {name: {} for name, _ in entries}
    all_refs: dict[int, Any] = {}
    for _, outs, rs in shares:
        for name in merged:
            merged[name].update(outs[name])
        all_refs.update(rs)
    lines = [it.line for it in items]
    ordered = {name: [merged[name][ln] for ln in lines] for name in merged}
    references = [all_refs[ln] for ln in lines] if noise_floor and all(all_refs.get(ln) is not None for ln in lines) else None
    result: dict[str, Any] = {"model": {"adapter": base.model.adapter, "checkpoint": base.model.checkpoint,
                                        "steps": base.model.steps, "batch": 1},
                              "seeds": [it.seed for it in items], "repeats": 1, "items": len(items),
                              "prompts": str(prompts), "processes": state.num_processes, "entries": [],
                              "timing": clock.describe()}
    for name, strategies in entries:
        reports = [o.report for o in ordered[name]]
        peer = peers.get(name)
        entry = {"name": name, "speedup": total["baseline"] / total[name],
                 "quality": adapter.quality(ordered["baseline"], ordered[name], references),
                 "fraction_computed": None if peer else sum(r["counters"]["fraction_computed"] for r in reports) / len(reports),
                 "strategies": [s.name for s in strategies], "reports": reports}
        if peer:
            entry["peer"] = {"use": peer.name, **attrs.asdict(peer.config)}
        result["entries"].append(entry)
    _strategy_quality(result, entries, ordered, result["seeds"])
    if judge_obj is not None:
        _judge_quality(result, adapter, judge_obj, pipe, base, ordered, False)
    if judge_info:
        result["judge"] = {**judge_info, **result.get("judge", {})}
    result["wall_s"] = time.perf_counter() - wall0
    if "score_s" in result.get("judge", {}):
        j = result["judge"]
        j["share_of_wall"] = (j["load_s"] + j["score_s"]) / result["wall_s"]
    return result


def main_bench(args) -> int:
    """The CLI's ``bench --prompts``: the table on the main process (and ``--json``)."""
    import json
    from pathlib import Path

    from .runner import format_table

    if args.batch is not None or args.repeats != 1:
        raise DiffaccelError("bench --prompts runs every item once, one row per call: --batch and --repeats do not apply")
    from ..runtime.jobs import exit_together

    try:
        result = run_prompt_bench(args.configs, args.prompts, noise_floor=not args.no_noise_floor,
                                  progress=not args.no_progress, seed=args.seed, judge=args.judge)
    except DiffaccelError as exc:
        return exit_together(exc)
    if result is None:
        return 0
    head = f"{result['items']} items of {result['prompts']} on {result['processes']} process(es)"
    table = format_table(result).split("\n")
    table[0] = f"{result['model']['adapter']} model {result['model']['checkpoint']}, {head}, interleaved"
    print("\n".join(table))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.json_path).with_name(Path(args.json_path).name + ".partial")
        tmp.write_text(json.dumps(result, indent=2, default=float))
        tmp.replace(args.json_path)
        print(f"wrote {args.json_path}")
    return 0
