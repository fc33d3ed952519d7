"""Hook dispatch: the chains of a config's strategies, their merge rules and the guarded call sites.

A ``Dispatcher`` is built from the contract's data (``diffaccel.contract.hookspecs.RULES``): for
each run hook, the implementations of the strategies not disabled, in config order (``tryfirst`` /
``trylast`` respected), then the built-in default (``diffaccel.runtime.builtin``), resolved into
plain lists once (and again only when a strategy is disabled); each hook's merge rule (first
result, collected list, pipe, union, each with wrappers) is one function of ``MERGES``. Every
implementation is called inside its own ``try``: a fault is blamed at the call site, on the
strategy whose implementation was called (``diffaccel.runtime.guard``), never by walking a
traceback, and an exception the model raised inside ``layer.compute`` is the model's, whoever
called it. ``diffaccel.runtime.accelerator.Accelerator`` adds the run's lifecycle on top.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..contract.errors import ConfigValueError, DiffaccelError
from ..contract.hookspecs import COLLECT, EACH, FIRST, PIPE, RULES, RUN_HOOKS, UNION, implementation, own
from ..contract.state import MODEL_FAULT, Layer, RunState
from .builtin import DefaultBehaviour
from .guard import strategy_error
from .registry import Registry, check_strategy

Entry = tuple[str | None, Callable[..., Any]]
"""One implementation in a chain: (strategy name, or None for the built-in default; its call)."""


# ---- the merge rules, one function each (hookspecs names them) --------------------------------------

def _first(acc: "Dispatcher", hook: str, run: RunState | None, args: tuple) -> Any:
    for owner, fn in acc._chains[hook]:
        r = acc._call(owner, hook, run, fn, args)
        if r is not None:
            return r
    return None


def _collect(acc: "Dispatcher", hook: str, run: RunState | None, args: tuple) -> list[Any]:
    out = []
    for owner, fn in acc._chains[hook]:
        r = acc._call(owner, hook, run, fn, args)
        if r is not None:
            out.append(r)
    return out


def _pipe(acc: "Dispatcher", hook: str, run: RunState | None, args: tuple) -> Any:
    for owner, fn in acc._chains[hook]:
        r = acc._call(owner, hook, run, fn, args)
        if r is not None:
            args = (*args[:-1], r)
    return args[-1]


def _union(acc: "Dispatcher", hook: str, run: RunState | None, args: tuple) -> Any:
    out = None
    for owner, fn in acc._chains[hook]:
        r = acc._call(owner, hook, run, fn, args)
        if r is not None:
            out = r if out is None else out | r
    return out


def _each(acc: "Dispatcher", hook: str, run: RunState | None, args: tuple) -> None:
    for owner, fn in acc._chains[hook]:
        acc._call(owner, hook, run, fn, args)


MERGES: dict[str, Callable[["Dispatcher", str, Any, tuple], Any]] = {
    FIRST: _first, COLLECT: _collect, PIPE: _pipe, UNION: _union, EACH: _each}
"""Merge rule (``hookspecs.Rule.merge``) -> how a chain's results combine."""


