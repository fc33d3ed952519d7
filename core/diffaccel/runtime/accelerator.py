"""Strategies of one config bound together: the object adapters call during a run.

``Accelerator`` is the run's lifecycle (``run_start`` ... ``run_end``, the non-finite check, the
quality guard, memory bounds) over the hook dispatch of ``diffaccel.runtime.dispatch`` (the
chains, their merge rules, the guarded call sites); counting is the run's ``Tally``
(``diffaccel.runtime.sequence``). ``apply`` attaches a config's strategies to a pipeline.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ..contract.capabilities import describe, missing
from ..contract.errors import ConfigError, ConfigValueError, NonFiniteError
from ..contract.hookspecs import own
from ..contract.state import Layer, RunState, StepPlan
from .adapters_registry import adapter_for, get_adapter
from .config import RunConfig, load_config, parse_config
from .dispatch import MERGES, Dispatcher, Entry  # noqa: F401 (Entry, MERGES: their 0.2 home)
from .guard import GuardConfig, all_finite, call_guarded, relative_error
from .memory import state_bytes
from .registry import Registry, check_strategy
from .sequence import Tally  # noqa: F401 (registers the run's counting: RunState.tally)

APPLY_SOURCE = "diffaccel.apply"
"""What ``ConfigError`` lines name in place of a file for ``apply(pipe, strategies=[{...}])``."""

def _renamed(old: str, new: str) -> None:
    warnings.warn(f"Accelerator.{old} is deprecated; use Accelerator.{new} (or diffaccel.runtime.sequence.RunSequence)",
                  DeprecationWarning, stacklevel=3)


class Accelerator(Dispatcher):
    """Runs the hooks of an ordered list of strategy instances for one adapter.

    Every hook call is guarded: an exception raised in a strategy's implementation becomes a
    ``StrategyError``, or drops that strategy for the rest of the run when its policy
    (``on_error``) is ``disable``. ``guard`` (a ``GuardConfig``) sets the non-finite check and the
    quality guard; ``registry`` names the strategies' distributions in errors (looked up only when
    one happens). Adapters drive it through ``diffaccel.runtime.sequence.RunSequence``.
    """

    def __init__(self, strategies: Sequence[Any] = (), adapter: str = "", *, on_error: Mapping[str, str] | None = None,
                 guard: GuardConfig | None = None, registry: Registry | None = None,
                 max_cache_mb: Mapping[str, float] | None = None):
        self.adapter = adapter
        self.max_cache_mb = dict(max_cache_mb or {})
        """Strategy name -> its ``max_cache_mb`` bound (checked after each step, only when given)."""
        self.guard = guard or GuardConfig()
        self.finite = self.guard.finite
        """Check each step's raw denoiser output for NaN and inf (``output_ok``)."""
        self._bypass = False
        self.last_report: dict[str, Any] | None = None
        """The report (``RunState.report()``) of the last run that ended, whatever the adapter."""
        super().__init__(strategies, on_error=on_error, registry=registry)

    @property
    def commits(self) -> bool:
        """Whether a strategy chooses commits (``diffaccel_commit``): the masked sampler then lets
        rows leave a finished block early."""
        return bool(self._chains["diffaccel_commit"])

    @property
    def watches_steps(self) -> bool:
        """Whether a strategy reads the step's output (``diffaccel_post_step``): without one an
        adapter need not build it (a text step's top-1 over every position, for instance)."""
        return bool(self._chains["diffaccel_post_step"] or self._wrappers["diffaccel_post_step"])

    @property
    def active(self) -> bool:
        """Whether strategies run (False also once every one was disabled, and while bypassed)."""
        return bool(self.strategies) and not self._bypass

    def names(self) -> list[str]:
        return [s.name for s in self.strategies]

    def hooked_modules(self, available: list[str]) -> list[str]:
        """The inner modules the strategies ask to be hooked (``diffaccel_hooked_modules``), the
        union in config order; a name not in ``available`` is a ConfigError naming the strategy."""
        wanted: list[str] = []
        for s in self.strategies:
            fn = own(s, "diffaccel_hooked_modules")
            if fn is None:
                continue
            for name in call_guarded(s, "hooked_modules", lambda: fn(available), self._registry) or ():
                if name not in available:
                    raise ConfigError(f"strategy '{s.name}' asks for inner module '{name}', which this model does not have; "
                                      f"it has: {', '.join(available)}")
                if name not in wanted:
                    wanted.append(name)
        return wanted

    # -- the run lifecycle, called through diffaccel.runtime.sequence.RunSequence ------------------------
    def run_start(self, run: RunState) -> None:
        if self._disabled or self._bypass:  # disabled for the last run only: a new run starts with all
            self._disabled.clear()
            self._bypass = False
            self._resolve()
        run.state_factories = self._state_factories
        self._dispatch("diffaccel_run_start", run, (run,))

    def pre_step(self, run: RunState) -> StepPlan | None:
        if self.max_cache_mb and run.step > 0:  # what the steps so far left (every adapter plans each step)
            self._check_bounds(run)
        run.plan = StepPlan.merge(self._dispatch("diffaccel_pre_step", run, (run,))) if self.strategies else None
        return run.plan

    def layer_output(self, run: RunState, layer: Layer, hidden: Any) -> Any:
        """The layer's output through the chain (``diffaccel_layer_output``), counted by the run's tally."""
        return (run._tally or run.tally).layer(self._layer_output, layer, hidden)

    def denoiser_output(self, run: RunState, output: Any) -> Any:
        if not self._chains["diffaccel_denoiser_output"]:
            return output
        return self._dispatch("diffaccel_denoiser_output", run, (run, output))

    def commit(self, run: RunState, proposal: Any) -> Any:
        """The union of the strategies' commit masks ((B, N) bool), or None when none chose."""
        if not self._chains["diffaccel_commit"]:
            return None
        return self._dispatch("diffaccel_commit", run, (run, proposal))

    def post_step(self, run: RunState, output: Any) -> None:
        if self.strategies:
            self._dispatch("diffaccel_post_step", run, (run, output))

    def _held(self, run: RunState, s: Any) -> int:
        fn = self._memory_hooks.get(s.name)
        held = self._call(s.name, "diffaccel_memory", run, fn, (run,)) if fn is not None else None
        return int(held) if held is not None else state_bytes(list(run.states(s).values()))

    def _check_bounds(self, run: RunState) -> None:
        """``max_cache_mb``, before each step after the first: a strategy whose state outgrew its
        bound is dropped for the rest of the generation (full compute from this step on) and its
        state released."""
        for s in list(self.strategies):
            bound = self.max_cache_mb.get(s.name)
            if bound is None or s.name in self._disabled:
                continue
            held = self._held(run, s)
            if held > bound * 2**20:
                run.drop_states(s.name)
                self._disable(run, s.name, "pre_step", f"max_cache_mb: its state held {held / 2**20:.2f} MiB, over "
                              f"the bound of {bound:g} MiB; the rest of the run is computed in full")

    def finalize(self, run: RunState, final: Any) -> None:
        self._dispatch("diffaccel_finalize", run, (run, final))
        self._measure_memory(run)

    def _measure_memory(self, run: RunState) -> None:
        """Each strategy's bytes for this run (``diffaccel_memory``, else its ``run.state``
        tensors), at its last step, before ``run_end`` releases them: ``run.memory``."""
        for s in list(self.strategies):
            held = self._held(run, s)
            if s.name not in self._disabled:
                run.memory[s.name] = held

    def run_end(self, run: RunState) -> None:
        self._bypass = False
        self._dispatch("diffaccel_run_end", run, (run,))
        self.last_report = run.report()  # plain data: the run's states (and tensors) are not kept

    def start_run(self, run: RunState) -> None:
        """Deprecated: ``run_start`` (the hook's name); kept for one minor release."""
        _renamed("start_run", "run_start")
        self.run_start(run)

    def end_run(self, run: RunState) -> None:
        """Deprecated: ``run_end`` (the hook's name); kept for one minor release."""
        _renamed("end_run", "run_end")
        self.run_end(run)

    # -- non-finite outputs and the quality guard, called through RunSequence.denoise ----------
    def output_ok(self, run: RunState, output: Any) -> bool:
        """Whether the step's raw denoiser output may be used. False: it holds NaN or inf and
        strategies are active; the adapter recomputes the step inside ``bypassed()``. Raises
        ``NonFiniteError`` when no strategy is active or the full step is non-finite too."""
        if not self.finite or all_finite(output):
            return True
        if self.active:
            run.reliability.nonfinite_recomputed += 1
            return False
        how = "also when recomputed without strategies" if self._bypass and self.strategies else "with no strategy active"
        raise NonFiniteError(f"the {self.adapter or 'model'} denoiser output holds NaN or inf at step {run.step} ({how}); "
                             "the model's weights or inputs produce them", run.step)

    def guard_due(self, run: RunState) -> bool:
        """Whether the quality guard computes this step in full beside the strategies' step."""
        every = self.guard.every
        return bool(every) and bool(self.strategies) and run.step % every == 0

    @contextmanager
    def bypassed(self, run: RunState) -> Iterator[None]:
        """Layers compute in full, whatever the strategies would say, for the ``with`` block (the
        full step of a non-finite recomputation or of the guard); the step's plan is dropped."""
        run.plan = None
        self._layer_chain, self._layer_owners, self._bypass = self._full_layer, [None] * len(self._full_layer), True
        self._layer_output = self._chain_call(self._layer_chain)
        try:
            yield
        finally:
            layer = self._chains["diffaccel_layer_output"]
            self._layer_chain, self._layer_owners, self._bypass = [fn for _, fn in layer], [o for o, _ in layer], False
            self._layer_output = self._chain_call(self._layer_chain)

    def guard_compare(self, run: RunState, accelerated: Any, full: Any) -> None:
        """The guard's comparison of the strategies' raw output with the full one; past the
        threshold every strategy's state is dropped (``reset``) or the strategies are disabled."""
        err = relative_error(accelerated, full)
        rel = run.reliability
        rel.guard_checks += 1
        rel.guard_max_error = max(rel.guard_max_error, err)
        if err <= self.guard.threshold:
            return
        rel.guard_trips += 1
        if self.guard.action == "reset":
            run.clear_states()
            rel.guard_resets += 1
        else:
            for s in list(self.strategies):
                self._disable(run, s.name, "guard", f"relative error {err:.3g} > threshold {self.guard.threshold}")


