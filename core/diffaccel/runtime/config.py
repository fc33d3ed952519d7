"""TOML configs: a ``[model]`` table and an ordered ``[[strategy]]`` array of tables.

Decoded into frozen attrs classes. Every mistake raises ``ConfigError`` with one line naming the
file, the table and the key, what was wrong and what is allowed.

    [model]
    adapter = "text"          # an installed adapter (`diffaccel plugins`): text, unet, ...
    checkpoint = "default"    # a shipped model name, a local path or a hub id
    steps = 128
    seed = 0

    [[strategy]]
    use = "swd"               # strategy name, see `diffaccel plugins`
    tau = 0.9

    [guard]                   # optional: checks of the run beside the strategies (diffaccel.runtime.guard)
    every = 10                # quality guard: a full step beside the strategies' every 10 steps

    [[peer]]                  # optional: another library's accelerator for `bench` to compare
    use = "deepcache"         # offered by the adapter (unet: deepcache)
    cache_interval = 3
"""

from __future__ import annotations

import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import attrs

from ..contract.errors import ConfigError, ConfigValueError
from ..contract.validators import non_empty, one_of, positive
from .guard import GuardConfig, on_error_value
from .placement import DTYPES, check_placement


@attrs.frozen(kw_only=True)
class ModelConfig:
    """Keys of ``[model]`` common to every adapter; adapter-specific keys live in its options class."""

    adapter: str = attrs.field(validator=non_empty)
    """Which adapter drives sampling: an entry-point name of the ``diffaccel.adapters`` group
    (shipped: ``text`` for diffusion LMs, ``unet`` for Stable Diffusion UNets)."""
    checkpoint: str = attrs.field(default="default", validator=non_empty)
    """A model shipped with diffaccel (see the adapter), a local folder, or a hub id."""
    steps: int | None = attrs.field(default=None, validator=positive)
    """Denoising steps (default: the adapter's)."""
    seed: int = 0
    """Seed of the first batch row; row i uses seed + i."""
    batch: int = attrs.field(default=1, validator=positive)
    """Samples generated together."""
    device: str = attrs.field(default="cpu", validator=non_empty)
    """torch device, e.g. ``cpu``, ``cuda`` or ``cuda:1``; checked before loading (``diffaccel.runtime.placement``)."""
    dtype: str = attrs.field(default="float32", validator=one_of(DTYPES))
    """The denoiser's weights and activations: ``float32``, ``bfloat16`` or ``float16`` (where the device
    has its kernels). Strategies' caches follow it; the text adapter's judge keeps its own (float32)."""
    allow_pickle: bool = False
    """Read a pickled checkpoint (``.bin``, ``.pt``, ``.ckpt``) where no safetensors exist, through
    ``torch.load(weights_only=True)`` only; by default such a checkpoint is refused."""


CORE_STRATEGY_KEYS = ("on_error", "max_cache_mb")
"""Keys of every ``[[strategy]]`` table that the core reads, beside ``use`` (not the strategy's)."""


@attrs.frozen(kw_only=True)
class StrategyEntry:
    """One ``[[strategy]]`` table, decoded."""

    name: str
    index: int
    """1-based position in the file, as in messages (``[[strategy]] #2``)."""
    config: Any
    on_error: str = "raise"
    """The table's ``on_error`` key: ``raise`` (an exception in one of its hooks ends the run
    with one line naming it) or ``disable`` (the run goes on without it; the report says so)."""
    max_cache_mb: float | None = None
    """The table's ``max_cache_mb`` key: the most MiB the strategy's state may hold in a
    generation (``diffaccel_memory``, else its ``run.state`` tensors, checked before each step).
    Past it the strategy is dropped for the rest of the generation, its state released: the
    remaining steps are computed in full and the run report's ``reliability`` says when and why."""


@attrs.frozen(kw_only=True)
class PeerEntry:
    """One ``[[peer]]`` table, decoded: an accelerator from another library (the adapter's
    ``PEERS``) that ``bench`` runs as its own entry, on the same pipeline, instead of strategies."""

    name: str
    index: int
    config: Any


@attrs.frozen(kw_only=True)
class RunConfig:
    model: ModelConfig
    options: Any
    """The adapter's options (adapter-specific ``[model]`` keys), decoded."""
    strategies: tuple[StrategyEntry, ...] = ()
    source: str = "<config>"
    peers: tuple[PeerEntry, ...] = ()
    """``[[peer]]`` tables in file order; only ``bench`` runs them."""
    guard: GuardConfig = GuardConfig()
    """The ``[guard]`` table: non-finite check and quality guard (``diffaccel.runtime.guard``)."""
    name: str | None = None
    """Its ``bench`` entry name when not the file's stem (``bench --grid``: the stem and the values)."""

    def without_strategies(self) -> "RunConfig":
        return attrs.evolve(self, strategies=())


# ---- decoding ------------------------------------------------------------------------------

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, tuple):
        (arg, *_) = typing.get_args(tp) or (Any,)
        plural = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}
        return f"a list of {plural.get(arg, 'values')}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))


