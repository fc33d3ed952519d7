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
from .reliability import Reliability

MODEL_FAULT = "diffaccel_layer"
"""Attribute set on an exception raised inside a ``Layer.compute``: the layer's name. The core
then reports it as the model's fault, never as the strategy whose hook called ``compute``."""

CURRENT_RUN: ContextVar["RunState | None"] = ContextVar("diffaccel_current_run", default=None)
"""The run whose step is being computed: set by ``RunSequence.denoise`` around the denoiser, so
that every ``Layer.compute`` called meanwhile (by the built-in default, a strategy, the guard's
full recomputation) is counted in that run's counters, by the core."""

_HAND_COUNTED: set[type] = set()
"""Layer classes already warned about counting their own computations (one warning each)."""


def _hand_counted(cls: type) -> None:
    if cls in _HAND_COUNTED:
        return
    _HAND_COUNTED.add(cls)
    warnings.warn(f"{cls.__qualname__}.compute adds to run.counters itself; the core counts every computed layer now "
                  "(diffaccel.runtime.sequence.RunSequence): remove those lines, and for a call computing only some positions "
                  "set self.computed_positions (deprecated, counted once until 0.3.0)", DeprecationWarning, stacklevel=4)


def _model_side(compute: Callable[..., Any]) -> Callable[..., Any]:
    """``Layer.compute`` of a subclass, marking what it raises as the model's (the call site of
    the model, whoever called it), and counting the computation in the current run (a
    ``positions`` argument a layer cannot take is still the caller's mistake)."""

    current = CURRENT_RUN.get  # the hot path: one call per layer, no global lookup

    @functools.wraps(compute)
    def guarded(self: "Layer", hidden: Any, positions: Any = None) -> Any:
        if positions is not None and not self.supports_positions:
            raise ValueError(f"{self.name}: this layer computes every row; positions apply to layers of adapters "
                             "declaring token-positions")
        run = current()
        if run is None:  # no step is computing (a layer called on its own): nothing to count
            try:
                return compute(self, hidden, positions)
            except Exception as exc:
                if not hasattr(exc, MODEL_FAULT):
                    setattr(exc, MODEL_FAULT, self.name)
                raise
        counters = run.counters
        # the counts made during the call: the core's (a block's inner modules hooked as layers
        # too) and any the layer made itself (the deprecated form)
        before, core = counters.layers_computed, run._core_counted
        self.computed_positions = None
        try:
            out = compute(self, hidden, positions)
        except Exception as exc:
            if not hasattr(exc, MODEL_FAULT):
                setattr(exc, MODEL_FAULT, self.name)
            raise
        if counters.layers_computed - before != run._core_counted - core:
            _hand_counted(type(self))
            return out
        n = self.computed_positions
        if n is None:
            n = run.positions_per_layer
        if n:  # 0: the layer had no position to compute and did not run
            counters.layers_computed += 1
            counters.positions_computed += n
            run._core_counted += 1
        return out

    guarded.diffaccel_model_side = True
    return guarded


@attrs.define
class Counters:
    """What the denoiser actually did during a run, counted by the core (``Layer.compute`` and
    ``diffaccel.runtime.sequence.RunSequence``); strategies add their ``cache_hits``."""

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


def _deprecated_key(key: str) -> None:
    new = f"run.info.{key}" if key in RUN_INFO_FIELDS else f"run.info.extra[{key!r}]"
    warnings.warn(f"run.info[{key!r}] (dict access to run info) is deprecated; use {new}", DeprecationWarning, stacklevel=3)


