"""The bench's typed result (``diffaccel.bench.results``): the recorded bench JSON files read and
written again byte for byte, the attributes, and the old dict reads (one DeprecationWarning each)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from diffaccel.bench.results import BenchResult, Entry, EntryMemory, ModelFacts

RECORDED = sorted(p for p in (Path(__file__).parent.parent / "docs" / "benchmarks").glob("*/*.json")
                  if p.name == "bench.json" or p.name.startswith("heldout-"))


def test_there_are_recorded_benches_to_read():
    assert len(RECORDED) >= 10


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_recorded_bench_json_reads_and_writes_back_byte_for_byte(path):
    text = path.read_text()
    indent = 1 if text.startswith('{\n "') else 2  # tune's held-out benches are written with indent 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no dict read on the way
        result = BenchResult.from_json(text)
        assert result.to_json(indent=indent) == text.rstrip("\n")
        assert result.entries[0].name == "baseline" and result.baseline is result.entries[0]
        assert isinstance(result.model, ModelFacts) and result.model.checkpoint


def test_fields_set_later_join_the_json_at_the_end_and_null_stays_null():
    e = Entry.new(name="x", speedup=None, quality={"psnr": 1.0})
    e.memory = EntryMemory.new(state_mb=0.0)
    e.speedup_ci = None
    assert list(e.to_dict()) == ["name", "speedup", "quality", "memory", "speedup_ci"]
    assert e.to_dict()["speedup"] is None and e.has("speedup_ci") and not e.has("peer")
    e.drop("memory")
    assert "memory" not in e.to_dict() and e.memory is None


def test_unknown_keys_are_kept_in_their_place():
    data = {"name": "baseline", "future": [1, 2], "speedup": 1.0}
    assert list(Entry.from_dict(data).to_dict().items()) == list(data.items())


def test_reading_a_result_as_a_dict_still_works_with_a_warning_naming_the_attribute():
    result = BenchResult.from_dict({"model": {"adapter": "text"}, "seeds": [0], "entries": [{"name": "baseline", "speedup": 1.0}]})
    with pytest.warns(DeprecationWarning, match=r"use the attribute \.entries"):
        entries = result["entries"]
    with pytest.warns(DeprecationWarning, match=r"\.speedup"):
        assert entries[0]["speedup"] == 1.0
    with pytest.warns(DeprecationWarning):
        assert entries[0].get("peer") is None and "peer" not in entries[0]
    with pytest.warns(DeprecationWarning):
        result["wall_s"] = 2.0
    assert result.wall_s == 2.0 and list(result.to_dict())[-1] == "wall_s"
