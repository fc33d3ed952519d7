"""Entry-point discovery with a real, throwaway plugin distribution installed by pip."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

PLUGIN_PY = '''
import attrs
import diffaccel
from diffaccel.contract.validators import positive

__version__ = "9.8.7"


@attrs.frozen(kw_only=True)
class EchoConfig:
    every: int = attrs.field(default=2, validator=positive)
    """Skip the last layer except every n-th step."""


class Echo:
    def __init__(self, config):
        self.config = config

    @diffaccel.hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if layer.index == run.info.n_layers - 1 and run.step % self.config.every:
            return layer.cached_output
        return None

    @diffaccel.hookimpl
    def diffaccel_finalize(self, run, final):
        run.metrics[self.name] = {"used": True}


@diffaccel.hookimpl
def diffaccel_register(register):
    register(diffaccel.Strategy(name="echo", config=EchoConfig, factory=Echo, requires=(diffaccel.contract.capabilities.TOKEN_POSITIONS,),
                                description="throwaway test strategy"))
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "diffaccel-echo-test"
version = "9.8.7"

[project.entry-points.diffaccel]
echo = "diffaccel_echo_test"

[tool.setuptools]
py-modules = ["diffaccel_echo_test"]
'''

USE = '''
import sys
import diffaccel
from diffaccel.adapters.text.testing import tiny_text_pipeline
cfg = diffaccel.parse_config({"model": {"adapter": "text"}, "strategy": [{"use": "echo", "every": 3}]})
pipe = tiny_text_pipeline()
with diffaccel.apply(pipe, cfg):
    out = pipe(length=8, steps=6, progress=False)
print(out.report["strategies"]["echo"]["used"], out.report["counters"]["layers_skipped"])
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "diffaccel_echo_test.py").write_text(PLUGIN_PY)
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, capture_output=True)
    return target


def _run(site, *args, env_extra=None, code=None):
    env = {**os.environ, "PYTHONPATH": str(site), **(env_extra or {})}
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "diffaccel.cli.entry", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def test_installed_plugin_is_listed(site):
    proc = _run(site, "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    rows = {r["name"]: r for r in listing["strategies"]}
    echo = rows["echo"]
    assert echo["distribution"] == "diffaccel-echo-test" and echo["version"] == "9.8.7"
    assert echo["requires"] == ["token-positions"]
    assert {a["name"]: a["distribution"] for a in listing["adapters"]} == {"dit": "diffaccel", "text": "diffaccel", "unet": "diffaccel",
                                                                           "unet2d": "diffaccel"}
    assert echo["fields"] == [{"name": "every", "default": 2, "doc": "Skip the last layer except every n-th step."}]
    text = _run(site, "plugins").stdout
    assert "echo  (diffaccel-echo-test 9.8.7" in text and "every = 2" in text


def test_installed_plugin_is_used(site):
    proc = _run(site, code=USE)
    assert proc.returncode == 0, proc.stderr
    used, skipped = proc.stdout.split()
    assert used == "True" and int(skipped) == 4  # steps 1, 2, 4, 5 of 0..5


def test_block_and_allow_lists(site, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nadapter = "text"\n[[strategy]]\nuse = "echo"\n')
    assert _run(site, "check", str(cfg)).returncode == 0
    blocked = _run(site, "check", str(cfg), env_extra={"DIFFACCEL_BLOCK_PLUGINS": "echo"})
    assert blocked.returncode == 2 and "unknown strategy 'echo'" in blocked.stderr
    none = _run(site, "plugins", "--json", env_extra={"DIFFACCEL_PLUGINS": ""})
    assert "echo" not in {r["name"] for r in json.loads(none.stdout)["strategies"]}
    allowed = _run(site, "plugins", "--json", env_extra={"DIFFACCEL_PLUGINS": "echo"})
    assert [r["name"] for r in json.loads(allowed.stdout)["strategies"]] == ["echo"]


def test_bad_plugin_value_is_a_config_error(site, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nadapter = "text"\n[[strategy]]\nuse = "echo"\nevery = 0\n')
    proc = _run(site, "check", str(cfg))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"diffaccel: error: {cfg}: [[strategy]] #1 (echo): key 'every': must be positive, got 0"


BAD_REGISTER = """
import diffaccel

@diffaccel.hookimpl
def diffaccel_register(register):
    raise RuntimeError("registration exploded")
