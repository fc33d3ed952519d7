"""Key-term recall: which extracted terms appear in a generated text.

A term is present when its words (split and lower-cased as the text fluency metrics do) occur
as a contiguous run of the text's words: ``"semester hours"`` is in ``"... in semester hours."``
but not in ``"semester hourses"``.
"""

from __future__ import annotations

from collections.abc import Sequence

from diffaccel.adapters.text.metrics import words


def present(term: str, text: str) -> bool:
    tw, xw = words(term), words(text)
    n = len(tw)
    return n > 0 and any(xw[i:i + n] == tw for i in range(len(xw) - n + 1))


def presence(terms: Sequence[str], text: str) -> list[bool]:
    return [present(t, text) for t in terms]


def recall(rows: Sequence[Sequence[bool]]) -> float:
    """Fraction of terms present, over every term of every row (1.0 when there are none)."""
    total = sum(len(r) for r in rows)
    return sum(sum(r) for r in rows) / total if total else 1.0