def _check_type(value: Any, tp: Any) -> tuple[bool, Any]:
    """Return (ok, converted value). Ints are accepted where floats are expected."""
    if tp is Any:
        return True, value
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return True, None
                continue
            ok, conv = _check_type(value, arg)
            if ok:
                return True, conv
        return False, value
    if origin in (list, tuple):
        if not isinstance(value, list):
            return False, value
        arg = (typing.get_args(tp) or (Any,))[0]
        out = []
        for item in value:
            ok, conv = _check_type(item, arg)
            if not ok:
                return False, value
            out.append(conv)
        return True, tuple(out) if origin is tuple else out
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    return True, value


def structure(cls: type, table: dict[str, Any], where: str, *, extra_ok: tuple[str, ...] = ()) -> Any:
    """Build ``cls`` from a TOML table; ``where`` prefixes every message (``file: [table]``).

    Hand-written rather than cattrs (considered for issue 19): the checks are strict (no string
    to number coercion, a bool is no int, ints are accepted as floats) and every failure is one
    line naming the key and the expected type; cattrs would need a structure hook per primitive
    and a translation of its grouped exceptions, so it would add a dependency and remove no code."""
    attrs.resolve_types(cls)
    fields = {f.name: f for f in attrs.fields(cls) if f.init}
    unknown = [k for k in table if k not in fields and k not in extra_ok]
    if unknown:
        allowed = ", ".join(sorted([*fields, *extra_ok])) or "(none)"
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'; allowed keys: {allowed}")
    kwargs = {}
    for name, f in fields.items():
        if name not in table:
            if f.default is attrs.NOTHING:
                raise ConfigError(f"{where}: missing key '{name}'")
            continue
        ok, value = _check_type(table[name], f.type)
        if not ok:
            raise ConfigError(f"{where}: key '{name}': expected {_type_name(f.type)}, got {table[name]!r}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {_attrs_message(exc)}") from None


def _attrs_message(exc: Exception) -> str:
    """One line for an error raised by an ``attrs.validators`` validator, whose args are
    (message, attribute, expected, value) and whose str() is that raw tuple."""
    args = exc.args
    if len(args) < 4 or not isinstance(args[1], attrs.Attribute):
        return str(exc)
    name, expected, value = args[1].name, args[2], args[3]
    if isinstance(expected, (list, tuple, set, frozenset, dict)):
        allowed = ", ".join(repr(v) for v in (sorted(expected, key=repr) if isinstance(expected, (set, frozenset)) else expected))
        return f"key '{name}': must be one of {allowed}, got {value!r}"
    if isinstance(expected, type) or (isinstance(expected, tuple) and all(isinstance(t, type) for t in expected)):
        return f"key '{name}': expected {getattr(expected, '__name__', expected)}, got {value!r}"
    return f"key '{name}': {args[0]}"


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a UTF-8 text file") from None


def load_config(path: str | Path, registry=None) -> RunConfig:
    """Read and validate a config file. Raises ``ConfigError`` with a one-line message."""
    return parse_config(read_toml(path), source=str(path), registry=registry)


NO_ADAPTERS = ("none installed (adapters register in the 'diffaccel.adapters' entry-point group; "
               "an install older than that has none: reinstall diffaccel, e.g. make setup)")


