"""Subcommands that plugins and adapters add to ``diffaccel`` (the ``diffaccel_register_commands`` hook).

Plugins (entry-point group ``diffaccel``) implement the hook in their plugin module, marked
``@diffaccel.hookimpl``; adapters (group ``diffaccel.adapters``) as an attribute of the adapter
object. Each gets a ``Commands`` and calls ``commands.add(...)`` once per command::

    @diffaccel.hookimpl
    def diffaccel_register_commands(commands):
        commands.add("swd-sweep", help="sweep swd's threshold", arguments=add_args, run=main,
                     examples="diffaccel swd-sweep configs/text-swd.toml --seeds 4")

The command line asks for them only when the command it was given is not a core one (or for
``diffaccel --help``), so core commands never import a plugin or adapter to parse their options.
A registration that raises, or a name already taken, is one warning line naming the plugin or
adapter; its commands are left out and every other command works.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
from collections.abc import Callable
from typing import Any

import attrs

from .errors import PluginError

GROUPS = ("train",)
"""Core commands whose subcommands come from adapters: ``diffaccel train MODEL`` (``group="train"``)."""


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
    """Who registered it (``plugin 'swd'``, ``adapter 'text'``), set by ``collect``."""


class Commands:
    """What ``diffaccel_register_commands`` receives: ``add`` registers one command."""

    def __init__(self, source: str, taken: set[tuple[str | None, str]]):
        self.source = source
        self._taken = taken
        self.added: list[Command] = []

    def add(self, name: str, *, help: str, run: Callable[[argparse.Namespace], int],
            arguments: Callable[[argparse.ArgumentParser], None] | None = None, examples: str = "",
            group: str | None = None) -> None:
        if not name or name.startswith("-") or any(c.isspace() for c in name):
            raise PluginError(f"command name {name!r} is not a word")
        if group is not None and group not in GROUPS:
            raise PluginError(f"command '{name}': group {group!r} is not one of {', '.join(GROUPS)}")
        if (group, name) in self._taken:
            shown = f"{group} {name}" if group else name
            raise PluginError(f"command '{shown}' is already taken (a core command or another registration)")
        self._taken.add((group, name))
        self.added.append(Command(name=name, help=help, run=run, arguments=arguments, examples=examples,
                                  group=group, source=self.source))


def collect(core: tuple[str, ...], registry: Any = None) -> tuple[list[Command], list[str]]:
    """Every plugin's and adapter's commands, and one line per registration that failed
    (``registry``: the plugins, default ``Registry()``, those the entry points name).

    Each registration runs on its own: one that raises (or takes a name already taken) is left
    out whole, nothing it added is kept, and the others still register."""
    from .adapters_registry import adapter_names, get_adapter
    from .plugins import Registry

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
    for name in adapter_names():
        try:
            adapter = get_adapter(name)
        except Exception as exc:  # noqa: BLE001 - reported by the commands that use the adapter
            problems.append(f"adapter '{name}': not loaded ({exc}); its commands are left out")
            continue
        impl = getattr(adapter, "diffaccel_register_commands", None)
        if impl is not None:
            register(f"adapter '{name}' ({_adapter_dist(name)})", impl)
    return found, problems


def _adapter_dist(name: str) -> str:
    for ep in md.entry_points(group="diffaccel.adapters"):
        if ep.name == name and ep.dist is not None:
            return f"{ep.dist.metadata['name']} {ep.dist.version}"
    return "-"
