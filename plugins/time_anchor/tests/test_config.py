"""Bad input: one-line errors naming the key; the entry point; shipped configs; calibrate CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import diffaccel
from diffaccel import ConfigError, ConfigValueError, load_config
from diffaccel.cli.entry import main as diffaccel_main
from diffaccel_time_anchor import Gate, TimeAnchorConfig
from diffaccel_time_anchor.cli import main as ta_main

ROOT = Path(__file__).resolve().parents[3]

BAD = [
    ({"threshold": 0}, "threshold", "must be in (0, 1), got 0"),
    ({"threshold": 1}, "threshold", "must be in (0, 1), got 1"),
    ({"threshold": -0.1}, "threshold", "must be in (0, 1)"),
    ({"threshold": 1.5}, "threshold", "must be in (0, 1)"),
    ({"threshold": "low"}, "threshold", "must be in (0, 1)"),
    ({"gate_threshold": 1.0}, "gate_threshold", "must be in (0, 1)"),
    ({"gate_threshold": 0.0}, "gate_threshold", "must be in (0, 1)"),
    ({"max_age": 0}, "max_age", "must be a positive integer, got 0"),
    ({"max_age": -2}, "max_age", "must be a positive integer"),
    ({"max_age": 1.5}, "max_age", "must be a positive integer"),
    ({"max_entries": 0}, "max_entries", "must be a positive integer"),
    ({"max_entries": -1}, "max_entries", "must be a positive integer"),
    ({"max_bytes": 0}, "max_bytes", "must be a positive integer"),
    ({"max_bytes": -1024}, "max_bytes", "must be a positive integer"),
    ({"stride": 0}, "stride", "must be a positive integer"),
    ({"warmup": -1}, "warmup", "must be 0 or more"),
    ({"min_depth": -1}, "min_depth", "must be 0 or more"),
    ({"neighbors": -1}, "neighbors", "must be 0 or more"),
    ({"sketch": 0}, "sketch", "must be in [16, 65536]"),
    ({"gate": "no/such/gate.json"}, "gate", "file not found: no/such/gate.json"),
    ({"clusters": "no/such/clusters.json"}, "clusters", "file not found"),
]


@pytest.mark.parametrize("kwargs,key,words", BAD, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(BAD)])
def test_bad_values_name_the_key(kwargs, key, words):
    with pytest.raises(ConfigValueError) as info:
        TimeAnchorConfig(**kwargs)
    assert info.value.key == key and words in str(info.value) and "\n" not in str(info.value)


def test_stride_and_clusters_exclude_each_other(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"length": 4, "n_clusters": 2, "assign": [0, 1, 0, 1]}))
    with pytest.raises(ConfigValueError, match="key 'stride': cannot be combined with clusters"):
        TimeAnchorConfig(stride=2, clusters=str(path))


@pytest.mark.parametrize("content,words", [
    ("not json", "is not a readable JSON file"),
    (json.dumps({"assign": [0, 3], "n_clusters": 2}), "every 'assign' value must be an integer in [0, 2)"),
    (json.dumps({"n_clusters": 2}), "needs 'assign'"),
])
def test_broken_clusters_files(tmp_path, content, words):
    from diffaccel_time_anchor import TimeAnchor

    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(ConfigValueError, match="key 'clusters'") as info:
        TimeAnchor(TimeAnchorConfig(clusters=str(path)))
    assert words in str(info.value)


@pytest.mark.parametrize("data,words", [
    ({"weight": [[0.0] * 17], "bias": [0.0, 1.0]}, "'weight' must be (layers, 1 + 2 * freqs)"),
    ({"weight": [[0.0] * 17] * 2, "bias": [0.0, 0.0], "n_layers": 3}, "'n_layers' is 3 but 'weight' has 2 rows"),
    ({"bias": [0.0]}, "is not a gate file"),
])
def test_broken_gate_files(tmp_path, data, words):
    from diffaccel_time_anchor import TimeAnchor

    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigValueError, match="key 'gate'") as info:
        TimeAnchor(TimeAnchorConfig(gate=str(path)))
    assert words in str(info.value)


def write_config(tmp_path, strategy: str, model: str | None = None) -> Path:
    model = model or '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 8\n'
    path = tmp_path / "ta.toml"
    path.write_text(model + '[[strategy]]\nuse = "time-anchor"\n' + strategy)
    return path


def test_cli_bad_value_is_one_line_and_exit_2(tmp_path, capsys):
    path = write_config(tmp_path, "threshold = 1.5\n")
    assert diffaccel_main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "key 'threshold': must be in (0, 1), got 1.5" in err


def test_gate_for_another_model_fails_when_the_strategies_are_built(tmp_path):
    gate = tmp_path / "gate.json"
    Gate(torch.zeros(7, 17), torch.zeros(7), [f"b{i}" for i in range(7)]).save(gate)
    cfg = load_config(write_config(tmp_path, f'gate = "{gate}"\n'))
    pipe = diffaccel.load_pipeline(cfg)
    with pytest.raises(ConfigError, match=r"\(time-anchor\): key 'gate': the gate file has 7 layers but the model has 4"):
        with diffaccel.apply(pipe, cfg):
            pass


def test_entry_point_is_registered():
    reg = diffaccel.Registry()
    spec = reg.get("time-anchor")
    assert spec is not None and spec.requires == (("token-positions", "block-stack"),)


@pytest.mark.parametrize("name", ["text-time-anchor.toml", "digits-time-anchor.toml"])
def test_shipped_configs_decode(name):
    cfg = load_config(ROOT / "configs" / name)
    assert [s.name for s in cfg.strategies] == ["time-anchor"]


def test_calibrate_and_clusters_commands(tmp_path, capsys):
    cfg = write_config(tmp_path, "threshold = 0.05\n")
    gate_path, cl_path = tmp_path / "gate.json", tmp_path / "clusters.json"
    assert diffaccel_main(["time-anchor-calibrate", str(cfg), "--out", str(gate_path), "--seeds", "2"]) == 0
    gate = Gate.load(gate_path)
    assert gate.n_layers == 4 and gate.layers == [f"block.{i}" for i in range(4)] and gate.meta["threshold"] == 0.05
    assert diffaccel_main(["time-anchor-clusters", str(cfg), "--out", str(cl_path), "--seeds", "1", "--k", "3"]) == 0
    data = json.loads(cl_path.read_text())
    assert data["length"] == 16 and len(data["assign"]) == 16 and 1 <= data["n_clusters"] <= 3
    # both files are accepted by the strategy on this model
    ok = load_config(write_config(tmp_path, f'gate = "{gate_path}"\n'))
    with diffaccel.apply(diffaccel.load_pipeline(ok), ok):
        pass
    capsys.readouterr()
    assert diffaccel_main(["time-anchor-calibrate", str(cfg), "--out", str(gate_path), "--threshold", "2"]) == 2
    assert capsys.readouterr().err.strip() == "diffaccel: error: key 'threshold': must be in (0, 1), got 2.0"
    assert diffaccel_main(["time-anchor-clusters", str(cfg), "--out", str(cl_path), "--k", "0"]) == 2
    assert capsys.readouterr().err.strip() == "diffaccel: error: key 'k': must be positive, got 0"


def test_the_old_command_line_is_a_deprecated_alias_naming_the_new_command(tmp_path, capsys):
    cfg = write_config(tmp_path, "threshold = 0.05\n")
    gate_path = tmp_path / "gate.json"
    assert ta_main(["calibrate", str(cfg), "--out", str(gate_path), "--seeds", "1"]) == 0
    assert Gate.load(gate_path).n_layers == 4
    err = capsys.readouterr().err
    assert f"deprecated (removed in diffaccel 0.3): run 'diffaccel time-anchor-calibrate {cfg} --out {gate_path} --seeds 1'" in err
    assert ta_main(["calibrate", str(cfg), "--out", str(gate_path), "--threshold", "2"]) == 2
    assert "error: key 'threshold': must be in (0, 1)" in capsys.readouterr().err


def test_fit_gates_follows_the_labels():
    from diffaccel_time_anchor import fit_gates

    t = torch.linspace(0, 1, 50)
    labels = torch.stack([(t > 0.5).float(), (t < 0.3).float()])
    g = fit_gates(t, labels, ["a", "b"])
    p = g.probs(50)
    assert p[0, -1] > 0.8 and p[0, 0] < 0.2 and p[1, 0] > 0.8 and p[1, -1] < 0.2