def build_strategies(config, registry: Registry | None = None, info: dict[str, Any] | None = None) -> list[Any]:
    """Instantiate the strategies of a ``RunConfig`` in config order.

    ``info`` (adapter facts such as ``vocab_size``) goes to each strategy's ``diffaccel_setup``
    hook, which may reject values that depend on the model (raising ConfigValueError). The
    strategy's ``requires`` are checked against ``info["capabilities"]`` first.
    """
    if not config.strategies:
        return []
    registry = registry or Registry()
    built = []
    for entry in config.strategies:
        spec = registry.get(entry.name)
        if spec is None:
            installed = ", ".join(sorted(registry.strategies)) or "none installed"
            raise ConfigError(f"{config.source}: [[strategy]] #{entry.index}: unknown strategy '{entry.name}'; installed: {installed}")
        where = f"{config.source}: [[strategy]] #{entry.index} ({entry.name})"
        if info is not None and "capabilities" in info:
            gone = missing(spec.requires, info["capabilities"])
            if gone:
                raise ConfigError(f"{where}: the model lacks capability {describe(gone[0])}, which strategy "
                                  f"'{entry.name}' requires; it offers: {', '.join(sorted(info['capabilities'])) or 'none'}")
        strategy = spec.factory(entry.config)
        strategy.name = entry.name
        check_strategy(strategy, entry.name)
        setup = own(strategy, "diffaccel_setup") if info is not None else None
        if setup is not None:
            try:
                call_guarded(strategy, "setup", lambda: setup(info), registry)
            except ConfigValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        built.append(strategy)
    return built


