"""The bench's result as typed records: ``BenchResult`` (what ``run_bench`` and
``run_prompt_bench`` return, what ``bench --json`` writes), its ``Entry`` list and the facts,
timing, judge and memory records they hold.

The JSON on disk is the same as before the records: a record remembers the keys it was made
with, in their order (``from_dict``, or the keyword arguments of ``new``), and every field set
later joins them at the end; ``to_dict`` writes exactly those keys, ``null`` included where one
was set to None. Keys a record does not know (a newer or an older bench's) are kept as they
came. Quality values (``Entry.quality``, ``quality_ci``) stay dicts: their keys are the
adapter's and the strategies' metrics.

Reading a record as a dict (``result["entries"]``, ``e.get("peer")``) still works until 0.3,
with a DeprecationWarning naming the attribute.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, ClassVar

import attrs


class Record:
    """Base of the bench's records: key order kept, unknown keys kept, dict reads deprecated."""

    _nested: ClassVar[dict[str, Any]] = {}  # field -> record class (or ("list", class))

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_keys", [f.name for f in attrs.fields(type(self))
                                           if f.name != "extra" and getattr(self, f.name) is not None])

    def __setattr__(self, name: str, value: Any) -> None:
        keys = self.__dict__.get("_keys")
        if keys is not None and name in _field_names(type(self)) and name not in keys:
            keys.append(name)
        object.__setattr__(self, name, value)

    @classmethod
    def new(cls, **values: Any) -> Any:
        """A record with exactly ``values``' keys, in their order (None values written as null)."""
        obj = cls(**values)
        object.__setattr__(obj, "_keys", list(values))
        return obj

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        names = _field_names(cls)
        known = {k: _load(cls._nested.get(k), v) for k, v in data.items() if k in names}
        obj = cls(**known, extra={k: v for k, v in data.items() if k not in names})
        object.__setattr__(obj, "_keys", list(data))
        return obj

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for k in self._keys:
            out[k] = _dump(getattr(self, k)) if k in _field_names(type(self)) else self.extra[k]
        return out

    def has(self, key: str) -> bool:
        """Whether the record holds ``key`` (the JSON has it), whatever its value."""
        return key in self._keys

    def drop(self, key: str) -> None:
        """Remove ``key`` from the record (and from its JSON)."""
        if key in self._keys:
            self._keys.remove(key)
        if key in _field_names(type(self)):
            object.__setattr__(self, key, None)
        else:
            self.extra.pop(key, None)

    def put(self, key: str, value: Any) -> None:
        """Set ``key``: a field, or a key the record does not know (kept in ``extra``, written last)."""
        if key in _field_names(type(self)):
            setattr(self, key, value)
            return
        self.extra[key] = value
        if key not in self._keys:
            self._keys.append(key)

    # ---- the dict forms, deprecated -----------------------------------------------------------
    def _old(self, key: str) -> None:
        warnings.warn(f"reading a bench {type(self).__name__} as a dict ([{key!r}], get, ...) is deprecated; "
                      f"use the attribute .{key} (diffaccel.bench.results), to_dict() for the JSON", DeprecationWarning, stacklevel=3)

    def _value(self, key: str) -> Any:
        return getattr(self, key) if key in _field_names(type(self)) else self.extra[key]

    def __getitem__(self, key: str) -> Any:
        self._old(key)
        if key not in self._keys:
            raise KeyError(key)
        return self._value(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._old(key)
        return self._value(key) if key in self._keys else default

    def __contains__(self, key: str) -> bool:
        self._old(key)
        return key in self._keys

    def __setitem__(self, key: str, value: Any) -> None:
        self._old(key)
        self.put(key, value)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._old(key)
        if key not in self._keys:
            self[key] = default
        return self._value(key)

    def pop(self, key: str, *default: Any) -> Any:
        self._old(key)
        if key not in self._keys:
            if default:
                return default[0]
            raise KeyError(key)
        value = self._value(key)
        self.drop(key)
        return value

    def keys(self) -> list[str]:
        self._old("keys")
        return list(self._keys)


def _field_names(cls: type) -> frozenset[str]:
    names = cls.__dict__.get("_names")
    if names is None:
        names = frozenset(f.name for f in attrs.fields(cls)) - {"extra"}
        cls._names = names
    return names


def _load(kind: Any, value: Any) -> Any:
    if kind is None or value is None:
        return value
    if isinstance(kind, tuple):
        return [kind[1].from_dict(v) for v in value]
    return kind.from_dict(value)


def _dump(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list) and value and isinstance(value[0], Record):
        return [v.to_dict() for v in value]
    return value


def _record(cls: type) -> type:
    return attrs.define(slots=False, eq=False, repr=True)(cls)


_extra = attrs.field(factory=dict, repr=False)


@_record
class ModelFacts(Record):
    """``result.model``: what the bench ran (the first config's ``[model]``)."""

    adapter: str | None = None
    checkpoint: str | None = None
    steps: int | None = None
    batch: int | None = None
    device: str | None = None
    dtype: str | None = None
    extra: dict[str, Any] = _extra


@_record
class Timing(Record):
    """``result.timing``: the clock (``DeviceClock.describe``); absent for a quality-only bench."""

    device: str | None = None
    clock: str | None = None
    warmup_runs: int | None = None
    synchronize: str | None = None
    extra: dict[str, Any] = _extra


@_record
class JudgeInfo(Record):
    """``result.judge``: the judge that scored ``gen_ppl`` (or ``note``: why none did)."""

    name: str | None = None
    note: str | None = None
    load_s: float | None = None
    noise_seeds: list[int] | None = None
    noise_runs_s: float | None = None
    score_s: float | None = None
    lines: int | None = None
    tokens: int | None = None
    share_of_wall: float | None = None
    extra: dict[str, Any] = _extra


@_record
class EntryMemory(Record):
    """``entry.memory``: what the entry's strategies held, and on CUDA the allocator's peak."""

    state_mb: float | None = None
    device_peak_mb: float | None = None
    over_baseline_mb: float | None = None
    extra: dict[str, Any] = _extra


@_record
class BenchMemory(Record):
    """``result.memory``: the process's peak RSS, and how device peaks were read."""

    process_peak_rss_mb: float | None = None
    device_peak: str | None = None
    extra: dict[str, Any] = _extra


@_record
class VsModel(Record):
    """``entry.vs_model``: an entry on a variant's model against that model alone."""

    entry: str | None = None
    quality: dict[str, Any] | None = None
    speedup: float | None = None
    extra: dict[str, Any] = _extra


@_record
class Entry(Record):
    """One bench entry: the baseline, a config's strategies, or a peer (``peer``: its table)."""

    _nested: ClassVar[dict[str, Any]] = {"memory": EntryMemory, "vs_model": VsModel}

    name: str | None = None
    speedup: float | None = None
    quality: dict[str, Any] | None = None
    fraction_computed: float | None = None
    strategies: list[str] | None = None
    reports: list[dict[str, Any]] | None = None
    memory: EntryMemory | None = None
    peer: dict[str, Any] | None = None
    speedup_ci: Any = None
    vs_model: VsModel | None = None
    quality_ci: dict[str, Any] | None = None
    quality_ratio_ci: dict[str, Any] | None = None
    judge_per_seed: dict[str, Any] | None = None
    extra: dict[str, Any] = _extra

    @property
    def is_peer(self) -> bool:
        return self.peer is not None


@_record
class BenchResult(Record):
    """What a bench returns and ``bench --json`` writes. ``items``, ``prompts`` and
    ``processes``: a prompt bench's (``bench --prompts``)."""

    _nested: ClassVar[dict[str, Any]] = {"model": ModelFacts, "entries": ("list", Entry), "timing": Timing,
                                         "judge": JudgeInfo, "memory": BenchMemory}

    model: ModelFacts | None = None
    seeds: list[int] | None = None
    repeats: int | None = None
    timed: bool | None = None
    items: int | None = None
    prompts: str | None = None
    processes: int | None = None
    entries: list[Entry] | None = None
    timing: Timing | None = None
    judge: JudgeInfo | None = None
    memory: BenchMemory | None = None
    wall_s: float | None = None
    extra: dict[str, Any] = _extra

    @property
    def is_timed(self) -> bool:
        """False for a quality-only bench (``bench --quality-only``); benches before it were timed."""
        return self.timed is not False

    def entry(self, name: str) -> Entry | None:
        return next((e for e in self.entries if e.name == name), None)

    @property
    def baseline(self) -> Entry | None:
        return self.entry("baseline")

    def by_name(self) -> dict[str, Entry]:
        return {e.name: e for e in self.entries}

    @classmethod
    def from_json(cls, text: str) -> BenchResult:
        return cls.from_dict(json.loads(text))

    def to_json(self, indent: int = 2) -> str:
        """The JSON ``bench --json`` writes (without a trailing newline)."""
        return json.dumps(self.to_dict(), indent=indent, default=float)


def as_result(result: BenchResult | dict[str, Any]) -> BenchResult:
    """``result`` as a ``BenchResult`` (a dict: a bench JSON as read from disk)."""
    return result if isinstance(result, BenchResult) else BenchResult.from_dict(result)