def _model_table(data: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """The tables of a config and its ``[model]`` adapter name, checked without importing any adapter."""
    from .adapters_registry import adapter_names

    unknown = [k for k in data if k not in ("model", "strategy", "peer", "guard")]
    if unknown:
        raise ConfigError(f"{source}: unknown table [{unknown[0]}]; allowed: [model], [[strategy]], [[peer]] and [guard]")
    if "model" not in data:
        raise ConfigError(f"{source}: missing table [model] (with at least adapter = \"text\" or \"unet\")")
    if not isinstance(data["model"], dict):
        raise ConfigError(f"{source}: 'model' must be a table, written [model]")
    model_table = dict(data["model"])
    adapter = model_table.get("adapter")
    names = adapter_names()
    if adapter not in names:
        shown = "missing" if adapter is None else repr(adapter)
        raise ConfigError(f"{source}: [model]: key 'adapter': {shown}; allowed: {', '.join(map(repr, names)) or NO_ADAPTERS}")
    return model_table, adapter


def _model(model_table: dict[str, Any], options_cls: type, where: str) -> tuple[ModelConfig, Any]:
    option_keys = tuple(f.name for f in attrs.fields(options_cls))
    common = {k: v for k, v in model_table.items() if k not in option_keys}
    model = structure(ModelConfig, common, where, extra_ok=option_keys)
    options = structure(options_cls, {k: v for k, v in model_table.items() if k in option_keys}, where)
    return model, options


@attrs.frozen
class Precheck:
    """What a config says before any adapter or plugin is imported (``precheck_config``)."""

    source: str
    adapter: str
    spec: Any
    """The adapter's light spec (``adapters_registry.adapter_spec``: ``Options``, ``output_suffix``), or None."""
    model: ModelConfig | None
    """``[model]`` decoded, when the adapter has a light spec (else None: its keys are checked at load)."""


def precheck_config(path: str | Path) -> Precheck:
    """The checks of a config that import no adapter, no plugin and no model library: the file,
    its TOML, its tables, the adapter's name, and ``[model]``'s keys and values where the adapter
    declares its options lightly. Same ``ConfigError`` lines as ``load_config``, which repeats them."""
    from .adapters_registry import adapter_spec

    source = str(path)
    table, adapter = _model_table(read_toml(path), source)
    spec = adapter_spec(adapter)
    model = _model(table, spec.Options, f"{source}: [model]")[0] if spec is not None else None
    return Precheck(source=source, adapter=adapter, spec=spec, model=model)


def parse_config(data: dict[str, Any], source: str = "<config>", registry=None) -> RunConfig:
    from .adapters_registry import get_adapter
    from ..contract.capabilities import describe, missing
    from .registry import Registry

    model_table, adapter = _model_table(data, source)
    where = f"{source}: [model]"
    adapter_obj = get_adapter(adapter, where=where)
    model, options = _model(model_table, adapter_obj.Options, where)
    problem = check_placement(model.device, model.dtype)
    if problem:
        raise ConfigError(f"{where}: {problem}")

    raw = data.get("strategy", [])
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"{source}: 'strategy' must be an array of tables, written [[strategy]]")
    registry = registry if registry is not None else (Registry() if raw else None)
    entries: list[StrategyEntry] = []
    seen: set[str] = set()
    for i, table in enumerate(raw, start=1):
        where = f"{source}: [[strategy]] #{i}"
        installed = ", ".join(sorted(registry.strategies)) or "none installed"
        name = table.get("use")
        if name is None:
            raise ConfigError(f"{where}: missing key 'use' (the strategy name); installed: {installed}")
        if not isinstance(name, str):
            raise ConfigError(f"{where}: key 'use': expected a string, got {name!r}; installed: {installed}")
        spec = registry.get(name)
        if spec is None:
            raise ConfigError(f"{where}: {registry.unknown_strategy(name)}")
        where = f"{source}: [[strategy]] #{i} ({name})"
        gone = missing(spec.requires, adapter_obj.capabilities)
        if gone:
            raise ConfigError(
                f"{where}: strategy '{name}' requires capability {describe(gone[0])}, which adapter '{adapter}' "
                f"does not declare; it declares: {', '.join(sorted(adapter_obj.capabilities)) or 'none'}"
            )
        if name in seen:
            raise ConfigError(f"{where}: strategy '{name}' is listed twice; list each strategy once")
        seen.add(name)
        params = {k: v for k, v in table.items() if k != "use"}
        on_error = table.get("on_error", "raise")
        bound = table.get("max_cache_mb")
        try:
            on_error_value(on_error)
            if bound is not None and (not isinstance(bound, (int, float)) or isinstance(bound, bool) or bound <= 0):
                raise ConfigValueError("max_cache_mb", f"must be a positive number of MiB, got {bound!r}")
        except ConfigValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        entries.append(StrategyEntry(name=name, index=i, on_error=on_error, max_cache_mb=bound,
                                     config=structure(spec.config, params, where, extra_ok=CORE_STRATEGY_KEYS)))
    peers = _parse_peers(data.get("peer", []), adapter, source)
    _check_peers(model, options, peers, source)
    raw_guard = data.get("guard", {})
    if not isinstance(raw_guard, dict):
        raise ConfigError(f"{source}: 'guard' must be a table, written [guard]")
    guard = structure(GuardConfig, raw_guard, f"{source}: [guard]")
    return RunConfig(model=model, options=options, strategies=tuple(entries), source=source, peers=peers, guard=guard)


def _parse_peers(raw: Any, adapter: str, source: str) -> tuple[PeerEntry, ...]:
    """Decode ``[[peer]]`` tables against the peers the adapter offers (its ``PEERS`` dict)."""
    from .adapters_registry import get_adapter

    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"{source}: 'peer' must be an array of tables, written [[peer]]")
    offered: dict[str, type] = dict(get_adapter(adapter).PEERS) if raw else {}
    available = ", ".join(sorted(offered)) or "none"
    peers: list[PeerEntry] = []
    for i, table in enumerate(raw, start=1):
        where = f"{source}: [[peer]] #{i}"
        name = table.get("use")
        if name is None:
            raise ConfigError(f"{where}: missing key 'use' (the peer name); adapter '{adapter}' offers: {available}")
        if not isinstance(name, str):
            raise ConfigError(f"{where}: key 'use': expected a string, got {name!r}; adapter '{adapter}' offers: {available}")
        if name not in offered:
            raise ConfigError(f"{where}: unknown peer '{name}'; adapter '{adapter}' offers: {available}")
        params = {k: v for k, v in table.items() if k != "use"}
        peers.append(PeerEntry(name=name, index=i, config=structure(offered[name], params, f"{where} ({name})")))
    return tuple(peers)


def _check_peers(model: ModelConfig, options: Any, peers: tuple[PeerEntry, ...], source: str) -> None:
    """The adapter's checks of peers against the [model] table (``check_peers``), if it has any."""
    from .adapters_registry import get_adapter

    check = getattr(get_adapter(model.adapter), "check_peers", None) if peers else None
    if check is not None:
        check(model, options, peers, source)
