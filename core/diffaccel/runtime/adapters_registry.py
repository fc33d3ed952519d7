"""Where the core finds adapters: the ``diffaccel.adapters`` entry-point group, loaded on first use.

Every adapter, the shipped ones included, is a distribution's entry point
``name = "module:object"``; the object must conform to ``diffaccel.contract.adapter.Adapter``. This module
knows no adapter by name.

Blocking: ``DIFFACCEL_BLOCK_PLUGINS`` names adapters never to load, as it names plugins (a
shipped adapter included); ``DIFFACCEL_PLUGINS``, the list of plugins to load, also lists the
third-party adapters to load (the shipped adapters, part of diffaccel itself, always load unless
blocked by name). A blocked adapter is not installed as far as diffaccel is concerned: configs
naming it are refused listing the installed ones.

Selection (``adapter_for``, ``diffaccel.apply(pipe)`` without a config), when several adapters
accept a pipeline, deterministic and most specific first:

1. a config's ``[model] adapter`` always wins (``diffaccel.apply(pipe, config)``);
2. the adapter that loaded the pipeline, when the pipeline names it (its ``adapter`` attribute,
   as ``TextAdapter.load`` sets) and it accepts it;
3. an adapter whose class derives from another accepting adapter's class before that one (a
   subclass of ``TextAdapter`` before ``text``);
4. a third-party adapter before a shipped one (the shipped adapters are the general ones);
5. then by name.
"""

from __future__ import annotations

import importlib.metadata as md
from typing import Any

import attrs

from ..contract.errors import ConfigError, DiffaccelError, PluginError

GROUP = "diffaccel.adapters"
SHIPPED = "diffaccel"
"""The distribution of the shipped adapters."""

_loaded: dict[str, Any] = {}
_dists: dict[str, str] = {}  # a loaded adapter's distribution


def _distribution(ep: md.EntryPoint) -> str:
    return ep.dist.metadata["name"] if ep.dist else "?"


def _blocked_name(name: str, dist: str) -> bool:
    """Whether the environment blocks adapter ``name`` of distribution ``dist`` (see the module
    docstring); read at every use, as the plugins' registry reads it."""
    from .registry import env_allows

    return not env_allows(name, shipped=dist == SHIPPED)


def _blocked(ep: md.EntryPoint) -> bool:
    return _blocked_name(ep.name, _distribution(ep))


def _entry_points() -> dict[str, md.EntryPoint]:
    eps: dict[str, md.EntryPoint] = {}
    for ep in md.entry_points(group=GROUP):
        if not _blocked(ep):
            eps.setdefault(ep.name, ep)  # the same distribution seen twice on sys.path
    return eps


def adapter_names(shipped: bool = False) -> tuple[str, ...]:
    """Names of the installed adapters (entry-point names), sorted; imports none of them.
    ``shipped``: diffaccel's own only (generated docs, the project's tests)."""
    return tuple(sorted(n for n, ep in _entry_points().items() if not shipped or _distribution(ep) == SHIPPED))


def get_adapter(name: str, *, where: str = "") -> Any:
    """The adapter registered under ``name``, loaded and checked against the ``Adapter`` protocol.

    An unknown name raises ``ConfigError`` (prefixed by ``where``, e.g. ``file: [model]``) listing
    the installed adapters; a broken one raises ``PluginError`` naming its distribution."""
    adapter = _loaded.get(name)
    if adapter is not None and not _blocked_name(name, _dists.get(name, "?")):
        return adapter
    ep = _entry_points().get(name)
    if ep is None:
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}key 'adapter': {name!r} is not an installed adapter; "
                          f"installed: {', '.join(map(repr, adapter_names())) or 'none'}")
    dist = _distribution(ep)
    try:
        adapter = ep.load()
    except Exception as exc:  # a broken third-party adapter must not look like our bug
        raise PluginError(f"adapter '{name}' (distribution {dist}) failed to load: {type(exc).__name__}: {exc}") from None
    _check(adapter, name, dist)
    _loaded[name], _dists[name] = adapter, dist
    return adapter


