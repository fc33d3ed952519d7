"""The README stays short and links what moved out; the Python examples (docs/python.md, linked
from the README) run as written (the Stable Diffusion one on a tiny random pipeline substituted
for the hub id, offline), and ``diffaccel.apply(pipe, strategies=[{...}])`` checks its tables
exactly as a config file's ``[[strategy]]`` tables are checked."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import diffaccel
from diffaccel import ConfigError, load_config
from diffaccel.adapters.text.testing import tiny_text_pipeline

README = Path(__file__).resolve().parents[1] / "README.md"
PYTHON = README.parent / "docs" / "python.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PYTHON.read_text(), re.S)


def test_readme_is_under_200_lines_with_the_commands_the_table_and_the_links():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert "```\nmake demo\n```" in text and "```\nmake test\n```" in text  # the two commands
    assert "<!-- strategies table: generated" in text and "<!-- end of the generated strategies table -->" in text
    for doc in ("docs/python.md", "docs/scale-out.md", "docs/serve.md", "docs/tune.md", "docs/writing-a-plugin.md"):
        assert f"]({doc})" in text and (README.parent / doc).exists(), doc
    assert "```python" not in text  # the examples live in docs/python.md


def test_readme_has_a_config_a_text_and_a_diffusers_example_of_at_most_ten_lines():
    blocks = python_blocks()
    assert len(blocks) == 3
    assert "diffaccel.Run(" in blocks[0] and "load_pipeline" in blocks[1] and "StableDiffusionPipeline" in blocks[2]
    assert all(len(b.strip().splitlines()) <= 10 for b in blocks)
    assert all("strategies=" in b for b in blocks)


def test_readme_config_example_runs_the_config_then_another_configs_strategies(monkeypatch, capsys):
    monkeypatch.chdir(README.parent)  # the example names configs/ of the repository
    exec(compile(python_blocks()[0], f"{README}:config-example", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].strip()  # a sample
    assert out[-2].startswith("wordnet-masked, 128 steps, strategies: swd; ") and not out[-2].endswith("computed 100%")
    assert eval(out[-1])["fraction_computed"] == 1.0  # text-default.toml has no strategy


def test_readme_text_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(python_blocks()[1], f"{README}:text-example", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].strip()  # a sample
    counters = eval(out[-1])  # the printed counters dict
    assert counters["fraction_computed"] < 0.9  # the strategies skipped (layer, position) states


def test_readme_diffusers_example_runs_on_a_tiny_pipeline(tmp_path, monkeypatch, capsys):
    from diffusers import StableDiffusionPipeline
    from PIL import Image

    from diffaccel.adapters.diffusers.unet.synthetic import build

    asked = []

    def from_pretrained(name, **kwargs):
        asked.append(name)
        return build("synthetic-sd-tiny")

    monkeypatch.setattr(StableDiffusionPipeline, "from_pretrained", staticmethod(from_pretrained))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(python_blocks()[2], f"{README}:diffusers-example", "exec"), namespace)
    assert asked == ["stable-diffusion-v1-5/stable-diffusion-v1-5"]
    with Image.open(tmp_path / "astronaut.png") as im:
        assert im.width > 0
    pipe = namespace["pipe"]
    from diffaccel.adapters.diffusers.unet import hooks

    assert hooks.session_of(pipe) is None  # the block's exit removed the hooks
    counters = eval(capsys.readouterr().out.splitlines()[-1])  # the printed report's counters
    # every block call of the run counted once, computed or skipped, over the 2 rows of a guided call
    assert counters["layers_computed"] + counters["layers_skipped"] == counters["positions_total"] // 2 > 0


def _error(fn) -> str:
    with pytest.raises(ConfigError) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize("table", [
    {"use": "topk", "k": 0},
    {"use": "swd", "no_such_key": 1},
    {"use": "swd", "tau": "high"},
    {"use": "no-such-strategy"},
    {"k": 3},
])
def test_apply_tables_fail_with_the_config_files_line(tmp_path, table):
    pipe = tiny_text_pipeline()
    toml = tmp_path / "c.toml"
    toml.write_text('[model]\nadapter = "text"\n[[strategy]]\n' + "".join(
        f"{k} = {v!r}\n".replace("'", '"') for k, v in table.items()))
    from_file = _error(lambda: load_config(toml))
    from_apply = _error(lambda: diffaccel.apply(pipe, strategies=[table]).__enter__())
    assert from_file.startswith(f"{toml}: ") and from_apply.startswith("diffaccel.apply: ")
    assert from_file.removeprefix(f"{toml}: ") == from_apply.removeprefix("diffaccel.apply: ")


def test_apply_tables_run_as_the_same_config_file(tmp_path):
    pipe = tiny_text_pipeline()
    toml = tmp_path / "c.toml"
    toml.write_text('[model]\nadapter = "text"\n[[strategy]]\nuse = "swd"\ntau = 0.8\n[[strategy]]\nuse = "time-anchor"\n')
    with diffaccel.apply(pipe, toml):
        a = pipe(length=24, steps=12, seed=3, progress=False)
    with diffaccel.apply(pipe, strategies=[{"use": "swd", "tau": 0.8}, {"use": "time-anchor"}]):
        b = pipe(length=24, steps=12, seed=3, progress=False)
    assert torch.equal(a.tokens, b.tokens)
    assert a.report["counters"] == b.report["counters"] and b.report["counters"]["fraction_computed"] < 1.0
    assert list(b.report["strategies"]) == ["swd", "time-anchor"]


def test_apply_refuses_tables_mixed_with_instances_or_a_config():
    pipe = tiny_text_pipeline()
    from diffaccel_swd import SWD

    assert "not both" in _error(lambda: diffaccel.apply(pipe, strategies=[{"use": "swd"}, SWD()]).__enter__())
    assert "not both" in _error(lambda: diffaccel.apply(pipe, "x.toml", strategies=[{"use": "swd"}]).__enter__())


def _benchmarks_script():
    import importlib.util

    path = README.parent / "docs" / "benchmarks.py"
    spec = importlib.util.spec_from_file_location("docs_benchmarks", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_readme_strategies_table_is_the_one_generated_from_the_benches():
    bench = _benchmarks_script()
    text = README.read_text()
    assert bench.readme_with_table(text, bench.headline_table()) == text, "run `python docs/benchmarks.py --combine-only`"


def test_strategies_table_follows_the_bench_json(tmp_path):
    import json
    import shutil

    bench = _benchmarks_script()
    src = README.parent / "docs" / "benchmarks" / "text-masked-b1"
    shutil.copytree(src, tmp_path / "text-masked-b1")
    before = bench.headline_table(tmp_path)
    path = tmp_path / "text-masked-b1" / "bench.json"
    result = json.loads(path.read_text())
    swd = next(e for e in result["entries"] if e["name"] == "text-swd")
    swd["speedup"] = 9.87
    path.write_text(json.dumps(result))
    after = bench.headline_table(tmp_path)
    assert "[9.87x / -](docs/benchmarks.md#wordnet-masked-text-batch-1) (batch 1 / -)" in after and "9.87x" not in before
    assert "not measured yet (bench `digits-solvers-b10`)" in after  # a missing bench is said, not invented


def _rows(table: str) -> list[list[str]]:
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]


def test_the_strategies_table_has_one_row_per_strategy_and_short_cells():
    bench = _benchmarks_script()
    table = bench.headline_table()
    rows = _rows(table)
    assert len(rows) == len(bench.HEADLINE) and all(len(r) == 3 + len(bench.FAMILIES) for r in rows)
    for row in rows:
        for cell in row:
            assert len(bench.visible(cell)) <= bench.CELL_MAX, cell
    # image figures are at batch 10, text ones at batch 8: each cell names its N
    digits = rows[1][2 + bench.FAMILIES.index(bench.UNET)]
    assert "(batch 1 / 10)" in digits and "(batch 1 / 8)" in rows[0][2]


def test_the_strategies_table_links_resolve_to_headings_of_the_records():
    bench = _benchmarks_script()

    def anchors(page: Path) -> set[str]:
        seen: dict[str, int] = {}
        out = set()
        for line in page.read_text().splitlines():
            if line.startswith("#"):
                slug = bench._slug(line.lstrip("#").strip())
                out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
                seen[slug] = seen.get(slug, 0) + 1
        return out

    pages = {name: anchors(README.parent / name) for name in ("docs/benchmarks.md", "docs/task-benchmarks.md")}
    links = re.findall(r"\]\((docs/[^)#]+)#([^)]+)\)", bench.headline_table())
    assert len(links) > 10
    for page, anchor in links:
        assert anchor in pages[page], f"{page}#{anchor}"


def test_readme_without_the_table_markers_is_refused():
    bench = _benchmarks_script()
    with pytest.raises(SystemExit, match="markers"):
        bench.readme_with_table("# no table here\n", "| a |")


def test_a_tune_that_found_nothing_is_said_on_the_rows_of_the_strategies_it_searched(tmp_path):
    import json

    bench = _benchmarks_script()
    (tmp_path / "tune-text").mkdir()
    (tmp_path / "tune-text" / "tune.json").write_text(json.dumps(
        {"budgets": ["gen_ppl<=+5%"], "chosen": None, "figures": {}, "trials": 12}))
    rows = {r[0]: r[-1] for r in _rows(bench.headline_table(tmp_path))}
    searched = [k for k, cell in rows.items() if "[text](docs/benchmarks.md#tune-text-tuned-to-a-budget): none" in cell]
    assert [k.split("`")[1] if "`" in k else k for k in searched] == ["swd", "time-anchor", "swd", "parallel"]
    assert not any("none" in cell for k, cell in rows.items() if "dct-anchor" in k)


def _cell(table: str, strategy: str, family: str, bench) -> str:
    row = next(r for r in _rows(table) if strategy in r[0])
    return row[2 + bench.FAMILIES.index(family)]


def test_an_image_strategy_below_the_solver_line_is_said_in_the_table(tmp_path):
    import json

    bench = _benchmarks_script()
    (tmp_path / "digits-solvers-b10").mkdir()  # digits-solvers-b1 missing: said, not invented

    def peer(name, x, psnr, acc, scheduler=None):
        return {"name": name, "speedup": x, "quality": {"psnr": psnr, "cond_acc": acc},
                "peer": {"use": "steps", "steps": 0, "scheduler": scheduler, "name": None}}

    entries = [{"name": "baseline", "speedup": 1.0, "quality": {"psnr": float("inf"), "cond_acc": 0.9}},
               peer("steps-25", 2.0, 30.0, 0.95), peer("steps-12", 4.0, 24.0, 1.0),
               peer("dpm++2m-17", 3.0, 25.0, 1.0, "dpm++2m"), peer("dpm++2m-10", 5.0, 24.5, 1.0, "dpm++2m"),
               {"name": "digits-time-anchor", "speedup": 3.0, "quality": {"psnr": 26.0, "cond_acc": 1.0}},
               {"name": "digits-dct", "speedup": 3.0, "quality": {"psnr": 28.0, "cond_acc": 1.0}}]
    (tmp_path / "digits-solvers-b10" / "bench.json").write_text(json.dumps({"model": {"batch": 10}, "entries": entries}))
    table = bench.headline_table(tmp_path)
    # at 3x the fewer-steps line is at 27 dB (between 30 at 2x and 24 at 4x), above DPM-Solver++'s 25
    assert _cell(table, "time-anchor", bench.UNET, bench).endswith(
        "(batch - / 10); PSNR 26.0 dB, acc 1.00 vs 0.90; **below the steps line**")
    assert _cell(table, "dct-anchor", bench.UNET, bench).endswith("PSNR 28.0 dB, acc 1.00 vs 0.90; above the steps line")
    assert "[- / 3.00x](docs/benchmarks.md#" in _cell(table, "dct-anchor", bench.UNET, bench)


def test_an_image_strategy_off_either_end_of_the_solver_line_is_said_in_the_table(tmp_path):
    import json

    bench = _benchmarks_script()
    (tmp_path / "dit-digits-solvers-b10").mkdir()
    steps = [{"name": n, "speedup": x, "quality": {"psnr": y, "cond_acc": 0.2},
              "peer": {"use": "steps", "steps": 0, "scheduler": None, "name": None}}
             for n, x, y in (("steps-25", 2.0, 37.0), ("steps-10", 5.0, 25.0))]
    entries = [{"name": "baseline", "speedup": 1.0, "quality": {"psnr": float("inf"), "cond_acc": 0.2}}, *steps,
               {"name": "dit-digits-time-anchor", "speedup": 1.5, "quality": {"psnr": 40.0, "cond_acc": 0.2}},
               {"name": "dit-digits-dct", "speedup": 6.0, "quality": {"psnr": 20.0, "cond_acc": 0.2}},
               {"name": "dit-digits-fast", "speedup": 0.8, "quality": {"psnr": 50.0, "cond_acc": 0.2}}]
    (tmp_path / "dit-digits-solvers-b10" / "bench.json").write_text(json.dumps({"entries": entries}))
    table = bench.headline_table(tmp_path)
    # off the line's ends: no verdict against its end points (the line would go on), said as such
    assert _cell(table, "time-anchor", bench.DIT, bench).endswith("; slower than any steps setting")
    assert _cell(table, "dct-anchor", bench.DIT, bench).endswith("; faster than any steps setting")
    assert _cell(table, "cache on a solver", bench.DIT, bench).endswith("; slower than the baseline")
    # a speedup whose interval holds 1x (a cost gate that kept full steps) is the baseline's speed, not slower
    entries[-1]["speedup_ci"] = [0.7, 1.02]
    (tmp_path / "dit-digits-solvers-b10" / "bench.json").write_text(json.dumps({"entries": entries}))
    table = bench.headline_table(tmp_path)
    assert _cell(table, "cache on a solver", bench.DIT, bench).endswith("; the baseline's speed")


def test_a_text_strategy_is_read_against_its_steps_line_in_its_own_quality(tmp_path):
    import json

    bench = _benchmarks_script()
    (tmp_path / "text-masked-b8").mkdir()
    steps = [{"name": n, "speedup": x, "quality": {"gen_ppl": y}, "peer": {"use": "steps", "steps": 0, "name": None}}
             for n, x, y in (("steps-64", 2.0, 1000.0), ("steps-32", 4.0, 2000.0))]
    entries = [{"name": "baseline", "speedup": 1.0, "quality": {"gen_ppl": 500.0}}, *steps,
               {"name": "text-swd", "speedup": 3.0, "quality": {"gen_ppl": 1400.0}},  # line: 1500 at 3x
               {"name": "text-time-anchor", "speedup": 3.0, "quality": {"gen_ppl": 1600.0}}]
    (tmp_path / "text-masked-b8" / "bench.json").write_text(json.dumps({"model": {"batch": 8}, "entries": entries}))
    table = bench.headline_table(tmp_path)
    # gen_ppl: lower is better, so 1400 under the line's 1500 is above it
    assert _cell(table, "swd`](", bench.WORDNET, bench).endswith("(batch - / 8); gen_ppl +180%; above the steps line")
    assert _cell(table, "time-anchor`](", bench.WORDNET, bench).endswith("gen_ppl +220%; **below the steps line**")
