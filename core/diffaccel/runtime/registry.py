"""Plugin discovery and the strategy registry.

Plugins are modules named by entry points in the ``diffaccel`` group. Each implements
``diffaccel_register(register)`` and hands ``Strategy`` objects to ``register``; the core never
guesses what a module offers.

Environment variables:

* ``DIFFACCEL_PLUGINS``: comma-separated entry-point names to load; all others are blocked.
  Set it empty to load none.
* ``DIFFACCEL_BLOCK_PLUGINS``: comma-separated entry-point names never to load.

Both cover third-party adapters and text model kinds too (``adapters_registry``, the text
adapter's ``loading``); the shipped adapters load unless blocked by name.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import inspect
import os
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import pluggy

from ..contract import hookspecs
from ..contract.errors import PluginError
from ..contract.hookspecs import hookimpl, own
# Strategy (what a plugin registers) is in the contract layer, importable here as before
from ..contract.strategy import Strategy

GROUP = "diffaccel"
__all__ = ["GROUP", "Registry", "Strategy", "call_own", "check_strategy", "contract_problems", "hookimpl", "own_impl"]


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    return pm


def _names(env: str) -> set[str] | None:
    value = os.environ.get(env)
    if value is None:
        return None
    return {n.strip() for n in value.split(",") if n.strip()}


def env_allows(name: str, shipped: bool = False) -> bool:
    """Whether the environment lets entry point ``name`` (a plugin, an adapter, a text model kind)
    load: not in ``DIFFACCEL_BLOCK_PLUGINS``, and in ``DIFFACCEL_PLUGINS`` when that is set, unless
    ``shipped`` (diffaccel's own adapters: the allow list names third parties). Read at every call,
    so a test's or a process's change of the variables counts. The one place for this rule."""
    if name in (_names("DIFFACCEL_BLOCK_PLUGINS") or set()):
        return False
    allowed = _names("DIFFACCEL_PLUGINS")
    return allowed is None or name in allowed or shipped


def blocked_distributions() -> set[str]:
    """Distributions whose every plugin (entry point of the ``diffaccel`` group) the environment
    blocks: their commands are left out too. From the metadata only; nothing is imported."""
    state: dict[str, bool] = {}  # distribution -> whether all its plugins so far are blocked
    for ep in md.entry_points(group=GROUP):
        if ep.dist is None:
            continue
        off = not env_allows(ep.name)
        name = ep.dist.metadata["name"]
        state[name] = state.get(name, True) and off
    return {name for name, off in state.items() if off}


class PluginWarning(UserWarning):
    """A plugin was left out: it failed to import or to register (one line naming it and why)."""


@attrs.frozen
class BrokenPlugin:
    """A plugin that failed to import or to register: left out, every other plugin still works."""

    name: str
    """Entry-point name (or the name it was registered under by hand)."""
    distribution: str
    version: str
    reason: str
    """What failed, one line: ``failed to load: RuntimeError: ...`` or ``diffaccel_register failed: ...``."""

    def line(self) -> str:
        return (f"plugin '{self.name}' (distribution {self.distribution} {self.version}) was left out: {self.reason}; "
                f"block it with DIFFACCEL_BLOCK_PLUGINS={self.name}")


_REPORTED: set[tuple[str, str]] = set()
"""(plugin, reason) pairs already warned about in this process: a broken plugin is reported once,
however many registries are built."""


class Registry:
    """Loaded plugins and the strategies they registered.

    A plugin that fails to import or to register is left out (``broken``) and reported once per
    process as a ``PluginWarning`` (one line naming its distribution and the reason): every
    command that does not use it works; a config that uses one of its strategies fails naming it.
    """

    def __init__(self, load_entrypoints: bool = True):
        self.pm = new_plugin_manager()
        self.strategies: dict[str, Strategy] = {}
        self.broken: dict[str, BrokenPlugin] = {}
        self._dists: dict[str, tuple[str, str]] = {}
        if load_entrypoints:
            self._load_entrypoints()

    def _load_entrypoints(self) -> None:
        for ep in md.entry_points(group=GROUP):
            if not env_allows(ep.name):
                self.pm.set_blocked(ep.name)
                continue
            if self.pm.get_plugin(ep.name) is not None or ep.name in self.broken:
                continue  # the same distribution seen twice on sys.path
            if ep.dist is not None:
                self._dists[ep.name] = (ep.dist.metadata["name"], ep.dist.version)
            try:
                plugin = ep.load()
                self.pm.register(plugin, name=ep.name)
            except Exception as exc:  # a broken third-party plugin must not stop the others
                self._leave_out(ep.name, f"failed to load: {type(exc).__name__}: {_first_line(exc)}")
                continue
            self._collect(ep.name, plugin)

    def register_plugin(self, plugin: Any, name: str) -> None:
        """Register a plugin object directly (tests, notebooks); same path as an entry point, but
        a registration that fails raises ``PluginError`` (the caller handed it in)."""
        self.pm.register(plugin, name=name)
        self._collect(name, plugin, strict=True)

    def _leave_out(self, name: str, reason: str) -> None:
        dist, version = self._dists.get(name, ("-", "-"))
        broken = self.broken[name] = BrokenPlugin(name, dist, version, reason)
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)
        self.strategies = {k: s for k, s in self.strategies.items() if s.plugin != name}
        if (name, reason) not in _REPORTED:
            _REPORTED.add((name, reason))
            warnings.warn(broken.line(), PluginWarning, stacklevel=_outside_diffaccel())

    def _collect(self, plugin_name: str, plugin: Any, strict: bool = False) -> None:
        impl = getattr(plugin, "diffaccel_register", None)
        if impl is None:
            return
        mine: dict[str, Strategy] = {}

        def register(strategy: Strategy) -> None:
            if not isinstance(strategy, Strategy):
                raise PluginError(f"plugin '{plugin_name}' registered {strategy!r}, not a diffaccel.Strategy")
            if not attrs.has(strategy.config):
                raise PluginError(f"plugin '{plugin_name}': strategy '{strategy.name}' config is not an attrs class")
            known = self.strategies.get(strategy.name)
            if known is not None and known.plugin != plugin_name:
                raise PluginError(
                    f"strategy '{strategy.name}' is registered by two plugins: '{known.plugin}' and '{plugin_name}'"
                    f"; block one with DIFFACCEL_BLOCK_PLUGINS"
                )
            mine[strategy.name] = attrs.evolve(strategy, plugin=plugin_name)

        reason = None
        try:
            impl(register=register)
        except Exception as exc:  # e.g. a Strategy field this core does not have
            old = old_forms(plugin, [], exc)
            if old:  # the first contract: every old form at once, not the first error alone
                reason = first_contract(old)
            elif isinstance(exc, PluginError):
                reason = str(exc).removeprefix(f"plugin '{plugin_name}': ")
            else:
                reason = f"diffaccel_register failed: {type(exc).__name__}: {_first_line(exc)}"
        else:
            old = old_forms(plugin, [s.factory for s in mine.values()], None)
            reason = first_contract(old) if old else None  # methods under old names would never be called
        if reason is not None:
            if strict:
                raise PluginError(reason if reason.startswith(("plugin ", "strategy ")) else f"plugin '{plugin_name}': {reason}")
            self._leave_out(plugin_name, reason)  # nothing it registered is kept
            return
        self.strategies.update(mine)

    def unknown_strategy(self, name: str) -> str:
        """Why ``name`` is no installed strategy, for a config error: the installed ones, and any
        plugin left out as broken (the strategy may be one of its)."""
        installed = ", ".join(sorted(self.strategies)) or "none installed"
        why = f"unknown strategy '{name}'; installed: {installed}"
        if name in self.broken:
            b = self.broken[name]
            return f"strategy '{name}': its plugin '{b.name}' (distribution {b.distribution} {b.version}) was left out: {b.reason}"
        if self.broken:
            why += "; left out as broken: " + "; ".join(f"plugin '{b.name}' ({b.distribution}): {b.reason}" for b in self.broken.values())
        return why

    def get(self, name: str) -> Strategy | None:
        return self.strategies.get(name)

    def distribution(self, plugin_name: str) -> tuple[str, str]:
        """(distribution name, version) of the plugin, or ('-', '-') for one registered by hand."""
        return self._dists.get(plugin_name, ("-", "-"))

    def describe(self) -> list[dict[str, Any]]:
        """One entry per strategy: name, distribution, version, requirements, fields with defaults."""
        rows = []
        for s in sorted(self.strategies.values(), key=lambda s: s.name):
            dist, version = self.distribution(s.plugin)
            fields = []
            for f in attrs.fields(s.config):
                default = None if f.default is attrs.NOTHING else f.default
                if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                    default = default.factory()
                fields.append({"name": f.name, "default": default, "doc": field_doc(s.config, f.name)})
            rows.append({"name": s.name, "plugin": s.plugin, "distribution": dist, "version": version,
                         "requires": [r if isinstance(r, str) else list(r) for r in s.requires],
                         "description": s.description, "fields": fields})
        return rows


OLD_METHODS = {"setup": "diffaccel_setup", "new_state": "diffaccel_new_state", "bench_quality": "diffaccel_bench_quality",
               "bench_plot": "diffaccel_bench_plot", "hooked_modules": "diffaccel_hooked_modules"}
"""Methods the first contract found by name; they are hooks now, and a method of the old name is
never called (on a class that lacks the hook: beside the hook, it is the plugin's own helper)."""


def first_contract(forms: list[str]) -> str:
    return "written against the first plugin contract; change " + "; ".join(forms) + " (docs/writing-a-plugin.md)"


def old_forms(plugin: Any, factories: list[Any], exc: BaseException | None) -> list[str]:
    """Every form of the first plugin contract found in ``plugin`` (its registration raised
    ``exc``, or registered ``factories``), each as 'old -> new'. Without factories (the
    registration failed), the plugin module's own classes are read."""
    forms = []
    if isinstance(exc, TypeError) and "'adapters'" in str(exc):
        forms.append("Strategy(adapters=...) -> Strategy(requires=(...)), capabilities from diffaccel.capabilities")
    classes = [f for f in factories if inspect.isclass(f)]
    if not factories and inspect.ismodule(plugin):
        classes = [c for c in vars(plugin).values()
                   if inspect.isclass(c) and c.__module__ == plugin.__name__ and not attrs.has(c)]
    for cls in classes:
        for old, new in OLD_METHODS.items():
            if callable(getattr(cls, old, None)) and not hasattr(cls, new):
                forms.append(f"{cls.__name__}.{old} -> {new} marked @diffaccel.hookimpl")
        read = _implicit_state(cls)
        if read:
            forms.append(f"{cls.__name__}: {read} on a state nothing makes (the first contract's empty dict) -> "
                         "diffaccel_new_state returning the state, an attrs object read by attribute")
    return forms


def _implicit_state(cls: type) -> str | None:
    """Where ``cls`` reads a per-run state that nothing makes: ``run.state(self)`` (no factory)
    on a class without ``diffaccel_new_state``, as the first contract allowed (it made an empty
    dict); None if nowhere (or no source to read)."""
    if hasattr(cls, "diffaccel_new_state"):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return None
    calls = [n for n in ast.walk(tree) if _is_state_call(n) and len(n.args) + len(n.keywords) == 1]
    if not calls:
        return None
    names = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.value in calls
             for t in n.targets if isinstance(t, ast.Name)}  # state = run.state(self)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
                and (node.value in calls or (isinstance(node.value, ast.Name) and node.value.id in names))):
            return f"run.state(self)[{node.slice.value!r}]"
    return "run.state(self)"