"""


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory):
    """A working plugin (the echo strategy registered as 'fine') beside two broken ones:
    'echo' raises on import, 'regbad' raises in diffaccel_register."""
    target = tmp_path_factory.mktemp("broken-site")
    dists = {
        "diffaccel-broken-test": ("echo", "raise RuntimeError('plugin import exploded')\n"),
        "diffaccel-regbad-test": ("regbad", BAD_REGISTER),
        "diffaccel-fine-test": ("fine", PLUGIN_PY.replace('name="echo"', 'name="fine"')),
    }
    for dist, (ep, code) in dists.items():
        src = tmp_path_factory.mktemp(ep)
        module = f"diffaccel_{ep}_test"
        (src / "pyproject.toml").write_text(PYPROJECT.replace("diffaccel-echo-test", dist)
                                            .replace('echo = "diffaccel_echo_test"', f'{ep} = "{module}"')
                                            .replace('"diffaccel_echo_test"]', f'"{module}"]'))
        (src / f"{module}.py").write_text(code)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], check=True, capture_output=True)
    return target


def test_broken_plugins_are_left_out_with_one_warning_line_each(broken_site):
    proc = _run(broken_site, "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(proc.stderr.splitlines()) == [
        "diffaccel: warning: plugin 'echo' (distribution diffaccel-broken-test 9.8.7) was left out: failed to load: "
        "RuntimeError: plugin import exploded; block it with DIFFACCEL_BLOCK_PLUGINS=echo",
        "diffaccel: warning: plugin 'regbad' (distribution diffaccel-regbad-test 9.8.7) was left out: diffaccel_register "
        "failed: RuntimeError: registration exploded; block it with DIFFACCEL_BLOCK_PLUGINS=regbad",
    ]
    listing = json.loads(proc.stdout)
    assert {b["name"]: b["distribution"] for b in listing["broken"]} == {"echo": "diffaccel-broken-test",
                                                                         "regbad": "diffaccel-regbad-test"}
    names = {r["name"] for r in listing["strategies"]}
    assert "fine" in names and "swd" in names and "echo" not in names
    text = _run(broken_site, "plugins").stdout
    assert "broken plugins" in text and "regbad  (diffaccel-regbad-test 9.8.7)" in text


def test_plugins_check_lists_each_broken_plugin_and_exits_1(broken_site):
    proc = _run(broken_site, "plugins", "--check")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    listed = [line for line in proc.stderr.splitlines() if not line.startswith("diffaccel: warning:")]
    assert listed == [
        "plugin echo (diffaccel-broken-test 9.8.7): broken, left out: failed to load: RuntimeError: plugin import exploded",
        "plugin regbad (diffaccel-regbad-test 9.8.7): broken, left out: diffaccel_register failed: RuntimeError: "
        "registration exploded",
    ]
    assert "strategy fine: ok" in proc.stdout  # the working plugin is still checked


def test_commands_that_do_not_use_a_broken_plugin_work(broken_site, tmp_path):
    ok = tmp_path / "ok.toml"
    ok.write_text('[model]\nadapter = "text"\n[[strategy]]\nuse = "fine"\n')
    proc = _run(broken_site, "check", str(ok))
    assert proc.returncode == 0, proc.stderr
    uses = tmp_path / "uses.toml"
    uses.write_text('[model]\nadapter = "text"\n[[strategy]]\nuse = "echo"\n')
    proc = _run(broken_site, "check", str(uses))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert error == [f"diffaccel: error: {uses}: [[strategy]] #1: strategy 'echo': its plugin 'echo' (distribution "
                     "diffaccel-broken-test 9.8.7) was left out: failed to load: RuntimeError: plugin import exploded"]


def test_a_broken_plugin_is_warned_about_once_per_process(broken_site):
    code = ("import warnings, diffaccel\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    regs = [diffaccel.Registry() for _ in range(3)]\n"
            "print(len([x for x in w if issubclass(x.category, diffaccel.PluginWarning)]), sorted(regs[2].broken))\n")
    proc = _run(broken_site, code=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(maxsplit=1) == ["2", "['echo', 'regbad']\n"]


def test_the_broken_plugin_warning_points_at_the_users_line(broken_site):
    code = ("import warnings, diffaccel\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    diffaccel.Registry()\n"  # line 4
            "print(sorted({(x.filename, x.lineno) for x in w if issubclass(x.category, diffaccel.PluginWarning)}))\n")
    proc = _run(broken_site, code=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[('<string>', 4)]"  # not diffaccel's plugins.py


def test_a_plugin_registered_by_hand_that_fails_raises():
    import diffaccel

    class Bad:
        @diffaccel.hookimpl
        def diffaccel_register(self, register):
            raise RuntimeError("nope")

    with pytest.raises(diffaccel.PluginError, match="plugin 'bad': diffaccel_register failed: RuntimeError: nope"):
        diffaccel.Registry(load_entrypoints=False).register_plugin(Bad(), "bad")
