"""The bench's page: one bench's section as blocks (headings, paragraphs, tables, images),
rendered to Markdown and to HTML, and several report folders combined into one page
(``combine``: ``docs/benchmarks.md``). Every figure is read from the bench's result."""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path
from typing import Any

from ..runtime.jobs import atomic_write
from ..runtime.memory import memory_cell
from .results import BenchResult, as_result

MEASURES = {"gen_ppl": False, "psnr": True, "perplexity": False, "ssim": True, "agreement": True}
"""The quality measures a page plots and summarises (the Pareto plot's y axis, the summary's
column), in the order they are preferred: the first that every entry of a bench has is its
measure. True: higher is better."""


def measure(result: BenchResult | dict[str, Any]) -> str | None:
    """The quality measure the Pareto plot shows: the first of ``MEASURES`` every entry has."""
    result = as_result(result)
    for key in MEASURES:
        if all(key in e.quality for e in result.entries):
            return key
    return None


def table(result: BenchResult | dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The results table (head, rows), every cell formatted from ``result``."""
    result = as_result(result)
    keys: list[str] = []
    for e in result.entries:
        keys += [k for k in e.quality if k not in keys]
    measured = any(e.has("memory") for e in result.entries)  # benches before issue 39 have no memory
    head = ["entry", "speedup", "computed", *(["state MB"] if measured else []), *keys]
    rows = []
    for e in result.entries:
        computed = "-" if e.fraction_computed is None else f"{e.fraction_computed:.0%}"
        mem = [memory_cell(e.memory)] if measured else []
        rows.append([e.name, f"{e.speedup:.2f}x", computed, *mem, *[fmt(e.quality.get(k)) for k in keys]])
    return head, rows


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"


def section_blocks(result: BenchResult | dict[str, Any], meta: dict[str, Any], *, prefix: str, level: int) -> list[tuple]:
    """The blocks of one bench's section; ``prefix``: the report folder relative to the page."""
    result = as_result(result)
    h, sub = f"h{level}", f"h{level + 1}"
    m = result.model
    batch = m.batch
    blocks: list[tuple] = [
        (h, f"{m.checkpoint} ({m.adapter}), batch {batch}"),
        ("pre", meta["command"]),
        ("p", f"{len(result.seeds)} seed(s) {result.seeds} of {batch} row(s) each, {result.repeats} repeat(s), "
              f"{m.steps or 'default'} steps; every entry runs on the same seeds, interleaved. Speedup: the "
              "baseline's wall time over the entry's in this run; quality: against the baseline's outputs of the same seeds."),
        ("table", *table(result)),
    ]
    j = result.judge
    if j and j.note:
        blocks.append(("p", f"gen_ppl: not reported: {j.note}"))
    elif j:
        blocks.append(("p", f"gen_ppl: perplexity of the samples under {j.name} ({j.lines} lines, {j.tokens} tokens)"
                            + ("; gen_ppl_noise: the baseline on other seeds " + str(j.noise_seeds) if j.has("noise_seeds") else "")))
    a = meta["assets"]
    if a.get("pareto"):
        blocks.append(("img", prefix + a["pareto"], f"speedup against {measure(result)}, {m.checkpoint}, batch {batch}"))
    if a.get("grid"):
        blocks += [(sub, "Images: the same prompts and seeds per entry, the baseline first"),
                   ("img", prefix + a["grid"], f"image grid, {m.checkpoint}")]
    if a.get("samples"):
        blocks.append((sub, "Samples: the first line of each entry's, beside the baseline's"))
        names = [e.name for e in result.entries]
        for row in a["samples"]:
            blocks.append(("table", ["entry", f"row seed {row['seed']}"], [[n, row["lines"].get(n, "")] for n in names]))
    if a.get("plots"):
        blocks.append((sub, "The strategies' own plots"))
        for p in a["plots"]:
            blocks.append(("img", prefix + p["path"], f"{p['strategy']} in {p['entry']}"))
    blocks.append((sub, "Versions and machine"))
    facts = {**{f"version {k}": v for k, v in meta["versions"].items()}, **meta["machine"],
             "bench wall time": f"{result.wall_s if result.wall_s is not None else float('nan'):.0f} s"}
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


def load_section(report_dir: str | Path) -> tuple[BenchResult, dict[str, Any]]:
    d = Path(report_dir)
    return BenchResult.from_json((d / "bench.json").read_text()), json.loads((d / "report.json").read_text())


def summary_blocks(sections: list[tuple[str, BenchResult, dict[str, Any]]]) -> list[tuple]:
    """One row per entry of every section: speedup and the section's quality measure beside the baseline's."""
    rows = []
    for _, result, _ in sections:
        key = measure(result)
        base = next((e for e in result.entries if e.name == "baseline"), None)
        for e in result.entries:
            if e.name == "baseline":
                continue
            q = "-" if key is None else f"{key} {fmt(e.quality[key])} (baseline {fmt(base.quality[key]) if base else '-'})"
            rows.append([result.model.checkpoint, str(result.model.batch), e.name + (" (peer)" if e.has("peer") else ""),
                         f"{e.speedup:.2f}x", q])
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


def _write_text(path: Path, text: str) -> None:
    # never leave a half-written file under the final name
    atomic_write(path, (text if text.endswith("\n") else text + "\n").encode("utf-8"))
