"""What the core did for a run's reliability, kept on ``RunState.reliability``.

It lives in the contract layer beside the run state (the state holds one); the guard and the
accelerator (``diffaccel.runtime``) fill it in.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define
class Reliability:
    """What the core did for a run's reliability (``RunState.reliability``; in the report when
    anything happened)."""

    disabled: list[dict[str, Any]] = attrs.Factory(list)
    """Strategies dropped for the rest of the run (``on_error = "disable"`` or the guard):
    strategy, hook, step, error."""
    nonfinite_recomputed: int = 0
    """Steps whose output held NaN or inf with strategies active, recomputed without them."""
    guard_checks: int = 0
    """Steps the quality guard computed in full beside the strategies' step."""
    guard_trips: int = 0
    """Of those, how many were past the threshold (then reset or disabled)."""
    guard_resets: int = 0
    """Times every strategy's per-run state was dropped by the guard."""
    guard_max_error: float = 0.0
    """Largest relative error the guard saw."""

    def as_dict(self) -> dict[str, Any] | None:
        d = attrs.asdict(self)
        return d if any(d.values()) else None
