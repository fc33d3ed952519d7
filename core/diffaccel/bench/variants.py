"""What ``diffaccel bench`` adds for adapters with a fewer-steps and solver line (the diffusers
adapters: ``solver_peers``, ``variant_peer``, ``peer_run_config``).

* ``--solver-line``: the adapter's ``solver_peers(config)`` join the first config's ``[[peer]]``
  tables: the same model at fewer steps (``steps-N``) and under a multistep solver
  (``dpm++2m-N``), each judged like any entry (PSNR and SSIM against the baseline, and the
  task metric, digit accuracy, where the model has one).
* configs whose ``[model]`` differs from the first's in ``steps`` and ``scheduler`` only (a
  cache on a solver), or in the option keys the adapter lists in ``VARIANT_OPTIONS`` (the text adapter:
  the masked sampler's ``block_size`` and ``prefix_cache``), run on the same pipeline, that model set up by the adapter's steps peer
  (``variant_peer``); the model alone joins the bench as a peer (``dpm++2m-12``) if no entry
  runs it yet, and each such entry also gets ``vs_model``: its speedup and quality against that
  model alone (the cache judged against its solver's own output).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..contract.errors import ConfigError
from ..runtime.config import PeerEntry, RunConfig
from .results import VsModel

VARIES = ("steps", "scheduler")
"""The ``[model]`` keys in which a bench's configs may differ from the first's."""


def model_differs(first: RunConfig, other: RunConfig) -> bool:
    return (first.model, first.options) != (other.model, other.options)


def check_same_model(first: RunConfig, other: RunConfig, adapter: Any) -> None:
    """``other``'s ``[model]`` may differ from ``first``'s in ``VARIES`` only, and only for an
    adapter that runs such variants (``variant_peer``)."""
    if not model_differs(first, other):
        return
    if not hasattr(adapter, "variant_peer"):
        raise ConfigError(f"{other.source}: [model] differs from {first.source}'s; bench compares configs that share one [model]")
    o = other.options
    keys = [k for k in ("scheduler", *getattr(adapter, "VARIANT_OPTIONS", ())) if k in attrs.fields_dict(type(o))]
    o = attrs.evolve(o, **{k: getattr(first.options, k) for k in keys})
    if (attrs.evolve(other.model, steps=first.model.steps), o) != (first.model, first.options):
        names = ["steps", *keys]
        shown = ", ".join(names[:-1]) + " and " + names[-1]
        raise ConfigError(f"{other.source}: [model] differs from {first.source}'s in keys other than {shown}; "
                          f"bench compares configs that share one [model] ({shown} may differ)")


def add_peers(configs: list[RunConfig], adapter: Any, solver_line: bool,
              name_of: Callable[[RunConfig], str]) -> tuple[list[RunConfig], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``configs`` with the solver line and the variants' models as peers of the first config
    (a variant without strategies or peers becomes that peer, under its own name); entry name ->
    the steps peer that sets up its model (``peer_context``) for the strategies and the peers of
    each variant; entry name -> the entry that runs that model alone; peer entry name -> the
    variant config it was listed in (it runs that config's model)."""
    base = configs[0]
    if solver_line and not hasattr(adapter, "solver_peers"):
        raise ConfigError(f"--solver-line: adapter '{base.model.adapter}' has no fewer-steps or solver line")
    extra = list(adapter.solver_peers(base)) if solver_line else []
    variants, alone, homes = {}, {}, {}
    elsewhere = {adapter.peer_name(p) for c in configs if not model_differs(base, c) for p in c.peers}
    for c in configs[1:]:
        if not model_differs(base, c):
            continue
        peer = adapter.variant_peer(base, c)
        if not c.strategies and not c.peers:
            extra.append(attrs.evolve(peer, name=name_of(c)))
            continue
        # its strategies and its [[peer]] tables (DeepCache on a solver) run on its model
        names = [name_of(c)] if c.strategies else []
        for p in c.peers:
            name = adapter.peer_name(p)
            if name in elsewhere or name in homes:
                raise ConfigError(f"{c.source}: [[peer]] #{p.index}: '{name}' runs on another [model] elsewhere in this "
                                  "bench; set the peer's name key")
            homes[name] = c
            names.append(name)
        same = [p for p in [*(e.config for e in base.peers), *extra] if attrs.evolve(p, name=None) == peer]
        if not same:
            extra.append(peer)
        for name in names:
            variants[name], alone[name] = peer, (same or [peer])[0]
    new: list[Any] = []  # by equality: peer configs may hold lists (unhashable)
    for p in extra:
        if p not in new and all(p != e.config for e in base.peers):
            new.append(p)
    entries = [PeerEntry(name="steps", index=len(base.peers) + i, config=p) for i, p in enumerate(new)]
    configs = [attrs.evolve(base, peers=tuple(base.peers) + tuple(entries)), *configs[1:]]
    alone = {name: adapter.peer_name(PeerEntry(name="steps", index=0, config=p)) for name, p in alone.items()}
    return configs, variants, alone, homes


def vs_model(result: Any, adapter: Any, names: dict[str, str], outputs: dict[str, list[Any]], times: dict[str, list[float]]) -> None:
    """Each entry run on a variant's model: ``vs_model``, its speedup over and quality against the
    entry that runs its model alone (``names``: variant entry -> that entry)."""
    by_name = result.by_name()
    for name, alone in names.items():
        e = by_name.get(name)
        if e is None or alone not in outputs:
            continue
        e.vs_model = VsModel.new(entry=alone, quality=adapter.quality(outputs[alone], outputs[name]))
        if result.is_timed:
            e.vs_model.speedup = sum(times[alone]) / sum(times[name])


def vs_model_lines(result: Any) -> list[str]:
    """One line per entry with ``vs_model`` (for the bench's table)."""
    lines = []
    for e in result.entries:
        v = e.vs_model
        if v:
            speed = f"{v.speedup:.2f}x, " if v.speedup is not None else ""
            q = ", ".join(f"{k} {x:.3f}" for k, x in v.quality.items() if isinstance(x, float))
            lines.append(f"{e.name} against {v.entry} alone (its own model): {speed}{q}")
    return lines
