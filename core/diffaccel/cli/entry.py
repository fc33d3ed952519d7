"""The ``diffaccel`` command line: one parser and one dispatch path for every command, the core's
(``diffaccel.cli.commands``, one module each) and those plugins and adapters register. Every user
mistake is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap

from ..contract.errors import ConfigError, DiffaccelError, ModelError, NonFiniteError, StrategyError
from .commands import CORE, GROUPS, Command, core
from .console import debugging as _debugging
from .console import say as _say
from .console import warnings_as_lines as _warnings_as_lines

__all__ = ["CORE", "add_command", "main"]


def add_command(sub, c: Command, common: argparse.ArgumentParser, grouped: list[Command] = ()) -> None:
    """A command (``diffaccel.cli.commands.Command``) as a subparser that runs it; ``grouped``: the
    commands registered under it (``train``'s models)."""
    if not c.source:  # the core's own: its examples as written
        epilog = textwrap.dedent(c.examples)
    elif c.examples:
        epilog = f"{textwrap.dedent(c.examples).strip()}\n(from {c.source})"
    else:
        epilog = f"(from {c.source})"
    p = sub.add_parser(c.name, help=c.help, description=c.help, epilog=epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common])
    if c.arguments is not None:
        c.arguments(p)
    p.set_defaults(registered=c.run, registered_precheck=c.precheck)
    if c.subcommands:
        models = p.add_subparsers(dest=c.subcommands.lower(), required=True, metavar=c.subcommands)
        for g in grouped:
            add_command(models, g, common)


def _parser(extra: list | None = None, commands: list[Command] | None = None) -> argparse.ArgumentParser:
    """The parser of ``commands`` (default the core's) and ``extra`` (plugins' and adapters')."""
    from .. import __version__

    extra = extra or []
    p = argparse.ArgumentParser(
        prog="diffaccel",
        description="Sample diffusion models faster by composing accelerator strategies from a TOML config.",
        epilog="Run 'diffaccel COMMAND --help' for a command's options and an example.",
    )
    p.add_argument("--version", action="version", version=f"diffaccel {__version__}")
    debug_help = "print the traceback of a strategy's exception too, and notes (or set DIFFACCEL_DEBUG=1)"
    p.add_argument("--debug", action="store_true", help=debug_help)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    for c in (core() if commands is None else commands) + [c for c in extra if c.group is None]:
        add_command(sub, c, common, [g for g in extra if g.group == c.name])
    return p


def _registered(argv: list[str]) -> list:
    """The registered commands parsing ``argv`` needs: none for a core command (``train``
    aside); for ``diffaccel --help`` (and ``train --help``) each declared command as a listing
    entry, from the distributions' metadata, importing nothing; for a registered command, that
    command's registration alone (and the others as listing entries, for usage messages). A
    command no distribution declares is unknown (``plugins --check`` names registrations that
    add undeclared ones), so a mistyped command fails at once."""
    words = [a for a in argv if not a.startswith("-")]
    if words and words[0] in CORE and words[0] not in GROUPS:
        return []
    if not words and not ("-h" in argv or "--help" in argv):
        return []
    from .commands import declared, load_declared

    found, problems = declared(CORE)
    for line in problems:
        _say(f"diffaccel: warning: {line}")
    if words[:1] and words[0] in GROUPS:
        want = (words[0], words[1]) if len(words) > 1 else None
    else:
        want = (None, words[0]) if words else None
    match = next((d for d in found if (d.group, d.name) == want), None)
    try:
        loaded = load_declared(match, CORE) if match is not None else None
    except DiffaccelError as exc:
        _say(f"diffaccel: error: {exc}")
        sys.exit(2)
    return [loaded if d is match else _listed(d) for d in found]


def _listed(d) -> object:
    """A declared command, not imported, as an entry of the usage lists: its help says where it
    comes from; typing it imports its registration (``_registered``)."""

    def not_loaded(args):  # only reachable if _registered did not import the typed command
        raise ConfigError(f"command '{d.typed}' ({d.source}) was not loaded")

    return Command(name=d.name, group=d.group, help=f"from {d.source}: 'diffaccel {d.typed} --help'", run=not_loaded,
                   source=d.source)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    _warnings_as_lines()
    args = _parser(_registered(argv)).parse_args(argv)
    args.command_line = "diffaccel " + shlex.join(argv)  # as the report records it
    debug = _debugging(args)
    try:
        precheck = getattr(args, "registered_precheck", None)
        if precheck is not None:
            precheck(args)  # before any adapter, plugin or model library is imported
        return args.registered(args)
    except (StrategyError, NonFiniteError, ModelError) as exc:  # a plugin's fault or broken numbers: exit 1
        if debug:
            import traceback

            traceback.print_exc()
        _say(f"diffaccel: {exc}")
        return 1
    except DiffaccelError as exc:
        _say(f"diffaccel: error: {exc}")
        return 2
    except KeyboardInterrupt:
        _say("diffaccel: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
