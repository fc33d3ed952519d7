"""The bench's first phase: what it runs, planned before and after the model loads.

``plan_configs`` reads and checks the configs (``--grid``, ``--batch``, ``--seed``, the solver
line and the variants' models as peers) before anything loads; ``plan_entries`` builds each
entry's strategies against the loaded model (through ``diffaccel.Run``) and names the peers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from ..contract.adapter import PeersRunOtherConfigs
from ..contract.errors import ConfigError
from ..runtime.adapters_registry import get_adapter
from ..runtime.config import RunConfig, load_config
from ..runtime.registry import Registry
from ..runtime.runs import Run
from .grid import expand, parse_grid
from .options import BenchOptions
from .variants import add_peers, check_same_model, model_differs


@attrs.define
class BenchPlan:
    """The entries of one bench, in the order they are reported: the baseline, each config's
    strategies, each peer. ``entries``: (name, built strategies); ``policies``: each strategy
    entry's config (its on_error keys and ``[guard]``); ``variants``: entry -> the steps peer that
    sets up its model; ``alone``: variant entry -> the entry running its model alone; ``homes``:
    peer entry -> the variant config it was listed in; ``peer_configs``: the config a peer runs
    (``PeersRunOtherConfigs``)."""

    adapter: Any
    configs: list[RunConfig]
    seeds: list[int]
    variants: dict[str, Any]
    alone: dict[str, str]
    homes: dict[str, RunConfig]
    entries: list[tuple[str, list[Any]]] = attrs.Factory(list)
    policies: dict[str, RunConfig] = attrs.Factory(dict)
    peers: dict[str, Any] = attrs.Factory(dict)
    peer_configs: dict[str, RunConfig] = attrs.Factory(dict)

    @property
    def base(self) -> RunConfig:
        return self.configs[0]

    def run_config(self, name: str) -> RunConfig:
        """The config entry ``name`` runs: a peer's own, a variant's, or the baseline's."""
        return self.peer_configs.get(name) or (self.policies[name] if name in self.variants else self.base)


def plan_configs(paths: list[str], o: BenchOptions, registry: Registry) -> BenchPlan:
    """The configs of ``paths`` as ``o`` changes them, checked; nothing loads."""
    grid = o.grid
    if grid and all(isinstance(a, str) for a in grid):  # as typed after --grid: "tau=0.01,0.5"
        grid = parse_grid(list(grid))
    configs = load_bench_configs(paths, registry, grid, o.batch, o.seed)
    adapter = get_adapter(configs[0].model.adapter)
    configs, variants, alone, homes = add_peers(configs, adapter, o.solver_line, entry_name)
    base = configs[0]
    seeds = [base.model.seed + k * base.model.batch for k in range(o.seeds)]
    return BenchPlan(adapter=adapter, configs=configs, seeds=seeds, variants=variants, alone=alone, homes=homes)


def plan_entries(plan: BenchPlan, run: Run) -> None:
    """Each entry's strategies, built against ``run``'s model, and the peers (``[[peer]]``)."""
    plan.entries = [("baseline", [])]
    plan.entries += [(entry_name(c), run.build(c)) for c in plan.configs if c.strategies]
    plan.policies = {entry_name(c): c for c in plan.configs if c.strategies}  # each entry's on_error and [guard]
    plan.peers = _peer_entries(plan.configs, plan.adapter, {name for name, _ in plan.entries})
    plan.entries += [(name, []) for name in plan.peers]
    # a peer may run another config than the baseline's (the text adapter's ``steps`` peer)
    if isinstance(plan.adapter, PeersRunOtherConfigs):
        plan.peer_configs = {name: plan.adapter.peer_run_config(plan.homes.get(name, plan.base), p.config)
                             for name, p in plan.peers.items()}


def entry_name(config: RunConfig) -> str:
    return config.name or Path(config.source).stem


def with_batch(config: RunConfig, batch: int) -> RunConfig:
    """The config with ``[model] batch`` replaced (``--batch`` of ``bench`` and ``partial``)."""
    if batch < 1:
        raise ConfigError(f"--batch must be 1 or more, got {batch}")
    return attrs.evolve(config, model=attrs.evolve(config.model, batch=batch))


def load_bench_configs(paths: list[str], registry: Registry, grid: list[Any] | None = None,
                       batch: int | None = None, seed: int | None = None) -> list[RunConfig]:
    """The configs of ``paths``, each config with strategies expanded over ``grid`` (``grid.Axis``
    list, ``bench --grid``) and ``[model] batch`` and ``seed`` set when given (``--batch``,
    ``--seed``: set before the same-model check, so configs written for another batch or seed,
    such as a tune's output, still share one model), all validated; one ``ConfigError`` line for
    the first problem."""
    configs = [load_config(p, registry) for p in paths]
    if grid:  # first: a grid point is built from its file, so --batch and --seed must reach it after
        configs = [g for c, p in zip(configs, paths) for g in (expand(p, grid, registry) if c.strategies else [c])]
    if batch is not None:
        configs = [with_batch(c, batch) for c in configs]
    if seed is not None:
        configs = [with_seed(c, seed) for c in configs]
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
