"""What a plugin registers: ``Strategy``, a name as written in configs and how to build it.

Part of the contract a plugin is written against (``diffaccel.Strategy``); the registry that
collects them is ``diffaccel.runtime.registry``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class Strategy:
    """What a plugin registers: a strategy name as written in configs and how to build it."""

    name: str
    """Name used in ``[[strategy]] use = "..."``."""
    config: type
    """Frozen, keyword-only attrs class of the strategy's parameters."""
    factory: Callable[[Any], Any]
    """Called with a config instance; returns the object whose hookimpls run."""
    requires: tuple[str | tuple[str, ...], ...] = attrs.field(default=(), converter=lambda r: tuple(
        x if isinstance(x, str) else tuple(x) for x in r))
    """Capabilities the model must offer (``diffaccel.contract.capabilities``); a tuple inside stands for
    alternatives, e.g. ``((TOKEN_POSITIONS, BLOCK_STACK),)``: either will do. Never adapter names."""
    description: str = ""
    """One line for ``diffaccel plugins``."""
    reports: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """Quality keys its ``diffaccel_bench_quality`` adds to a bench (``diffaccel tune``'s budgets
    may name them, e.g. ``key_term_recall>=0.95``)."""
    plugin: str = ""
    """Entry-point name of the plugin that registered it (set by the registry)."""
