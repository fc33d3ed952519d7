"""Formerly the core commands' epilogs by name (``EXAMPLES``). Each command's module now holds its
own (``diffaccel.cli.commands.generate.EXAMPLES``, ...); ``EXAMPLES`` still maps the core's command
names to them, with a DeprecationWarning, until 0.3."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name != "EXAMPLES":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .._moved import warn
    from .commands import core

    warn(f"{__name__}.EXAMPLES", "diffaccel.cli.commands.<command>.EXAMPLES")
    return {c.name: c.examples for c in core()}
