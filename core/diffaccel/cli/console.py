"""The command line's stderr: one line per message, ``--debug``, diffaccel's warnings as lines."""

from __future__ import annotations

import os
import sys


def say(line: str) -> None:
    """One line on stderr in one write: processes of one launch share the stream, and print's
    separate write of the newline lets their lines run together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def debugging(args) -> bool:
    """``--debug`` or ``DIFFACCEL_DEBUG`` (tracebacks, and notes a normal run keeps quiet)."""
    return bool(getattr(args, "debug", False)) or os.environ.get("DIFFACCEL_DEBUG", "") not in ("", "0")


def warnings_as_lines() -> None:
    """diffaccel's own warnings (a plugin left out as broken) as one stderr line each, no source line."""
    import warnings

    from ..runtime.registry import PluginWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PluginWarning):
            say(f"diffaccel: warning: {message}")
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
