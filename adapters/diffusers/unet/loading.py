"""The UNet adapter's checkpoints (``[model] checkpoint``): the shipped digits model, the synthetic
Stable Diffusion pipelines, a ``DigitsPipeline`` folder, else ``StableDiffusionPipeline``; read
through the shared diffusers loader (``diffaccel.adapters.diffusers.pipelines``), whose checks
are ``diffaccel.adapters.checkpoints``'. Below the adapter, so that the digits model's training
and eval load checkpoints without importing the adapter."""

from __future__ import annotations

from ..pipelines import PipelineSource, load_pipeline
from .pipeline import DigitsPipeline
from .synthetic import SYNTHETIC, build

SHIPPED = {"digits": "digits", "default": "digits"}
"""Shipped model name (as a config gives it) -> its checkpoint in the ``diffaccel.checkpoints``
registry (diffaccel-models ships it: ``diffaccel.kit.checkpoints``)."""


def _from_pretrained(name: str, **kwargs):
    # deferred: importing StableDiffusionPipeline takes a second or more and imports transformers'
    # image processors, which print a torchvision warning on every command that merely lists or checks adapters
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(name, safety_checker=None, requires_safety_checker=False, **kwargs)


SOURCE = PipelineSource(
    shipped=SHIPPED, retrain="'diffaccel train digits --out DIR' and copy DIR/pipeline there",
    synthetic=SYNTHETIC, build=build, own_class=DigitsPipeline, fallback=_from_pretrained)
"""What ``load_checkpoint`` reads: the digits model, the synthetic Stable Diffusion pipelines, a
``DigitsPipeline`` folder, else ``StableDiffusionPipeline``."""


def load_checkpoint(checkpoint: str, allow_pickle: bool = False):
    """A pipeline for a ``checkpoint`` string (see the adapter's docstring). Safetensors only unless
    ``allow_pickle`` (then diffusers reads pickles with ``torch.load(weights_only=True)``); damaged
    files and NaN/inf weights are one ``ModelLoadError`` (``diffaccel.adapters.checkpoints``)."""
    return load_pipeline(SOURCE, checkpoint, allow_pickle)