def accelerator_for(config: Any, strategies: Sequence[Any], adapter: str, registry: Registry | None = None) -> Accelerator:
    """The ``Accelerator`` of built ``strategies`` with the policies of ``config`` (a
    ``RunConfig``, or None for the defaults): each strategy's ``on_error`` and the ``[guard]``."""
    on_error = {e.name: e.on_error for e in config.strategies} if config is not None else {}
    bounds = {e.name: e.max_cache_mb for e in config.strategies if e.max_cache_mb} if config is not None else {}
    return Accelerator(strategies, adapter, on_error=on_error, guard=getattr(config, "guard", None), registry=registry,
                       max_cache_mb=bounds)


class Applied:
    """What ``apply`` returns: a context manager that attaches the strategies to the pipeline for
    its ``with`` block (and gives the pipeline), and the report of the last run made meanwhile,
    for every adapter (a diffusers pipeline's own output has no place for one)::

        handle = diffaccel.apply(pipe, "configs/digits-dct.toml")
        with handle as pipe:
            images = pipe(["digit 3"], num_inference_steps=20).images
        handle.last_report["counters"]["fraction_computed"]
    """

    def __init__(self, pipe: Any, adapter: Any, accelerator: Accelerator):
        self.pipe = pipe
        self.adapter = adapter
        """The adapter driving the pipeline."""
        self.accelerator = accelerator
        """The ``Accelerator`` its runs go through."""

    @property
    def last_report(self) -> dict[str, Any] | None:
        """The report of the last run that ended (``RunState.report()``: ``adapter``, ``steps``,
        ``steps_run``, ``counters``, ``strategies``, ``reliability`` when anything happened), or
        None before the first; equal to the ``.report`` an adapter's output carries."""
        return self.accelerator.last_report

    def __enter__(self) -> Any:
        self.adapter.attach(self.pipe, self.accelerator)
        return self.pipe

    def __exit__(self, *exc: Any) -> None:
        self.adapter.detach(self.pipe)


