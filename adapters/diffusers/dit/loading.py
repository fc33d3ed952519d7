"""The DiT adapter's checkpoints (``[model] checkpoint``): the shipped digits DiT, the synthetic
DiTs, a ``TextDiTPipeline`` folder, else any diffusers pipeline (``DiffusionPipeline``); read
through the shared diffusers loader (``diffaccel.adapters.diffusers.pipelines``), whose checks
are ``diffaccel.adapters.checkpoints``'. Below the adapter, so that the digits DiT's training and
eval load checkpoints without importing the adapter."""

from __future__ import annotations

from ..pipelines import PipelineSource, load_pipeline
from .pipeline import TextDiTPipeline
from .synthetic import SYNTHETIC, build

SHIPPED = {"dit-digits": "dit-digits"}
"""Shipped model name -> its checkpoint in the ``diffaccel.checkpoints`` registry (diffaccel-models)."""

def _from_pretrained(name: str, **kwargs):
    # deferred, as in unet/loading.py: the generic pipeline loader pulls in every pipeline's
    # processors, which print a torchvision warning on import
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(name, **kwargs)


SOURCE = PipelineSource(
    shipped=SHIPPED, retrain="'diffaccel train dit-digits --out DIR' and copy DIR there",
    synthetic=SYNTHETIC, build=build, own_class=TextDiTPipeline, fallback=_from_pretrained)
"""What ``load_checkpoint`` reads: the digits DiT, the synthetic DiTs, a ``TextDiTPipeline``
folder, else any diffusers pipeline (``DiffusionPipeline``)."""


def load_checkpoint(checkpoint: str, allow_pickle: bool = False):
    """A pipeline for a ``checkpoint`` string (see the adapter's docstring). The same checkpoint
    checks as the UNet adapter's: safetensors only unless ``allow_pickle``, damaged files, missing
    tensors and NaN/inf weights are one ``ModelLoadError`` (``diffaccel.adapters.checkpoints``)."""
    return load_pipeline(SOURCE, checkpoint, allow_pickle)
