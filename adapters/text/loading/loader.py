"""What a text model kind's loader works with: the ``Source`` it is asked about, the ``Loaded``
components it returns, the ``ModelFacts`` it reads without weights, and the ``Loader`` protocol
(the dispatch over the loaders is ``loading.py``, whose docstring says how to add one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import attrs

from diffaccel.contract.errors import ModelLoadError


KINDS_GROUP = "diffaccel.text_models"
"""The entry-point group of third-party text model kinds (each names a ``Loader``)."""


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception's first line (``limit`` characters at most), for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


@attrs.define(eq=False)
class Source:
    """A checkpoint string as the loaders see it: a name, a local folder with a config.json, or a
    hub id. ``config()`` reads the config.json once (the hub's: cached, or fetched when online)."""

    checkpoint: str
    allow_pickle: bool = False
    known: tuple[str, ...] = ()
    """Every name a loader answers to (for the message when nothing matches)."""
    families: tuple[str, ...] = ()
    """The masked-LM families (``model_type``) that the other loaders run, shipped or installed
    (``Loader.model_types``): listed where the catch-all refuses a family. Filled by
    ``loading.source`` so that no loader needs to ask for the others."""
    _config: dict[str, Any] | None = attrs.field(default=None, init=False)

    @property
    def path(self) -> Path | None:
        """The local model folder (one with a config.json), or None."""
        p = Path(self.checkpoint)
        return p if p.is_dir() and (p / "config.json").is_file() else None

    @property
    def where(self) -> Any:
        """Where the config comes from, as error lines name it."""
        return self.path / "config.json" if self.path is not None else f"{self.checkpoint}: config.json"

    @property
    def name(self) -> str:
        """The pipeline's name: the folder's, or a hub id's last part."""
        return Path(self.checkpoint).name

    def config(self) -> dict[str, Any]:
        if self._config is None:
            self._config = self._read_config()
        return self._config

    def _read_config(self) -> dict[str, Any]:
        path = self.path
        if path is not None:
            try:
                return json.loads((path / "config.json").read_text())
            except ValueError as exc:
                raise ModelLoadError(f"{path / 'config.json'}: not valid JSON ({exc})") from None
        if Path(self.checkpoint).exists() or self.checkpoint.startswith((".", "/", "~")):
            raise ModelLoadError(f"{self.checkpoint}: not a model folder (no config.json)")
        try:
            from huggingface_hub import hf_hub_download  # only a hub id needs the hub client

            return json.loads(Path(hf_hub_download(self.checkpoint, "config.json")).read_text())
        except Exception as exc:  # offline, unknown repo, invalid id: all end the same way
            raise ModelLoadError(
                f"checkpoint '{self.checkpoint}': not a shipped model ({', '.join(self.known)}), not a local model folder, "
                f"and its config.json could not be fetched ({first_line(exc)})"
            ) from None


@attrs.frozen(kw_only=True)
class Loaded:
    """What a loader returns; the dispatch checks ``weights`` and builds the pipeline."""

    denoiser: Any
    """The pipeline's model: a denoiser (``TextDiffusionPipeline``) or the transformers model."""
    tokenizer: Any
    name: str
    weights: Any
    """The ``torch.nn.Module`` holding the loaded weights, checked for NaN/inf."""
    where: Any
    """The weights' file or folder (or hub id), as the finite check's error names it."""
    pipeline: type | None = None
    """The pipeline class, when not ``TextDiffusionPipeline``; built as ``pipeline(denoiser, tokenizer, name=name)``."""
    model_kind: str | None = None
    """The model kind named in run reports (``report["model"]``); None: the entry-point name of
    a third-party kind, nothing for the shipped loaders."""


@attrs.frozen
class ModelFacts:
    """A model's facts from its config files (no weights), for ``diffaccel check``."""

    kind: str
    vocab_size: int
    n_layers: int
    max_len: int
    time_conditioned: bool = False
    cond_dim: int = 0


class Loader(Protocol):
    """A text model kind's loader (``loading.py``'s docstring says how the dispatch asks them)."""

    names: tuple[str, ...]
    """Checkpoint names it answers to without a folder (may be empty)."""

    def recognises(self, source: Source) -> bool:
        """Whether this kind runs ``source`` (from ``source.checkpoint``, ``.path``, ``.config()``)."""

    def load(self, source: Source) -> Loaded:
        """The loaded components; one-line ``ModelLoadError`` for what it cannot run."""

    def facts(self, source: Source) -> ModelFacts | None:
        """The model's facts from its config files, no weights; refuses what ``load`` refuses,
        with the same line (None: the facts need the model)."""


__all__ = ["KINDS_GROUP", "Loaded", "Loader", "ModelFacts", "Source", "first_line"]
