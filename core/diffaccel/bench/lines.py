"""Where a bench's entries sit against its fewer-steps and solver lines.

The cheapest way to sample faster is to take fewer steps (``[[peer]] use = "steps"``, or
``bench --solver-line``: fewer DDIM steps and DPM-Solver++); every strategy must beat that line at
its own speed. ``line_points`` gathers the lines' points, ``line_at`` reads a line at a speedup
(linear between its points), and ``against_lines`` says it in one line per entry under the
bench's table: the entry's quality beside the best line's at the entry's speedup.
"""

from __future__ import annotations

import math
from typing import Any

from .results import BenchResult, as_result

LINE_MEASURES = {"acc": True, "psnr": True, "cond_acc": True, "gen_ppl": False, "perplexity": False}
"""The quality keys ``against_lines`` reads off the lines, in this order (True: higher is
better): a task model's exact accuracy, an image's PSNR and digit accuracy, a text's perplexities."""


def line_points(result: BenchResult | dict[str, Any], key: str) -> dict[str, list[tuple[float, float, str]]]:
    """The ``steps`` peers as lines, one per scheduler ("steps": the config's own), each a list of
    (speedup, quality, entry name) by increasing speedup; a line needs two points."""
    result = as_result(result)
    lines: dict[str, list[tuple[float, float, str]]] = {}
    for e in result.entries:
        p = e.peer or {}
        q = (e.quality or {}).get(key)
        if p.get("use") == "steps" and e.speedup is not None and isinstance(q, (int, float)) and math.isfinite(q):
            lines.setdefault(p.get("scheduler") or "steps", []).append((e.speedup, q, e.name))
    return {name: sorted(pts) for name, pts in lines.items() if len(pts) > 1}


def line_at(points: list[tuple[float, ...]], x: float) -> float | None:
    """A line's quality at speedup ``x``: linear between its two points around ``x``, None
    beyond its ends (points: (speedup, quality, ...) by increasing speedup)."""
    for (x0, y0, *_), (x1, y1, *_) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else max(y0, y1)
    return None


def _best(lines: dict[str, list[tuple[float, float, str]]], x: float, higher: bool) -> tuple[str, float, str] | None:
    """The best line's value at ``x`` (line, value, the two points it lies between)."""
    found = []
    for name, pts in lines.items():
        y = line_at(pts, x)
        if y is not None:
            lo = max((p for p in pts if p[0] <= x), key=lambda p: p[0])
            hi = min((p for p in pts if p[0] >= x), key=lambda p: p[0])
            found.append((name, y, f"between {lo[2]} at {lo[0]:.2f}x and {hi[2]} at {hi[0]:.2f}x"))
    if not found:
        return None
    return (max if higher else min)(found, key=lambda f: f[1])


def against_lines(result: BenchResult | dict[str, Any]) -> list[str]:
    """One line per timed entry (not the baseline, not a peer) of a bench with a fewer-steps or
    solver line: its quality beside the best line's at the same speedup, or that no point of the
    line is as fast (its fastest point then) or as slow."""
    result = as_result(result)
    out = []
    lines = {k: line_points(result, k) for k in LINE_MEASURES}
    lines = {k: v for k, v in lines.items() if v}
    for e in result.entries:
        if e.name == "baseline" or e.is_peer or e.speedup is None:
            continue
        parts = []
        for key, ls in lines.items():
            q = (e.quality or {}).get(key)
            if not isinstance(q, (int, float)):
                continue
            best = _best(ls, e.speedup, LINE_MEASURES[key])
            if best is not None:
                parts.append(f"{key} {q:.3f} vs {best[1]:.3f} on the {best[0]} line ({best[2]})")
                continue
            pts = [p for v in ls.values() for p in v]
            end = max(pts) if e.speedup > max(pts)[0] else min(pts)
            side = "faster than" if e.speedup > end[0] else "slower than"
            parts.append(f"{key} {q:.3f}; {side} every point of the line (nearest: {end[2]} at {end[0]:.2f}x, {key} {end[1]:.3f})")
        if parts:
            out.append(f"{e.name} at {e.speedup:.2f}x against the fewer-steps line at that speed: " + "; ".join(parts))
    return out
