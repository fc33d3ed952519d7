"""``bench --grid [STRATEGY.]KEY=V1,V2,...``: one config's strategy over a parameter grid.

Each config with strategies becomes one bench entry per combination of the grid's values (the
product over every ``--grid``), named by them (``text-swd[threshold=0.05]``), each decoded and
validated exactly as a config file with those values written in would be, before any model
loads. Values are TOML values (``0.05``, ``3``, ``true``, ``"x"``); a bare word is a string.
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from pathlib import Path
from typing import Any

import attrs

from ..contract.errors import ConfigError

FORM = "--grid [STRATEGY.]KEY=V1,V2,... (e.g. --grid threshold=0.05,0.1,0.2 or --grid swd.tau=0.8,0.9)"


@attrs.frozen
class Axis:
    """One ``--grid`` option."""

    strategy: str | None
    """The strategy's name (``use``) when given as ``STRATEGY.KEY``; else the config's one strategy with KEY."""
    key: str
    values: tuple[Any, ...]
    raw: tuple[str, ...]
    """The values as typed, for entry names."""


def _value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word: a string


def parse_grid(specs: list[str] | tuple[str, ...]) -> list[Axis]:
    """The ``--grid`` options, checked for their form only (no config, no plugin is read)."""
    axes: list[Axis] = []
    for spec in specs:
        name, eq, values = spec.partition("=")
        raws = tuple(v.strip() for v in values.split(",")) if eq else ()
        if not name.strip() or not raws or any(not r for r in raws):
            raise ConfigError(f"--grid {spec!r}: expected {FORM}")
        strategy, _, key = name.strip().rpartition(".")
        if any((a.strategy, a.key) == (strategy or None, key) for a in axes):
            raise ConfigError(f"--grid {spec!r}: {name.strip()} is given twice; give each key once, with all its values")
        if len(set(raws)) != len(raws):
            raise ConfigError(f"--grid {spec!r}: a value is listed twice")
        axes.append(Axis(strategy=strategy or None, key=key, values=tuple(_value(r) for r in raws), raw=raws))
    return axes


def _table(data: dict[str, Any], axis: Axis, source: str, registry) -> dict[str, Any]:
    """The ``[[strategy]]`` table of ``data`` that ``axis`` sets."""
    tables = [t for t in data.get("strategy", []) if isinstance(t, dict)]
    if axis.strategy is not None:
        found = [t for t in tables if t.get("use") == axis.strategy]
        if not found:
            raise ConfigError(f"{source}: --grid {axis.strategy}.{axis.key}: the config has no [[strategy]] use = "
                              f"'{axis.strategy}'; it uses: {', '.join(str(t.get('use')) for t in tables) or 'none'}")
        return found[0]
    having = []
    for t in tables:
        spec = registry.get(t.get("use")) if isinstance(t.get("use"), str) else None
        if spec is not None and axis.key in {f.name for f in attrs.fields(spec.config)}:
            having.append(t)
    if len(having) != 1:
        why = "no strategy of the config has" if not having else "several strategies have"
        raise ConfigError(f"{source}: --grid {axis.key}: {why} a key '{axis.key}'; write STRATEGY.KEY, "
                          f"strategies: {', '.join(str(t.get('use')) for t in tables) or 'none'}")
    return having[0]


def expand(path: str, axes: list[Axis], registry) -> list[Any]:
    """The configs of ``path`` over the grid, each a ``RunConfig`` named by its values, validated."""
    from ..runtime.config import parse_config, read_toml

    data = read_toml(path)
    stem = Path(path).stem
    configs = []
    for combo in itertools.product(*[range(len(a.values)) for a in axes]):
        point = copy.deepcopy(data)
        for axis, i in zip(axes, combo):
            _table(point, axis, path, registry)[axis.key] = axis.values[i]
        label = ",".join(f"{a.key}={a.raw[i]}" for a, i in zip(axes, combo))
        cfg = parse_config(point, source=f"{path} (--grid {label})", registry=registry)
        configs.append(attrs.evolve(cfg, name=f"{stem}[{label}]"))
    return configs
