"""``python -m`` of the adapters' tools, kept for one minor release (CHANGELOG.md, 0.2.0): each tool
is a registered command now (``diffaccel gguf-convert``, ``diffaccel train smollm2-dlm``, ...), and
its module's ``main`` runs that command with a DeprecationWarning naming it, until 0.3."""

from __future__ import annotations

import sys
import warnings


def deprecated_main(command: list[str] | dict[str, list[str]], argv: list[str] | None, module: str) -> int:
    """Run ``diffaccel COMMAND ARGV...``; ``command`` a dict maps the module's old first argument (its
    subcommand: ``train``, ``export``, ``eval``) to the command that replaces it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if isinstance(command, dict):
        if not argv or argv[0] not in command:
            print(f"python -m {module}: use {' or '.join(repr('diffaccel ' + ' '.join(c)) for c in command.values())}",
                  file=sys.stderr)
            return 2
        command, argv = command[argv[0]], argv[1:]
    shown = "diffaccel " + " ".join(command)
    warnings.warn(f"python -m {module} is deprecated (removed in diffaccel 0.3): use '{shown}'", DeprecationWarning,
                  stacklevel=3)
    from diffaccel.cli.entry import main

    return main([*command, *argv])
