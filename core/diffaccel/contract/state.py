"""Per-run state handed to every hook: step, timestep, counters, and each strategy's own state.

One ``RunState`` lives for one generation. Strategy state is created lazily by the strategy's
``diffaccel_new_state(run)`` hook (an instance of an attrs class the strategy defines) and kept
apart per classifier-free-guidance branch (``run.branch``); tensors inside a state keep a leading
batch dimension, so batch rows never share a cache entry.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import attrs

from .errors import PluginError
from .hookspecs import own
from .info import RUN_INFO_FIELDS, ImageFacts, RunInfo, StackFacts, TokenFacts  # noqa: F401 (their 0.2 home)
from .reliability import Reliability

MODEL_FAULT = "diffaccel_layer"
"""Attribute set on an exception raised inside a ``Layer.compute``: the layer's name. The core
then reports it as the model's fault, never as the strategy whose hook called ``compute``."""

CURRENT_STEP: ContextVar[Any] = ContextVar("diffaccel_current_step", default=None)
"""The step being computed: the ``Tally`` of its run (``run.tally``), set by ``RunSequence.denoise``
around the denoiser, so that every ``Layer.compute`` called meanwhile (by the built-in default, a
strategy, the guard's full recomputation) is counted in that run's counters, by the core."""

TALLY: list[Callable[["RunState"], Any]] = []
"""The run machinery's counting class (``diffaccel.runtime.sequence.Tally``), registered when it
is imported (the contract imports nothing above it): ``RunState.tally`` makes one per run."""


def _model_side(compute: Callable[..., Any]) -> Callable[..., Any]:
    """``Layer.compute`` of a subclass, marking what it raises as the model's (the call site of
    the model, whoever called it); while a step computes, the call goes through the run's tally
    (``CURRENT_STEP``), which counts it (a ``positions`` argument a layer cannot take is still
    the caller's mistake)."""

    current = CURRENT_STEP.get  # the hot path: one call per layer, no global lookup

    @functools.wraps(compute)
    def guarded(self: "Layer", hidden: Any, positions: Any = None) -> Any:
        if positions is not None and not self.supports_positions:
            raise ValueError(f"{self.name}: this layer computes every row; positions apply to layers of adapters "
                             "declaring token-positions")
        step = current()
        try:
            if step is None:  # no step is computing (a layer called on its own): nothing to count
                return compute(self, hidden, positions)
            return step.computed(self, compute, hidden, positions)
        except Exception as exc:
            if not hasattr(exc, MODEL_FAULT):
                setattr(exc, MODEL_FAULT, self.name)
            raise

    guarded.diffaccel_model_side = True
    return guarded


def __getattr__(name: str) -> Any:
    if name == "CURRENT_RUN":
        warnings.warn("diffaccel.contract.state.CURRENT_RUN is deprecated; use diffaccel.contract.state.CURRENT_STEP "
                      "(its value is the run's tally, .run the run)", DeprecationWarning, stacklevel=2)
        return CURRENT_STEP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@attrs.define
class Counters:
    """What the denoiser actually did during a run, counted by the core in one place, the run's
    ``Tally`` (``run.tally``, ``diffaccel.runtime.sequence.Tally``); strategies add their cache
    hits and the layers they ran outside ``Layer.compute`` through it."""

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
    """Cached values served by strategies (they add to it: ``run.tally.cache_hits(n)``)."""

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

    The core counts each ``compute`` call made while a step computes (``layers_computed``, and
    ``run.positions_per_layer`` added to ``positions_computed``, in the run's ``Tally``); a layer
    that computed only some positions sets ``computed_positions`` to their number during the
    call (0: it did not run).
    """

    supports_positions = False
    computed_positions: int | None = None
    """Set by ``compute`` of a layer that ran on part of the positions: how many it computed (0:
    none, the layer did not run); None (reset by the core before each call): every position."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("compute")
        if fn is not None and not getattr(fn, "diffaccel_model_side", False):
            cls.compute = _model_side(fn)

    def __init__(self, name: str, index: int, kind: str):
        self.name = name
        self.index = index
        self.kind = kind

    def compute(self, hidden: Any, positions: Any = None) -> Any:  # pragma: no cover - adapters override
        """Run the layer on ``hidden`` (what ``layer_output`` was handed) and return its output;
        with ``positions``, only there (``token-positions``). What the layer's own code raises is
        the model's fault (a ``ModelError``), whoever called ``compute``."""
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
    model: str | None = attrs.field(default=None, kw_only=True)
    """The model kind that ran, where the adapter has several (the text adapter's kinds:
    ``modernbert``, a third party's entry-point name); reports only, in ``report["model"]``."""
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
    info: RunInfo = attrs.Factory(RunInfo)
    """Facts about the run strategies may read, as attributes (``RunInfo``)."""
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
    """What the adapter offers at this run (``diffaccel.contract.capabilities``); strategies that serve
    several kinds of model choose their behaviour from it."""
    reliability: Reliability = attrs.Factory(Reliability)
    """What the core did for this run's reliability (strategies disabled, steps recomputed, guard
    checks); in the report under ``reliability`` when anything happened."""
    memory: dict[str, int] = attrs.Factory(dict)
    """Strategy name -> the bytes its state held at the run's last step (``diffaccel_memory``);
    in the report under ``memory`` when a strategy ran."""
    state_factories: dict[str, Callable[["RunState"], Any]] = attrs.Factory(dict)
    """Strategy name -> its ``diffaccel_new_state`` implementation (set by the accelerator)."""
    _states: dict[tuple[str, str], Any] = attrs.Factory(dict)
    _tally: Any = attrs.field(default=None, init=False, repr=False)

    @property
    def tally(self) -> Any:
        """The run's counting (``diffaccel.runtime.sequence.Tally``), the one place ``counters``
        change: the core counts through it, and a strategy reports what only it knows there,
        ``run.tally.cache_hits(n)`` and ``run.tally.computed_outside()`` (a layer it ran in part
        outside ``Layer.compute``, a block's tail)."""
        tally = self._tally
        if tally is None:
            tally = self._tally = TALLY[0](self)
        return tally

    def state(self, strategy: Any, factory: Callable[["RunState"], Any] | None = None) -> Any:
        """The strategy's own state for the current guidance branch, created on first use by
        ``factory`` or else its ``diffaccel_new_state`` hook."""
        key = (strategy.name, self.branch)
        st = self._states.get(key)
        if st is None:
            make = factory or self.state_factories.get(strategy.name) or own(strategy, "diffaccel_new_state")
            if make is None:
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

    def drop_states(self, name: str) -> None:
        """Release every state of strategy ``name`` (a strategy dropped mid-run: ``max_cache_mb``)."""
        for key in [k for k in self._states if k[0] == name]:
            del self._states[key]

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
            **({"model": self.model} if self.model is not None else {}),
            "steps": self.num_steps,
            "steps_run": self.step + 1,
            "counters": self.counters.as_dict(),
            "strategies": self.metrics,
        }
        reliability = self.reliability.as_dict()
        if reliability is not None:
            report["reliability"] = reliability
        if self.memory:
            report["memory"] = {"state_bytes": dict(self.memory)}
        return report