@attrs.define(kw_only=True)
class RunInfo:
    """Facts about one run that strategies may read as attributes (``run.info.length``). Adapters
    fill the fields that apply to them; a field an adapter does not fill is None. Facts beyond
    these go in ``extra``. Dict access (``run.info["length"]``, ``.get``, ``.update``) still works
    for one minor release, with a DeprecationWarning naming the attribute."""

    checkpoint: str | None = None
    """The model's checkpoint (as ``[model] checkpoint`` names it, or the pipeline's name)."""
    seeds: list[int] | None = None
    """Per batch row: the seed it was generated from."""
    n_layers: int | None = None
    """Layers or blocks the denoiser runs per step (through ``layer_output``)."""
    layers: list[str] | None = None
    """Their names, in forward order (text layers: None, ``block.{i}``; DiffusionGemma: ``decoder.{i}``)."""
    time_conditioned: bool | None = None
    """Whether the denoiser reads the time step (a step's output can change with equal inputs)."""
    # text
    length: int | None = None
    """Text: positions per row (DiffusionGemma: of the active canvas)."""
    vocab_size: int | None = None
    """Text: the vocabulary size (the logits' last dimension)."""
    kind: str | None = None
    """Text: the model's kind (``masked``, ``continuous``, ``block``)."""
    sampler: str | None = None
    """Text: the sampler of this run (``masked``, ``ddim``, ``ddpm``, ``hybrid``, ``block``)."""
    temperature: float | None = None
    """Text: the sampling temperature."""
    tokenizer: Any = None
    """Text: the tokenizer (``encode(text)``, ``decode(ids)``)."""
    prompt_lengths: list[int] | None = None
    """Text: per row, the prompt's tokens at the start of the sequence."""
    cond_dim: int | None = None
    """Text: the width of ``run.condition`` the model takes (0: none)."""
    truncated_logits: Any = None
    """Text (``token-logits``): ``truncated_logits(values, indices, vocab_size)`` builds logits a
    sampler draws from without a dense tensor."""
    draw_tokens: Any = None
    """Text (``token-logits``): ``draw_tokens(logits, temperature, generator)`` -> (confidence,
    token) per row of (M, V) logits or of a truncated slice (``truncated_logits(...).rows``): the
    masked sampler's own draw, the model's special tokens never drawn."""
    canvas_length: int | None = None
    """DiffusionGemma: positions per block (canvas)."""
    blocks: int | None = None
    """DiffusionGemma: blocks of the generation."""
    pins: bool | None = None
    """Whether the adapter honours ``run.pinned`` at this run (False: it ignores it)."""
    # block stacks (UNet, DiT)
    depths: list[int] | None = None
    """Block stacks: per layer, its depth (0 outermost)."""
    kinds: list[str] | None = None
    """Block stacks: per layer, ``down``, ``mid`` or ``up``."""
    modules: list[str] | None = None
    """Inner modules hooked at this run (``hooked_modules``)."""
    sample_size: Any = None
    """Images: the denoiser's latent size."""
    in_channels: int | None = None
    """Images: the denoiser's latent channels."""
    guidance: bool | None = None
    """Images: whether classifier-free guidance runs."""
    cfg_mode: str | None = None
    """Images: ``batched``, ``unbatched`` (two denoiser calls per step) or ``none``."""
    timesteps: list[float] | None = None
    """Images: the scheduler's timesteps of the run."""
    prompts: list[str] | None = None
    """Images: per row, its prompt."""
    extra: dict[str, Any] = attrs.Factory(dict)
    """Adapter facts beyond the fields above."""

    def as_dict(self) -> dict[str, Any]:
        """The facts given, as a plain dict (fields that are None left out), ``extra`` merged in."""
        d = {k: v for k, v in attrs.asdict(self, recurse=False).items() if v is not None and k != "extra"}
        d.update(self.extra)
        return d

    def set(self, **facts: Any) -> "RunInfo":
        """Set facts by name (fields, or else ``extra``); returns self (for adapters)."""
        for k, v in facts.items():
            if k in RUN_INFO_FIELDS:
                setattr(self, k, v)
            else:
                self.extra[k] = v
        return self

    # -- the deprecated dict form (one minor release) ---------------------------------------------
    def __getitem__(self, key: str) -> Any:
        _deprecated_key(key)
        value = getattr(self, key) if key in RUN_INFO_FIELDS else self.extra.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        _deprecated_key(key)
        value = getattr(self, key) if key in RUN_INFO_FIELDS else self.extra.get(key)
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        _deprecated_key(key)
        return (getattr(self, key) if key in RUN_INFO_FIELDS else self.extra.get(key)) is not None

    def __setitem__(self, key: str, value: Any) -> None:
        _deprecated_key(key)
        self.set(**{key: value})

    def update(self, *args: Any, **facts: Any) -> None:
        warnings.warn("run.info.update(...) is deprecated; set the attributes (run.info.length = ...) or use "
                      "run.info.set(...)", DeprecationWarning, stacklevel=2)
        self.set(**dict(*args, **facts))


RUN_INFO_FIELDS = frozenset(f.name for f in attrs.fields(RunInfo)) - {"extra"}


class Layer:
    """Handle for one layer or block, created once per model by its adapter.

    ``name`` is stable (``block.3`` for text, ``down_blocks.2`` for a UNet), ``index`` is the
    order in the forward pass, ``kind`` says what it is (``transformer-block``, ``down``, ``mid``,
    ``up``, ...). ``compute(hidden, positions=None)`` runs the layer; with ``positions`` (adapters
    declaring ``token-positions``: a (batch, length) bool mask) it runs on those positions and
    merges the result with the layer's cached outputs for the others. Adapters subclass this and
    add what their capabilities promise (``cached_output``, ``depth``, ...).

    The core counts each ``compute`` call made while a step computes (``layers_computed``, and
    ``run.positions_per_layer`` added to ``positions_computed``); a layer that computed only some
    positions sets ``computed_positions`` to their number during the call (0: it did not run).
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
    _core_counted: int = attrs.field(default=0, init=False, repr=False)
    """Layer computations the core counted (it tells them from a layer's own counting)."""

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
