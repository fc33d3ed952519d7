"""Errors before work: ``generate`` and ``bench`` check their output paths and options before any
model loads (the loader is replaced by one that fails the test), and leave no file behind; image
models write ``<config name>.png`` here when ``--out`` is not given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diffaccel.adapters.text.adapter import TextAdapter
from diffaccel.adapters.diffusers.unet.adapter import UNetAdapter
from diffaccel.cli.entry import main

DIGITS = ('[model]\nadapter = "unet"\ncheckpoint = "digits"\nsteps = 3\nbatch = 2\nprompts = ["digit 4", "digit 7"]\n'
          'scheduler = "ddim"\n')
TEXT = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 4\n'


@pytest.fixture
def no_loading(monkeypatch):
    """Every adapter's loader records the call and stops: a check that comes after loading fails."""
    calls = []

    def load(config):
        calls.append(config.model.checkpoint)
        raise AssertionError("the model was loaded before the bad option was reported")

    for adapter in (UNetAdapter, TextAdapter):
        monkeypatch.setattr(adapter, "load", staticmethod(load))
    return calls


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("digits.toml").write_text(DIGITS)
    Path("text.toml").write_text(TEXT)
    Path("a-file").write_text("x")
    Path("a-folder").mkdir()
    return tmp_path


BAD_GENERATE = [
    (["digits.toml", "--out", "a-file/grid.png"], "--out a-file/grid.png: a-file is a file, not a folder"),
    (["digits.toml", "--out", "a-folder"], "--out a-folder: is a folder; give a file name"),
    (["digits.toml", "--out", "grid.jpg"], "--out grid.jpg: must end in .png (the unet adapter writes PNG files)"),
    (["digits.toml", "--out", "a-file/deeper/grid.png"], "a-file is a file, not a folder"),
    (["text.toml", "--out", "a-folder"], "--out a-folder: is a folder"),
    (["text.toml", "--out", ""], "--out: empty path"),
]


@pytest.mark.parametrize("argv,message", BAD_GENERATE, ids=[" ".join(a) for a, _ in BAD_GENERATE])
def test_generate_rejects_a_bad_out_before_the_model_loads(folder, no_loading, capsys, argv, message):
    before = tree(folder)
    assert main(["generate", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert no_loading == []
    assert tree(folder) == before  # nothing written, not even a partial file


def test_generate_rejects_an_unwritable_folder(folder, no_loading, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes everywhere")
    Path("locked").mkdir()
    os.chmod("locked", 0o500)
    try:
        assert main(["generate", "digits.toml", "--out", "locked/grid.png"]) == 2
    finally:
        os.chmod("locked", 0o700)
    assert "the folder locked is not writable" in capsys.readouterr().err and no_loading == []


BAD_BENCH = [
    (["--json", "a-file/b.json"], "--json a-file/b.json: a-file is a file, not a folder"),
    (["--json", "a-folder"], "--json a-folder: is a folder"),
    (["--report", "a-file"], "--report a-file: is a file, not a folder"),
    (["--plots", "a-file/plots"], "--plots a-file/plots: a-file is a file, not a folder"),
    (["--seeds", "0"], "--seeds must be 1 or more, got 0"),
    (["--repeats", "-1"], "--repeats must be 1 or more, got -1"),
    (["--batch", "0"], "--batch must be 1 or more, got 0"),
]


@pytest.mark.parametrize("extra,message", BAD_BENCH, ids=[" ".join(a) for a, _ in BAD_BENCH])
def test_bench_rejects_bad_outputs_and_options_before_the_model_loads(folder, no_loading, capsys, extra, message):
    before = tree(folder)
    assert main(["bench", "text.toml", "--no-progress", "--judge", "none", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert no_loading == []
    assert tree(folder) == before


def test_bench_checks_every_config_before_loading(folder, no_loading, capsys):
    Path("bad.toml").write_text(TEXT + '[[strategy]]\nuse = "swd"\nno_such_key = 1\n')
    assert main(["bench", "text.toml", "bad.toml", "--no-progress", "--judge", "none"]) == 2
    assert "bad.toml: [[strategy]] #1 (swd): unknown key 'no_such_key'" in capsys.readouterr().err
    assert no_loading == []


def test_generate_writes_config_name_png_here_without_out(folder, capsys):
    from PIL import Image

    assert main(["generate", "digits.toml", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "output: digits.png" in err
    with Image.open("digits.png") as im:
        assert im.format == "PNG" and im.width == 2 * 32 and im.height == 32  # both images, one row
    assert not list(folder.glob("*.partial"))
