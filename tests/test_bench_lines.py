"""diffaccel.bench.lines: each entry's quality beside the fewer-steps line's at its own speed,
the lines under the bench's table (``make demo`` prints them)."""

from diffaccel.bench.lines import against_lines, line_at, line_points
from diffaccel.bench.table import format_table


def _entry(name, speedup, acc, peer=None):
    return {"name": name, "speedup": speedup, "quality": {"acc": acc}, **({"peer": peer} if peer else {})}


def _result(*entries):
    return {"model": {"adapter": "text", "checkpoint": "sudoku", "batch": 8}, "seeds": [0, 8], "repeats": 1,
            "entries": [_entry("baseline", 1.0, 0.97), *entries]}


STEPS = [_entry("steps-20", 2.0, 0.90, {"use": "steps", "steps": 20}), _entry("steps-10", 4.0, 0.70, {"use": "steps", "steps": 10})]


def test_the_line_is_read_between_its_two_points_around_the_speed():
    result = _result(_entry("fast", 3.0, 0.95), *STEPS)
    pts = line_points(result, "acc")["steps"]
    assert [p[2] for p in pts] == ["steps-20", "steps-10"]
    assert abs(line_at(pts, 3.0) - 0.80) < 1e-12
    assert line_at(pts, 5.0) is None and line_at(pts, 1.5) is None
    (line,) = against_lines(result)
    assert line.startswith("fast at 3.00x") and "acc 0.950 vs 0.800 on the steps line" in line
    assert "between steps-20 at 2.00x and steps-10 at 4.00x" in line


def test_an_entry_beyond_the_line_gets_its_nearest_end_not_a_value_read_off_it():
    result = _result(_entry("faster", 6.0, 0.85), _entry("slower", 0.9, 0.96), *STEPS)
    faster, slower = against_lines(result)
    assert "faster than every point" in faster and "steps-10 at 4.00x" in faster and " vs " not in faster
    assert "slower than every point" in slower and "steps-20 at 2.00x" in slower


def test_the_best_of_several_lines_is_taken_and_a_bench_without_one_prints_nothing():
    solver = [_entry("dpm++2m-20", 2.0, 0.95, {"use": "steps", "steps": 20, "scheduler": "dpm++2m"}),
              _entry("dpm++2m-10", 4.0, 0.85, {"use": "steps", "steps": 10, "scheduler": "dpm++2m"})]
    (line,) = against_lines(_result(_entry("fast", 3.0, 0.95), *STEPS, *solver))
    assert "vs 0.900 on the dpm++2m line" in line
    assert against_lines(_result(_entry("fast", 3.0, 0.95))) == []
    # one point is no line
    assert against_lines(_result(_entry("fast", 3.0, 0.95), STEPS[0])) == []


def test_the_bench_table_carries_the_line():
    table = format_table(_result(_entry("fast", 3.0, 0.95), *STEPS))
    assert table.splitlines()[-1].startswith("fast at 3.00x against the fewer-steps line")
