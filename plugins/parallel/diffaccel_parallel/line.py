"""``diffaccel parallel-line``: how far an entry's gen_ppl sits from the fewer-steps line.

The line is the bench's ``steps`` peers and the baseline: log gen_ppl linear in the steps between
the two points around the entry's steps (by default the entry's mean steps run, i.e. equal steps;
``--at`` reads it elsewhere, e.g. at the steps the line needs for the entry's speedup). Read from
a bench JSON with a judge (``diffaccel bench ... --judge smollm2 --json B.json``, or
``parallel-sweep``'s JSON), which keeps every entry's judge nll and tokens seed by seed
(``judge_per_seed``); the interval resamples seeds, the same for the entry and every point of the
line (paired), recomputing each gen_ppl and the line (``diffaccel.kit.stats.pooled_ci``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from diffaccel.contract.errors import DiffaccelError
from diffaccel.kit.stats import pooled_ci, resample

from .sweep import steps_run

EXAMPLES = """
    examples:
      diffaccel bench configs/text-parallel.toml --quality-only --seeds 32 --judge smollm2 --json runs/q.json
      diffaccel parallel-line runs/q.json text-parallel
      diffaccel parallel-line runs/q.json text-parallel --at 31.9
    Prints the entry's gen_ppl, the line's at its steps, their ratio less 1 with a 95% interval
    (seeds resampled, paired), and the share of resamples where the entry is below the line.
    The bench needs 'steps' peers ([[peer]] use = "steps") on both sides of the entry's steps."""


def register(commands) -> None:
    commands.add("parallel-line", help="an entry's gen_ppl against the fewer-steps line of a bench JSON, with a paired interval",
                 arguments=add_arguments, run=run, examples=EXAMPLES)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("json", help="a bench's --json (with a judge: judge_per_seed)")
    ap.add_argument("entry", nargs="+", help="entries to place against the line")
    ap.add_argument("--at", type=float, nargs="+", help="steps at which to read the line, one per entry (default: its steps run)")


def line_points(result: dict[str, Any]) -> dict[float, str]:
    """Steps -> entry name of the line's points: every ``steps`` peer and the baseline."""
    points = {float(e["peer"]["steps"]): e["name"] for e in result["entries"] if (e.get("peer") or {}).get("use") == "steps"}
    base = next(e for e in result["entries"] if e["name"] == "baseline")
    points[steps_run(base)] = "baseline"
    return points


def line_at(x: float, points: dict[float, float]) -> float:
    """log gen_ppl of the line at ``x`` steps, linear between the neighbouring points."""
    ns = sorted(points)
    if not ns[0] <= x <= ns[-1]:
        raise DiffaccelError(f"{x:.1f} steps is outside the line's points ({ns[0]:g} to {ns[-1]:g} steps); "
                             f"add 'steps' peers around it")
    hi = min(n for n in ns if n >= x)
    lo = max(n for n in ns if n <= x)
    if hi == lo:
        return points[lo]
    w = (x - lo) / (hi - lo)
    return (1 - w) * points[lo] + w * points[hi]


def _log_ppl(entry: dict[str, Any], idx: tuple[int, ...] | np.ndarray) -> float:
    per_seed = entry["judge_per_seed"]
    nll, tok = np.asarray(per_seed["nll"], dtype=float), np.asarray(per_seed["tokens"], dtype=float)
    return float(nll[list(idx)].sum() / tok[list(idx)].sum())


def against_line(result: dict[str, Any], name: str, at: float | None = None) -> dict[str, float]:
    """The entry's gen_ppl against the line at ``at`` steps (default: its mean steps run):
    ``diff`` (ratio less 1), its 95% interval ``lo``, ``hi``, and ``below``, the share of resamples
    where the entry is under the line; seeds resampled the same for every entry (paired)."""
    by = {e["name"]: e for e in result["entries"]}
    if name not in by:
        raise DiffaccelError(f"no entry '{name}'; the entries: {', '.join(by)}")
    points = line_points(result)
    for n in [name, *points.values()]:
        if not (by[n].get("judge_per_seed") or {}).get("nll"):
            raise DiffaccelError(f"entry '{n}' has no judge_per_seed: run the bench with a judge (--judge smollm2)")
    steps = steps_run(by[name])
    x = steps if at is None else at

    def diff(idx) -> tuple[float, float]:
        line = line_at(x, {k: _log_ppl(by[v], idx) for k, v in points.items()})
        return math.exp(_log_ppl(by[name], idx) - line) - 1, line

    n = len(result["seeds"])
    point, line = diff(range(n))
    if n < 2:
        raise DiffaccelError(f"{n} seed: an interval needs 2 seeds or more")
    lo, hi = pooled_ci(n, lambda idx: {"diff": diff(idx)[0]})["diff"]
    below = float(np.mean([diff(row)[0] < 0 for row in resample(n)]))
    return {"steps": steps, "at": x, "gen_ppl": math.exp(_log_ppl(by[name], range(n))), "line": math.exp(line),
            "diff": point, "lo": lo, "hi": hi, "below": below}


def run(args: argparse.Namespace) -> int:
    path = Path(args.json)
    if not path.is_file():
        raise DiffaccelError(f"{path}: no such file (a bench's --json)")
    try:
        result = json.loads(path.read_text())
        result["entries"], result["seeds"]
    except (ValueError, KeyError, TypeError):
        raise DiffaccelError(f"{path}: not a bench JSON (no entries or seeds)") from None
    if args.at and len(args.at) != len(args.entry):
        raise DiffaccelError(f"--at: {len(args.at)} values for {len(args.entry)} entries; give one per entry")
    points = line_points(result)
    by = {e["name"]: e for e in result["entries"]}
    n = len(result["seeds"])
    print(f"{n} seeds; line: " + ", ".join(f"{k:g} steps {math.exp(_log_ppl(by[v], range(n))):.1f}" for k, v in sorted(points.items())
                                            if by[v].get("judge_per_seed")))
    for i, name in enumerate(args.entry):
        r = against_line(result, name, args.at[i] if args.at else None)
        print(f"{name}: {r['steps']:.1f} steps run, gen_ppl {r['gen_ppl']:.1f}; line at {r['at']:.1f} steps {r['line']:.1f}; "
              f"difference {100 * r['diff']:+.1f}% (95% CI {100 * r['lo']:+.1f}% to {100 * r['hi']:+.1f}%), "
              f"below the line in {100 * r['below']:.0f}% of resamples")
    return 0
