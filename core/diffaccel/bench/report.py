"""``diffaccel bench --report DIR``: the bench as a page a person reads, made by the command.

A report folder holds ``bench.json`` (the bench's result, as ``--json`` writes it), ``report.json``
(the command, versions and machine facts), ``index.md`` and ``index.html`` (the same page, the
HTML opening offline: images are relative paths into the folder, no script, no stylesheet
fetched), a Pareto plot (speedup against the quality measure, every entry and peer a labelled
point, the baseline at 1x), an image grid (image models: the same prompts and seeds, one row per
entry, the baseline's first) or the first lines of each entry's samples (text), and the
strategies' own plots (``diffaccel_bench_plot``).

Every figure on the page is read from ``bench.json``; nothing is typed by hand. Several report
folders combine into one page (``combine``): ``docs/benchmarks.md`` is made that way by
``make benchmarks`` (docs/benchmarks.py).
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any

from ..runtime.jobs import atomic_write
from ..runtime.memory import memory_cell
from .facts import machine, versions
from .page import (MEASURES, _write_text, combine, fmt, load_section, measure, section_blocks, summary_blocks, table,  # noqa: F401
                   to_html, to_markdown)
from .results import BenchResult, as_result

GRID_COLUMNS = 10
TEXT_ROWS = 3
TEXT_CHARS = 110
# the page (blocks, Markdown, HTML, combine) is ``diffaccel.bench.page``, the machine facts
# ``diffaccel.bench.facts``: their names are importable from here as before


# ---- writing one report -----------------------------------------------------------------------

def write_report(out_dir: str | Path, result: BenchResult | dict[str, Any], outputs: dict[str, list[Any]], *, command: str,
                 plot_dir: str | Path | None = None, note: str | None = None) -> Path:
    """Write the report of one bench into ``out_dir`` (created); returns the path of index.md.

    ``outputs``: entry name -> that entry's run outputs, in the order of ``result.seeds``
    (``run_bench(..., keep_outputs=...)``); ``plot_dir``: where the bench wrote the strategies'
    plots (``--plots``)."""
    result = as_result(result)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_text(out / "bench.json", result.to_json())
    assets: dict[str, Any] = {"pareto": None, "grid": None, "samples": None, "plots": []}
    if pareto_plot(result, out / "pareto.png"):
        assets["pareto"] = "pareto.png"
    if image_grid(result, outputs, out / "grid.png"):
        assets["grid"] = "grid.png"
    assets["samples"] = text_samples(result, outputs)
    if plot_dir is not None:
        for e in result.entries:
            for s in e.strategies:
                p = Path(plot_dir) / f"{e.name}-{s}.png"
                if p.is_file():
                    assets["plots"].append({"entry": e.name, "strategy": s, "path": os.path.relpath(p, out)})
    meta = {"command": command, "versions": versions(), "machine": machine(note), "assets": assets}
    _write_text(out / "report.json", json.dumps(meta, indent=2, default=str))
    blocks = section_blocks(result, meta, prefix="", level=2)
    title = f"diffaccel bench: {result.model.checkpoint}"
    _write_text(out / "index.md", to_markdown([("h1", title), *blocks]))
    _write_text(out / "index.html", to_html([("h1", title), *blocks], title))
    return out / "index.md"


def _save_figure(fig, path: Path, dpi: int) -> None:
    """A matplotlib figure as a PNG at ``path``, written atomically; the figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def pareto_plot(result: BenchResult | dict[str, Any], path: Path) -> bool:
    """Speedup (x) against the quality measure (y): every entry and peer a labelled point, the
    baseline at 1x, the non-dominated entries joined. False when there is no measure to plot."""
    result = as_result(result)
    key = measure(result)
    if key is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    higher = MEASURES[key]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    points = []
    finite = [e.quality[key] for e in result.entries if _finite(e.quality[key])]
    # an entry whose outputs equal the baseline's (PSNR inf) is drawn above the others, so labelled
    top = (max(finite) + 0.1 * ((max(finite) - min(finite)) or abs(max(finite)) or 1.0)) if finite else 1.0
    for e in result.entries:
        y = e.quality[key]
        kind = "baseline" if e.name == "baseline" else ("peer" if e.has("peer") else "diffaccel")
        held = e.memory.state_mb if e.memory else None
        label = e.name + (f" ({memory_cell(e.memory)} MB)" if held else "")  # memory: the price of a cache
        if not _finite(y):
            if kind == "baseline":  # e.g. PSNR of the baseline against itself: a line at 1x
                ax.axvline(1.0, color="#555555", ls="--", lw=1)
                ax.annotate("baseline (reference)", (1.0, 0.0), xycoords=("data", "axes fraction"), xytext=(3, 4),
                            textcoords="offset points", fontsize=8, color="#555555")
                continue
            y, label = top, f"{label} ({key} {fmt(y)}: the baseline's outputs)"
        points.append((e.speedup, y, label, kind))
    style = {"baseline": ("#555555", "s"), "diffaccel": ("#1f77b4", "o"), "peer": ("#ff7f0e", "^")}
    for kind, (colour, marker) in style.items():
        xs = [p[0] for p in points if p[3] == kind]
        ys = [p[1] for p in points if p[3] == kind]
        if xs:
            ax.scatter(xs, ys, c=colour, marker=marker, s=46, label={"diffaccel": "diffaccel entry"}.get(kind, kind), zorder=3)
    for x, y, name, _ in points:
        ax.annotate(name, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
    for line, pts in steps_lines(result, key).items():  # the fewer-steps and solver lines (bench --solver-line)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=":", lw=1.2, zorder=2, label=f"{line} line")
    front = pareto_front([(x, y) for x, y, _, _ in points], higher)
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], color="#999999", lw=1, zorder=1)
    ax.set_xlabel("speedup over the baseline (wall clock, same run)")
    ax.set_ylabel(f"{key} ({'higher' if higher else 'lower'} is better)")
    m = result.model
    ax.set_title(f"{m.checkpoint}, batch {m.batch}, seeds {len(result.seeds)}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    _save_figure(fig, path, dpi=110)
    return True


def steps_lines(result: BenchResult | dict[str, Any], key: str) -> dict[str, list[tuple[float, float]]]:
    """The ``steps`` peers (``[[peer]] use = "steps"``, ``bench --solver-line``) as lines, one per
    scheduler ("steps": the config's own), each (speedup, quality) by increasing speedup."""
    result = as_result(result)
    lines: dict[str, list[tuple[float, float]]] = {}
    for e in result.entries:
        p = e.peer or {}
        if p.get("use") == "steps" and e.speedup is not None and _finite(e.quality.get(key)):
            lines.setdefault(p.get("scheduler") or "steps", []).append((e.speedup, e.quality[key]))
    return {name: sorted(pts) for name, pts in lines.items() if len(pts) > 1}


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def pareto_front(points: list[tuple[float, float]], higher: bool) -> list[tuple[float, float]]:
    """The points no other point beats on both speedup and quality, by increasing speedup."""
    better = (lambda a, b: a >= b) if higher else (lambda a, b: a <= b)
    front = [p for p in points
             if not any(q != p and q[0] >= p[0] and better(q[1], p[1]) for q in points)]
    return sorted(front)


def image_grid(result: BenchResult | dict[str, Any], outputs: dict[str, list[Any]], path: Path) -> bool:
    """One row per entry (the baseline first), the first ``GRID_COLUMNS`` images of the bench's
    seeds in each: the same prompts and seeds in every column. False for outputs without images."""
    result = as_result(result)
    names = [e.name for e in result.entries]
    rows = []
    for name in names:
        outs = outputs.get(name) or []
        if not outs or not all(hasattr(o, "images") for o in outs):
            return False
        images = [img for o in outs for img in o.images][:GRID_COLUMNS]
        labels = [f"{p}, seed {s}" if p else f"seed {s}" for o in outs for p, s in zip(o.prompts, o.seeds)][:GRID_COLUMNS]
        rows.append((name, images, labels))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(len(r[1]) for r in rows)
    size = 1.3 if rows[0][1][0].shape[-1] <= 64 else 2.2
    fig, axes = plt.subplots(len(rows), cols, figsize=(size * cols + 1.2, size * len(rows) + 0.6), squeeze=False)
    for r, (name, images, labels) in enumerate(rows):
        for c in range(cols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(images):
                ax.axis("off")
                continue
            arr = images[c].detach().float().clamp(0, 1).permute(1, 2, 0).numpy()
            ax.imshow(arr[..., 0] if arr.shape[-1] == 1 else arr[..., :3], cmap="gray" if arr.shape[-1] == 1 else None,
                      vmin=0, vmax=1, interpolation="nearest")
            if r == 0:
                ax.set_title(labels[c], fontsize=6)
            if c == 0:
                ax.set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
    _save_figure(fig, path, dpi=100)
    return True


def text_samples(result: BenchResult | dict[str, Any], outputs: dict[str, list[Any]]) -> list[dict[str, Any]] | None:
    """For text outputs: the first line of the first ``TEXT_ROWS`` samples of every entry, by
    row (the same seed in every entry). None for outputs without texts."""
    result = as_result(result)
    names = [e.name for e in result.entries]
    texts = {}
    for name in names:
        outs = outputs.get(name) or []
        if not outs or not all(hasattr(o, "texts") for o in outs):
            return None
        texts[name] = [t for o in outs for t in o.texts][:TEXT_ROWS]
    seeds = [s for seed in result.seeds for s in range(seed, seed + result.model.batch)][:TEXT_ROWS]
    return [{"seed": seed, "lines": {n: _first_line(texts[n][i]) for n in names if i < len(texts[n])}}
            for i, seed in enumerate(seeds)]


def _first_line(text: str) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= TEXT_CHARS else line[: TEXT_CHARS - 3].rstrip() + "..."
