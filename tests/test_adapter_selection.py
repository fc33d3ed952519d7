"""Which adapter drives a pipeline when several accept it, what blocking does to adapters, and
that an installed third party's adapters change nothing of the project's own (generated docs,
commands). tests/subtext_adapter is a distribution of three adapters accepting the text adapter's
pipelines (two subclasses of ``TextAdapter``, one look-alike deriving from nothing), installed
into a throwaway folder put on sys.path for this module only."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import diffaccel
from diffaccel.runtime import adapters_registry
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.runtime.adapters_registry import adapter_for, adapter_names, get_adapter
from diffaccel.contract.errors import ConfigError, DiffaccelError

ROOT = Path(__file__).resolve().parents[1]
THIRD = ("subtext", "subsub", "sibling")


def _docgen():
    spec = importlib.util.spec_from_file_location("docgen_selection", ROOT / "docs" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def docs_before():
    """The generated docs with no third-party adapter on sys.path."""
    gen = _docgen()
    return gen.reference(), gen.architecture_tables()


@pytest.fixture(scope="module")
def site(install_distribution, docs_before):
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(install_distribution(ROOT / "tests" / "subtext_adapter")))
        mp.delenv("DIFFACCEL_PLUGINS", raising=False)
        mp.delenv("DIFFACCEL_BLOCK_PLUGINS", raising=False)
        yield
    for name in THIRD:
        adapters_registry._loaded.pop(name, None)


def test_they_are_installed(site):
    assert set(THIRD) <= set(adapter_names())
    assert not set(THIRD) & set(adapter_names(shipped=True))


def test_the_most_specific_adapter_drives_a_pipeline_nobody_loaded(site):
    # SubSub derives from SubText, which derives from TextAdapter: the deepest wins
    assert adapter_for(tiny_text_pipeline()).name == "subsub"


def test_a_third_party_adapter_goes_before_the_shipped_one_it_does_not_derive_from(site, monkeypatch):
    monkeypatch.setenv("DIFFACCEL_BLOCK_PLUGINS", "subtext,subsub")
    assert adapter_for(tiny_text_pipeline()).name == "sibling"


def test_the_adapter_that_loaded_a_pipeline_drives_it(site):
    cfg = diffaccel.parse_config({"model": {"adapter": "text", "checkpoint": "wordnet-masked", "length": 8, "steps": 2}})
    pipe = get_adapter("text").load(cfg)
    assert adapter_for(pipe).name == "text"
    handle = diffaccel.apply(pipe)
    with handle:
        get_adapter("text").run(pipe, cfg, 0, progress=False)
    assert handle.last_report["adapter"] == "text"


def test_a_configs_adapter_always_wins(site):
    pipe = tiny_text_pipeline()
    cfg = diffaccel.parse_config({"model": {"adapter": "text", "length": 8, "steps": 2}})
    handle = diffaccel.apply(pipe, cfg)
    with handle:
        pipe(length=8, steps=2, progress=False)
    assert handle.last_report["adapter"] == "text"
    pipe = tiny_text_pipeline()
    handle = diffaccel.apply(pipe)  # no config: the most specific
    with handle:
        pipe(length=8, steps=2, progress=False)
    assert handle.last_report["adapter"] == "subsub"


def test_blocking_covers_adapters(site, monkeypatch):
    monkeypatch.setenv("DIFFACCEL_BLOCK_PLUGINS", "subsub")
    get_adapter("subtext")  # loaded (and cached) before it is blocked below
    assert "subsub" not in adapter_names()
    with pytest.raises(ConfigError, match=r"key 'adapter': 'subsub' is not an installed adapter; installed: .*'subtext'"):
        get_adapter("subsub")
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "sibling")  # third-party adapters: only those listed
    assert set(adapter_names()) & set(THIRD) == {"sibling"}
    with pytest.raises(ConfigError, match="'subtext' is not an installed adapter"):
        get_adapter("subtext")  # a cached adapter is blocked too
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "")  # no plugin: the shipped adapters still load
    assert set(adapter_names()) == set(adapter_names(shipped=True)) and "text" in adapter_names()
    monkeypatch.setenv("DIFFACCEL_BLOCK_PLUGINS", ",".join(adapter_names(shipped=True)))
    with pytest.raises(DiffaccelError, match="no diffaccel adapter drives a TextDiffusionPipeline"):
        adapter_for(tiny_text_pipeline())


def test_subclasses_of_the_text_adapter_inherit_no_train_command(site):
    # issue 58: 'train text' is diffaccel-models' (declared in its metadata), not the text adapter's
    from diffaccel.cli.commands import collect

    found, problems = collect(("generate", "check", "bench"))
    assert problems == []
    assert [(c.group, c.name) for c in found].count(("train", "text")) == 0


def test_the_generated_docs_leave_a_third_partys_adapters_out(site, docs_before):
    gen = _docgen()
    assert (gen.reference(), gen.architecture_tables()) == docs_before
