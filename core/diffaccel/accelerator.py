"""Strategies of one config bound together: the object adapters call during a run.

The run hooks go through a private pluggy ``PluginManager`` holding the strategy instances,
registered so that pluggy calls them in config order (pluggy calls the last registered first,
so they are registered in reverse), then the built-in default. The per-layer hook is on the hot
path: its implementations are resolved into a plain list once, here, not on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .builtin import DefaultBehaviour
from .errors import ConfigError, ConfigValueError
from .plugins import Registry, call_own, check_strategy, new_plugin_manager, own_impl
from .state import Layer, RunState, StepPlan

LayerFn = Callable[[RunState, Layer, Any], Any]
APPLY_SOURCE = "diffaccel.apply"
"""What ``ConfigError`` lines name in place of a file for ``apply(pipe, strategies=[{...}])``."""


def _positional(fn: Callable, argnames: Sequence[str]) -> LayerFn:
    """Adapt a hookimpl that declares a subset of (run, layer, hidden) to a positional call."""
    if tuple(argnames) == ("run", "layer", "hidden"):
        return fn
    names = tuple(argnames)
    return lambda run, layer, hidden: fn(**{n: v for n, v in (("run", run), ("layer", layer), ("hidden", hidden)) if n in names})


class Accelerator:
    """Runs the hooks of an ordered list of strategy instances for one adapter."""

    def __init__(self, strategies: Sequence[Any] = (), adapter: str = ""):
        self.strategies = list(strategies)
        self.adapter = adapter
        self.pm = new_plugin_manager()
        for s in self.strategies:
            check_strategy(s, s.name)
        for s in reversed(self.strategies):
            self.pm.register(s, name=f"strategy:{s.name}")
        # per strategy, resolved once: ``run.state(s)`` creates states through these
        self._state_factories = {s.name: fn for s in self.strategies if (fn := own_impl(s, "diffaccel_new_state"))}
        self.pm.register(DefaultBehaviour(), name=DefaultBehaviour.name)
        self.hook = self.pm.hook
        impls = reversed(self.hook.diffaccel_layer_output.get_hookimpls())  # now in call order
        self._layer_chain: list[LayerFn] = [_positional(i.function, i.argnames) for i in impls]
        self._output_chain = [i.function for i in reversed(self.hook.diffaccel_denoiser_output.get_hookimpls())]
        self._commit_chain = [i.function for i in reversed(self.hook.diffaccel_commit.get_hookimpls())]

    @property
    def commits(self) -> bool:
        """Whether a strategy chooses commits (``diffaccel_commit``): the masked sampler then lets
        rows leave a finished block early."""
        return bool(self._commit_chain)

    @property
    def active(self) -> bool:
        return bool(self.strategies)

    def names(self) -> list[str]:
        return [s.name for s in self.strategies]

    def hooked_modules(self, available: list[str]) -> list[str]:
        """The inner modules the strategies ask to be hooked (``diffaccel_hooked_modules``), the
        union in config order; a name not in ``available`` is a ConfigError naming the strategy."""
        wanted: list[str] = []
        for s in self.strategies:
            for names in call_own(s, "diffaccel_hooked_modules", available=available):
                for name in names:
                    if name not in available:
                        raise ConfigError(f"strategy '{s.name}' asks for inner module '{name}', which this model does not have; "
                                          f"it has: {', '.join(available)}")
                    if name not in wanted:
                        wanted.append(name)
        return wanted

    # -- the run lifecycle, called by adapters --
    def start_run(self, run: RunState) -> None:
        run.state_factories = self._state_factories
        self.hook.diffaccel_run_start(run=run)

    def pre_step(self, run: RunState) -> StepPlan | None:
        run.plan = StepPlan.merge(self.hook.diffaccel_pre_step(run=run)) if self.strategies else None
        return run.plan

    def layer_output(self, run: RunState, layer: Layer, hidden: Any) -> Any:
        counters = run.counters
        computed = counters.layers_computed
        counters.positions_total += run.positions_per_layer
        for fn in self._layer_chain:
            out = fn(run, layer, hidden)
            if out is not None:
                break
        if counters.layers_computed == computed:
            counters.layers_skipped += 1
        return out

    def denoiser_output(self, run: RunState, output: Any) -> Any:
        for fn in self._output_chain:
            replaced = fn(run=run, output=output)
            if replaced is not None:
                output = replaced
        return output

    def commit(self, run: RunState, proposal: Any) -> Any:
        """The union of the strategies' commit masks ((B, N) bool), or None when none chose."""
        chosen = None
        for fn in self._commit_chain:
            mask = fn(run=run, proposal=proposal)
            if mask is not None:
                chosen = mask if chosen is None else chosen | mask
        return chosen

    def post_step(self, run: RunState, output: Any) -> None:
        if self.strategies:
            self.hook.diffaccel_post_step(run=run, output=output)

    def finalize(self, run: RunState, final: Any) -> None:
        self.hook.diffaccel_finalize(run=run, final=final)

    def end_run(self, run: RunState) -> None:
        self.hook.diffaccel_run_end(run=run)


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
            from .capabilities import describe, missing

            gone = missing(spec.requires, info["capabilities"])
            if gone:
                raise ConfigError(f"{where}: the model lacks capability {describe(gone[0])}, which strategy "
                                  f"'{entry.name}' requires; it offers: {', '.join(sorted(info['capabilities'])) or 'none'}")
        strategy = spec.factory(entry.config)
        strategy.name = entry.name
        check_strategy(strategy, entry.name)
        if info is not None:
            try:
                call_own(strategy, "diffaccel_setup", info=info)
            except ConfigValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        built.append(strategy)
    return built


