"""The bench's second phase: every entry run on the same seeds, interleaved (for each repeat and
seed, every entry runs once, in an order that rotates), so machine noise hits them alike; each
run timed on the device's clock (``DeviceClock``) and its allocator peak read (``DevicePeak``)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import attrs
from tqdm.auto import tqdm

from ..runtime.accelerator import apply
from ..runtime.memory import DevicePeak
from ..runtime.placement import DeviceClock
from ..runtime.registry import Registry
from .plan import BenchPlan


@attrs.define
class Timed:
    """What the timed runs left: each entry's seconds per run, its outputs (one per seed, from
    the first repeat: ``outputs[name][i]`` is the run of ``plan.seeds[i]``), its device peak."""

    clock: DeviceClock
    times: dict[str, list[float]]
    outputs: dict[str, list[Any]]
    device_peaks: dict[str, int]


def time_entries(plan: BenchPlan, pipe: Any, registry: Registry, *, repeats: int, timed: bool, progress: bool) -> Timed:
    """Run every entry on every seed, ``repeats`` times, interleaved; ``timed``: after one
    untimed warm-up run (a quality-only bench has none, and its times mean nothing)."""
    adapter, base, entries = plan.adapter, plan.base, plan.entries
    clock = DeviceClock(base.model.device, warmup_runs=1 if timed else 0)
    peak = DevicePeak(base.model.device)
    out = Timed(clock=clock, times={name: [] for name, _ in entries}, outputs={name: [] for name, _ in entries},
                device_peaks={})
    if timed:
        adapter.run(pipe, base, plan.seeds[0], progress=False)  # warm-up, untimed
    bar = tqdm(total=repeats * len(plan.seeds) * len(entries), desc="bench", unit="run", disable=not progress)
    k = 0
    for rep in range(repeats):
        for seed in plan.seeds:
            order = entries[k % len(entries):] + entries[: k % len(entries)]
            k += 1
            for name, strategies in order:
                with ExitStack() as stack:  # a variant's model (its scheduler) is set up before its strategies or peer
                    for ctx in _contexts(plan, name):
                        stack.enter_context(adapter.peer_context(pipe, ctx) if ctx is not None else
                                            apply(pipe, plan.policies.get(name), strategies=strategies, registry=registry))
                    peak.reset()
                    with clock.region() as r:
                        result = adapter.run(pipe, plan.run_config(name), seed, progress=False)
                    out.times[name].append(r.seconds)
                    if (p := peak.read()) is not None:
                        out.device_peaks[name] = max(out.device_peaks.get(name, 0), p)
                if rep == 0:
                    out.outputs[name].append(result)
                bar.update(1)
    bar.close()
    return out


def _contexts(plan: BenchPlan, name: str) -> list[Any]:
    """What entry ``name`` runs under, in order: its variant's model (a steps peer), then its peer
    config, or None for its strategies (``apply``)."""
    peer = plan.peers.get(name)
    return ([plan.variants[name]] if name in plan.variants else []) + [peer.config if peer else None]
