"""``diffaccel parallel-line``: an entry's distance to the fewer-steps line of a bench JSON, the
bootstrap paired over seeds (the bench keeps the judge's sums seed by seed)."""

from __future__ import annotations

import json
import math

import pytest

from diffaccel.cli.entry import main
from diffaccel.contract.errors import DiffaccelError
from diffaccel_parallel.line import against_line, line_at


def test_line_is_linear_in_log_ppl_between_the_neighbouring_points():
    points = {32.0: 4.0, 64.0: 3.0, 128.0: 2.0}
    assert line_at(48, points) == pytest.approx(3.5)
    assert line_at(64, points) == 3.0
    with pytest.raises(DiffaccelError, match="outside the line's points"):
        line_at(16, points)


def bench(shift: float, noise: list[float]) -> dict:
    """A bench JSON as ``diffaccel bench --judge ... --json`` writes it: the peers on a line in the
    steps, every entry sharing each seed's ``noise``; 'par' runs 48 steps, ``shift`` nats per
    token off the line there."""
    def e(name, level, steps, peer=None):
        entry = {"name": name, "quality": {}, "reports": [{"steps_run": steps}] * len(noise),
                 "judge_per_seed": {"nll": [2 * (level + n) for n in noise], "tokens": [2] * len(noise)}}
        if peer:
            entry["peer"] = {"use": "steps", "steps": steps, "name": None}
        return entry
    return {"model": {"adapter": "text", "checkpoint": "wordnet-masked", "steps": 128, "batch": 1},
            "seeds": list(range(len(noise))),
            "entries": [e("baseline", 5.0, 128), e("par", 6.5 + shift, 48), e("steps-64", 6.0, 64, True), e("steps-32", 7.0, 32, True)]}


def test_a_shared_per_seed_noise_cancels_in_the_paired_interval():
    r = against_line(bench(-0.1, [0.0, 1.5, -0.7, 0.3, 2.0, -1.1]), "par")
    d = math.exp(-0.1) - 1
    assert r["at"] == 48 and r["diff"] == pytest.approx(d) and r["lo"] == pytest.approx(d) and r["hi"] == pytest.approx(d)
    assert r["below"] == 1.0


def test_unpaired_noise_widens_the_interval_and_at_moves_the_line():
    data = bench(0.0, [0.0, 0.4, -0.2, 0.9])
    data["entries"][1]["judge_per_seed"]["nll"] = [2 * (6.5 + n) for n in (0.9, -0.2, 0.4, 0.0)]  # the same values, other seeds
    r = against_line(data, "par")
    assert r["diff"] == pytest.approx(0.0) and r["lo"] < -0.05 and r["hi"] > 0.05 and r["lo"] <= r["diff"] <= r["hi"]
    r64 = against_line(data, "par", at=64)
    assert r64["diff"] == pytest.approx(math.exp(0.5) - 1)  # at 64 steps the line is 0.5 nats lower than at 48


def test_the_command_prints_each_entry_and_refuses_a_bench_without_judge_sums(tmp_path, capsys):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(bench(-0.1, [0.0, 1.5, -0.7, 0.3])))
    assert main(["parallel-line", str(path), "par", "--at", "40"]) == 0
    out = capsys.readouterr().out
    assert "par: 48.0 steps run" in out and "line at 40.0 steps" in out
    data = bench(0.0, [0.0, 1.0])
    del data["entries"][2]["judge_per_seed"]
    path.write_text(json.dumps(data))
    assert main(["parallel-line", str(path), "par"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "steps-64" in err[0] and "judge_per_seed" in err[0]
    assert main(["parallel-line", str(path), "nope"]) == 2
    assert "no entry 'nope'" in capsys.readouterr().err
