"""The ``diffaccel`` commands as objects: the core's, the plugins' and the adapters' alike, each
added by a ``diffaccel_register_commands`` implementation calling ``commands.add(...)`` once per
command, parsed and run by one dispatch path (``diffaccel.cli.entry``).

The core registers its own commands the way a plugin does (``diffaccel_register_commands`` below):
one module per command in this package, named as the command (``generate.py``, ``scale_bench.py``),
holding its options, the checks it runs before any adapter import (its ``precheck``), its run
and its examples for ``--help``. ``CORE`` names them in ``diffaccel --help`` order.

Plugins (entry-point group ``diffaccel``) implement the hook in their plugin module, marked
``@diffaccel.hookimpl``; adapters (group ``diffaccel.adapters``) as an attribute of the adapter
object. Each gets a ``Commands`` and calls ``commands.add(...)`` once per command::

    @diffaccel.hookimpl
    def diffaccel_register_commands(commands):
        commands.add("swd-sweep", help="sweep swd's threshold", arguments=add_args, run=main,
                     examples="diffaccel swd-sweep configs/text-swd.toml --seeds 4")

Each command is also declared by name in the distribution's metadata (entry-point group
``diffaccel.commands``: the name as typed, ``GROUP.NAME`` for a grouped one, pointing at the
registration that adds it)::

    [project.entry-points."diffaccel.commands"]
    swd-sweep = "diffaccel_swd:diffaccel_register_commands"

so that ``diffaccel --help`` lists every command from the metadata alone, importing no plugin,
adapter or model library (a plugin package imports torch), and ``diffaccel swd-sweep ...``
imports that one registration only. A command its distribution does not declare is unknown to
the command line; ``diffaccel plugins --check`` asks every registration (``collect``) and names
the commands left undeclared. Core commands never import a plugin or adapter to parse their options. A registration that
raises, or a name already taken, is one warning line naming the plugin or adapter; its commands
are left out and every other command works.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
from collections.abc import Callable
from typing import Any

import attrs

from ...contract.errors import PluginError

ENTRY_GROUP = "diffaccel.commands"
"""Entry-point group declaring commands by name (read without importing anything)."""

GROUPS = ("train",)
"""Core commands whose subcommands come from adapters: ``diffaccel train MODEL`` (``group="train"``)."""

CORE = ("generate", "bench", "overhead", "partial", "plugins", "check", "train", "scale-bench", "tune", "serve", "serve-loadtest", "fluency")
"""The core's commands, in ``diffaccel --help`` order; each is the module of this package named as
it (``-`` as ``_``). Parsing one imports no plugin or adapter, except ``train`` (its models come
from adapters)."""


@attrs.frozen(kw_only=True)
class Command:
    """One registered subcommand."""

    name: str
    """As typed: ``diffaccel NAME`` (or ``diffaccel GROUP NAME``)."""
    help: str
    """One line, shown in ``diffaccel --help`` and as the command's description."""
    run: Callable[[argparse.Namespace], int]
    """Called with the parsed options; returns the exit code. A ``DiffaccelError`` is one line, exit 2."""
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    """Adds the command's options to its parser (``parser.add_argument(...)``)."""
    examples: str = ""
    """The epilog of ``diffaccel NAME --help``: example command lines, then what the command does."""
    group: str | None = None
    """A core command that groups subcommands (``train``), or None for a top-level command."""
    source: str = ""
    """Who registered it (``plugin 'swd'``, ``adapter 'text'``), set by ``collect``; empty for the core's."""
    precheck: Callable[[argparse.Namespace], None] | None = None
    """Checks of the parsed options run before ``run`` (paths, counts, config files), importing no
    adapter or model library: a mistake is one line before minutes of loading."""
    subcommands: str | None = None
    """For a command of ``GROUPS``: the metavar of the subcommands registered with ``group=NAME``
    (``train``'s ``MODEL``)."""


