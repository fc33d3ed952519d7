"""The one run setup, ``diffaccel.Run``: lazy until the model is needed, the model loaded once,
the strategies built against the model's facts, and generations equal to the steps written out by
hand (adapter -> load -> build_strategies(info) -> apply -> run) that the commands used to repeat."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import diffaccel
from diffaccel import ConfigError, load_config
from diffaccel.runtime.accelerator import apply, build_strategies
from diffaccel.runtime.adapters_registry import get_adapter
from diffaccel.runtime.runs import Run

SWD = """[model]
adapter = "text"
checkpoint = "wordnet-masked"
length = 16
steps = 16
seed = 3
batch = 2

[[strategy]]
use = "swd"
"""


def _write(tmp_path: Path, text: str, name: str = "c.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.fixture
def loads(monkeypatch):
    """How many times the text adapter loaded a model."""
    adapter = get_adapter("text")
    calls = []
    real = adapter.load

    def counted(cfg):
        calls.append(cfg.model.checkpoint)
        return real(cfg)

    monkeypatch.setattr(adapter, "load", counted)
    return calls


def test_a_run_loads_nothing_until_the_model_is_needed_then_loads_it_once(tmp_path, loads):
    run = Run(_write(tmp_path, SWD))
    assert loads == [] and "not loaded" in repr(run)
    assert run.adapter.name == "text" and [e.name for e in run.config.strategies] == ["swd"]
    a = run.generate()
    b = run.generate(seed=4)
    assert loads == ["wordnet-masked"]
    assert [s.name for s in run.strategies] == ["swd"]
    assert a.texts != b.texts  # another seed, same loaded model


def test_generate_equals_the_setup_written_out_by_hand(tmp_path):
    path = _write(tmp_path, SWD)
    cfg = load_config(path)
    adapter = get_adapter(cfg.model.adapter)
    pipe = adapter.load(cfg)
    strategies = build_strategies(cfg, None, adapter.info(pipe))
    with apply(pipe, cfg, strategies=strategies):
        by_hand = adapter.run(pipe, cfg, cfg.model.seed, progress=False)
    run = Run(path)
    out = run.generate()
    assert out.texts == by_hand.texts
    assert out.report["counters"] == by_hand.report["counters"]
    assert out.report["counters"]["fraction_computed"] < 1.0  # the strategy did skip work
    assert run.last_report is out.report


def test_a_given_pipeline_is_not_loaded_again_and_other_configs_build_on_its_facts(tmp_path, loads):
    path = _write(tmp_path, SWD)
    first = Run(path).load()
    assert len(loads) == 1
    plain = load_config(path).without_strategies()
    second = Run(plain, pipe=first.pipe)
    assert second.strategies == [] and len(loads) == 1
    out = second.generate(strategies=first.build(first.config))  # another config's strategies, same model
    assert second.summary(out).startswith("wordnet-masked, 16 steps, strategies: swd; ")
    untouched = second.generate()
    assert untouched.report["counters"]["fraction_computed"] == 1.0
    assert second.summary().endswith("positions computed 100%") and "strategies: none" in second.summary()


def test_a_setting_the_model_refuses_is_refused_by_check_without_weights(tmp_path, loads):
    bad = _write(tmp_path, SWD.replace('use = "swd"', 'use = "topk"\nk = 100000\nk_keep = 0'), "bad.toml")
    run = Run(bad)
    with pytest.raises(ConfigError, match=r"bad\.toml: \[\[strategy\]\] #1 \(topk\): key 'k': must be at most the vocabulary size"):
        run.check()
    assert loads == []  # the facts came from the checkpoint's config files
    assert Run(_write(tmp_path, SWD)).check() is True
    with pytest.raises(ConfigError, match="must be at most the vocabulary size"):
        run.load()  # the same refusal once the model is loaded


def test_summary_before_any_generation_says_so(tmp_path):
    with pytest.raises(ValueError, match="nothing has run yet"):
        Run(_write(tmp_path, SWD)).summary()


def test_run_is_public_lazily_and_load_pipeline_uses_it(tmp_path, loads):
    code = "import sys, diffaccel; assert 'diffaccel.runtime.runs' not in sys.modules; diffaccel.Run; " \
           "assert 'diffaccel.runtime.runs' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert diffaccel.Run is Run and "Run" in diffaccel.__all__
    pipe = diffaccel.load_pipeline(_write(tmp_path, SWD))
    assert loads == ["wordnet-masked"] and get_adapter("text").accepts(pipe)


def test_generate_hands_more_inputs_to_the_adapter_as_serve_does(tmp_path):
    """serve's batches: one seed per row, through ``generate(..., seeds=...)``, equal to the adapter
    called by hand under ``apply``."""
    path = _write(tmp_path, SWD)
    run = Run(path)
    out = run.generate(7, seeds=[7, 9])
    with apply(run.pipe, run.config, strategies=run.build(run.config)):
        by_hand = run.adapter.run(run.pipe, run.config, 7, progress=False, seeds=[7, 9])
    assert out.texts == by_hand.texts and out.report["counters"] == by_hand.report["counters"]
    assert out.texts != run.generate(7, seeds=[7, 8]).texts  # the inputs reached the adapter