class Dispatcher:
    """The hook chains of an ordered list of strategy instances, and their guarded calls.

    An exception raised in a strategy's implementation becomes a ``StrategyError``, or drops that
    strategy for the rest of the run when its policy (``on_error``) is ``disable``; ``registry``
    names the strategies' distributions in errors (looked up only when one happens)."""

    def __init__(self, strategies: Sequence[Any] = (), *, on_error: Mapping[str, str] | None = None,
                 registry: Registry | None = None):
        self.configured = list(strategies)
        for s in self.configured:
            check_strategy(s, s.name)
        self.on_error = dict(on_error or {})
        self._registry = registry
        self._default = DefaultBehaviour()
        self._disabled: set[str] = set()
        self._resolve()

    def _resolve(self) -> None:
        """(Re)build the chains of every run hook from the strategies not disabled."""
        self.strategies = [s for s in self.configured if s.name not in self._disabled]
        plugins: list[tuple[str | None, Any]] = [(s.name, s) for s in self.strategies] + [(None, self._default)]
        self._chains: dict[str, list[Entry]] = {}
        self._wrappers: dict[str, list[Entry]] = {}
        for hook in RUN_HOOKS:
            found = [(impl, owner) for owner, obj in plugins if (impl := implementation(obj, hook, owner or ""))]
            found.sort(key=lambda f: f[0].order)  # stable: config order within tryfirst / normal / trylast
            self._chains[hook] = [(owner, impl.call) for impl, owner in found if not impl.wrapper]
            self._wrappers[hook] = [(owner, impl.call) for impl, owner in found if impl.wrapper]
        # per strategy, resolved once: ``run.state(s)`` creates states through these
        self._state_factories = {s.name: fn for s in self.strategies if (fn := own(s, "diffaccel_new_state"))}
        self._memory_hooks = {s.name: fn for s in self.strategies if (fn := own(s, "diffaccel_memory"))}
        # the hot path: a plain list of callables, and who owns each (read only when one raised)
        layer = self._chains["diffaccel_layer_output"]
        self._layer_chain = [fn for _, fn in layer]
        self._layer_owners = [owner for owner, _ in layer]
        self._full_layer = [fn for owner, fn in layer if owner is None]
        self._layer_output = self._chain_call(self._layer_chain)

    def _chain_call(self, chain: list[Callable[..., Any]]) -> Callable[[RunState, Layer, Any], Any]:
        """What ``layer_output`` calls: the chain, or its one implementation when it has no other
        than the built-in default (whose exceptions are re-raised as they are: the same calls)."""
        return chain[0] if len(chain) == 1 and self._layer_owners[0] is None else self._layer_chain_output

    def _layer_chain_output(self, run: RunState, layer: Layer, hidden: Any) -> Any:
        """``layer_output``'s chain, the hot path: the first output given (the built-in default
        computes the layer); a strategy that raised is blamed and, when disabled, skipped."""
        chain = self._layer_chain
        try:  # costs nothing unless raised; the loop variable says whose call raised
            for fn in chain:
                out = fn(run, layer, hidden)
                if out is not None:
                    return out
        except Exception as exc:
            k, owners = chain.index(fn), self._layer_owners  # as they were: a disabled strategy rebuilds them
            if not self._fault(exc, run, owners[k], "diffaccel_layer_output"):
                raise
            for j in range(k + 1, len(chain)):  # the rest of the chain, without the strategy just disabled
                out = self._call(owners[j], "diffaccel_layer_output", run, chain[j], (run, layer, hidden))
                if out is not None:
                    return out
        return None

    # -- calls and faults ----------------------------------------------------------------------
    def _call(self, owner: str | None, hook: str, run: RunState | None, fn: Callable, args: tuple) -> Any:
        """One implementation, guarded at its call site; None when its strategy is disabled."""
        if self._disabled and owner in self._disabled:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            if not self._fault(exc, run, owner, hook):
                raise
            return None

    def _dispatch(self, hook: str, run: RunState | None, args: tuple) -> Any:
        """Call ``hook`` over the chain with its merge rule, inside its wrappers if it has any."""
        merge = MERGES[RULES[hook].merge]
        if not self._wrappers.get(hook):
            return merge(self, hook, run, args)
        return self._wrapped(hook, run, args, lambda: merge(self, hook, run, args))

    def _wrapped(self, hook: str, run: RunState | None, args: tuple, inner: Callable[[], Any]) -> Any:
        """``wrapper=True`` implementations (generators yielding once), outermost first: each runs
        to its ``yield``, then the chain, then each gets the result back, innermost first."""
        open_: list[tuple[str | None, Any]] = []
        for owner, fn in self._wrappers[hook]:
            if self._disabled and owner in self._disabled:
                continue
            try:
                gen = fn(*args)
                next(gen)
            except Exception as exc:
                if not self._fault(exc, run, owner, hook):
                    raise
                continue
            open_.append((owner, gen))
        try:
            result = inner()
        except BaseException:
            for _, gen in open_:
                gen.close()
            raise
        for owner, gen in reversed(open_):
            try:
                gen.send(result)
            except StopIteration as stop:
                result = stop.value if stop.value is not None else result
            except Exception as exc:
                if not self._fault(exc, run, owner, hook):
                    raise
        return result

    def _fault(self, exc: Exception, run: RunState | None, owner: str | None, hook: str) -> bool:
        """Called only when an implementation raised, with its owner (the call site knows it).
        True: the strategy is disabled, go on without it. False: not a strategy's fault (the
        built-in default, the model's own compute, a DiffaccelError): re-raise it. Otherwise
        raises the StrategyError."""
        if owner is None or isinstance(exc, (DiffaccelError, ConfigValueError)) or hasattr(exc, MODEL_FAULT):
            # ConfigValueError: a strategy refusing a value only the run reveals (a tail longer than
            # the block, a clusters file for another length) is the user's input, not a fault
            return False
        name, hook = owner, hook.removeprefix("diffaccel_")
        step = run.step if run is not None else None
        if self.on_error.get(name, "raise") == "disable" and run is not None:
            self._disable(run, name, hook, f"{type(exc).__name__}: {exc}")
            return True
        raise strategy_error(exc, name, hook, step, self._registry) from exc

    def _disable(self, run: RunState, name: str, hook: str, why: str) -> None:
        self._disabled.add(name)
        run.reliability.disabled.append({"strategy": name, "hook": hook, "step": run.step, "error": why.strip().split("\n")[0]})
        self._resolve()