class Commands:
    """What ``diffaccel_register_commands`` receives: ``add`` registers one command."""

    def __init__(self, source: str, taken: set[tuple[str | None, str]]):
        self.source = source
        self._taken = taken
        self.added: list[Command] = []

    def add(self, name: str, *, help: str, run: Callable[[argparse.Namespace], int],
            arguments: Callable[[argparse.ArgumentParser], None] | None = None, examples: str = "",
            group: str | None = None, precheck: Callable[[argparse.Namespace], None] | None = None,
            subcommands: str | None = None) -> None:
        if not name or name.startswith("-") or any(c.isspace() for c in name):
            raise PluginError(f"command name {name!r} is not a word")
        if group is not None and group not in GROUPS:
            raise PluginError(f"command '{name}': group {group!r} is not one of {', '.join(GROUPS)}")
        if subcommands is not None and (group is not None or name not in GROUPS):
            raise PluginError(f"command '{name}': only the core's groups ({', '.join(GROUPS)}) take subcommands")
        if (group, name) in self._taken:
            shown = f"{group} {name}" if group else name
            raise PluginError(f"command '{shown}' is already taken (a core command or another registration)")
        self._taken.add((group, name))
        self.added.append(Command(name=name, help=help, run=run, arguments=arguments, examples=examples,
                                  group=group, source=self.source, precheck=precheck, subcommands=subcommands))


def diffaccel_register_commands(commands: Commands) -> None:
    """The core's own registration: each module of ``CORE`` adds its command, in help order."""
    for name in CORE:
        importlib.import_module(f"{__name__}.{name.replace('-', '_')}").register(commands)


def core() -> list[Command]:
    """The core's commands (``diffaccel_register_commands`` into an empty ``Commands``)."""
    commands = Commands("", set())
    diffaccel_register_commands(commands)
    return commands.added


def _function(impl: Any) -> Any:
    """The function behind a (static, class or bound) method, the same object when inherited."""
    return getattr(impl, "__func__", impl)


def collect(core: tuple[str, ...], registry: Any = None) -> tuple[list[Command], list[str]]:
    """Every plugin's and adapter's commands, and one line per registration that failed
    (``registry``: the plugins, default ``Registry()``, those the entry points name).

    Each registration runs on its own: one that raises (or takes a name already taken) is left
    out whole, nothing it added is kept, and the others still register."""
    from ...runtime.adapters_registry import adapter_names, get_adapter
    from ...runtime.registry import Registry

    taken: set[tuple[str | None, str]] = {(None, name) for name in core}
    found: list[Command] = []
    problems: list[str] = []

    def register(source: str, impl: Callable[..., Any]) -> None:
        commands = Commands(source, set(taken))
        try:
            impl(commands=commands)
        except Exception as exc:  # a broken plugin's registration must not stop the other commands
            text = str(exc).strip().splitlines()
            what = text[0] if text else ""
            shown = what if isinstance(exc, PluginError) else f"{type(exc).__name__}: {what}"
            problems.append(f"{source}: diffaccel_register_commands failed ({shown}); its commands are left out")
            return
        taken.update((c.group, c.name) for c in commands.added)
        found.extend(commands.added)

    registry = registry if registry is not None else Registry()
    for impl in registry.pm.hook.diffaccel_register_commands.get_hookimpls():  # registration order
        dist, version = registry.distribution(impl.plugin_name)
        register(f"plugin '{impl.plugin_name}' ({dist} {version})", impl.function)
    registered: set[Any] = set()  # an adapter subclassing another inherits its commands: they register once
    for name in adapter_names():
        try:
            adapter = get_adapter(name)
        except Exception as exc:  # noqa: BLE001 - reported by the commands that use the adapter
            problems.append(f"adapter '{name}': not loaded ({exc}); its commands are left out")
            continue
        impl = getattr(adapter, "diffaccel_register_commands", None)
        if impl is not None and _function(impl) not in registered:
            registered.add(_function(impl))
            register(f"adapter '{name}' ({_adapter_dist(name)})", impl)
    return found, problems


def _adapter_dist(name: str) -> str:
    for ep in md.entry_points(group="diffaccel.adapters"):
        if ep.name == name and ep.dist is not None:
            return f"{ep.dist.metadata['name']} {ep.dist.version}"
    return "-"


