"""diffaccel's own reference models (``TextDiffusionLM``): the shipped ones by name, and any
folder ``TextDiffusionLM.save`` wrote (config.json with ``kind``, model.safetensors,
tokenizer.json). Weights are checked against the config (names, shapes), the tokenizer against the
embedding table, each one line."""

from __future__ import annotations

from pathlib import Path

from diffaccel.contract.errors import ModelLoadError
from diffaccel.kit.checkpoints import shipped_checkpoint

from ...checkpoints import check_vocab, folder_weights, match_state, read_tensors
from ..sampling.denoisers import ReferenceDenoiser
from .loader import Loaded, ModelFacts, Source, first_line
from ..sampling.model import TextDiffusionConfig, TextDiffusionLM
from ..sampling.tokenizer import TextTokenizer

SHIPPED = {"wordnet-masked": "wordnet-masked", "default": "wordnet-masked", "wordnet-continuous": "wordnet-continuous",
           "wordnet-masked-cond": "wordnet-masked-cond", "arith": "arith", "sudoku": "sudoku",
           "sudoku9": "sudoku9", "ledger": "ledger"}
"""Shipped model name (as a config gives it) -> its checkpoint in the ``diffaccel.checkpoints``
registry, which diffaccel-models fills (``diffaccel.kit.checkpoints``)."""


def shipped_path(name: str) -> Path:
    """The folder of the shipped model ``name``; one ``ConfigError`` line naming it and
    diffaccel-models when that distribution is not installed."""
    return shipped_checkpoint(SHIPPED[name])


def read_config(path: Path) -> TextDiffusionConfig:
    try:
        return TextDiffusionConfig.from_json((path / "config.json").read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelLoadError(f"{path / 'config.json'}: not a valid reference-model config ({first_line(exc, 200)})") from None


def facts_of(conf: TextDiffusionConfig) -> ModelFacts:
    return ModelFacts(conf.kind, conf.vocab_size, conf.n_layers, conf.max_len,
                      bool(conf.time_conditioned or conf.kind == "continuous"), conf.cond_dim)


def load_reference(path: Path, name: str, allow_pickle: bool = False) -> Loaded:
    weights = path / "model.safetensors"
    if not weights.is_file():
        _, pickles = folder_weights(path)
        if not pickles:
            raise ModelLoadError(f"{path}: no model.safetensors beside its config.json")
        weights = pickles[0]
    if not (path / "tokenizer.json").is_file():
        raise ModelLoadError(f"{path}: no tokenizer.json beside the model")
    conf = read_config(path)
    try:
        tok = TextTokenizer.from_file(path / "tokenizer.json")
    except Exception as exc:  # tokenizers raises its own Exception type for a damaged file
        raise ModelLoadError(f"{path / 'tokenizer.json'}: not a readable tokenizer ({first_line(exc, 200)})") from None
    check_vocab(tok.vocab_size, conf.vocab_size, path / "tokenizer.json")
    state = read_tensors(weights, allow_pickle)
    model = TextDiffusionLM(conf)
    match_state({k: tuple(v.shape) for k, v in model.state_dict().items()}, {k: tuple(v.shape) for k, v in state.items()}, weights)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return Loaded(denoiser=ReferenceDenoiser(model.eval()), tokenizer=tok, name=name, weights=model, where=weights)


class ShippedLoader:
    """The shipped reference models (diffaccel-models), by name."""

    names = tuple(SHIPPED)

    def recognises(self, source: Source) -> bool:
        return source.checkpoint in SHIPPED

    def _path(self, source: Source, needed: str) -> Path:
        path = shipped_path(source.checkpoint)
        if not (path / needed).is_file():
            raise ModelLoadError(f"shipped model '{source.checkpoint}' is missing at {path}; reinstall diffaccel-models or retrain it (see README)")
        return path

    def load(self, source: Source) -> Loaded:
        return load_reference(self._path(source, "model.safetensors"), name=source.checkpoint)

    def facts(self, source: Source) -> ModelFacts:
        return facts_of(read_config(self._path(source, "config.json")))


class ReferenceLoader:
    """A local folder ``TextDiffusionLM.save`` wrote: its config.json has ``kind``."""

    names = ()

    def recognises(self, source: Source) -> bool:
        return source.path is not None and "kind" in source.config()

    def load(self, source: Source) -> Loaded:
        return load_reference(source.path, name=source.path.name, allow_pickle=source.allow_pickle)

    def facts(self, source: Source) -> ModelFacts:
        return facts_of(read_config(source.path))


SHIPPED_LOADER = ShippedLoader()
LOADER = ReferenceLoader()
