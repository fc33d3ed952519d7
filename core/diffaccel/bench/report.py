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

import html
import io
import json
import math
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..contract.errors import DiffaccelError
from ..runtime.jobs import atomic_write
from ..runtime.memory import memory_cell

# quality measures, in the order the Pareto plot prefers them; True: higher is better
MEASURES = {"gen_ppl": False, "psnr": True, "perplexity": False, "ssim": True, "agreement": True}
GRID_COLUMNS = 10
TEXT_ROWS = 3
TEXT_CHARS = 110


# ---- facts ------------------------------------------------------------------------------------

def versions() -> dict[str, str]:
    """Versions of diffaccel, its libraries and every installed strategy distribution."""
    out = {}
    for dist in ("diffaccel", "torch", "transformers", "diffusers", "numpy", "pluggy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        from ..runtime.registry import Registry

        for row in Registry().describe():
            out.setdefault(row["distribution"], str(row["version"]))
    except DiffaccelError as exc:  # a broken plugin: say so rather than fail the report
        out["plugins"] = f"not listed ({exc})"
    return out


def machine(note: str | None = None) -> dict[str, Any]:
    """What the figures were measured on: CPU, cores, threads, memory, load, date, commit; and
    ``note`` or else the environment's ``DIFFACCEL_MACHINE_NOTE`` (e.g. that the machine was shared)."""
    import torch

    note = note or os.environ.get("DIFFACCEL_MACHINE_NOTE")
    facts: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                             "platform": platform.platform(), "python": platform.python_version(),
                             "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
                             "torch_threads": torch.get_num_threads(),
                             "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset")}
    try:
        facts["load_average_1_5_15min"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    mem = _meminfo_gib()
    if mem:
        facts["memory_gib"] = mem
    commit = _git_commit()
    if commit:
        facts["git_commit"] = commit
    if note:
        facts["note"] = note
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _git_commit() -> str | None:
    """The commit of the diffaccel checkout (``-dirty`` with uncommitted changes), if it is one."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


# ---- writing one report -----------------------------------------------------------------------

def write_report(out_dir: str | Path, result: dict[str, Any], outputs: dict[str, list[Any]], *, command: str,
                 plot_dir: str | Path | None = None, note: str | None = None) -> Path:
    """Write the report of one bench into ``out_dir`` (created); returns the path of index.md.

    ``outputs``: entry name -> that entry's run outputs, in the order of ``result["seeds"]``
    (``run_bench(..., keep_outputs=...)``); ``plot_dir``: where the bench wrote the strategies'
    plots (``--plots``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_text(out / "bench.json", json.dumps(result, indent=2, default=float))
    assets: dict[str, Any] = {"pareto": None, "grid": None, "samples": None, "plots": []}
    if pareto_plot(result, out / "pareto.png"):
        assets["pareto"] = "pareto.png"
    if image_grid(result, outputs, out / "grid.png"):
        assets["grid"] = "grid.png"
    assets["samples"] = text_samples(result, outputs)
    if plot_dir is not None:
        for e in result["entries"]:
            for s in e["strategies"]:
                p = Path(plot_dir) / f"{e['name']}-{s}.png"
                if p.is_file():
                    assets["plots"].append({"entry": e["name"], "strategy": s, "path": os.path.relpath(p, out)})
    meta = {"command": command, "versions": versions(), "machine": machine(note), "assets": assets}
    _write_text(out / "report.json", json.dumps(meta, indent=2, default=str))
    blocks = section_blocks(result, meta, prefix="", level=2)
    title = f"diffaccel bench: {result['model']['checkpoint']}"
    _write_text(out / "index.md", to_markdown([("h1", title), *blocks]))
    _write_text(out / "index.html", to_html([("h1", title), *blocks], title))
    return out / "index.md"


def _write_text(path: Path, text: str) -> None:
    # never leave a half-written file under the final name
    atomic_write(path, (text if text.endswith("\n") else text + "\n").encode("utf-8"))


def _save_figure(fig, path: Path, dpi: int) -> None:
    """A matplotlib figure as a PNG at ``path``, written atomically; the figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def measure(result: dict[str, Any]) -> str | None:
    """The quality measure the Pareto plot shows: the first of ``MEASURES`` every entry has."""
    for key in MEASURES:
        if all(key in e["quality"] for e in result["entries"]):
            return key
    return None


def pareto_plot(result: dict[str, Any], path: Path) -> bool:
    """Speedup (x) against the quality measure (y): every entry and peer a labelled point, the
    baseline at 1x, the non-dominated entries joined. False when there is no measure to plot."""
    key = measure(result)
    if key is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    higher = MEASURES[key]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    points = []
    finite = [e["quality"][key] for e in result["entries"] if _finite(e["quality"][key])]
    # an entry whose outputs equal the baseline's (PSNR inf) is drawn above the others, so labelled
    top = (max(finite) + 0.1 * ((max(finite) - min(finite)) or abs(max(finite)) or 1.0)) if finite else 1.0
    for e in result["entries"]:
        y = e["quality"][key]
        kind = "baseline" if e["name"] == "baseline" else ("peer" if "peer" in e else "diffaccel")
        held = (e.get("memory") or {}).get("state_mb")
        label = e["name"] + (f" ({memory_cell(e['memory'])} MB)" if held else "")  # memory: the price of a cache
        if not _finite(y):
            if kind == "baseline":  # e.g. PSNR of the baseline against itself: a line at 1x
                ax.axvline(1.0, color="#555555", ls="--", lw=1)
                ax.annotate("baseline (reference)", (1.0, 0.0), xycoords=("data", "axes fraction"), xytext=(3, 4),
                            textcoords="offset points", fontsize=8, color="#555555")
                continue
            y, label = top, f"{label} ({key} {fmt(y)}: the baseline's outputs)"
        points.append((e["speedup"], y, label, kind))
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
    m = result["model"]
    ax.set_title(f"{m['checkpoint']}, batch {m['batch']}, seeds {len(result['seeds'])}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    _save_figure(fig, path, dpi=110)
    return True


def steps_lines(result: dict[str, Any], key: str) -> dict[str, list[tuple[float, float]]]:
    """The ``steps`` peers (``[[peer]] use = "steps"``, ``bench --solver-line``) as lines, one per
    scheduler ("steps": the config's own), each (speedup, quality) by increasing speedup."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for e in result["entries"]:
        p = e.get("peer") or {}
        if p.get("use") == "steps" and e.get("speedup") is not None and _finite(e["quality"].get(key)):
            lines.setdefault(p.get("scheduler") or "steps", []).append((e["speedup"], e["quality"][key]))
    return {name: sorted(pts) for name, pts in lines.items() if len(pts) > 1}


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def pareto_front(points: list[tuple[float, float]], higher: bool) -> list[tuple[float, float]]:
    """The points no other point beats on both speedup and quality, by increasing speedup."""
    better = (lambda a, b: a >= b) if higher else (lambda a, b: a <= b)
    front = [p for p in points
             if not any(q != p and q[0] >= p[0] and better(q[1], p[1]) for q in points)]
    return sorted(front)


def image_grid(result: dict[str, Any], outputs: dict[str, list[Any]], path: Path) -> bool:
    """One row per entry (the baseline first), the first ``GRID_COLUMNS`` images of the bench's
    seeds in each: the same prompts and seeds in every column. False for outputs without images."""
    names = [e["name"] for e in result["entries"]]
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


def text_samples(result: dict[str, Any], outputs: dict[str, list[Any]]) -> list[dict[str, Any]] | None:
    """For text outputs: the first line of the first ``TEXT_ROWS`` samples of every entry, by
    row (the same seed in every entry). None for outputs without texts."""
    names = [e["name"] for e in result["entries"]]
    texts = {}
    for name in names:
        outs = outputs.get(name) or []
        if not outs or not all(hasattr(o, "texts") for o in outs):
            return None
        texts[name] = [t for o in outs for t in o.texts][:TEXT_ROWS]
    seeds = [s for seed in result["seeds"] for s in range(seed, seed + result["model"]["batch"])][:TEXT_ROWS]
    return [{"seed": seed, "lines": {n: _first_line(texts[n][i]) for n in names if i < len(texts[n])}}
            for i, seed in enumerate(seeds)]


def _first_line(text: str) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= TEXT_CHARS else line[: TEXT_CHARS - 3].rstrip() + "..."


# ---- the page, as blocks rendered to Markdown and to HTML -------------------------------------

def table(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The results table (head, rows), every cell formatted from ``result``."""
    keys: list[str] = []
    for e in result["entries"]:
        keys += [k for k in e["quality"] if k not in keys]
    measured = any("memory" in e for e in result["entries"])  # benches before issue 39 have no memory
    head = ["entry", "speedup", "computed", *(["state MB"] if measured else []), *keys]
    rows = []
    for e in result["entries"]:
        computed = "-" if e["fraction_computed"] is None else f"{e['fraction_computed']:.0%}"
        mem = [memory_cell(e.get("memory"))] if measured else []
        rows.append([e["name"], f"{e['speedup']:.2f}x", computed, *mem, *[fmt(e["quality"].get(k)) for k in keys]])
    return head, rows


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"


def section_blocks(result: dict[str, Any], meta: dict[str, Any], *, prefix: str, level: int) -> list[tuple]:
    """The blocks of one bench's section; ``prefix``: the report folder relative to the page."""
    h, sub = f"h{level}", f"h{level + 1}"
    m = result["model"]
    batch = m["batch"]
    blocks: list[tuple] = [
        (h, f"{m['checkpoint']} ({m['adapter']}), batch {batch}"),
        ("pre", meta["command"]),
        ("p", f"{len(result['seeds'])} seed(s) {result['seeds']} of {batch} row(s) each, {result['repeats']} repeat(s), "
              f"{m['steps'] or 'default'} steps; every entry runs on the same seeds, interleaved. Speedup: the "
              "baseline's wall time over the entry's in this run; quality: against the baseline's outputs of the same seeds."),
        ("table", *table(result)),
    ]
    j = result.get("judge")
    if j and j.get("note"):
        blocks.append(("p", f"gen_ppl: not reported: {j['note']}"))
    elif j:
        blocks.append(("p", f"gen_ppl: perplexity of the samples under {j['name']} ({j['lines']} lines, {j['tokens']} tokens)"
                            + ("; gen_ppl_noise: the baseline on other seeds " + str(j["noise_seeds"]) if "noise_seeds" in j else "")))
    a = meta["assets"]
    if a.get("pareto"):
        blocks.append(("img", prefix + a["pareto"], f"speedup against {measure(result)}, {m['checkpoint']}, batch {batch}"))
    if a.get("grid"):
        blocks += [(sub, "Images: the same prompts and seeds per entry, the baseline first"),
                   ("img", prefix + a["grid"], f"image grid, {m['checkpoint']}")]
    if a.get("samples"):
        blocks.append((sub, "Samples: the first line of each entry's, beside the baseline's"))
        names = [e["name"] for e in result["entries"]]
        for row in a["samples"]:
            blocks.append(("table", ["entry", f"row seed {row['seed']}"], [[n, row["lines"].get(n, "")] for n in names]))
    if a.get("plots"):
        blocks.append((sub, "The strategies' own plots"))
        for p in a["plots"]:
            blocks.append(("img", prefix + p["path"], f"{p['strategy']} in {p['entry']}"))
    blocks.append((sub, "Versions and machine"))
    facts = {**{f"version {k}": v for k, v in meta["versions"].items()}, **meta["machine"],
             "bench wall time": f"{result.get('wall_s', float('nan')):.0f} s"}
    blocks.append(("table", ["fact", "value"], [[k, str(v)] for k, v in facts.items()]))
    return blocks


def to_markdown(blocks: list[tuple]) -> str:
    parts = []
    for b in blocks:
        kind = b[0]
        if kind[0] == "h":
            parts.append("#" * int(kind[1:]) + " " + b[1])
        elif kind == "p":
            parts.append(b[1])
        elif kind == "pre":
            parts.append(f"```\n{b[1]}\n```")
        elif kind == "img":
            parts.append(f"![{b[2]}]({b[1]})")
        elif kind == "table":
            head, rows = b[1], b[2]
            cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
            lines = ["| " + " | ".join(map(cell, head)) + " |", "| " + " | ".join("---" for _ in head) + " |"]
            lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
            parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def to_html(blocks: list[tuple], title: str) -> str:
    esc = html.escape
    body = []
    for b in blocks:
        kind = b[0]
        if kind[0] == "h":
            body.append(f"<{kind}>{esc(b[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{esc(b[1])}</p>")
        elif kind == "pre":
            body.append(f"<pre>{esc(b[1])}</pre>")
        elif kind == "img":
            body.append(f'<p><img src="{esc(b[1])}" alt="{esc(b[2])}"></p>')
        elif kind == "table":
            head = "".join(f"<th>{esc(str(c))}</th>" for c in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
    style = ("body{font-family:sans-serif;max-width:70em;margin:1em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}"
             "pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap}img{max-width:100%}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# ---- several reports on one page --------------------------------------------------------------

def load_section(report_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    d = Path(report_dir)
    return json.loads((d / "bench.json").read_text()), json.loads((d / "report.json").read_text())


def summary_blocks(sections: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[tuple]:
    """One row per entry of every section: speedup and the section's quality measure beside the baseline's."""
    rows = []
    for _, result, _ in sections:
        key = measure(result)
        base = next((e for e in result["entries"] if e["name"] == "baseline"), None)
        for e in result["entries"]:
            if e["name"] == "baseline":
                continue
            q = "-" if key is None else f"{key} {fmt(e['quality'][key])} (baseline {fmt(base['quality'][key]) if base else '-'})"
            rows.append([result["model"]["checkpoint"], str(result["model"]["batch"]), e["name"] + (" (peer)" if "peer" in e else ""),
                         f"{e['speedup']:.2f}x", q])
    return [("table", ["model", "batch", "entry", "speedup", "quality measure"], rows)]


def combine(report_dirs: list[str | Path], md_path: str | Path, html_path: str | Path, *, title: str, intro: str,
            extra: list[tuple[str | Path, list[tuple]]] = ()) -> None:
    """One page (Markdown and HTML) from several report folders: a summary table, then each
    bench's section, then ``extra`` sections (a folder and its blocks, images relative to that
    folder: e.g. ``tune_report.tune_blocks``); image links relative to each page."""
    md_path, html_path = Path(md_path), Path(html_path)
    sections = [(str(d), *load_section(d)) for d in report_dirs]
    head = [("h1", title), ("p", intro), ("h2", "Summary"), *summary_blocks(sections)]
    for page, render in ((md_path, lambda b: to_markdown(b)), (html_path, lambda b: to_html(b, title))):
        blocks = list(head)
        for d, result, meta in sections:
            prefix = os.path.relpath(d, page.parent).replace(os.sep, "/") + "/"
            blocks += section_blocks(result, meta, prefix=prefix, level=2)
        for d, more in extra:
            prefix = os.path.relpath(d, page.parent).replace(os.sep, "/") + "/"
            blocks += [(b[0], prefix + b[1], *b[2:]) if b[0] == "img" else b for b in more]
        page.parent.mkdir(parents=True, exist_ok=True)
        _write_text(page, render(blocks))
