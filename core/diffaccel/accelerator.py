"""Strategies of one config bound together: the object adapters call during a run.

The strategy instances are registered in a private pluggy ``PluginManager`` so that pluggy orders
them in config order (pluggy calls the last registered first, so they are registered in
reverse), then the built-in default. The run hooks' implementations are then resolved into plain
lists once, here, not on every call (``finalize``, which strategies may wrap, goes through
pluggy). Every call is guarded by one ``try`` around the loop: the strategy at fault is found
only when something was raised (``diffaccel.guard``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
import warnings
from contextlib import contextmanager
from typing import Any

from .builtin import DefaultBehaviour
from .errors import ConfigError, ConfigValueError, DiffaccelError, NonFiniteError
from .guard import GuardConfig, all_finite, blame, call_guarded, hook_codes, relative_error, strategy_error
from .plugins import Registry, call_own, check_strategy, new_plugin_manager, own_impl
from .state import Layer, RunState, StepPlan

LayerFn = Callable[[RunState, Layer, Any], Any]
APPLY_SOURCE = "diffaccel.apply"
"""What ``ConfigError`` lines name in place of a file for ``apply(pipe, strategies=[{...}])``."""


HOOK_ARGS = {
    "diffaccel_run_start": ("run",), "diffaccel_pre_step": ("run",), "diffaccel_layer_output": ("run", "layer", "hidden"),
    "diffaccel_denoiser_output": ("run", "output"), "diffaccel_commit": ("run", "proposal"),
    "diffaccel_post_step": ("run", "output"), "diffaccel_run_end": ("run",),
}
"""The run hooks the accelerator calls through its own resolved chains (``finalize`` goes through
pluggy: strategies may wrap it), with their arguments in call order."""


def _bound(fn: Callable, argnames: Sequence[str], order: Sequence[str]) -> Callable:
    """Adapt a hookimpl declaring a subset of ``order`` to a positional call in ``order``."""
    if tuple(argnames) == tuple(order):
        return fn
    idx = [order.index(n) for n in argnames]
    return lambda *args: fn(*[args[i] for i in idx])


def _through_pluggy(caller: Any, order: Sequence[str]) -> Callable:
    """A hook some strategy wraps (``wrapper=True``): one chain entry calling pluggy, which
    returns a list (or, for ``firstresult`` hooks, the first result); faults are still blamed."""
    return lambda *args: caller(**dict(zip(order, args)))


def _renamed(old: str, new: str) -> None:
    warnings.warn(f"Accelerator.{old} is deprecated; use Accelerator.{new} (or diffaccel.sequence.RunSequence)",
                  DeprecationWarning, stacklevel=3)


class Accelerator:
    """Runs the hooks of an ordered list of strategy instances for one adapter.

    Every hook call is guarded (see ``diffaccel.guard``): an exception raised in a strategy's
    implementation becomes a ``StrategyError``, or drops that strategy for the rest of the run
    when its policy (``on_error``) is ``disable``. ``guard`` (a ``GuardConfig``) sets the
    non-finite check and the quality guard; ``registry`` names the strategies' distributions in
    errors (looked up only when one happens).
    """

    def __init__(self, strategies: Sequence[Any] = (), adapter: str = "", *, on_error: Mapping[str, str] | None = None,
                 guard: GuardConfig | None = None, registry: Registry | None = None):
        self.configured = list(strategies)
        self.adapter = adapter
        for s in self.configured:
            check_strategy(s, s.name)
        self.on_error = dict(on_error or {})
        self.guard = guard or GuardConfig()
        self.finite = self.guard.finite
        """Check each step's raw denoiser output for NaN and inf (``output_ok``)."""
        self._registry = registry
        self._codes = hook_codes(self.configured)
        self._disabled: set[str] = set()
        self._bypass = False
        self._owner: dict[int, str | None] = {}
        self._keep: list[Any] = []  # every chain ever resolved: keeps ids in ``_owner`` unique
        self._via_pluggy: set[int] = set()
        self._resolve()

    def _resolve(self) -> None:
        """(Re)build the plugin manager and the per-hook chains from the strategies not disabled."""
        self.strategies = [s for s in self.configured if s.name not in self._disabled]
        self.pm = new_plugin_manager()
        for s in reversed(self.strategies):
            self.pm.register(s, name=f"strategy:{s.name}")
        # per strategy, resolved once: ``run.state(s)`` creates states through these
        self._state_factories = {s.name: fn for s in self.strategies if (fn := own_impl(s, "diffaccel_new_state"))}
        self.pm.register(DefaultBehaviour(), name=DefaultBehaviour.name)
        self.hook = self.pm.hook
        self._chains: dict[str, list[Callable]] = {}
        for hook, order in HOOK_ARGS.items():
            impls = getattr(self.hook, hook).get_hookimpls()
            if any(i.wrapper or i.hookwrapper for i in impls):  # wrappers need pluggy's own call
                self._chains[hook] = [_through_pluggy(getattr(self.hook, hook), order)]
                self._owner[id(self._chains[hook][0])] = None
                self._via_pluggy.add(id(self._chains[hook][0]))
                self._keep.append(self._chains[hook])
                continue
            chain = []
            for impl in reversed(impls):  # now in call order
                fn = _bound(impl.function, impl.argnames, order)
                self._owner[id(fn)] = None if impl.plugin_name == DefaultBehaviour.name else impl.plugin_name.removeprefix("strategy:")
                chain.append(fn)
            self._chains[hook] = chain
            self._keep.append(chain)
        self._layer_chain: list[LayerFn] = self._chains["diffaccel_layer_output"]
        self._full_layer = [fn for fn in self._layer_chain if self._owner[id(fn)] is None]
        self._output_chain = self._chains["diffaccel_denoiser_output"]
        self._commit_chain = self._chains["diffaccel_commit"]

    @property
    def commits(self) -> bool:
        """Whether a strategy chooses commits (``diffaccel_commit``): the masked sampler then lets
        rows leave a finished block early."""
        return bool(self._commit_chain)

    @property
    def watches_steps(self) -> bool:
        """Whether a strategy reads the step's output (``diffaccel_post_step``): without one an
        adapter need not build it (a text step's top-1 over every position, for instance)."""
        return bool(self._chains["diffaccel_post_step"])

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
            asked = call_guarded(s, "hooked_modules", lambda: call_own(s, "diffaccel_hooked_modules", available=available),
                                 self._registry)
            for names in asked:
                for name in names:
                    if name not in available:
                        raise ConfigError(f"strategy '{s.name}' asks for inner module '{name}', which this model does not have; "
                                          f"it has: {', '.join(available)}")
                    if name not in wanted:
                        wanted.append(name)
        return wanted

    # -- faults ------------------------------------------------------------------------------------
    def _fault(self, exc: Exception, run: RunState | None) -> bool:
        """Called only when a hook call raised. True: the blamed strategy is disabled, go on
        without it. False: not a strategy's fault (the model, a DiffaccelError): re-raise it.
        Otherwise raises the StrategyError."""
        if isinstance(exc, (DiffaccelError, ConfigValueError)):
            # ConfigValueError: a strategy refusing a value only the run reveals (a tail longer than
            # the block, a clusters file for another length) is the user's input, not a fault
            return False
        hit = blame(exc, self._codes)
        if hit is None:
            return False
        name, hook = hit
        step = run.step if run is not None else None
        if self.on_error.get(name, "raise") == "disable" and run is not None:
            self._disable(run, name, hook, f"{type(exc).__name__}: {exc}")
            return True
        raise strategy_error(exc, name, hook, step, self._registry) from exc

    def _disable(self, run: RunState, name: str, hook: str, why: str) -> None:
        self._disabled.add(name)
        run.reliability.disabled.append({"strategy": name, "hook": hook, "step": run.step, "error": why.strip().split("\n")[0]})
        self._resolve()

    def _dispatch(self, hook: str, run: RunState, args: tuple, chain: list[Callable] | None = None, start: int = 0) -> Any:
        """Call ``hook``'s chain from ``start`` with its merge rule, guarded: first non-None result
        (layer_output), list of results (pre_step), piped output (denoiser_output), union (commit),
        nothing (the others). A strategy disabled on the way is skipped from then on."""
        chain = self._chains[hook] if chain is None else chain
        results: list[Any] = []
        for fn in chain[start:]:
            if self._disabled and self._owner.get(id(fn)) in self._disabled:
                continue
            try:
                r = fn(*args)
            except Exception as exc:
                if not self._fault(exc, run):
                    raise
                continue
            if r is None:
                continue
            if hook == "diffaccel_layer_output":
                return r
            if id(fn) in self._via_pluggy:  # pluggy's list of results
                if hook == "diffaccel_denoiser_output":  # pluggy does not pipe: the last replacement wins
                    args = (args[0], r[-1]) if r else args
                elif hook == "diffaccel_commit":
                    for m in r:
                        results = [m if not results else results[0] | m]
                else:
                    results.extend(r)
                continue
            if hook == "diffaccel_denoiser_output":
                args = (args[0], r)
            elif hook == "diffaccel_commit":
                results = [r if not results else results[0] | r]
            else:
                results.append(r)
        if hook == "diffaccel_denoiser_output":
            return args[1]
        if hook == "diffaccel_commit":
            return results[0] if results else None
        return results

    # -- the run lifecycle, called by adapters --
    def run_start(self, run: RunState) -> None:
        if self._disabled or self._bypass:  # disabled for the last run only: a new run starts with all
            self._disabled.clear()
            self._bypass = False
            self._owner, self._keep, self._via_pluggy = {}, [], set()  # no call in flight: forget old chains
            self._resolve()
        run.state_factories = self._state_factories
        self._dispatch("diffaccel_run_start", run, (run,))

    def pre_step(self, run: RunState) -> StepPlan | None:
        run.plan = StepPlan.merge(self._dispatch("diffaccel_pre_step", run, (run,))) if self.strategies else None
        return run.plan

    def layer_output(self, run: RunState, layer: Layer, hidden: Any) -> Any:
        counters = run.counters
        computed = counters.layers_computed
        counters.positions_total += run.positions_per_layer
        chain = self._layer_chain
        try:  # costs nothing unless raised
            for fn in chain:
                out = fn(run, layer, hidden)
                if out is not None:
                    break
        except Exception as exc:
            if not self._fault(exc, run):
                raise
            out = self._dispatch("diffaccel_layer_output", run, (run, layer, hidden), chain, chain.index(fn) + 1)
        if counters.layers_computed == computed:
            counters.layers_skipped += 1
        return out

    def denoiser_output(self, run: RunState, output: Any) -> Any:
        if not self._output_chain:
            return output
        return self._dispatch("diffaccel_denoiser_output", run, (run, output))

    def commit(self, run: RunState, proposal: Any) -> Any:
        """The union of the strategies' commit masks ((B, N) bool), or None when none chose."""
        if not self._commit_chain:
            return None
        return self._dispatch("diffaccel_commit", run, (run, proposal))

    def post_step(self, run: RunState, output: Any) -> None:
        if self.strategies:
            self._dispatch("diffaccel_post_step", run, (run, output))

    def finalize(self, run: RunState, final: Any) -> None:
        try:
            self.hook.diffaccel_finalize(run=run, final=final)
        except Exception as exc:
            if not self._fault(exc, run):
                raise
            self.finalize(run, final)  # again, without the strategy just disabled

    def run_end(self, run: RunState) -> None:
        self._bypass = False
        self._dispatch("diffaccel_run_end", run, (run,))

    def start_run(self, run: RunState) -> None:
        """Deprecated: ``run_start`` (the hook's name); kept for one minor release."""
        _renamed("start_run", "run_start")
        self.run_start(run)

    def end_run(self, run: RunState) -> None:
        """Deprecated: ``run_end`` (the hook's name); kept for one minor release."""
        _renamed("end_run", "run_end")
        self.run_end(run)

    # -- non-finite outputs and the quality guard, called by adapters at each step --
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
        self._layer_chain, self._bypass = self._full_layer, True
        try:
            yield
        finally:
            self._layer_chain, self._bypass = self._chains["diffaccel_layer_output"], False

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
                call_guarded(strategy, "setup", lambda: call_own(strategy, "diffaccel_setup", info=info), registry)
            except ConfigValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        built.append(strategy)
    return built


