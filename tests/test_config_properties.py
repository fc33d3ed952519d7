"""Property test of the config validators (issue 27): random TOML values of every TOML type, in
every field of every installed strategy (fields read from its attrs config class), of the
``[model]`` table of each adapter, and of each adapter's ``[[peer]]`` tables. Whatever the values,
``parse_config`` returns a valid config or raises one ``ConfigError`` of one line: never another
exception."""

from __future__ import annotations

import datetime as dt
import math

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffaccel import ConfigError, ModelConfig, Registry, parse_config
from diffaccel.runtime.adapters_registry import adapter_names, get_adapter
from diffaccel.contract.capabilities import missing

import diffaccel.runtime.adapters_registry as adapters_registry

REGISTRY = Registry()
STRATEGIES = sorted(REGISTRY.strategies)
ADAPTERS = adapter_names()
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Every TOML value type: strings, 64-bit integers, floats (inf and nan included), booleans,
# offset/local date-times, dates, times, arrays and inline tables, nested.
_scalars = st.one_of(
    st.text(max_size=12), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-3, max_value=300),  # small numbers reach the range checks
    st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=-1.0, max_value=2.0),
    st.booleans(), st.datetimes(timezones=st.just(dt.timezone.utc)), st.datetimes(), st.dates(), st.times(),
)
TOML_VALUES = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=6)


@pytest.fixture(scope="module", autouse=True)
def _entry_points_once():
    """parse_config lists the installed adapters (an entry-point scan, tens of ms) on every call;
    scanned once here, the property runs thousands of examples in seconds."""
    eps = adapters_registry._entry_points()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(adapters_registry, "_entry_points", lambda: eps)
        yield


def _fields(cls) -> list[attrs.Attribute]:
    return [f for f in attrs.fields(cls) if f.init]


def _near(f: attrs.Attribute):
    """Values of a field: any TOML value, or its default nudged (to get past the type check
    and into the validators and cross-field checks)."""
    default = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default
    options = [TOML_VALUES]
    if default is not attrs.NOTHING and default is not None and not isinstance(default, (dt.date, dt.time)):
        options.append(st.just(default))
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            options.append(st.sampled_from([0, -1, 1, 2, default * 2, default + 1, 0.5, math.inf, math.nan]))
    return st.one_of(*options)


def _table(cls, extra: dict | None = None):
    """A TOML table for ``cls``: a random subset of its fields with random values, sometimes an
    unknown key too."""
    fields = _fields(cls)
    return st.fixed_dictionaries(
        {}, optional={**{f.name: _near(f) for f in fields}, "no_such_key": TOML_VALUES}).map(lambda t: {**t, **(extra or {})})


def _adapter_for(name: str) -> str:
    spec = REGISTRY.get(name)
    fits = [a for a in ADAPTERS if not missing(spec.requires, get_adapter(a).capabilities)]
    return fits[0] if fits else ADAPTERS[0]


def _assert_clean(data: dict) -> None:
    try:
        cfg = parse_config(data, source="prop.toml", registry=REGISTRY)
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith("prop.toml") and "\n" not in msg, msg
        return
    # a valid config: every value is of its declared kind and the classes built
    assert isinstance(cfg.model, ModelConfig)
    for entry in cfg.strategies:
        assert attrs.has(type(entry.config))


@pytest.mark.parametrize("name", STRATEGIES)
@SETTINGS
@given(data=st.data())
def test_strategy_fields_give_a_config_or_one_config_error(name, data):
    spec = REGISTRY.get(name)
    table = data.draw(_table(spec.config, {"use": name}))
    _assert_clean({"model": {"adapter": _adapter_for(name)}, "strategy": [table]})


@pytest.mark.parametrize("adapter", ADAPTERS)
@SETTINGS
@given(data=st.data())
def test_model_table_gives_a_config_or_one_config_error(adapter, data):
    opts = data.draw(_table(get_adapter(adapter).Options))
    common = data.draw(_table(ModelConfig))
    common.pop("adapter", None)
    _assert_clean({"model": {**common, **opts, "adapter": adapter}})


@pytest.mark.parametrize("adapter", ADAPTERS)
@SETTINGS
@given(data=st.data())
def test_peer_tables_give_a_config_or_one_config_error(adapter, data):
    peers = get_adapter(adapter).PEERS
    if not peers:
        pytest.skip(f"adapter {adapter} offers no peers")
    name = data.draw(st.sampled_from(sorted(peers)))
    _assert_clean({"model": {"adapter": adapter}, "peer": [data.draw(_table(peers[name], {"use": name}))]})


@SETTINGS
@given(doc=st.dictionaries(st.sampled_from(["model", "strategy", "peer", "other"]), TOML_VALUES, max_size=3))
def test_any_document_shape_gives_a_config_or_one_config_error(doc):
    _assert_clean(doc)


def test_the_property_finds_errors_and_valid_configs():
    """The generators reach both outcomes (else the property above would test little)."""
    from hypothesis import find

    def bare_is_valid(name):
        try:
            parse_config({"model": {"adapter": _adapter_for(name)}, "strategy": [{"use": name}]}, registry=REGISTRY)
            return True
        except ConfigError:
            return False

    name = next(n for n in STRATEGIES if bare_is_valid(n))  # one whose defaults alone are valid
    spec, adapter = REGISTRY.get(name), _adapter_for(name)

    def outcome(table):
        try:
            parse_config({"model": {"adapter": adapter}, "strategy": [{**table, "use": spec.name}]}, registry=REGISTRY)
            return "valid"
        except ConfigError:
            return "error"

    assert outcome(find(_table(spec.config), lambda t: outcome(t) == "valid" and len(t) > 0)) == "valid"
    assert outcome(find(_table(spec.config), lambda t: outcome(t) == "error")) == "error"
