"""Key-term recall: which extracted terms appear in a generated text.

A term is present when its words (split and lower-cased as the text fluency metrics do) occur
as a contiguous run of the text's words: ``"semester hours"`` is in ``"... in semester hours."``
but not in ``"semester hourses"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from diffaccel.kit.words import words


def starts(term_words: Sequence[str], text_words: Sequence[str]) -> Iterator[int]:
    """Each index of ``text_words`` where ``term_words`` begins as a contiguous run (none for an
    empty term)."""
    n = len(term_words)
    return (i for i in range(len(text_words) - n + 1) if n and list(text_words[i:i + n]) == list(term_words))


def present(term: str, text: str) -> bool:
    return next(starts(words(term), words(text)), None) is not None


def presence(terms: Sequence[str], text: str) -> list[bool]:
    return [present(t, text) for t in terms]


def recall(rows: Sequence[Sequence[bool]]) -> float:
    """Fraction of terms present, over every term of every row (1.0 when there are none)."""
    total = sum(len(r) for r in rows)
    return sum(sum(r) for r in rows) / total if total else 1.0
