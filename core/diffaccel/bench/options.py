"""``BenchOptions``: how a bench runs (``run_bench``, ``run_prompt_bench``), one record instead of
a long keyword list.

``run_bench(paths, BenchOptions(seeds=8, judge="default"))``. The old keyword form
(``run_bench(paths, seeds=8, ...)``) still works until 0.3, with one DeprecationWarning naming
``BenchOptions``. What a bench runs on rather than how (``registry``, ``pipe``, ``keep_outputs``)
stays a keyword of ``run_bench``.
"""

from __future__ import annotations

import warnings
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class BenchOptions:
    seeds: int = 3
    """Seeds per entry (each seed ``batch`` rows: seed k starts at ``seed + k * batch``)."""
    repeats: int = 1
    """Timed passes over the seeds (the outputs of the first are kept)."""
    json_path: str | None = None
    """Write the result there (``bench --json``)."""
    noise_floor: bool = True
    """Score the adapter's reference run (the noise floor of its metrics), where it has one."""
    progress: bool = True
    plot_dir: str | None = None
    """Where the strategies' own plots go (``diffaccel_bench_plot``, ``bench --plots``)."""
    batch: int | None = None
    """Overrides every config's ``[model] batch`` (rows per call)."""
    seed: int | None = None
    """Overrides every config's first seed."""
    judge: str | None = None
    """A judge the adapter's ``load_judge`` knows; "default": the adapter's own, if it loads (else
    a note in the result); None or "none": no judge."""
    judge_noise: bool | None = None
    """Also score the baseline on as many seeds again for ``gen_ppl_noise`` (default: as ``noise_floor``)."""
    timed: bool = True
    """False (``bench --quality-only``): every entry once per seed, no warm-up, no clock (speedup None)."""
    grid: list[Any] | None = None
    """``bench --grid``: the options as typed (``["tau=0.01,0.5", "swd.R=1,2"]``) or
    ``diffaccel.bench.grid.Axis`` list; each config with strategies becomes one entry per
    combination of values."""
    solver_line: bool = False
    """Add the adapter's fewer-steps and solver peers (``bench_variants``, ``bench --solver-line``)."""


def options_from(cls: type, options: Any, old: dict[str, Any], where: str) -> Any:
    """``options`` (an instance of ``cls``, or None: the defaults), or one built from the old
    keyword form ``old`` with a DeprecationWarning naming ``cls`` (``where``: the function)."""
    if not old:
        return options if options is not None else cls()
    names = {f.name for f in attrs.fields(cls)}
    unknown = sorted(set(old) - names)
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument '{unknown[0]}'")
    if options is not None:
        raise TypeError(f"{where}(): give {cls.__name__} or the old keywords, not both")
    warnings.warn(f"{where}({', '.join(f'{k}=...' for k in old)}) is deprecated; pass "
                  f"{cls.__module__}.{cls.__name__}({', '.join(f'{k}=...' for k in old)})", DeprecationWarning, stacklevel=3)
    return cls(**old)