def _is_state_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "state"


def contract_problems(strategy: Any) -> list[str]:
    """What keeps ``strategy`` (an instance) from meeting the hook contract, one line each:
    ``diffaccel_*`` methods that are no hook, hookimpls whose arguments the hook does not have,
    unmarked hook methods, wrappers on a hook whose rule has none."""
    problems = []
    pm = new_plugin_manager()
    try:
        pm.register(strategy, name="check")
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        problems.append(" ".join(str(exc).split()))
    for attr in dir(type(strategy)):
        rule = hookspecs.RULES.get(attr)
        if rule is None:
            continue
        opts = getattr(getattr(strategy, attr), "diffaccel_impl", None)
        if opts is None:
            problems.append(f"method '{attr}' is not marked @diffaccel.hookimpl, so it is never called")
        elif opts.get("hookwrapper") or (opts.get("wrapper") and not rule.wrappers):
            problems.append(f"method '{attr}' is marked as a wrapper; {attr} takes none ({rule.describe()})"
                            if not opts.get("hookwrapper") else
                            f"method '{attr}' uses hookwrapper=True; use @diffaccel.hookimpl(wrapper=True)")
    return problems


def check_strategy(strategy: Any, name: str) -> None:
    """Raise ``PluginError`` (one line) if ``strategy`` does not meet the hook contract."""
    problems = contract_problems(strategy)
    if problems:
        raise PluginError(f"strategy '{name}': {problems[0]}")