def apply(pipe: Any, config: Any = None, *, strategies: Sequence[Any] | None = None,
          registry: Registry | None = None) -> Applied:
    """Attach strategies to a pipeline for the duration of a ``with`` block.

        with diffaccel.apply(pipe, "configs/text-swd.toml") as pipe:
            out = pipe(seed=0)

    ``config`` is a path or a ``RunConfig``; or pass ``strategies``: tables as a config file's
    ``[[strategy]]`` array writes them (``[{"use": "dct-anchor", "threshold": 0.1}]``, validated
    exactly like a file, the same one-line ``ConfigError``s with ``diffaccel.apply`` for the file
    name), or ready strategy instances (with a ``config`` too, its ``on_error`` keys and ``[guard]``
    table apply to them). Leaving the block removes every hook, also after an exception: the
    pipeline then behaves bitwise as if it never had strategies. What it returns (an ``Applied``)
    keeps the report of the last run: ``handle.last_report``. The config and strategies are
    checked here, before the block runs.
    """
    if config is not None and strategies is not None and any(isinstance(s, Mapping) for s in strategies):
        raise ConfigError("diffaccel.apply: give a config or strategy tables, not both")
    cfg = None
    if config is not None:
        cfg = config if isinstance(config, RunConfig) else load_config(config, registry=registry)
    # the adapter the config names, when it drives the pipeline: probing every installed adapter
    # would import each one (the diffusers ones import diffusers and transformers' image processors)
    named = get_adapter(cfg.model.adapter) if cfg is not None else None
    adapter = named if named is not None and named.accepts(pipe) else adapter_for(pipe)
    if cfg is not None:
        if cfg.model.adapter != adapter.name:
            raise ConfigError(f"{cfg.source}: [model] key 'adapter': '{cfg.model.adapter}' but the pipeline needs '{adapter.name}'")
    if strategies is not None and any(isinstance(s, Mapping) for s in strategies):
        if not all(isinstance(s, Mapping) for s in strategies):
            raise ConfigError("diffaccel.apply: strategies: give tables (dicts with 'use') or strategy instances, not both")
        cfg = parse_config({"model": {"adapter": adapter.name}, "strategy": [dict(s) for s in strategies]},
                           source=APPLY_SOURCE, registry=registry)
        strategies = build_strategies(cfg, registry, adapter.info(pipe))
    if strategies is None:
        strategies = build_strategies(cfg, registry, adapter.info(pipe)) if cfg is not None else []
    return Applied(pipe, adapter, accelerator_for(cfg, strategies, adapter.name, registry))
