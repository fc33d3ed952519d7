"""Per-run state handed to every hook: step, timestep, counters, and each strategy's own state.

One ``RunState`` lives for one generation. Strategy state is created lazily by the strategy's
``diffaccel_new_state(run)`` hook (an instance of an attrs class the strategy defines) and kept
apart per classifier-free-guidance branch (``run.branch``); tensors inside a state keep a leading
batch dimension, so batch rows never share a cache entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .guard import Reliability


@attrs.define
class Counters:
    """What the denoiser actually did during a run (filled by the adapters and the core)."""

    layers_computed: int = 0
    """Layer or block calls that ran (partially or fully)."""
    layers_skipped: int = 0
    """Layer or block calls answered without running the layer."""
    positions_computed: int = 0
    """Sum over computed layer calls of the positions (text) or batch rows (images) computed."""
    positions_total: int = 0
    """Sum over all layer calls of the positions or rows that a full computation would cover."""
    steps_reused: int = 0
    """Whole denoiser steps reused without running the model."""
    cache_hits: int = 0
    """Cached values served by strategies (strategies add to it)."""

    def as_dict(self) -> dict[str, float]:
        d = attrs.asdict(self)
        d["fraction_computed"] = self.positions_computed / self.positions_total if self.positions_total else 1.0
        return d


@attrs.define
class StepPlan:
    """What a strategy asks for at one step (returned from ``diffaccel_pre_step``).

    * ``positions``: text only, a bool tensor (batch, length); True where the position must be
      computed this step. ``None`` means every position.
    * ``skip``: names of layers or blocks this strategy is willing to skip this step.
    * ``reuse_step``: the whole denoiser output of the last step may be reused as is.

    Several plans merge so that work any strategy needs is done: positions are OR-ed, only layers
    every plan skips are skipped, and a step is reused only if every plan says so.
    """

    positions: Any = None
    skip: frozenset[str] = frozenset()
    reuse_step: bool = False

    @staticmethod
    def merge(plans: list["StepPlan"]) -> "StepPlan | None":
        plans = [p for p in plans if p is not None]
        if not plans:
            return None
        if len(plans) == 1:
            return plans[0]
        positions = None
        if all(p.positions is not None for p in plans):
            positions = plans[0].positions
            for p in plans[1:]:
                positions = positions | p.positions
        skip = frozenset.intersection(*[frozenset(p.skip) for p in plans])
        return StepPlan(positions=positions, skip=skip, reuse_step=all(p.reuse_step for p in plans))


class Layer:
    """Handle for one layer or block, created once per model by its adapter.

    ``name`` is stable (``block.3`` for text, ``down_blocks.2`` for a UNet), ``index`` is the
    order in the forward pass, ``kind`` says what it is (``transformer-block``, ``down``, ``mid``,
    ``up``, ...). ``compute(hidden, positions=None)`` runs the layer; with ``positions`` (adapters
    declaring ``token-positions``: a (batch, length) bool mask) it runs on those positions and
    merges the result with the layer's cached outputs for the others. Adapters subclass this and
    add what their capabilities promise (``cached_output``, ``depth``, ...).
    """

    supports_positions = False

    def __init__(self, name: str, index: int, kind: str):
        self.name = name
        self.index = index
        self.kind = kind

    def compute(self, hidden: Any, positions: Any = None) -> Any:  # pragma: no cover - adapters override
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Layer {self.name} ({self.kind})>"


@attrs.define(eq=False)
class RunState:
    """State of one generation; returned (summarised) with the result."""

    adapter: str
    """Adapter name, for reports only: strategies read ``capabilities``, never this."""
    num_steps: int
    """Denoising steps of this run."""
    batch_size: int
    """Rows in the batch (per guidance branch)."""
    step: int = -1
    """Index of the current step, 0-based; -1 before the first."""
    timestep: Any = None
    """The scheduler's timestep (images) or noise level (text) of the current step."""
    branch: str = "main"
    """Current classifier-free-guidance branch: ``main`` (no guidance or both branches batched),
    ``cond`` or ``uncond`` when the pipeline runs them separately."""
    plan: StepPlan | None = None
    """The merged plan of the current step."""
    counters: Counters = attrs.Factory(Counters)
    metrics: dict[str, dict[str, Any]] = attrs.Factory(dict)
    """Per strategy name, what it reports (strategies fill it, mostly at finalize)."""
    positions_per_layer: int = 0
    """Positions (text) or rows (images) one full layer call covers; set by the adapter."""
    info: dict[str, Any] = attrs.Factory(dict)
    """Adapter facts strategies may read: ``length``, ``vocab_size``, ``time_conditioned``, ..."""
    stop: bool = False
    """Set by a strategy (in ``post_step``) to end the generation after the current step, on every
    adapter: the remaining steps are not computed and the run finalises with what it has
    (``steps_run`` in the report says where it stopped; ``diffaccel_post_step`` says what each
    adapter finalises from)."""
    pinned: Any = None
    """Set by a strategy in ``run_start``: tokens to hold fixed, a long tensor (B, N), -1 where
    free. The text adapter writes them into the sequence right after ``run_start``; they are
    never re-masked or resampled and stay in the output, like prompt tokens."""
    condition: Any = None
    """Set by a strategy: an external condition vector (B, cond_dim) for models with condition
    gating (text adapter, reference models with ``cond_dim`` > 0); None: no external condition."""
    capabilities: frozenset[str] = frozenset()
    """What the adapter offers at this run (``diffaccel.capabilities``); strategies that serve
    several kinds of model choose their behaviour from it."""
    reliability: Reliability = attrs.Factory(Reliability)
    """What the core did for this run's reliability (strategies disabled, steps recomputed, guard
    checks); in the report under ``reliability`` when anything happened."""
    state_factories: dict[str, Callable[["RunState"], Any]] = attrs.Factory(dict)
    """Strategy name -> its ``diffaccel_new_state`` implementation (set by the accelerator)."""
    _states: dict[tuple[str, str], Any] = attrs.Factory(dict)

    def state(self, strategy: Any, factory: Callable[["RunState"], Any] | None = None) -> Any:
        """The strategy's own state for the current guidance branch, created on first use by
        ``factory`` or else its ``diffaccel_new_state`` hook."""
        key = (strategy.name, self.branch)
        st = self._states.get(key)
        if st is None:
            make = factory or self.state_factories.get(strategy.name)
            if make is None:
                from .plugins import own_impl

                make = own_impl(strategy, "diffaccel_new_state")
            if make is None:
                from .errors import PluginError

                raise PluginError(f"strategy '{strategy.name}' calls run.state() but implements no diffaccel_new_state hook")
            st = make(self)
            self._states[key] = st
        return st

    def states(self, strategy: Any = None) -> dict[str, Any]:
        """The per-run states created so far, by guidance branch: those of ``strategy`` (an
        instance or its name), or of every strategy when None (then keyed ``(name, branch)``).
        A strategy releasing its tensors at ``run_end`` walks its own branches here."""
        if strategy is None:
            return dict(self._states)
        name = strategy if isinstance(strategy, str) else strategy.name
        return {branch: st for (n, branch), st in self._states.items() if n == name}

    def clear_states(self) -> None:
        """Drop every strategy's state (the quality guard's reset: caches start afresh)."""
        self._states.clear()

    def rename_branch(self, old: str, new: str) -> None:
        """Move every state of guidance branch ``old`` to ``new`` (an adapter that learns mid-run
        that its guidance branches run separately)."""
        for (name, branch) in list(self._states):
            if branch == old:
                self._states[(name, new)] = self._states.pop((name, branch))

    def report(self) -> dict[str, Any]:
        """A plain-data summary: counters and per-strategy metrics."""
        report = {
            "adapter": self.adapter,
            "steps": self.num_steps,
            "steps_run": self.step + 1,
            "counters": self.counters.as_dict(),
            "strategies": self.metrics,
        }
        reliability = self.reliability.as_dict()
        if reliability is not None:
            report["reliability"] = reliability
        return report