def _check(adapter: Any, name: str, dist: str) -> None:
    from ..contract.adapter import missing_members

    gone = missing_members(adapter)
    if gone:
        raise PluginError(f"adapter '{name}' (distribution {dist}) does not implement the Adapter protocol: "
                          f"missing {', '.join(gone)}")
    if getattr(adapter, "name", None) != name:
        raise PluginError(f"adapter '{name}' (distribution {dist}) calls itself {getattr(adapter, 'name', None)!r}; "
                          f"its name must be its entry-point name")


SPEC_GROUP = "diffaccel.adapters.options"


def adapter_spec(name: str) -> Any | None:
    """The light part of adapter ``name`` (entry-point group ``diffaccel.adapters.options``): an
    object with its ``Options`` class and, for adapters that write files of one kind, its
    ``output_suffix``, importable without the adapter's model libraries, so that the command line
    checks ``[model]`` and ``--out`` in well under a second. None when the adapter declares none,
    or when it does not load (the adapter itself then reports why, when it is imported)."""
    for ep in md.entry_points(group=SPEC_GROUP):
        if ep.name == name:
            try:
                spec = ep.load()
            except Exception:  # noqa: BLE001 - get_adapter names the distribution and the error
                return None
            options = getattr(spec, "Options", None)
            return spec if isinstance(options, type) and attrs.has(options) else None
    return None


def adapter_options(name: str) -> type:
    """The attrs class of the adapter-specific keys of ``[model]``."""
    return get_adapter(name).Options


def adapter_for(pipe: Any) -> Any:
    """The adapter that drives ``pipe``, most specific first when several accept it (the module
    docstring's rule); raises DiffaccelError if none does."""
    names = adapter_names()
    loaded_by = getattr(pipe, "adapter", None)
    if isinstance(loaded_by, str) and loaded_by in names:
        adapter = get_adapter(loaded_by)
        if adapter.accepts(pipe):
            return adapter
    accepting = [get_adapter(name) for name in names]
    accepting = [a for a in accepting if a.accepts(pipe)]
    if accepting:
        return min(accepting, key=lambda a: _specificity(a, accepting))
    compiled = [k for k, v in vars(pipe).items() if type(v).__name__ == "OptimizedModule"] if hasattr(pipe, "__dict__") else []
    if compiled:  # torch.compile(pipe.unet): the blocks diffaccel routes are inside one compiled graph
        raise DiffaccelError(f"pipe.{compiled[0]} is torch.compile'd as a whole; diffaccel routes its blocks through "
                             f"the strategies: compile the blocks in place instead (block.compile() for each block, "
                             f"docs/compile.md), or apply diffaccel to the uncompiled pipeline")
    raise DiffaccelError(f"no diffaccel adapter drives a {type(pipe).__name__}; adapters: {', '.join(names)}")


def _specificity(adapter: Any, accepting: list[Any]) -> tuple[int, bool, str]:
    """Sort key, most specific first: more accepting adapters it derives from, third-party
    before shipped, then its name."""
    cls = adapter if isinstance(adapter, type) else type(adapter)
    bases = sum(1 for other in accepting if other is not adapter
                and issubclass(cls, other if isinstance(other, type) else type(other))
                and cls is not (other if isinstance(other, type) else type(other)))
    return (-bases, _distribution(_entry_points()[adapter.name]) == SHIPPED, adapter.name)


def describe_adapters(shipped: bool = False) -> list[dict[str, Any]]:
    """One row per installed adapter (``shipped``: diffaccel's own only): name, distribution,
    version, capabilities, option keys, peers."""
    rows = []
    for name, ep in sorted(_entry_points().items()):
        if shipped and _distribution(ep) != SHIPPED:
            continue
        adapter = get_adapter(name)
        rows.append({"name": name, "distribution": ep.dist.metadata["name"] if ep.dist else "-",
                     "version": ep.dist.version if ep.dist else "-", "object": ep.value,
                     "capabilities": sorted(adapter.capabilities),
                     "options": [f.name for f in attrs.fields(adapter.Options)],
                     "peers": sorted(adapter.PEERS)})
    return rows
