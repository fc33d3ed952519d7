"""Issue 58 item 1: the runtime (``diffaccel``) carries no weights and no training code; the shipped
models, their recipes and the train commands are diffaccel-models' (models/), found through the
``diffaccel.checkpoints`` entry points; without that distribution a config naming a shipped model
is one line naming the checkpoint and the distribution, exit 2, before anything loads."""

from __future__ import annotations

import importlib.metadata as md
import types
from pathlib import Path

import pytest

from diffaccel.cli.entry import main
from diffaccel.kit import checkpoints

ROOT = Path(__file__).resolve().parents[1]


def test_the_runtime_carries_no_weights_and_no_recipes():
    runtime = [ROOT / "core", ROOT / "adapters"]
    weights = [p for d in runtime for p in d.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".ckpt")]
    assert not weights
    recipes = {"training", "task_commands.py", "train.py", "grow.py"}  # the core's 'train' group itself stays
    assert not [p for p in (ROOT / "adapters").rglob("*") if p.name in recipes and "__pycache__" not in p.parts]
    runtime_commands = {ep.name for ep in md.entry_points(group="diffaccel.commands")
                        if ep.dist is not None and ep.dist.metadata["name"] == "diffaccel"}
    assert not [name for name in runtime_commands if name.startswith("train.") or "accuracy" in name]


def test_every_shipped_name_is_registered_by_the_models_distribution():
    from diffaccel.adapters.diffusers.dit.loading import SHIPPED as DIT
    from diffaccel.adapters.diffusers.unet.loading import SHIPPED as UNET
    from diffaccel.adapters.text.loading.reference import SHIPPED as TEXT

    registered = checkpoints.registered()
    for name in {*TEXT.values(), *UNET.values(), *DIT.values()}:
        assert registered.get(name) == checkpoints.MODELS, name
        assert checkpoints.shipped_checkpoint(name).is_dir(), name
    commands = {ep.name for ep in md.entry_points(group="diffaccel.commands")
                if ep.dist is not None and ep.dist.metadata["name"] == checkpoints.MODELS}
    assert {"train.text", "train.task", "train.digits", "train.dit-digits", "digits-accuracy"} <= commands


@pytest.fixture()
def no_models(monkeypatch):
    """diffaccel-models as if not installed: the registry's group is empty, and a model read fails the test."""
    real = md.entry_points
    monkeypatch.setattr(checkpoints, "md", types.SimpleNamespace(
        entry_points=lambda group=None: [] if group == checkpoints.ENTRY_GROUP else real(group=group)))

    def loaded(*args, **kwargs):
        raise AssertionError("a model was read although its distribution is missing")

    from diffaccel.adapters.diffusers import pipelines
    from diffaccel.adapters.text.loading import reference

    monkeypatch.setattr(reference, "load_reference", loaded)
    monkeypatch.setattr(pipelines, "check_pipeline", loaded)  # called on every pipeline load_pipeline read


@pytest.mark.parametrize("config,name", [("arith.toml", "arith"), ("text-default.toml", "default"),
                                         ("digits.toml", "digits"), ("dit-digits.toml", "dit-digits")])
def test_a_shipped_checkpoint_without_its_distribution_is_one_line_exit_2(no_models, config, name, tmp_path, capsys):
    out = tmp_path / ("out.png" if "digits" in config else "out.txt")
    code = main(["generate", str(ROOT / "configs" / config), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("diffaccel: error: "), err
    shown = "wordnet-masked" if name == "default" else name
    assert f"checkpoint '{shown}'" in err and "pip install diffaccel-models" in err, err
    assert not out.exists()


def test_the_error_names_the_checkpoint_and_the_distribution(monkeypatch):
    monkeypatch.setattr(checkpoints, "md", types.SimpleNamespace(entry_points=lambda group=None: []))
    from diffaccel.contract.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        checkpoints.shipped_checkpoint("sudoku9")
    assert str(err.value).count("\n") == 0
    assert "'sudoku9'" in str(err.value) and "diffaccel-models" in str(err.value)