@attrs.frozen(kw_only=True)
class Declared:
    """A command declared in a distribution's metadata (``diffaccel.cli.commands``), not yet imported."""

    name: str
    group: str | None
    target: str
    """The entry point's value: ``module:attr``, the registration that adds the command."""
    source: str
    """The distribution: ``diffaccel-swd 0.1.0``."""

    @property
    def typed(self) -> str:
        return f"{self.group} {self.name}" if self.group else self.name


def declared(core: tuple[str, ...]) -> tuple[list[Declared], list[str]]:
    """Every command the installed distributions declare, from their metadata only (nothing is
    imported), and one line per declaration refused: a core command's name, a name declared
    twice, a group the core does not have. Commands of a distribution whose every plugin is
    blocked (``DIFFACCEL_PLUGINS``, ``DIFFACCEL_BLOCK_PLUGINS``) are left out."""
    from ...runtime.registry import blocked_distributions

    blocked = blocked_distributions()
    taken: set[tuple[str | None, str]] = {(None, name) for name in core}
    found: list[Declared] = []
    problems: list[str] = []
    for ep in md.entry_points(group=ENTRY_GROUP):
        dist = ep.dist.metadata["name"] if ep.dist is not None else "-"
        if dist in blocked:
            continue
        source = f"{dist} {ep.dist.version}" if ep.dist is not None else "-"
        group, _, name = ep.name.rpartition(".")
        group = group or None
        if group is not None and group not in GROUPS:
            problems.append(f"{source}: command '{ep.name}' ({ENTRY_GROUP}): group {group!r} is not one of "
                            f"{', '.join(GROUPS)}; left out")
            continue
        if (group, name) in taken:
            if any(d.target == ep.value and (d.group, d.name) == (group, name) for d in found):
                continue  # the same distribution seen twice on sys.path
            shown = f"{group} {name}" if group else name
            problems.append(f"{source}: command '{shown}' is already taken (a core command or another distribution); left out")
            continue
        taken.add((group, name))
        found.append(Declared(name=name, group=group, target=ep.value, source=source))
    return found, problems


def load_declared(d: Declared, core: tuple[str, ...]) -> Command:
    """Import ``d``'s registration alone and return the command it adds under ``d``'s name; a
    registration that raises or does not add it is a ``PluginError`` naming the distribution."""
    module, _, attr = d.target.partition(":")
    taken = {(None, name) for name in core}
    commands = Commands(f"{d.source}", taken)
    try:
        impl = importlib.import_module(module)
        for part in filter(None, attr.split(".")):
            impl = getattr(impl, part)
        impl(commands=commands)
    except Exception as exc:  # a broken registration is one line naming where it comes from
        text = str(exc).strip().splitlines()
        what = text[0] if text else ""
        shown = what if isinstance(exc, PluginError) else f"{type(exc).__name__}: {what}"
        raise PluginError(f"command '{d.typed}' ({d.source}, {d.target}): its registration failed ({shown})") from None
    for c in commands.added:
        if (c.group, c.name) == (d.group, d.name):
            return c
    raise PluginError(f"command '{d.typed}' ({d.source}): declared in {ENTRY_GROUP}, but {d.target} did not add it "
                      f"(it added: {', '.join(c.name for c in commands.added) or 'nothing'})")


def undeclared(core: tuple[str, ...], registry: Any = None) -> list[str]:
    """One line per problem ``diffaccel plugins --check`` reports about commands: a registration
    that fails, or a command it adds that no ``diffaccel.commands`` entry point declares."""
    found, problems = collect(core, registry)
    names = {(d.group, d.name) for d in declared(core)[0]}
    lines = [f"commands: {p}" for p in problems]
    for c in found:
        if (c.group, c.name) not in names:
            shown = f"{c.group}.{c.name}" if c.group else c.name
            lines.append(f"commands: {c.source} adds '{shown}', which no {ENTRY_GROUP} entry point declares: "
                         f"'diffaccel --help' does not list it and the command line does not find it; declare "
                         f'{shown} = "module:diffaccel_register_commands" in its pyproject.toml')
    return lines