def call_own(strategy: Any, hook: str, **kwargs: Any) -> list[Any]:
    """Call hook ``hook`` on ``strategy`` alone (the *per strategy* hooks): ``[its result]``, or
    empty if it does not implement the hook. Resolved directly, no plugin manager per call."""
    fn = own(strategy, hook)
    result = None if fn is None else fn(**kwargs)
    return [] if result is None else [result]


def own_impl(strategy: Any, hook: str) -> Callable[..., Any] | None:
    """The function implementing ``hook`` on ``strategy`` (resolved once, for the hot path), or None."""
    return own(strategy, hook)


def _outside_diffaccel() -> int:
    """The ``stacklevel`` of the first caller outside the diffaccel package, for a warning raised
    inside it: the user's line (``Registry()`` may be built several calls deep in diffaccel)."""
    root = os.path.dirname(sys.modules["diffaccel"].__file__ or "") + os.sep
    frame, level = sys._getframe(1), 1  # the caller of this function is level 1 to warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(root):
        frame, level = frame.f_back, level + 1
    return level


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def field_doc(cls: type, name: str) -> str:
    """The docstring written under an attrs field (``x: int = 1`` then ``\"\"\"doc\"\"\"``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return ""
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            return " ".join(nxt.value.value.split())
    return ""