@contextmanager
def apply(pipe: Any, config: Any = None, *, strategies: Sequence[Any] | None = None,
          registry: Registry | None = None) -> Iterator[Any]:
    """Attach strategies to a pipeline for the duration of a ``with`` block.

        with diffaccel.apply(pipe, "configs/text-swd.toml") as pipe:
            out = pipe(seed=0)

    ``config`` is a path or a ``RunConfig``; or pass ``strategies``: tables as a config file's
    ``[[strategy]]`` array writes them (``[{"use": "dct-anchor", "threshold": 0.1}]``, validated
    exactly like a file, the same one-line ``ConfigError``s with ``diffaccel.apply`` for the file
    name), or ready strategy instances. Leaving the block removes every hook: the pipeline then
    behaves bitwise as if it never had strategies.
    """
    from .adapters_registry import adapter_for
    from .config import RunConfig, load_config, parse_config

    adapter = adapter_for(pipe)
    if strategies is not None and config is not None:
        raise ConfigError("diffaccel.apply: give a config or strategies, not both")
    if strategies is not None and any(isinstance(s, Mapping) for s in strategies):
        if not all(isinstance(s, Mapping) for s in strategies):
            raise ConfigError("diffaccel.apply: strategies: give tables (dicts with 'use') or strategy instances, not both")
        cfg = parse_config({"model": {"adapter": adapter.name}, "strategy": [dict(s) for s in strategies]},
                           source=APPLY_SOURCE, registry=registry)
        strategies = build_strategies(cfg, registry, adapter.info(pipe))
    if strategies is None:
        if config is None:
            strategies = []
        else:
            cfg = config if isinstance(config, RunConfig) else load_config(config, registry=registry)
            if cfg.model.adapter != adapter.name:
                raise ConfigError(f"{cfg.source}: [model] key 'adapter': '{cfg.model.adapter}' but the pipeline needs '{adapter.name}'")
            strategies = build_strategies(cfg, registry, adapter.info(pipe))
    accelerator = Accelerator(strategies, adapter.name)
    adapter.attach(pipe, accelerator)
    try:
        yield pipe
    finally:
        adapter.detach(pipe)
