"""A third-party strategy that fails: one line naming it, and nothing left patched (issue 27).

tests/boom_plugin/ is a distribution (``diffaccel-boom`` 0.1.0) whose strategy ``boom`` raises in
the hook its config names, at one step (or returns NaN there). It is pip-installed into a
throwaway folder put on ``sys.path`` (``PYTHONPATH`` for the command line), so only these tests
see it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import diffaccel
from diffaccel import StrategyError
from diffaccel.runtime.config import parse_config
from diffaccel.contract.errors import ConfigError, NonFiniteError
from diffaccel.runtime.registry import Registry
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.adapters.diffusers.unet.testing import tiny_digits_pipeline

BOOM = Path(__file__).resolve().parent / "boom_plugin"
HOOKS = ("pre_step", "layer_output", "post_step", "finalize")
TEXT_MODEL = '[model]\nadapter = "text"\nsteps = 8\nlength = 24\n'
UNET_MODEL = '[model]\nadapter = "unet"\nsteps = 5\nbatch = 2\nprompts = ["digit 3", "digit 5"]\n'
# a strategy that caches (so that a failure leaves caches behind unless the core cleans up)
CACHING = {"text": '[[strategy]]\nuse = "swd"\n', "unet": '[[strategy]]\nuse = "time-anchor"\nthreshold = 0.5\n'}


@pytest.fixture(scope="module")
def site(install_distribution):
    return install_distribution(BOOM)


@pytest.fixture
def registry(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    reg = Registry()
    assert reg.distribution("boom") == ("diffaccel-boom", "0.1.0")
    return reg


def _config(adapter: str, registry, boom: str = "", extra: str = "", caching: bool = True):
    model = TEXT_MODEL if adapter == "text" else UNET_MODEL
    text = model + boom + (CACHING[adapter] if caching else "") + extra  # boom first: asked first for each layer
    return parse_config(tomllib.loads(text), source=f"{adapter}.toml", registry=registry)


def _pipe(adapter: str):
    return tiny_text_pipeline() if adapter == "text" else tiny_digits_pipeline()


def _run(adapter: str, pipe, cfg, registry=None):
    from diffaccel.runtime.adapters_registry import get_adapter

    a = get_adapter(adapter)
    if registry is None:  # the untouched pipeline
        return a.run(pipe, cfg, 0, progress=False)
    with diffaccel.apply(pipe, cfg, registry=registry):
        return a.run(pipe, cfg, 0, progress=False)


def _same(adapter: str, a, b) -> bool:
    return torch.equal(a.tokens, b.tokens) if adapter == "text" else torch.equal(a.images, b.images)


@pytest.mark.parametrize("adapter", ["text", "unet"])
@pytest.mark.parametrize("hook", HOOKS)
def test_a_raising_hook_is_one_strategy_error_and_leaves_nothing_patched(adapter, hook, registry):
    cfg = _config(adapter, registry, f'[[strategy]]\nuse = "boom"\nhook = "{hook}"\nstep = 2\n')
    pipe = _pipe(adapter)
    with pytest.raises(StrategyError) as info:
        _run(adapter, pipe, cfg, registry)
    err = info.value
    assert (err.strategy, err.distribution, err.version, err.hook) == ("boom", "diffaccel-boom", "0.1.0", hook)
    assert err.step == (2 if hook != "finalize" else cfg.model.steps - 1)
    assert isinstance(err.__cause__, RuntimeError) and str(err.__cause__) == f"boom in {hook}"
    assert "\n" not in str(err)
    # nothing left behind: the pipeline gives what a fresh one gives, bitwise, with and without the core
    plain = cfg.without_strategies()
    fresh = _run(adapter, _pipe(adapter), plain)
    assert _same(adapter, _run(adapter, pipe, plain), fresh)
    assert _same(adapter, _run(adapter, pipe, plain, registry), fresh)
    # and the caching strategy alone runs as on a fresh pipeline
    alone = _config(adapter, registry)
    assert _same(adapter, _run(adapter, pipe, alone, registry), _run(adapter, _pipe(adapter), alone, registry))


@pytest.mark.parametrize("adapter", ["text", "unet"])
@pytest.mark.parametrize("hook", HOOKS)
def test_on_error_disable_finishes_the_run_without_it(adapter, hook, registry):
    boom = f'[[strategy]]\nuse = "boom"\nhook = "{hook}"\nstep = 2\non_error = "disable"\n'
    out = _run(adapter, _pipe(adapter), _config(adapter, registry, boom), registry)
    disabled = out.report["reliability"]["disabled"]
    assert [(d["strategy"], d["hook"]) for d in disabled] == [("boom", hook)]
    assert "boom in" in disabled[0]["error"]
    # boom does nothing until it fails: the run is the caching strategy's alone, bitwise
    assert _same(adapter, out, _run(adapter, _pipe(adapter), _config(adapter, registry), registry))


def test_an_exception_of_the_model_is_not_blamed_on_a_strategy(registry, monkeypatch):
    pipe = tiny_text_pipeline()
    cfg = _config("text", registry)  # swd's hooks run, the head breaks outside them

    def broken(*a, **k):
        raise ValueError("the model broke")

    monkeypatch.setattr(pipe.denoiser, "logits", broken)
    with pytest.raises(ValueError, match="the model broke"):
        _run("text", pipe, cfg, registry)


def test_a_failing_setup_names_the_strategy(registry):
    cfg = _config("text", registry, '[[strategy]]\nuse = "boom"\nhook = "setup"\n')
    with pytest.raises(StrategyError) as info:
        _run("text", _pipe("text"), cfg, registry)
    assert (info.value.hook, info.value.step) == ("setup", None)


# ---- the command line ---------------------------------------------------------------------------

def _cli(site, tmp_path, toml: str, *args, env=None):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    env = {**os.environ, "PYTHONPATH": str(site), **(env or {})}
    return subprocess.run([sys.executable, "-m", "diffaccel.cli.entry", *args[:1], str(path), *args[1:]],
                          capture_output=True, text=True, env=env)


CLI_TEXT = '[model]\nadapter = "text"\nsteps = 4\nlength = 16\n[[strategy]]\nuse = "boom"\nhook = "layer_output"\nstep = 2\n'


def test_cli_one_line_exit_1_and_a_traceback_only_with_debug(site, tmp_path):
    proc = _cli(site, tmp_path, CLI_TEXT, "generate", "--no-progress")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "diffaccel: strategy 'boom' (diffaccel-boom 0.1.0) raised RuntimeError in layer_output at step 2: boom in layer_output"]
    for extra, env in ((("--debug",), None), ((), {"DIFFACCEL_DEBUG": "1"})):
        proc = _cli(site, tmp_path, CLI_TEXT, "generate", "--no-progress", *extra, env=env)
        assert proc.returncode == 1 and "Traceback" in proc.stderr and "RuntimeError: boom in layer_output" in proc.stderr


def test_cli_disable_reports_it_and_exits_0(site, tmp_path):
    proc = _cli(site, tmp_path, CLI_TEXT + 'on_error = "disable"\n', "generate", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "strategy 'boom' disabled at step 2 (layer_output: RuntimeError: boom in layer_output)" in proc.stderr


# ---- non-finite outputs -------------------------------------------------------------------------

@pytest.mark.parametrize("adapter", ["text", "unet"])
def test_a_non_finite_step_with_strategies_is_recomputed_without_them(adapter, registry):
    boom = '[[strategy]]\nuse = "boom"\nfail = "nan"\nstep = 2\n'
    out = _run(adapter, _pipe(adapter), _config(adapter, registry, boom, caching=False), registry)
    rel = out.report["reliability"]
    assert rel["nonfinite_recomputed"] == 1  # one model call a step (the tiny digits model batches its guidance)
    plain = _config(adapter, registry, caching=False)
    assert _same(adapter, out, _run(adapter, _pipe(adapter), plain))  # the recomputed step is the plain one


def _nan_weights(pipe):
    with torch.no_grad():
        next(pipe.denoiser.model.parameters()).fill_(float("nan"))
    return pipe


def test_a_non_finite_output_with_no_strategy_is_one_error(registry):
    cfg = _config("text", registry, caching=False)
    with pytest.raises(NonFiniteError) as info:
        _run("text", _nan_weights(tiny_text_pipeline()), cfg, registry)
    assert info.value.step == 0 and "NaN or inf" in str(info.value)


def test_non_finite_also_without_strategies_is_one_error(registry):
    cfg = _config("text", registry)  # swd active: the step is recomputed, and is non-finite again
    with pytest.raises(NonFiniteError, match="also when recomputed without strategies"):
        _run("text", _nan_weights(tiny_text_pipeline()), cfg, registry)


def test_finite_false_turns_the_check_off(registry):
    cfg = _config("text", registry, extra="[guard]\nfinite = false\n", caching=False)
    _run("text", _nan_weights(tiny_text_pipeline()), cfg, registry)  # no error: garbage, as before


def test_cli_non_finite_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    from diffaccel.cli import entry as cli
    from diffaccel.adapters.text.adapter import TextAdapter

    monkeypatch.setattr(TextAdapter, "load", staticmethod(lambda config: _nan_weights(tiny_text_pipeline())))
    path = tmp_path / "c.toml"
    path.write_text('[model]\nadapter = "text"\nsteps = 4\nlength = 16\n')
    assert cli.main(["generate", str(path), "--no-progress"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diffaccel: the text denoiser output holds NaN or inf at step 0")


# ---- the quality guard --------------------------------------------------------------------------

@pytest.mark.parametrize("adapter", ["text", "unet"])
def test_the_guard_compares_every_n_steps_and_resets_past_the_threshold(adapter, registry):
    tight = _run(adapter, _pipe(adapter), _config(adapter, registry, extra="[guard]\nevery = 2\nthreshold = 1e-12\n"), registry)
    rel = tight.report["reliability"]
    due = len(range(0, tight.report["steps"], 2))  # the tiny digits model batches its guidance: one call a step
    assert rel["guard_checks"] == due
    loose = _run(adapter, _pipe(adapter), _config(adapter, registry, extra="[guard]\nevery = 2\nthreshold = 1e9\n"), registry)
    assert loose.report["reliability"]["guard_checks"] == due and loose.report["reliability"]["guard_trips"] == 0
    if rel["guard_max_error"] > 1e-12:  # the strategy changed something: the tight guard tripped
        assert rel["guard_trips"] >= 1 and rel["guard_resets"] == rel["guard_trips"]


def test_guard_disable_drops_every_strategy_for_the_run(registry):
    # swd on the tiny model computes part of the positions: the full step differs from it
    cfg = _config("text", registry, extra="[guard]\nevery = 3\nthreshold = 1e-12\naction = \"disable\"\n")
    out = _run("text", _pipe("text"), cfg, registry)
    rel = out.report["reliability"]
    assert rel["guard_trips"] == 1 and [d["strategy"] for d in rel["disabled"]] == ["swd"]
    assert rel["disabled"][0]["hook"] == "guard"


@pytest.mark.parametrize("table, message", [
    ("[guard]\nevery = -1\n", "[guard]: key 'every': must be 0 or more, got -1"),
    ("[guard]\naction = \"ignore\"\n", "[guard]: key 'action': must be one of 'reset', 'disable', got 'ignore'"),
    ("[guard]\nthreshold = 0\n", "[guard]: key 'threshold': must be positive, got 0.0"),
    ("[guard]\nfinite = 1\n", "[guard]: key 'finite': expected true or false, got 1"),
    ("[guard]\nevrey = 1\n", "[guard]: unknown key 'evrey'; allowed keys: action, every, finite, threshold"),
    ("guard = 3\n", "'guard' must be a table, written [guard]"),
])
def test_guard_table_is_validated(table, message, registry):
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(table + TEXT_MODEL), source="g.toml", registry=registry)
    assert str(info.value) == f"g.toml: {message}"


def test_on_error_is_validated(registry):
    with pytest.raises(ConfigError) as info:
        _config("text", registry, '[[strategy]]\nuse = "boom"\non_error = "ignore"\n')
    assert str(info.value) == "text.toml: [[strategy]] #1 (boom): key 'on_error': must be one of 'raise', 'disable', got 'ignore'"


# ---- check refuses what generate refuses ----------------------------------------------------------

@pytest.mark.parametrize("toml", [
    '[model]\nadapter = "text"\nsteps = 4\nlength = 16\n[[strategy]]\nuse = "topk"\nk = 100000\n',
    '[model]\nadapter = "unet"\nsteps = 4\nbatch = 1\n[[strategy]]\nuse = "dct-anchor"\nblocks = ["down_blocks.9"]\n',
])
def test_check_refuses_what_generate_refuses_with_the_same_line(toml, tmp_path, capsys):
    from diffaccel.cli import entry as cli

    path = tmp_path / "c.toml"
    path.write_text(toml)
    assert cli.main(["generate", str(path), "--no-progress"]) == 2
    refused = capsys.readouterr().err.strip().splitlines()
    assert cli.main(["check", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == refused and len(refused) == 1


def test_check_reads_no_weights(tmp_path, monkeypatch, capsys):
    """The facts come from config files: loading any weights during check fails this test."""
    import safetensors.torch

    from diffaccel.cli import entry as cli

    def no_weights(*a, **k):
        raise AssertionError("check read weights")

    monkeypatch.setattr(safetensors.torch, "load_file", no_weights)
    monkeypatch.setattr(torch, "load", no_weights)
    for toml in ('[model]\nadapter = "text"\nlength = 16\n[[strategy]]\nuse = "topk"\nk = 100\n',
                 '[model]\nadapter = "unet"\n[[strategy]]\nuse = "dct-anchor"\n'):
        path = tmp_path / "c.toml"
        path.write_text(toml)
        assert cli.main(["check", str(path)]) == 0, capsys.readouterr().err


def test_after_a_fault_the_shipped_model_writes_what_a_fresh_process_writes(site, registry, tmp_path, capsys):
    """The pipeline a faulty strategy ran on, in this process, against a new process."""
    from diffaccel.adapters.text.adapter import TextAdapter

    toml = '[model]\nadapter = "text"\nsteps = 6\nlength = 24\nbatch = 2\n'
    cfg = parse_config(tomllib.loads(toml + '[[strategy]]\nuse = "swd"\n[[strategy]]\nuse = "boom"\nhook = "post_step"\nstep = 3\n'),
                       source="c.toml", registry=registry)
    pipe = TextAdapter.load(cfg)
    with pytest.raises(StrategyError):
        _run("text", pipe, cfg, registry)
    TextAdapter.write([_run("text", pipe, cfg.without_strategies())], None)
    here = capsys.readouterr().out
    proc = _cli(site, tmp_path, toml, "generate", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == here and here.count("--- sample") == 2


def test_disabled_is_for_one_generation_the_next_starts_with_every_strategy(registry):
    from diffaccel.runtime.adapters_registry import get_adapter

    boom = '[[strategy]]\nuse = "boom"\nhook = "pre_step"\nstep = 1\non_error = "disable"\n'
    cfg, pipe, text = _config("text", registry, boom), _pipe("text"), get_adapter("text")
    with diffaccel.apply(pipe, cfg, registry=registry):
        reports = [text.run(pipe, cfg, seed, progress=False).report for seed in (0, 1)]
    for report in reports:
        assert [(d["strategy"], d["step"]) for d in report["reliability"]["disabled"]] == [("boom", 1)]
