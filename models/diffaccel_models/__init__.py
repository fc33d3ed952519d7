"""diffaccel-models: the demonstration models diffaccel's configs name (the WordNet text models,
the arith and sudoku task models, the digits UNet and DiT), their recipes and the
``diffaccel train ...`` commands, apart from the runtime (``diffaccel``), which carries no weights
and no training code.

The checkpoints are registered by name in the entry-point group ``diffaccel.checkpoints``
(pyproject.toml), each pointing at ``folder`` below; the runtime finds them there
(``diffaccel.kit.checkpoints.shipped_checkpoint``). The commands are declared in
``diffaccel.commands`` as every plugin's are. This module imports nothing but pathlib: the
runtime loads it to find a folder.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

ASSETS = Path(__file__).parent / "assets"
"""The shipped checkpoints, one folder each, named as the checkpoint."""


def folder(name: str) -> Path:
    """The folder of the shipped checkpoint ``name`` (the ``diffaccel.checkpoints`` entry points)."""
    return ASSETS / name
