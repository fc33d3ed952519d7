"""The bench's table, as ``diffaccel bench`` prints it: one row per entry, speedup and the
quality columns with their intervals, then the lines under it (vs_model, the fewer-steps line at
each entry's speed, the judge)."""

from __future__ import annotations

from typing import Any

from ..runtime.memory import memory_cell
from .lines import against_lines
from .results import BenchResult, as_result
from .variants import vs_model_lines


def format_table(result: BenchResult | dict[str, Any]) -> str:
    """The bench's table as the CLI prints it (a dict: a bench JSON as read)."""
    result = as_result(result)
    keys: list[str] = []
    for e in result.entries:
        keys += [k for k in e.quality if k not in keys]
    measured = any(e.has("memory") for e in result.entries)  # benches before issue 39 have no memory
    head = ["entry", "speedup", "computed", *(["state MB"] if measured else []), *keys]
    rows = [head]
    for e in result.entries:
        computed = "-" if e.fraction_computed is None else f"{e.fraction_computed:.0%}"
        speed = "-" if e.speedup is None else f"{e.speedup:.2f}x" + _ci(e.speedup_ci, "{:.2f}")
        qci = e.quality_ci or {}
        rows.append([e.name, speed, computed, *([memory_cell(e.memory)] if measured else []),
                     *[_fmt(e.quality.get(k)) + _ci(qci.get(k)) for k in keys]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    m = result.model
    how = f"{result.repeats} repeat(s), interleaved" if result.is_timed else "quality only (not timed)"
    lines.insert(0, f"{m.adapter} model {m.checkpoint}, seeds {result.seeds}, {how}")
    lines.insert(2, "  ".join("-" * w for w in widths))
    if any(e.speedup_ci or e.quality_ci for e in result.entries):
        lines.append("[lo-hi]: 95% bootstrap interval over the seeds, paired with the baseline's (JSON: speedup_ci, "
                     "quality_ci, quality_ratio_ci)")
    lines += vs_model_lines(result)
    lines += against_lines(result)  # the fewer-steps (and solver) line at each entry's speed
    j = result.judge
    if j and j.note:
        lines.append(f"gen_ppl: not reported: {j.note}")
    elif j:
        noise = f"; gen_ppl_noise: the baseline on seeds {j.noise_seeds}" if j.has("noise_seeds") else ""
        lines.append(f"gen_ppl: judge {j.name}, {j.lines} lines, {j.tokens} tokens, loading and scoring "
                     f"{j.share_of_wall:.0%} of the bench's wall time{noise}")
    return "\n".join(lines)


def _ci(ci: Any, fmt: str | None = None) -> str:
    if not ci:
        return ""
    lo, hi = ci
    return f" [{fmt.format(lo)}-{fmt.format(hi)}]" if fmt else f" [{_fmt(lo)}-{_fmt(hi)}]"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)
