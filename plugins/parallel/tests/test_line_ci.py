"""line_ci.py: an entry's distance to the fewer-steps line, the bootstrap paired over seeds."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

_SPEC = importlib.util.spec_from_file_location("parallel_line_ci", Path(__file__).parents[1] / "line_ci.py")
line_ci = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(line_ci)


def test_line_is_linear_in_log_ppl_between_the_neighbouring_peers():
    peers = {32: torch.tensor(4.0), 64: torch.tensor(3.0), 128: torch.tensor(2.0)}
    assert float(line_ci.line_at(48, peers)) == pytest.approx(3.5)
    assert float(line_ci.line_at(64, peers)) == 3.0
    with pytest.raises(SystemExit, match="outside the peers"):
        line_ci.line_at(16, peers)


def write(path: Path, shift: float, noise: list[float]) -> None:
    """Per-sample nll: peers on a line in the steps, every entry sharing each seed's ``noise``;
    the entry runs 48 steps and sits ``shift`` nats per token off the line there."""
    def e(level, steps):
        return {"nll": [2 * (level + n) for n in noise], "tokens": [2] * len(noise), "steps_run": [steps] * len(noise)}
    path.write_text(json.dumps({"entries": {"baseline": e(5.0, 128), "steps=64": e(6.0, 64), "steps=32": e(7.0, 32),
                                            "par": e(6.5 + shift, 48)}}))


def test_a_shared_per_seed_noise_cancels_in_the_paired_interval(tmp_path):
    write(tmp_path / "p.json", -0.1, [0.0, 1.5, -0.7, 0.3, 2.0, -1.1])
    r = line_ci.against_line(json.loads((tmp_path / "p.json").read_text())["entries"], "par", resamples=200)
    d = math.exp(-0.1) - 1
    assert r["at"] == 48 and r["diff"] == pytest.approx(d) and r["lo"] == pytest.approx(d) and r["hi"] == pytest.approx(d)
    assert r["below"] == 1.0


def test_unpaired_noise_widens_the_interval_and_at_moves_the_line(tmp_path):
    write(tmp_path / "p.json", 0.0, [0.0, 0.4, -0.2, 0.9])
    data = json.loads((tmp_path / "p.json").read_text())["entries"]
    data["par"]["nll"] = [2 * (6.5 + n) for n in (0.9, -0.2, 0.4, 0.0)]  # the same values on other seeds
    r = line_ci.against_line(data, "par", resamples=500)
    assert r["diff"] == pytest.approx(0.0) and r["lo"] < -0.05 and r["hi"] > 0.05
    r64 = line_ci.against_line(data, "par", at=64, resamples=50)
    assert r64["diff"] == pytest.approx(math.exp(0.5) - 1)  # at 64 steps the line is 0.5 nats lower than at 48
