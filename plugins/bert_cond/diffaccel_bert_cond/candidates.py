"""Candidate key terms of a source text, before any model scores them.

Candidates are word n-grams (1 to ``ngram_max`` words) inside one clause (punctuation other than
hyphens and apostrophes ends a phrase) that neither start nor end with a stop word. Numbers and
amounts (``12``, ``$5,000``, ``12.5%``, ``3 million``) and capitalised names (maximal runs of
capitalised words, possibly linked by ``of``: ``Goliath``, ``New York``,
``Bank of America``) are always candidates, whatever the other rules
say: they are the rare, decisive tokens end-to-end diffusion tends to drop.
"""

from __future__ import annotations

import re

import attrs

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing down during each either etc few for from further had has
have having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should so
some such than that the their theirs them themselves then there these they this those through to too
under until up upon usually very was we were what when where which while who whom why will with within
without would you your yours yourself yourselves especially something someone one ones often since e g i e
""".split())

# a number: optional currency sign, digits with thousands separators, decimals, optional percent
_NUMBER = r"[$€£¥]?\d+(?:[,.]\d+)*%?"
_WORD = r"[A-Za-z][A-Za-z'\-]*[A-Za-z]|[A-Za-z]"
_TOKEN = re.compile(rf"(?P<num>{_NUMBER})|(?P<word>{_WORD})|(?P<punct>[^\sA-Za-z0-9])")
# lower-case words that may link capitalised words into one name
NAME_LINKS = frozenset(("of", "de", "del", "da", "van", "von", "der", "la", "le"))
# words that make a number an amount when they follow it
AMOUNT_WORDS = frozenset("""percent per cent cents dollar dollars euro euros pound pounds yen hundred thousand
million millions billion billions trillion dozen""".split())


@attrs.frozen
class Word:
    text: str
    start: int
    end: int
    kind: str
    """``word``, ``num`` or ``punct``."""


@attrs.frozen
class Candidate:
    text: str
    start: int
    """Character offset of its first occurrence in the source."""
    end: int
    always: bool = False
    """A number, amount or capitalised name: always a candidate (and chosen first with always_keep)."""


def split_words(text: str) -> list[Word]:
    return [Word(m.group(), m.start(), m.end(), m.lastgroup) for m in _TOKEN.finditer(text)]


def _clauses(words: list[Word]) -> list[list[Word]]:
    """Runs of words and numbers between punctuation marks."""
    out, cur = [], []
    for w in words:
        if w.kind == "punct":
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(w)
    if cur:
        out.append(cur)
    return out


def _is_stop(w: Word) -> bool:
    return w.kind == "word" and w.text.lower() in STOPWORDS


def _span(source: str, ws: list[Word], always: bool = False) -> Candidate:
    return Candidate(source[ws[0].start: ws[-1].end], ws[0].start, ws[-1].end, always)


def always_candidates(source: str, words: list[Word] | None = None) -> list[Candidate]:
    """Numbers and amounts (a number and a following amount word), and capitalised names."""
    words = split_words(source) if words is None else words
    out = []
    for clause in _clauses(words):
        i = 0
        while i < len(clause):
            w = clause[i]
            if w.kind == "num":
                j = i + 1
                while j < len(clause) and clause[j].text.lower() in AMOUNT_WORDS:
                    j += 1
                out.append(_span(source, clause[i:j], True))
                i = j
            elif w.text[0].isupper() and not _is_stop(w):
                j = i + 1
                while j < len(clause) and clause[j].kind == "word":
                    if clause[j].text[0].isupper():
                        j += 1
                    elif clause[j].text in NAME_LINKS and j + 1 < len(clause) and clause[j + 1].text[0].isupper():
                        j += 2  # "Bank of America", "City of Boston"
                    else:
                        break
                out.append(_span(source, clause[i:j], True))
                i = j
            else:
                i += 1
    return out


def candidates(source: str, ngram_max: int = 3) -> list[Candidate]:
    """Every candidate of ``source``, each text once (first occurrence), in source order."""
    words = split_words(source)
    found: dict[str, Candidate] = {}
    for c in always_candidates(source, words):
        found.setdefault(c.text.lower(), c)
    for clause in _clauses(words):
        for n in range(1, ngram_max + 1):
            for i in range(len(clause) - n + 1):
                ws = clause[i:i + n]
                if _is_stop(ws[0]) or _is_stop(ws[-1]) or (n == 1 and len(ws[0].text) < 2):
                    continue
                c = _span(source, ws)
                key = c.text.lower()
                if key in found:
                    if found[key].start > c.start:  # keep the first occurrence
                        found[key] = attrs.evolve(c, always=found[key].always)
                    continue
                found[key] = c
    return sorted(found.values(), key=lambda c: (c.start, c.end))