def accelerator_for(config: Any, strategies: Sequence[Any], adapter: str, registry: Registry | None = None) -> Accelerator:
    """The ``Accelerator`` of built ``strategies`` with the policies of ``config`` (a
    ``RunConfig``, or None for the defaults): each strategy's ``on_error`` and the ``[guard]``."""
    on_error = {e.name: e.on_error for e in config.strategies} if config is not None else {}
    return Accelerator(strategies, adapter, on_error=on_error, guard=getattr(config, "guard", None), registry=registry)


@contextmanager
def apply(pipe: Any, config: Any = None, *, strategies: Sequence[Any] | None = None,
          registry: Registry | None = None) -> Iterator[Any]:
    """Attach strategies to a pipeline for the duration of a ``with`` block.

        with diffaccel.apply(pipe, "configs/text-swd.toml") as pipe:
            out = pipe(seed=0)

    ``config`` is a path or a ``RunConfig``; or pass ``strategies``: tables as a config file's
    ``[[strategy]]`` array writes them (``[{"use": "dct-anchor", "threshold": 0.1}]``, validated
    exactly like a file, the same one-line ``ConfigError``s with ``diffaccel.apply`` for the file
    name), or ready strategy instances (with a ``config`` too, its ``on_error`` keys and ``[guard]``
    table apply to them). Leaving the block removes every hook, also after an exception: the
    pipeline then behaves bitwise as if it never had strategies.
    """
    from .adapters_registry import adapter_for
    from .config import RunConfig, load_config, parse_config

    adapter = adapter_for(pipe)
    if config is not None and strategies is not None and any(isinstance(s, Mapping) for s in strategies):
        raise ConfigError("diffaccel.apply: give a config or strategy tables, not both")
    cfg = None
    if config is not None:
        cfg = config if isinstance(config, RunConfig) else load_config(config, registry=registry)
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
    accelerator = accelerator_for(cfg, strategies, adapter.name, registry)
    adapter.attach(pipe, accelerator)
    try:
        yield pipe
    finally:
        adapter.detach(pipe)
