"""Commands that plugins and adapters register (``diffaccel_register_commands``): listed in
``diffaccel --help``, run with their exit code, a broken registration one warning line that
stops no other command; core commands never ask for them; ``train`` comes from the adapters."""

from __future__ import annotations

import importlib

import pytest

from diffaccel.cli import CORE, main
from diffaccel.commands import Commands, collect
from diffaccel.errors import PluginError

GOOD = '''
import diffaccel

def _args(parser):
    parser.add_argument("--times", type=int, required=True)

def _run(args):
    print("hello " * args.times)
    return 7

@diffaccel.hookimpl
def diffaccel_register_commands(commands):
    commands.add("hello", help="say hello", arguments=_args, run=_run, examples="example: diffaccel hello --times 2")
'''
BAD = '''
import diffaccel

@diffaccel.hookimpl
def diffaccel_register_commands(commands):
    commands.add("never", help="left out with the rest of this registration", run=print)
    raise RuntimeError("boom in registration")
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    """Two plugin distributions on sys.path (a module and its dist-info each); only they load."""
    for name, body in (("good_cmds", GOOD), ("bad_cmds", BAD)):
        (tmp_path / f"{name}.py").write_text(body)
        info = tmp_path / f"{name}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[diffaccel]\n{name.replace('_', '-')} = {name}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "good-cmds,bad-cmds")
    return tmp_path


def test_a_registered_command_is_listed_and_runs_with_its_exit_code(site, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert "hello" in out.split() and "never" not in out.split()
    assert main(["hello", "--times", "2"]) == 7
    assert capsys.readouterr().out.split() == ["hello", "hello"]


def test_a_raising_registration_is_one_line_naming_its_plugin(site, capsys):
    assert main(["hello", "--times", "1"]) == 7
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "bad-cmds" in lines[0] and "boom in registration" in lines[0]


def test_a_registered_command_checks_its_options(site, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["hello", "--times", "x"])
    assert exc.value.code == 2


def test_core_commands_do_not_ask_plugins_for_commands(site, capsys, tmp_path):
    """``check`` parses with the core's parser: the broken registration is never called."""
    (tmp_path / "c.toml").write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\n')
    assert main(["check", str(tmp_path / "c.toml")]) == 0
    assert "boom" not in capsys.readouterr().err


def test_a_name_taken_by_the_core_or_another_plugin_is_refused():
    commands = Commands("plugin 'x'", {(None, "bench"), ("train", "text")})
    with pytest.raises(PluginError, match="'bench' is already taken"):
        commands.add("bench", help="mine", run=print)
    with pytest.raises(PluginError, match="'train text' is already taken"):
        commands.add("text", group="train", help="mine", run=print)
    with pytest.raises(PluginError, match="not a word"):
        commands.add("two words", help="mine", run=print)
    commands.add("text", help="a top-level name is free", run=print)
    assert [(c.group, c.name) for c in commands.added] == [(None, "text")]


def test_train_models_come_from_the_adapters(monkeypatch):
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "")
    found, problems = collect(CORE)
    train = {c.name: c.source for c in found if c.group == "train"}
    assert problems == []
    assert train["text"].startswith("adapter 'text'") and train["digits"].startswith("adapter 'unet'")


def test_train_without_a_model_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "")
    with pytest.raises(SystemExit) as exc:
        main(["train"])
    assert exc.value.code == 2
