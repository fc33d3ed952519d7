"""Shipped checkpoints by name: the registry the models distributions fill.

The runtime (``diffaccel``) carries no weights. A distribution that ships checkpoints (this
repository's ``diffaccel-models``, or a third party's) registers each one by name in the
entry-point group ``diffaccel.checkpoints``, pointing at a callable that returns the
checkpoint's folder::

    [project.entry-points."diffaccel.checkpoints"]
    arith = "diffaccel_models:folder"

An adapter that names shipped checkpoints (``[model] checkpoint = "arith"``) asks
``shipped_checkpoint(name, provider)``: the folder, or, when no installed distribution registers
the name, one ``ConfigError`` line naming the checkpoint and the distribution to install, raised
before anything loads. Only the metadata is read to find the name; the provider's module is
imported when the name is found (it should be light: paths only).
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

from ..contract.errors import ConfigError

ENTRY_GROUP = "diffaccel.checkpoints"
"""Entry-point group: checkpoint name -> a callable ``folder(name) -> path``."""

MODELS = "diffaccel-models"
"""The distribution of this repository that ships the demonstration models (``models/``)."""


def registered() -> dict[str, str]:
    """Every registered checkpoint name -> the distribution that registers it (metadata only)."""
    return {ep.name: (ep.dist.metadata["name"] if ep.dist is not None else "-") for ep in md.entry_points(group=ENTRY_GROUP)}


def shipped_checkpoint(name: str, provider: str = MODELS) -> Path:
    """The folder of the shipped checkpoint ``name``, from the ``diffaccel.checkpoints`` registry;
    a ``ConfigError`` naming ``name`` and ``provider`` (the distribution that ships it) when no
    installed distribution registers it."""
    for ep in md.entry_points(group=ENTRY_GROUP):
        if ep.name == name:
            return Path(ep.load()(name))
    raise ConfigError(f"checkpoint '{name}' is a shipped model of the {provider} distribution, which is not installed; "
                      f"install it: pip install {provider}")
