"""``diffaccel bench --report DIR``: the files of a report rendered from tiny benches, its table
read back against the bench's JSON, and several reports combined into one page."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from diffaccel.cli.entry import main
from diffaccel.runtime.memory import memory_cell
from diffaccel.bench.report import combine, pareto_front, to_markdown

DIGITS = ('[model]\nadapter = "unet"\ncheckpoint = "digits"\nsteps = 6\nbatch = 3\nguidance_scale = 2.0\n'
          'prompts = ["digit 1", "digit 2", "digit 3"]\nscheduler = "ddim"\n')
TEXT = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 6\n'


def md_tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of ``text`` as rows of cells (head first, the --- row dropped)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("| "):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(c == "---" for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def assert_table_matches_json(table: list[list[str]], result: dict) -> None:
    head, rows = table[0], table[1:]
    assert head[:3] == ["entry", "speedup", "computed"]
    assert [r[0] for r in rows] == [e["name"] for e in result["entries"]]
    for row, e in zip(rows, result["entries"]):
        assert float(row[1].rstrip("x")) == pytest.approx(e["speedup"], abs=0.006)
        if e["fraction_computed"] is None:
            assert row[2] == "-"
        else:
            assert float(row[2].rstrip("%")) == pytest.approx(100 * e["fraction_computed"], abs=0.51)
        q = 3
        if head[3] == "state MB":  # the entry's memory cost (issue 39)
            assert row[3] == memory_cell(e.get("memory")) and e["memory"]["state_mb"] >= 0
            q = 4
        for key, cell in zip(head[q:], row[q:]):
            value = e["quality"].get(key)
            if value is None:
                assert cell == "-"
            elif cell == "inf":
                assert value == float("inf")
            else:
                assert float(cell) == pytest.approx(value, abs=0.051, rel=1e-3)


def html_images(page: Path) -> list[Path]:
    html = page.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html  # opens offline
    return [page.parent / src for src in re.findall(r'<img src="([^"]+)"', html)]


def test_image_bench_report_has_table_plots_and_grid(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("base.toml").write_text(DIGITS)
    Path("dct.toml").write_text(DIGITS + '[[strategy]]\nuse = "dct-anchor"\nthreshold = 0.3\nband = 2\n')
    Path("ta.toml").write_text(DIGITS + '[[strategy]]\nuse = "time-anchor"\nthreshold = 0.05\n')
    assert main(["bench", "base.toml", "dct.toml", "ta.toml", "--seeds", "2", "--no-progress", "--report", "rep"]) == 0
    rep = tmp_path / "rep"
    result = json.loads((rep / "bench.json").read_text())
    assert [e["name"] for e in result["entries"]] == ["baseline", "dct", "ta"]
    md = (rep / "index.md").read_text()
    assert_table_matches_json(md_tables(md)[0], result)
    for name in ("pareto.png", "grid.png", "plots/dct-dct-anchor.png", "plots/ta-time-anchor.png"):
        assert (rep / name).stat().st_size > 1000, name
        assert f"]({name})" in md
    images = html_images(rep / "index.html")
    assert {p.relative_to(rep).as_posix() for p in images} == {"pareto.png", "grid.png", "plots/dct-dct-anchor.png", "plots/ta-time-anchor.png"}
    from PIL import Image

    grid = Image.open(rep / "grid.png")
    assert grid.height > grid.width / 6  # three rows of images, the baseline's first
    meta = json.loads((rep / "report.json").read_text())
    assert meta["command"] == "diffaccel bench base.toml dct.toml ta.toml --seeds 2 --no-progress --report rep"
    assert {"diffaccel", "torch", "transformers", "diffusers", "diffaccel-dct-anchor"} <= set(meta["versions"])
    assert meta["machine"]["cpu_count"] == os.cpu_count() and "OMP_NUM_THREADS" in meta["machine"]
    assert "```\ndiffaccel bench base.toml dct.toml ta.toml" in md
    assert not list(rep.rglob("*.partial*"))


def test_text_bench_report_shows_each_entrys_first_lines_beside_the_baseline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("base.toml").write_text(TEXT)
    Path("swd.toml").write_text(TEXT + '[[strategy]]\nuse = "swd"\n')
    assert main(["bench", "base.toml", "swd.toml", "--seeds", "2", "--batch", "2", "--judge", "none",
                 "--no-progress", "--report", "rep", "--json", "b.json"]) == 0
    rep = tmp_path / "rep"
    result = json.loads((rep / "bench.json").read_text())
    assert json.loads(Path("b.json").read_text())["entries"][1]["speedup"] == result["entries"][1]["speedup"]
    md = (rep / "index.md").read_text()
    tables = md_tables(md)
    assert_table_matches_json(tables[0], result)
    samples = [t for t in tables if t[0][0] == "entry" and t[0][1].startswith("row seed")]
    assert [t[0][1] for t in samples] == ["row seed 0", "row seed 1", "row seed 2"]
    assert all([r[0] for r in t[1:]] == ["baseline", "swd"] for t in samples)
    assert all(t[1][1] for t in samples)  # the baseline's line is not empty
    assert (rep / "pareto.png").is_file() and not (rep / "grid.png").exists()
    assert (rep / "plots" / "swd-swd.png").is_file()
    assert "agreement" in md  # the Pareto plot's measure without a judge: perplexity, then agreement


def test_combined_page_links_each_reports_files_relative_to_the_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("base.toml").write_text(TEXT)
    Path("swd.toml").write_text(TEXT + '[[strategy]]\nuse = "swd"\n')
    for batch in ("1", "2"):
        assert main(["bench", "base.toml", "swd.toml", "--seeds", "1", "--batch", batch, "--judge", "none",
                     "--no-progress", "--no-noise-floor", "--report", f"docs/benchmarks/b{batch}"]) == 0
    combine(["docs/benchmarks/b1", "docs/benchmarks/b2"], "docs/benchmarks.md", "docs/benchmarks/index.html",
            title="Benchmarks", intro="intro")
    md = Path("docs/benchmarks.md").read_text()
    links = re.findall(r"\]\(([^)]+\.png)\)", md)
    assert "benchmarks/b1/pareto.png" in links and "benchmarks/b2/pareto.png" in links
    assert all((Path("docs") / link).is_file() for link in links)
    assert all(p.is_file() for p in html_images(Path("docs/benchmarks/index.html")))
    summary = md_tables(md)[0]
    b2 = json.loads(Path("docs/benchmarks/b2/bench.json").read_text())
    row = next(r for r in summary[1:] if r[1] == "2")
    assert row[2] == "swd" and float(row[3].rstrip("x")) == pytest.approx(b2["entries"][1]["speedup"], abs=0.006)


def test_pareto_front_keeps_only_points_nothing_beats():
    pts = [(1.0, 10.0), (2.0, 12.0), (3.0, 11.0), (2.5, 15.0), (0.9, 20.0)]
    assert pareto_front(pts, higher=False) == [(1.0, 10.0), (3.0, 11.0)]  # lower is better
    assert pareto_front(pts, higher=True) == [(0.9, 20.0), (2.5, 15.0), (3.0, 11.0)]


def test_markdown_cells_escape_the_pipe():
    md = to_markdown([("table", ["a", "b"], [["x|y", "1"]])])
    assert md_tables(md) == [[["a", "b"], ["x|y", "1"]]]
