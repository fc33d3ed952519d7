"""What the task models share: the problem record, the held-out split, the word-level tokenizer.

A task (``arith``, ``ledger``, ``sudoku``) makes a problem from a seed, deterministically. A content hash of
the problem's prompt decides its split: one problem in ``HELD_OUT_EVERY`` is held out, and
training never sees one (``training_problem`` rejects them). The bench's seed ``s`` is held-out
problem s (``heldout_problem``), so any seed range is a set of unseen problems.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import attrs
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from ..sampling.tokenizer import MASK, PAD, SEP, UNK, TextTokenizer

#: one problem in this many is held out (by content hash)
HELD_OUT_EVERY = 8
#: fills the generation after the solution; a token the sampler may draw (the pad id it may not)
EOS = "[EOS]"


class PromptError(ValueError):
    """A prompt that is not a problem of the task: one line naming what was expected."""


@attrs.frozen
class Problem:
    prompt: str
    """What the model is given."""
    solution: list[list[str]]
    """The generation's lines, each a list of tokens (lines are joined by [SEP])."""
    answer: str
    """The final answer (arith) or the solved grid (sudoku), as a string."""


def is_held_out(prompt: str) -> bool:
    """The split: held out when the prompt's SHA-256 is 0 modulo ``HELD_OUT_EVERY``."""
    return int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big") % HELD_OUT_EVERY == 0


def seed_rng(task: str, *seed: int) -> np.random.Generator:
    """The generator of problem ``seed`` (one or more integers) of ``task`` (independent streams per task)."""
    return np.random.default_rng([int.from_bytes(task.encode(), "big") % (2**32), *seed])


_HELD: dict[tuple[str, int], Problem] = {}


def heldout_problem(task: str, draw: Callable[[np.random.Generator], Problem], index: int) -> Problem:
    """Held-out problem ``index`` of ``task``: the first held-out one of the problems drawn from
    the streams (index, 0), (index, 1), ... (about ``HELD_OUT_EVERY`` draws; no scan over the
    indices before it, so any seed is as quick as seed 0). Kept once drawn (a few thousand at
    most): a bench draws the same problems for every entry, inside its timed runs, and a
    searched sudoku grid costs milliseconds."""
    if (task, index) in _HELD:
        return _HELD[task, index]
    if len(_HELD) > 8192:
        _HELD.clear()
    _HELD[task, index] = p = _first_held_out(task, draw, index)
    return p


def _first_held_out(task: str, draw: Callable[[np.random.Generator], Problem], index: int) -> Problem:
    j = 0
    while True:
        p = draw(seed_rng(task, index, j))
        if is_held_out(p.prompt):
            return p
        j += 1


def training_problem(make: Callable[[np.random.Generator], Problem], rng: np.random.Generator) -> Problem:
    """A problem of the training split: drawn from ``rng``, redrawn while it is held out."""
    while True:
        p = make(rng)
        if not is_held_out(p.prompt):
            return p


def build_tokenizer(words: list[str]) -> TextTokenizer:
    """A word-level tokenizer over a closed vocabulary: the specials, [EOS], every digit and the
    task's words and symbols. Spaces become a leading ``▁`` (as SentencePiece), digits are single
    tokens, and punctuation stands alone, so ``Tom has 12 apples.`` is
    ``▁Tom ▁has ▁ 1 2 ▁apples .`` and decodes back exactly."""
    vocab: dict[str, int] = {}
    for w in [PAD, UNK, MASK, SEP, EOS, "\u2581", *"0123456789", *words]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens([PAD, UNK, MASK, SEP, EOS])
    return TextTokenizer(tok)


def eos_id(tok: TextTokenizer) -> int:
    return tok.tok.token_to_id(EOS)


def solution_ids(tok: TextTokenizer, lines: list[list[str]]) -> list[int]:
    """The generation's ids: each line's tokens, [SEP] between lines."""
    ids: list[int] = []
    for i, line in enumerate(lines):
        if i:
            ids.append(tok.sep_id)
        ids.extend(tok.tok.token_to_id(t) for t in line)
    return ids


def unknown_words(tok: TextTokenizer, text: str) -> list[str]:
    """The pieces of ``text`` outside the tokenizer's vocabulary."""
    enc = tok.tok.encode(text, add_special_tokens=False)
    return [t for t, i in zip(enc.tokens, enc.ids) if i == tok.unk_id]
