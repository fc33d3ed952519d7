"""Text model kinds from outside (entry-point group ``diffaccel.text_models``): tests/text_kind_plugin
is a distribution whose loader recognises ``"model_type": "tiny-kind"`` folders. Installed into a
throwaway folder put on sys.path, it runs from a config with ``adapter = "text"`` and the folder
as ``checkpoint`` (no edit of the project, no adapter subclass), ``check`` reads its facts, the
report names it, and blocking it leaves the folder to the catch-all, which refuses it in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import diffaccel
from diffaccel.adapters.text.families import dispatch as loading
from diffaccel.runtime.adapters_registry import get_adapter
from diffaccel.cli.entry import main
from diffaccel.testing import check_adapter

PLUGIN = Path(__file__).resolve().parent / "text_kind_plugin"


@pytest.fixture(scope="module")
def site(install_distribution):
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(install_distribution(PLUGIN)))
        mp.delenv("DIFFACCEL_PLUGINS", raising=False)
        mp.delenv("DIFFACCEL_BLOCK_PLUGINS", raising=False)
        yield
    loading._kinds.clear()


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "tiny-kind", "seed": 3, "n_layers": 3, "max_len": 32}))
    return tmp_path


def _config(folder, **model):
    return diffaccel.parse_config({"model": {"adapter": "text", "checkpoint": str(folder), "length": 12, "steps": 4,
                                             "batch": 2, **model}}, source="kinds")


def test_it_is_asked_after_the_shipped_loaders_and_before_the_catch_all(site):
    names = [name for name, _ in loading.loaders()]
    assert names.index("tinykind") == len(loading.LOADERS) - 1 and names[-1] is None


def test_a_config_naming_its_folder_runs_and_the_report_names_the_kind(site, folder):
    cfg = _config(folder)
    adapter = get_adapter("text")
    pipe = diffaccel.load_pipeline(cfg)
    out = adapter.run(pipe, cfg, 0, progress=False)
    assert out.report["adapter"] == "text" and out.report["model"] == "tinykind"
    assert pipe.denoiser.n_layers == 3
    assert {"partial", "facts", "name"} <= set(check_adapter(adapter, pipe, cfg))


def test_check_reads_its_facts_and_refuses_what_load_refuses(site, folder, tmp_path, capsys):
    toml = tmp_path / "c.toml"
    toml.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{folder}"\nlength = 12\nsteps = 4\n')
    assert main(["check", str(toml)]) == 0
    (folder / "config.json").write_text(json.dumps({"model_type": "tiny-kind", "n_layers": 0}))
    for command in ("check", "generate"):
        assert main([command, str(toml)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{folder / 'config.json'}: key 'n_layers': 0 is not a positive integer" in err


def test_blocked_it_is_not_asked(site, folder, monkeypatch):
    monkeypatch.setenv("DIFFACCEL_BLOCK_PLUGINS", "tinykind")
    assert "tinykind" not in dict(loading.loaders())
    with pytest.raises(diffaccel.ModelLoadError, match="model_type 'tiny-kind' is not a masked-LM family"):
        loading.load_pipeline(str(folder))


def test_a_shipped_family_reports_its_model_type(tmp_path):
    from diffaccel.adapters.text.families.tiny_families import tiny_masked_lm

    path, _ = tiny_masked_lm(tmp_path, "distilbert")
    pipe = loading.load_pipeline(str(path))
    assert pipe(length=8, steps=2, progress=False).report["model"] == "distilbert"
