"""The text adapter's loading dispatch: a model kind is one loader in ``loading.LOADERS``; the
dispatch checks what every loader returns and builds the pipeline."""

from __future__ import annotations

import pytest
import torch

from diffaccel.adapters.text.families import dispatch as loading
from diffaccel.adapters.text.sampling.denoisers import ReferenceDenoiser
from diffaccel.adapters.text.loading.loader import Loaded, ModelFacts, Source
from diffaccel.adapters.text.sampling.pipeline import TextDiffusionPipeline
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.contract.errors import ModelLoadError


class FakeLoader:
    """A model kind the adapter has never heard of: recognised by name, built from the tiny model."""

    names = ("fake-model",)

    def __init__(self, poison: bool = False):
        self.poison = poison
        self.loads = 0

    def recognises(self, source: Source) -> bool:
        return source.checkpoint in self.names

    def load(self, source: Source) -> Loaded:
        self.loads += 1
        tiny = tiny_text_pipeline()
        model = tiny.denoiser.model
        if self.poison:
            with torch.no_grad():
                model.blocks[0].mod.weight[0, 0] = float("nan")
        return Loaded(denoiser=ReferenceDenoiser(model), tokenizer=tiny.tokenizer, name=source.checkpoint, weights=model,
                      where="fake://weights")

    def facts(self, source: Source) -> ModelFacts:
        return ModelFacts("masked", 64, 2, 32)


@pytest.fixture
def fake(monkeypatch):
    def install(**kw) -> FakeLoader:
        loader = FakeLoader(**kw)
        monkeypatch.setattr(loading, "LOADERS", [loader, *loading.LOADERS])
        return loader
    return install


def test_a_new_kind_is_one_loader_in_the_list(fake):
    loader = fake()
    pipe = loading.load_pipeline("fake-model")
    assert isinstance(pipe, TextDiffusionPipeline) and pipe.name == "fake-model" and loader.loads == 1
    assert pipe(length=8, steps=2, progress=False).tokens.shape == (1, 8)
    assert loading.model_facts("fake-model") == ModelFacts("masked", 64, 2, 32)
    # its name is among those the hub-id error lists
    with pytest.raises(ModelLoadError, match="fake-model"):
        loading.load_pipeline("nobody/no-such-model-xyz")


def test_the_dispatch_checks_every_loaded_model_for_non_finite_weights(fake):
    fake(poison=True)
    with pytest.raises(ModelLoadError, match=r"fake://weights: tensor 'blocks.0.mod.weight' holds NaN"):
        loading.load_pipeline("fake-model")


def test_loaders_are_asked_in_order_and_the_catch_all_is_last():
    kinds = [type(loader).__name__ for loader in loading.LOADERS]
    assert kinds[0] == "ShippedLoader" and kinds[-1] == "BertLoader"
    src = loading.source("wordnet-masked")
    assert loading.loader_of(src) is loading.LOADERS[0] and src._config is None  # a name needs no config.json
