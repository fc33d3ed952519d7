"""The ``time-anchor`` strategy: skip the (layer, position) states that have settled.

After ``warmup`` full steps, each computed state is compared with its reference in the latent
cache (its output when last computed): if the relative change per step since then is below
``threshold`` (or, with a learned gate, if the layer's gate is open at this time), the entry is
written *anchored*. While an anchored entry is younger than ``max_age`` steps its state is not
computed. How a state is left out depends on what the model offers, never on which adapter
drives it; two policies share the cache (``cache.py``) and the gate (``gate.py``):

* ``token-positions`` (``tokens.py``): the layer runs on the other positions only;
* ``block-stack`` (``blocks.py``): below the shallowest anchored depth, every block is skipped.
"""

from __future__ import annotations

from typing import Any

import torch

from diffaccel import hookimpl
from diffaccel.contract.capabilities import BLOCK_STACK, BLOCK_TAIL, TOKEN_POSITIONS
from diffaccel.contract.errors import ConfigValueError, DiffaccelError

from .blocks import BlockPolicy, BlockStackState
from .config import TimeAnchorConfig, load_clusters
from .gate import Gate
from .plot import plot_anchored
from .state import AnchorState, rel_change
from .tokens import TokenPolicy, TokenState

BRANCHES = ("main", "uncond", "cond")


class TimeAnchor:
    name = "time-anchor"

    def __init__(self, config: TimeAnchorConfig):
        self.config = config
        self.gate = Gate.load(config.gate) if config.gate else None
        self.clusters = load_clusters(config.clusters) if config.clusters else None
        self.tokens = TokenPolicy(config, self.gate, self.clusters)
        self.blocks = BlockPolicy(config, self.gate)

    def policy(self, capabilities) -> TokenPolicy | BlockPolicy:
        """The policy for a model offering ``capabilities``: token positions first, else blocks."""
        if TOKEN_POSITIONS in capabilities:
            return self.tokens
        if BLOCK_STACK in capabilities:
            return self.blocks
        raise DiffaccelError(f"time-anchor: key 'use': the model offers neither '{TOKEN_POSITIONS}' nor '{BLOCK_STACK}'")

    @hookimpl
    def diffaccel_setup(self, info: dict[str, Any]) -> None:
        if self.gate is not None:
            self.gate.check(info)
        caps = info.get("capabilities")
        if self.clusters is not None:
            if caps is not None and TOKEN_POSITIONS not in caps:
                raise ConfigValueError("clusters", "position clusters need a model with token positions; this one's blocks are keyed per row")
            max_len = info.get("max_len")
            if max_len is not None and len(self.clusters["assign"]) > max_len:
                raise ConfigValueError("clusters", f"the file assigns {len(self.clusters['assign'])} positions but the model has {max_len}")
        if self.config.tail_layers and caps is not None and BLOCK_TAIL not in caps:
            raise ConfigValueError("tail_layers", f"needs a model with capability '{BLOCK_TAIL}'")

    @hookimpl
    def diffaccel_new_state(self, run) -> TokenState | BlockStackState:
        return self.policy(run.capabilities).new_state()

    # -- hooks: each hands over to the policy of the run's model ------------------------------
    @hookimpl
    def diffaccel_run_start(self, run):
        self.policy(run.capabilities).run_start(run)

    @hookimpl
    def diffaccel_pre_step(self, run):
        return self.policy(run.capabilities).pre_step(run.state(self), run)

    @hookimpl
    def diffaccel_post_step(self, run, output):
        if TOKEN_POSITIONS in run.capabilities and output.masked is not None:  # what the token policy tracks
            self.tokens.post_step(run.state(self), run, output)

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        return self.policy(run.capabilities).layer_output(run.state(self), run, layer, hidden)

    @hookimpl
    def diffaccel_finalize(self, run, final):
        policy = self.policy(run.capabilities)
        states = _branch_states(run, self)
        for st in states:
            policy.finish(st)
        if not states:
            # no cache: the cost gate kept it aside from the start, or response_test = false
            # (the step's plan was all it did): the served share and the gate's verdict still
            if policy is self.tokens:
                ran = [s for s in _branch_states(run, self, cached=False) if s.gate is not None]
                if ran:
                    run.metrics[self.name] = self.tokens.plan_metrics(ran)
                    run.tally.cache_hits(run.metrics[self.name]["hits"])
            return
        m = self.metrics(states, run)
        policy.add_metrics(m, states, run)
        run.metrics[self.name] = m
        run.tally.cache_hits(m["hits"])

    # -- reporting ---------------------------------------------------------------------------
    def metrics(self, states: list[AnchorState], run) -> dict[str, Any]:
        hits = sum(int(s.hits) for s in states)
        lookups = sum(s.lookups for s in states)
        per_step = torch.stack([s.anchored.float().cpu() for s in states if s.anchored is not None]).mean(0)
        stats = [s.cache.stats() for s in states if s.cache is not None]
        layers = run.info.layers or [f"block.{i}" for i in range(per_step.shape[0])]
        return {
            "hit_rate": hits / lookups if lookups else 0.0,
            "hits": hits,
            "layers": list(layers),
            "anchored_per_layer": [round(float(x), 4) for x in per_step.mean(1)],
            "anchored_by_step": [[round(float(x), 4) for x in row] for row in per_step],
            "peak_entries": sum(s["peak_entries"] for s in stats),
            "peak_bytes": sum(s["peak_bytes"] for s in stats),
            "max_age_recomputes": sum(s["stale"] for s in stats),
            "evictions": sum(s["evictions"] for s in stats),
            "dropped": sum(s["dropped"] for s in stats),
            "branches": len(states),
        }

    @hookimpl
    def diffaccel_bench_plot(self, reports: list[dict[str, Any]], path) -> None:
        plot_anchored(reports, self.name, path)


def _branch_states(run, strategy, cached: bool = True) -> list[AnchorState]:
    """This strategy's states of every guidance branch that ran (without creating any); those
    with a cache only, unless ``cached`` is False."""
    found, branch = [], run.branch
    for b in BRANCHES:
        run.branch = b
        st = run.state(strategy, factory=lambda _run: None)
        if st is not None:
            found.append(st)
    run.branch = branch
    return [s for s in found if s.cache is not None or not cached]


__all__ = ["BRANCHES", "TimeAnchor", "rel_change"]
