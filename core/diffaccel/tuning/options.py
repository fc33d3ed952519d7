"""``TuneOptions``: how ``diffaccel tune`` searches and validates, one record instead of a long
keyword list.

``tune(config, budget, out, TuneOptions(trials=60))``. The old keyword form
(``tune(config, budget, out, trials=60, ...)``) still works until 0.3, with one
DeprecationWarning naming ``TuneOptions``. What a tune runs on rather than how (``registry``,
and for a loaded pipeline ``model`` and ``strategies``) stays a keyword of ``tune``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

DEFAULT_HELDOUT_SEED = 100_000
"""First held-out seed: far from the seeds configs and benches use, so the ranges stay disjoint."""


@attrs.frozen(kw_only=True)
class TuneOptions:
    trials: int = 30
    """Trials of the search (a resumed study counts the ones it has)."""
    tune_seeds: int = 8
    """Seeds each trial runs on, from the config's seed."""
    heldout: int = 32
    """Held-out samples the candidates are benched on."""
    heldout_seed: int = DEFAULT_HELDOUT_SEED
    batch: int | None = None
    """The larger held-out batch (default: the config's batch, or 8 if that is 1)."""
    judge: str | None = "default"
    candidates: int = 3
    """The best feasible points benched on the held-out seeds (beside the config as given)."""
    report: str | Path | None = None
    """The report folder (default ``OUT.tune/``): the study, the held-out benches, the figures."""
    progress: bool = True
    search_seed: int = 0
    model_space: dict[str, Sequence[Any]] | None = None
    """``[model]`` keys searched too, {"steps": (8, 10), "scheduler": ("dpm++2m",)} (``tune_model``)."""

    def check(self) -> None:
        from ..contract.errors import ConfigError

        for name, v in (("--trials", self.trials), ("--tune-seeds", self.tune_seeds), ("--heldout", self.heldout),
                        ("--candidates", self.candidates)):
            if v < 1:
                raise ConfigError(f"{name} must be 1 or more, got {v}")
