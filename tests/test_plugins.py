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
from diffaccel.validators import positive

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
    register(diffaccel.Strategy(name="echo", config=EchoConfig, factory=Echo, requires=(diffaccel.capabilities.TOKEN_POSITIONS,),
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
from diffaccel.testing import tiny_text_pipeline
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
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "diffaccel.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def test_installed_plugin_is_listed(site):
    proc = _run(site, "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    rows = {r["name"]: r for r in listing["strategies"]}
    echo = rows["echo"]
    assert echo["distribution"] == "diffaccel-echo-test" and echo["version"] == "9.8.7"
    assert echo["requires"] == ["token-positions"]
    assert {a["name"]: a["distribution"] for a in listing["adapters"]} == {"dit": "diffaccel", "text": "diffaccel", "unet": "diffaccel"}
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


def test_broken_plugin_is_one_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text(PYPROJECT.replace("diffaccel-echo-test", "diffaccel-broken-test"))
    (src / "diffaccel_echo_test.py").write_text("raise RuntimeError('plugin import exploded')\n")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, capture_output=True)
    proc = _run(target, "plugins")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert "plugin 'echo' (distribution diffaccel-broken-test) failed to load: RuntimeError: plugin import exploded" in proc.stderr
