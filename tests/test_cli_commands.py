"""Commands that plugins and adapters register (``diffaccel_register_commands``): listed in
``diffaccel --help``, run with their exit code, a broken registration one warning line that
stops no other command; core commands never ask for them; ``train`` comes from the adapters."""

from __future__ import annotations

import importlib

import pytest

from diffaccel.cli.entry import CORE, main
from diffaccel.cli.commands import Commands, collect
from diffaccel.contract.errors import PluginError

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
        declared = {"good_cmds": "hello", "bad_cmds": "never"}[name]  # the metadata declares each command by name
        (info / "entry_points.txt").write_text(f"[diffaccel]\n{name.replace('_', '-')} = {name}\n\n"
                                               f"[diffaccel.commands]\n{declared} = {name}:diffaccel_register_commands\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "good-cmds,bad-cmds")
    return tmp_path


def test_a_registered_command_is_listed_and_runs_with_its_exit_code(site, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert "hello" in out.split()
    assert main(["hello", "--times", "2"]) == 7
    assert capsys.readouterr().out.split() == ["hello", "hello"]


def test_a_raising_registration_is_one_line_naming_its_plugin(site, capsys):
    """Asked for all registrations (``collect``), the broken one is a warning; typed, its command
    is one error line naming the distribution, exit 2; the good command never imports it."""
    found, problems = collect(CORE)
    assert [c.name for c in found if c.source.startswith("plugin 'good-cmds'")] == ["hello"]
    assert len(problems) == 1 and "bad-cmds" in problems[0] and "boom in registration" in problems[0]
    assert main(["hello", "--times", "1"]) == 7
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as exc:
        main(["never"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "bad_cmds" in lines[0] and "boom in registration" in lines[0]


def test_help_lists_declared_commands_without_importing_them(site, capsys):
    """``diffaccel --help`` reads the metadata: neither registration module is imported."""
    import sys

    for name in ("good_cmds", "bad_cmds"):
        sys.modules.pop(name, None)
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out.split()
    assert "hello" in out and "never" in out
    assert "good_cmds" not in sys.modules and "bad_cmds" not in sys.modules


def test_an_undeclared_command_is_unknown_and_plugins_check_names_it(site, capsys, monkeypatch):
    """A registration whose command the metadata does not declare: typing it is argparse's
    invalid choice (no registration imported), and ``plugins --check`` names it, exit 1."""
    import sys

    info = site / "good_cmds-0.1.dist-info"
    (info / "entry_points.txt").write_text("[diffaccel]\ngood-cmds = good_cmds\n")
    importlib.invalidate_caches()
    sys.modules.pop("good_cmds", None)
    with pytest.raises(SystemExit) as exc:
        main(["hello", "--times", "1"])
    assert exc.value.code == 2 and "good_cmds" not in sys.modules
    assert "invalid choice: 'hello'" in capsys.readouterr().err
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "good-cmds")
    assert main(["plugins", "--check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plugin 'good-cmds'" in err[0] and "'hello'" in err[0] and "diffaccel.commands" in err[0]


def test_a_declared_command_its_registration_does_not_add_is_one_line(site, capsys):
    info = site / "good_cmds-0.1.dist-info"
    (info / "entry_points.txt").write_text("[diffaccel]\ngood-cmds = good_cmds\n\n"
                                           "[diffaccel.commands]\nhola = good_cmds:diffaccel_register_commands\n")
    importlib.invalidate_caches()
    with pytest.raises(SystemExit) as exc:
        main(["hola"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'hola'" in err and "did not add it" in err and "hello" in err


def test_help_imports_no_model_library_and_lists_plugin_and_adapter_commands():
    """``diffaccel --help`` in a fresh process: the installed plugins' and adapters' commands are
    listed, and neither torch, diffusers nor transformers (nor any plugin package) is imported."""
    import subprocess
    import sys

    code = ("import sys\nfrom diffaccel.cli.entry import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers') "
            "or m.startswith('diffaccel_') or m.split('.')[:2] == ['diffaccel', 'adapters'])\nprint('HEAVY', heavy)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("DIFFACCEL_PLUGINS", "DIFFACCEL_BLOCK_PLUGINS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "HEAVY []" in out
    listed = out.split()
    assert "swd-sweep" in listed and "parallel-sweep" in listed
    train = subprocess.run([sys.executable, "-m", "diffaccel.cli.entry", "train", "--help"], capture_output=True, text=True,
                           env=env, check=True).stdout.split()
    assert "text" in train and "digits" in train


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


def test_train_models_come_from_the_models_distribution(monkeypatch):
    """Issue 58: the recipes and their commands are diffaccel-models', declared in its metadata; the
    adapters (the runtime) register none."""
    from diffaccel.cli.commands import declared

    monkeypatch.setenv("DIFFACCEL_PLUGINS", "")
    found, problems = collect(CORE)
    assert problems == [] and not [c for c in found if c.group == "train"]
    train = {d.name: d.source for d in declared(CORE)[0] if d.group == "train"}
    assert {"text", "task", "digits", "dit-digits", "smollm2-dlm"} <= set(train)
    assert all(source.startswith("diffaccel-models ") for source in train.values()), train


def test_train_without_a_model_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "")
    with pytest.raises(SystemExit) as exc:
        main(["train"])
    assert exc.value.code == 2


def test_core_commands_are_registered_as_plugins_are():
    """The core's commands come from its own ``diffaccel_register_commands`` (``commands.add``),
    one module each, in ``CORE`` order; those that read configs check them before any import."""
    from diffaccel.cli.commands import core

    commands = core()
    assert tuple(c.name for c in commands) == CORE
    assert all(c.source == "" and c.group is None and c.examples.strip() for c in commands)
    checked = {c.name for c in commands if c.precheck is not None}
    assert checked == {"generate", "bench", "overhead", "partial", "check", "tune", "scale-bench", "fluency", "serve-loadtest"}
    assert [c.subcommands for c in commands if c.subcommands] == ["MODEL"]


def test_the_old_examples_table_is_the_commands_examples_with_a_warning():
    import warnings

    from diffaccel.cli import examples
    from diffaccel.cli.commands import generate

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        table = examples.EXAMPLES
    assert table["generate"] == generate.EXAMPLES and set(table) == set(CORE)
    assert any("diffaccel.cli.examples.EXAMPLES moved" in str(w.message) for w in seen)


def test_only_the_cores_groups_take_subcommands():
    with pytest.raises(PluginError, match="only the core's groups"):
        Commands("plugin 'x'", set()).add("mine", help="mine", run=print, subcommands="THING")
