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


def test_grid_entry_names_parse_as_the_old_ones():
    assert sweep.parse_entry("threshold-prob[tau=0.03,spacing=6]") == {
        "rule": "threshold", "prob": True, "knob": "tau", "value": "0.03", "spacing": "6"}
    assert sweep.parse_entry("factor[factor=2.5,spacing=0]") == sweep.parse_entry("factor-factor2.5")
    assert sweep.parse_entry("steps-32") is None and sweep.parse_entry("baseline") is None


def test_the_retired_sweep_prints_and_runs_one_bench_grid_per_rule(tmp_path, monkeypatch, capsys):
    ran = []

    def fake_bench(paths, options):
        texts = [Path(p).read_text() for p in paths]
        ran.append((texts, options))
        names = ["baseline"] + [f"{Path(paths[1]).stem}[x={v}]" for v in options.grid[0].split("=")[1].split(",")]
        Path(options.json_path).write_text(json.dumps({"model": {"checkpoint": "m", "batch": 1}, "seeds": [5000], "entries": [
            {"name": n, "speedup": 1.0, "quality": {"perplexity": 100.0, "distinct_2": 0.9}, "reports": []} for n in names]}))
        return {"entries": []}

    monkeypatch.setattr(sweep, "run_bench", fake_bench)
    monkeypatch.setattr(sweep, "format_table", lambda result: "table")
    monkeypatch.setattr(sweep, "plot", lambda result, path, metric: None)
    out = tmp_path / "pareto.png"
    assert sweep.main(["configs/text-default.toml", "--seed", "5000", "--seeds", "2", "--factor", "2.5,5", "--tau", "",
                       "--gamma", "2", "--steps", "32", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "deprecated" in err
    assert (f"diffaccel bench baseline-model.toml factor.toml --grid parallel.factor=2.5,5 --seeds 2 --no-noise-floor "
            f"--json {tmp_path}/pareto-factor.json; diffaccel bench baseline-model-entropy.toml entropy.toml") in err
    (base, factor), options = ran[0]
    assert "seed = 5000" in base and 'use = "steps"' in base and 'rule = "factor"' in factor
    assert options.grid == ["parallel.factor=2.5,5"] and options.seeds == 2 and not options.noise_floor
    assert 'use = "steps"' not in ran[1][0][0]  # the fewer-steps line once
    merged = json.loads(out.with_suffix(".json").read_text())
    assert [e["name"] for e in merged["entries"]] == ["baseline", "factor[x=2.5]", "factor[x=5]", "entropy[x=2]"]


def test_the_sweep_is_a_registered_command(monkeypatch):
    from diffaccel.cli.entry import CORE
    from diffaccel.cli.commands import collect

    monkeypatch.setenv("DIFFACCEL_PLUGINS", "parallel")
    found, problems = collect(CORE)
    mine = [c for c in found if c.name == "parallel-sweep"]
    assert problems == [] and len(mine) == 1 and mine[0].source.startswith("plugin 'parallel'")
    assert mine[0].run is sweep.run
