"""Malformed configs: each gets its own one-line message naming file, table and key; exit code 2."""

import subprocess
import sys

import attrs
import pytest

from diffaccel import ConfigError, Registry, Strategy, hookimpl, load_config
from diffaccel.cli.entry import main
from diffaccel.contract.validators import in_range, positive

GOOD_MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\n'


@attrs.frozen(kw_only=True)
class DemoConfig:
    tau: float = attrs.field(default=0.9, validator=in_range(0.0, 1.0, lo_open=True))
    """Stability threshold."""
    window: int = attrs.field(default=2, validator=positive)
    """Window radius."""


class DemoStrategy:
    def __init__(self, config):
        self.config = config


class DemoPlugin:
    @hookimpl
    def diffaccel_register(self, register):
        register(Strategy(name="demo", config=DemoConfig, factory=DemoStrategy, requires=("token-positions",)))


@pytest.fixture
def registry():
    reg = Registry(load_entrypoints=False)
    reg.register_plugin(DemoPlugin(), name="demo-plugin")
    return reg


CASES = [
    ("missing-model", '[[strategy]]\nuse = "demo"\n', "missing table [model]"),
    ("unknown-table", GOOD_MODEL + "[extras]\nx = 1\n", "unknown table [extras]; allowed: [model], [[strategy]], [[peer]] and [guard]"),
    ("bad-toml", "[model\nadapter = 1\n", "invalid TOML"),
    ("no-adapter", '[model]\nsteps = 10\n', "[model]: key 'adapter': missing; allowed: 'dit', 'text'"),
    ("bad-adapter", '[model]\nadapter = "video"\n', "[model]: key 'adapter': 'video'; allowed:"),
    ("unknown-model-key", GOOD_MODEL + "stepz = 10\n", "[model]: unknown key 'stepz'; allowed keys:"),
    ("steps-type", GOOD_MODEL + 'steps = "ten"\n', "[model]: key 'steps': expected an integer, got 'ten'"),
    ("steps-zero", GOOD_MODEL + "steps = 0\n", "[model]: key 'steps': must be positive, got 0"),
    ("batch-negative", GOOD_MODEL + "batch = -2\n", "[model]: key 'batch': must be positive, got -2"),
    ("seed-float", GOOD_MODEL + "seed = 1.5\n", "[model]: key 'seed': expected an integer, got 1.5"),
    ("temperature-negative", GOOD_MODEL + "temperature = -1.0\n", "[model]: key 'temperature': must be in [0.0, inf), got -1.0"),
    ("sampler-unknown", GOOD_MODEL + 'sampler = "euler"\n', "[model]: key 'sampler': must be one of 'masked', 'ddim', 'ddpm', 'hybrid', 'block', got 'euler'"),
    ("prompts-type", GOOD_MODEL + "prompts = [1, 2]\n", "[model]: key 'prompts': expected a list of strings, got [1, 2]"),
    ("checkpoint-empty", '[model]\nadapter = "text"\ncheckpoint = ""\n', "[model]: key 'checkpoint': must not be empty"),
    ("strategy-not-array", GOOD_MODEL + '[strategy]\nuse = "demo"\n', "'strategy' must be an array of tables, written [[strategy]]"),
    ("strategy-no-use", GOOD_MODEL + "[[strategy]]\ntau = 0.5\n", "[[strategy]] #1: missing key 'use' (the strategy name); installed: demo"),
    ("strategy-unknown", GOOD_MODEL + '[[strategy]]\nuse = "warp"\n', "[[strategy]] #1: unknown strategy 'warp'; installed: demo"),
    ("strategy-use-type", GOOD_MODEL + "[[strategy]]\nuse = 3\n", "[[strategy]] #1: key 'use': expected a string, got 3"),
    ("strategy-unknown-key", GOOD_MODEL + '[[strategy]]\nuse = "demo"\ntaus = 0.5\n', "[[strategy]] #1 (demo): unknown key 'taus'; allowed keys: max_cache_mb, on_error, tau, window"),
    ("strategy-range", GOOD_MODEL + '[[strategy]]\nuse = "demo"\ntau = 1.5\n', "[[strategy]] #1 (demo): key 'tau': must be in (0.0, 1.0], got 1.5"),
    ("strategy-type", GOOD_MODEL + '[[strategy]]\nuse = "demo"\nwindow = "wide"\n', "[[strategy]] #1 (demo): key 'window': expected an integer, got 'wide'"),
    ("strategy-bool-for-int", GOOD_MODEL + '[[strategy]]\nuse = "demo"\nwindow = true\n', "key 'window': expected an integer, got True"),
    ("strategy-twice", GOOD_MODEL + '[[strategy]]\nuse = "demo"\n[[strategy]]\nuse = "demo"\n', "[[strategy]] #2 (demo): strategy 'demo' is listed twice"),
    ("strategy-adapter", '[model]\nadapter = "text"\n[[strategy]]\nuse = "imgonly"\n', "strategy 'imgonly' requires capability 'block-stack', which adapter 'text' does not declare; it declares: mask-confidences, pinned-tokens, token-logits, token-positions"),
]


@pytest.mark.parametrize("name,text,expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_config_message(tmp_path, registry, name, text, expected):
    if name == "strategy-adapter":
        registry.strategies["imgonly"] = Strategy(name="imgonly", config=DemoConfig, factory=DemoStrategy, requires=("block-stack",), plugin="x")
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, registry)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path)), message
    assert expected in message, message


def test_messages_are_distinct(tmp_path, registry):
    registry.strategies["imgonly"] = Strategy(name="imgonly", config=DemoConfig, factory=DemoStrategy, requires=("block-stack",), plugin="x")
    seen = set()
    for name, text, _ in CASES:
        path = tmp_path / "c.toml"
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_config(path, registry)
        seen.add(str(info.value))
    assert len(seen) == len(CASES)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.toml")


def test_cli_exit_code_2_without_traceback(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(GOOD_MODEL + "steps = 0\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"diffaccel: error: {path}: [model]: key 'steps': must be positive, got 0"


def test_cli_subprocess_exit_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nadapter = "text"\nunknown = 1\n')
    proc = subprocess.run([sys.executable, "-m", "diffaccel.cli.entry", "check", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "unknown key 'unknown'" in proc.stderr


def test_good_config_decodes_into_frozen_classes(tmp_path, registry):
    path = tmp_path / "ok.toml"
    path.write_text(GOOD_MODEL + 'steps = 8\ntemperature = 0\n[[strategy]]\nuse = "demo"\ntau = 1\n')
    cfg = load_config(path, registry)
    assert cfg.model.steps == 8 and cfg.options.temperature == 0.0
    assert cfg.strategies[0].config == DemoConfig(tau=1.0)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.model.steps = 3  # type: ignore[misc]


def test_shipped_configs_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs"
    for path in sorted(root.glob("*.toml")):
        load_config(path)


@attrs.frozen(kw_only=True)
class _AttrsValidated:
    mode: str = attrs.field(default="a", validator=attrs.validators.in_(("a", "b")))
    flag: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


def test_attrs_validators_in_options_are_one_line_naming_the_key():
    """An adapter's or strategy's options validated with attrs' own validators (in_ raises a
    ValueError whose str() is a raw tuple) still give one line naming the key and what is allowed."""
    from diffaccel.runtime.config import structure

    with pytest.raises(ConfigError) as err:
        structure(_AttrsValidated, {"mode": "c"}, "f.toml: [model]")
    assert str(err.value) == "f.toml: [model]: key 'mode': must be one of 'a', 'b', got 'c'"
