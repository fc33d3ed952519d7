"""Stage two's plan: where each key term's tokens go in the generated sequence.

Each term is encoded with the diffusion model's tokenizer with a leading space, as it would be
tokenized in running text, and the terms are spread evenly over the free positions (after the
prompt), in source order: equal gaps between terms, half a gap before the first and after the
last. The planned tokens are pinned (``RunState.pinned``): the adapter holds them fixed like a
prompt, so the sampler never re-masks or resamples them and they stay in the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class TermsDoNotFit(ValueError):
    """The terms' tokens need more positions than the output leaves free."""

    def __init__(self, needed: int, free: int):
        super().__init__(f"take {needed} tokens but only {free} positions are free")
        self.needed, self.free = needed, free


def term_token_ids(terms: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """Token ids of each term as in running text (encoded with a leading space)."""
    ids = [list(tokenizer.encode(" " + t)) for t in terms]
    for t, i in zip(terms, ids):
        if not i:
            raise ValueError(f"the model's tokenizer turns the term {t!r} into no tokens")
    return ids


def spread(lengths: Sequence[int], lo: int, hi: int) -> list[int]:
    """Start position of each block of ``lengths`` tokens in [lo, hi), in order, evenly spread."""
    total, k = sum(lengths), len(lengths)
    if total > hi - lo:
        raise TermsDoNotFit(total, hi - lo)
    gap = hi - lo - total
    starts, used = [], 0
    for i, n in enumerate(lengths):
        starts.append(lo + used + gap * (2 * i + 1) // (2 * k))
        used += n
    return starts


def pin_row(term_ids: Sequence[Sequence[int]], lo: int, length: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """One row's plan: pinned ids (length,) long with -1 where free, the positions right after
    each term (length,) bool (free positions only), and each term's start."""
    pinned = torch.full((length,), -1, dtype=torch.long)
    starts = spread([len(i) for i in term_ids], lo, length)
    for s, ids in zip(starts, term_ids):
        pinned[s:s + len(ids)] = torch.tensor(ids, dtype=torch.long)
    after = torch.zeros(length, dtype=torch.bool)
    for s, ids in zip(starts, term_ids):
        e = s + len(ids)
        if e < length and pinned[e] < 0:
            after[e] = True
    return pinned, after, starts


def word_continuations(tokenizer: Any, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) bool: True for tokens that, placed after a word, glue onto it (BPE pieces
    without a leading space, WordPiece ##-pieces, single letters of a character tokenizer).

    Found by decoding: a token continues the word if ``decode(encode(" a") + [token])`` puts a
    letter or digit straight after the ``a``.
    """
    prefix_ids = list(tokenizer.encode(" a"))
    prefix = tokenizer.decode(prefix_ids)
    out = torch.zeros(vocab_size, dtype=torch.bool)
    for v in range(vocab_size):
        joined = tokenizer.decode(prefix_ids + [v])
        if joined.startswith(prefix) and len(joined) > len(prefix) and joined[len(prefix)].isalnum():
            out[v] = True
    return out
