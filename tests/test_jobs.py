"""``generate --prompts``: reading the prompts file, resume, per-item errors, bad input (one process).
The runs under ``accelerate launch`` are in test_scale_out.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffaccel.cli.entry import main
from diffaccel.contract.errors import DiffaccelError
from diffaccel.runtime.jobs import RESULTS, Item, read_items

TEXT = """[model]
adapter = "text"
checkpoint = "wordnet-masked"
length = 16
steps = 16
seed = 5
batch = 4
"""


def _write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / RESULTS).read_text(encoding="utf-8").splitlines()]


def test_items_seeds_and_json_lines(tmp_path):
    p = _write(tmp_path / "p.txt", 'dog:\r\n{"prompt": "cat:", "seed": 99}\n{"prompt": "{x}"}\n\n')
    assert read_items(p, 10) == [Item(0, "dog:", 10), Item(1, "cat:", 99), Item(2, "{x}", 12), Item(3, "", 13)]


@pytest.mark.parametrize("content,expected", [
    (None, "prompts file not found"),
    ("", "prompts file is empty"),
    (b"dog\n\xff\xfe cat\n", "line 2: not UTF-8"),
    ('dog\n{"prompt": "cat", \n', "line 2: a line starting with '{' must be a JSON object"),
    ('{"prompt": 3}\n', 'a JSON line needs a "prompt" string'),
    ('{"prompt": "a", "seed": -1}\n', 'line 1: key "seed": must be an integer >= 0'),
    ('{"prompt": "a", "colour": 1}\n', 'a JSON line needs a "prompt" string'),
])
def test_unreadable_prompts_file(tmp_path, content, expected):
    p = tmp_path / "p.txt"
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif content is not None:
        p.write_text(content)
    with pytest.raises(DiffaccelError, match=expected.replace("(", r"\(").replace("{", r"\{")) as e:
        read_items(p, 0)
    assert str(p) in str(e.value)


def _cli(capsys, *argv) -> tuple[int, str]:
    code = main(["generate", *map(str, argv), "--no-progress"])
    return code, capsys.readouterr().err


def test_bad_input_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch):
    from diffaccel.adapters.text.adapter import TextAdapter

    def no_load(*a, **k):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(TextAdapter, "load", staticmethod(no_load))
    cfg = _write(tmp_path / "c.toml", TEXT)
    prompts = _write(tmp_path / "p.txt", "dog:\n")
    afile = _write(tmp_path / "a-file", "x")
    cases = [
        ((cfg, "--prompts", tmp_path / "missing.txt", "--out", tmp_path / "o"), "missing.txt: prompts file not found"),
        ((cfg, "--prompts", _write(tmp_path / "e.txt", ""), "--out", tmp_path / "o"), "e.txt: prompts file is empty"),
        ((cfg, "--prompts", prompts, "--out", afile), "a-file: --out must be a folder"),
        ((cfg, "--prompts", prompts, "--out", Path(afile) / "sub"), "is a file"),
        ((cfg, "--prompts", prompts), "--prompts needs --out DIR"),
    ]
    for argv, expected in cases:
        code, err = _cli(capsys, *argv)
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert "Traceback" not in err


def test_model_that_cannot_load_is_one_line(tmp_path, capsys):
    cfg = _write(tmp_path / "c.toml", TEXT.replace("wordnet-masked", str(tmp_path / "no-such-model")))
    code, err = _cli(capsys, cfg, "--prompts", _write(tmp_path / "p.txt", "dog:\n"), "--out", tmp_path / "o")
    assert code == 2 and "no-such-model" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / RESULTS).exists()


def test_results_in_line_order_with_per_item_errors(tmp_path, capsys):
    cfg = _write(tmp_path / "c.toml", TEXT)
    long = "word " * 40  # fills all 16 positions: an error inside the model, for this item only
    prompts = _write(tmp_path / "p.txt", f'dog:\n\n{long}\n{{"prompt": "cat:", "seed": 3}}\n')
    out = tmp_path / "o"
    code, err = _cli(capsys, cfg, "--prompts", prompts, "--out", out)
    assert code == 1 and "2 failed" in err
    recs = _records(out)
    assert [r["line"] for r in recs] == [0, 1, 2, 3]
    assert [r["seed"] for r in recs] == [5, 6, 7, 3]
    assert recs[1]["error"] == "empty prompt"
    assert recs[2]["error"].startswith("ValueError: a prompt fills all 16 positions")
    assert recs[0]["text"].startswith("dog:") and recs[3]["text"].startswith("cat:")
    assert recs[0]["report"]["counters"]["layers_computed"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["job.json", RESULTS]  # no parts, no temporary files left

    # an item is the run of its own prompt and seed, whatever else is in the file
    alone = tmp_path / "alone"
    assert _cli(capsys, cfg, "--prompts", _write(tmp_path / "q.txt", '{"prompt": "cat:", "seed": 3}\n'), "--out", alone)[0] == 0
    assert _records(alone)[0]["text"] == recs[3]["text"]


def test_resume_skips_done_items_and_retries_failed_ones(tmp_path, capsys):
    cfg = _write(tmp_path / "c.toml", TEXT)
    out = tmp_path / "o"
    prompts = _write(tmp_path / "p.txt", "dog:\n\ncat:\n")
    assert _cli(capsys, cfg, "--prompts", prompts, "--out", out)[0] == 1
    first = (out / RESULTS).read_text()
    # a done item is not run again: a marker put in its text survives the rerun
    recs = _records(out)
    recs[0]["text"] = "MARKER"
    (out / RESULTS).write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    _write(tmp_path / "p.txt", "dog:\nbird:\ncat:\n")  # the failed line fixed; the others unchanged
    code, err = _cli(capsys, cfg, "--prompts", prompts, "--out", out)
    assert code == 0 and "1 run on 1 process(es), 2 already done" in err
    again = _records(out)
    assert again[0]["text"] == "MARKER" and "error" not in again[1] and again[1]["text"].startswith("bird:")
    assert again[2] == json.loads(first.splitlines()[2])


def test_interrupted_job_resumes_from_its_parts(tmp_path, capsys):
    """A job killed mid-way leaves whole per-item records in DIR/.parts; the rerun keeps them."""
    cfg = _write(tmp_path / "c.toml", TEXT)
    out = tmp_path / "o"
    prompts = _write(tmp_path / "p.txt", "dog:\ncat:\n")
    assert _cli(capsys, cfg, "--prompts", prompts, "--out", out)[0] == 0
    recs = _records(out)
    (out / RESULTS).unlink()
    (out / ".parts").mkdir()
    (out / ".parts" / "00001.json").write_text(json.dumps({**recs[1], "text": "KEPT"}))
    (out / ".parts" / ".00000.json.123.partial").write_text('{"line": 0, "pro')  # a write cut short
    code, err = _cli(capsys, cfg, "--prompts", prompts, "--out", out)
    assert code == 0 and "1 run on 1 process(es), 1 already done" in err
    assert [r.get("text") for r in _records(out)] == [recs[0]["text"], "KEPT"]
    assert sorted(p.name for p in out.iterdir()) == ["job.json", RESULTS]


def test_another_config_does_not_resume_into_the_same_folder(tmp_path, capsys):
    out = tmp_path / "o"
    prompts = _write(tmp_path / "p.txt", "dog:\n")
    assert _cli(capsys, _write(tmp_path / "c.toml", TEXT), "--prompts", prompts, "--out", out)[0] == 0
    code, err = _cli(capsys, _write(tmp_path / "d.toml", TEXT.replace("steps = 16", "steps = 8")), "--prompts", prompts, "--out", out)
    assert code == 2 and "written by another config" in err


def test_digits_items_are_pngs(tmp_path, capsys):
    from PIL import Image

    cfg = _write(tmp_path / "d.toml", '[model]\nadapter = "unet"\ncheckpoint = "digits"\nsteps = 3\nguidance_scale = 2.0\n')
    out = tmp_path / "o"
    code, _ = _cli(capsys, cfg, "--prompts", _write(tmp_path / "p.txt", "digit 3\ndigit 7\n"), "--out", out)
    assert code == 0
    recs = _records(out)
    assert [r["image"] for r in recs] == ["00000.png", "00001.png"]
    assert Image.open(out / "00000.png").size == (32, 32)
    assert (out / "00000.png").read_bytes() != (out / "00001.png").read_bytes()


def test_config_prompt_longer_than_length_is_one_line(tmp_path, capsys):
    """A [model] prompt that leaves no position to generate is refused before any step runs."""
    cfg = _write(tmp_path / "c.toml", TEXT + 'prompts = ["' + "word " * 40 + '"]\n')
    code, err = _cli(capsys, cfg, "--out", tmp_path / "o.txt")
    assert code == 2 and "key 'prompts'" in err and "fills all 16 positions" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o.txt").exists()
