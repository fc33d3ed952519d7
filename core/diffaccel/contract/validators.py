"""Pure validators for frozen attrs config classes; each failure names the key and what is allowed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .errors import ConfigValueError


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def in_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Callable:
    """Value must lie in the interval; open ends are excluded. ``None`` is unbounded."""
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    text = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"

    def check(_inst, attribute, value):
        if value is None:
            return
        ok = _is_number(value)
        if ok and lo is not None:
            ok = value > lo if lo_open else value >= lo
        if ok and hi is not None:
            ok = value < hi if hi_open else value <= hi
        if not ok:
            raise ConfigValueError(attribute.name, f"must be in {text}, got {value!r}")

    return check


def positive(_inst, attribute, value):
    """Strictly positive number."""
    if value is not None and not (_is_number(value) and value > 0):
        raise ConfigValueError(attribute.name, f"must be positive, got {value!r}")


def non_negative(_inst, attribute, value):
    if value is not None and not (_is_number(value) and value >= 0):
        raise ConfigValueError(attribute.name, f"must be 0 or more, got {value!r}")


def one_of(choices: Iterable[str]) -> Callable:
    allowed = tuple(choices)

    def check(_inst, attribute, value):
        if value is not None and value not in allowed:
            raise ConfigValueError(attribute.name, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")

    return check


def non_empty(_inst, attribute, value):
    if value is not None and len(value) == 0:
        raise ConfigValueError(attribute.name, "must not be empty")
