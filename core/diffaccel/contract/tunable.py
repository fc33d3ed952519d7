"""``Tunable``: one parameter of a strategy that ``diffaccel tune`` may set, as a plugin's
``diffaccel_tunables`` hook returns it. In the contract because a hook returns it: a plugin or an
adapter builds it without importing the tuner (``diffaccel.tuning``, the top layer, searches over
it). Also ``diffaccel.Tunable``. It lived in ``diffaccel.tuning.search`` until 0.2: that path still
gives it, with a DeprecationWarning, until 0.3.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class Tunable:
    """One parameter of a strategy that ``tune`` may set (returned from ``diffaccel_tunables``)."""

    key: str
    """The strategy's config key."""
    low: float | None = None
    """Lowest value (numeric parameters)."""
    high: float | None = None
    """Highest value (numeric parameters)."""
    choices: tuple[Any, ...] | None = None
    """The values to choose among (categorical parameters); then ``low``/``high`` are unused."""
    log: bool = False
    """Sample on a log scale (thresholds spanning decades)."""
    integer: bool = False
    """An integer parameter (intervals, windows, block counts)."""

    def __attrs_post_init__(self) -> None:
        if self.choices is None and (self.low is None or self.high is None or self.low > self.high):
            raise ValueError(f"tunable '{self.key}': give choices, or low <= high")
        if self.log and self.choices is None and self.low <= 0:
            raise ValueError(f"tunable '{self.key}': a log scale needs low > 0")

    def suggest(self, trial: Any, name: str) -> Any:
        """This parameter's value in ``trial`` (an optuna trial, named ``name`` there)."""
        if self.choices is not None:
            return trial.suggest_categorical(name, list(self.choices))
        if self.integer:
            return trial.suggest_int(name, int(self.low), int(self.high), log=self.log)
        # three significant digits: the value measured is the value a TUNED.toml writes
        return float(f"{trial.suggest_float(name, float(self.low), float(self.high), log=self.log):.3g}")
