"""diffaccel parallel-sweep's parts: merged into one result, checked to share a baseline, names parsed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffaccel.contract.errors import DiffaccelError
from diffaccel_parallel import sweep


def part(path: Path, names: list[str], base_ppl: float = 100.0, seeds=(5000, 5001)) -> str:
    entries = [{"name": "baseline", "speedup": 1.0, "quality": {"perplexity": base_ppl}, "reports": [{"steps_run": 128}]}]
    entries += [{"name": n, "speedup": 2.0 + i, "quality": {"perplexity": 150.0}, "reports": [{"steps_run": 40}, {"steps_run": 50}]}
                for i, n in enumerate(names)]
    path.write_text(json.dumps({"model": {"checkpoint": "m", "batch": 1}, "seeds": list(seeds), "repeats": 1, "entries": entries}))
    return str(path)


def test_merge_keeps_one_baseline_and_every_parts_entries_with_their_own_speedups(tmp_path):
    a = part(tmp_path / "a.json", ["factor-factor5", "steps-32"])
    b = part(tmp_path / "b.json", ["threshold-prob-tau0.03-s6", "steps-32"])
    merged = sweep.merge([a, b])
    assert [e["name"] for e in merged["entries"]] == ["baseline", "factor-factor5", "steps-32", "threshold-prob-tau0.03-s6"]
    assert merged["entries"][3]["speedup"] == 2.0 and merged["entries"][3]["part"] == b
    assert sweep.steps_run(merged["entries"][1]) == 45.0


def test_merge_refuses_parts_whose_baselines_differ(tmp_path):
    a = part(tmp_path / "a.json", ["factor-factor5"])
    b = part(tmp_path / "b.json", ["entropy-gamma2"], base_ppl=101.0)
    with pytest.raises(DiffaccelError, match="baseline"):
        sweep.merge([a, b])
    c = part(tmp_path / "c.json", ["entropy-gamma2"], seeds=(6000, 6001))
    with pytest.raises(DiffaccelError, match="seeds"):
        sweep.merge([a, c])


def test_entry_names_carry_rule_scale_knob_and_spacing():
    m = sweep.ENTRY.match("threshold-prob-tau0.03-s6")
    assert (m["rule"], bool(m["prob"]), m["knob"], m["value"], m["spacing"]) == ("threshold", True, "tau", "0.03", "6")
    m = sweep.ENTRY.match("factor-factor2.5")
    assert (m["rule"], bool(m["prob"]), m["value"], m["spacing"]) == ("factor", False, "2.5", None)
    assert sweep.ENTRY.match("steps-32") is None


def test_the_sweep_is_a_registered_command(monkeypatch):
    from diffaccel.cli.entry import CORE
    from diffaccel.cli.commands import collect

    monkeypatch.setenv("DIFFACCEL_PLUGINS", "parallel")
    found, problems = collect(CORE)
    mine = [c for c in found if c.name == "parallel-sweep"]
    assert problems == [] and len(mine) == 1 and mine[0].source.startswith("plugin 'parallel'")
    assert mine[0].run is sweep.run
