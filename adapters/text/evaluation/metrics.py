"""Quality metrics for text: token agreement, n-gram perplexity (fluency), distinct-n (diversity).

Fluency is the perplexity of a word-level trigram language model with interpolated Kneser-Ney
smoothing, fitted on held-out WordNet text that the default models never saw in training.
Lower is better; repetitive text can score deceptively well, which is why distinct-n sits
beside it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from functools import lru_cache

import torch

from diffaccel.kit.words import words

from ..loading.corpus import heldout_lines

BOS, EOS = "<s>", "</s>"


def sentences(texts: Iterable[str]) -> list[list[str]]:
    return [w for t in texts for line in t.split("\n") if (w := words(line))]


class KneserNeyTrigram:
    """Interpolated Kneser-Ney trigram model over words, discount 0.75."""

    def __init__(self, corpus: Iterable[Sequence[str]], discount: float = 0.75):
        self.d = discount
        tri, bi, uni = Counter(), Counter(), Counter()
        for sent in corpus:
            toks = [BOS, BOS, *sent, EOS]
            for i in range(2, len(toks)):
                tri[tuple(toks[i - 2 : i + 1])] += 1
        self.vocab = {w for (_, _, w) in tri} | {"<unk>"}
        self.tri = tri
        # continuation counts for lower orders
        self.bi_cont = Counter((b, c) for (_, b, c) in tri)
        self.uni_cont = Counter(c for (_, c) in self.bi_cont)
        self.n_bigram_types = len(self.bi_cont)
        self.ctx2 = Counter()
        self.ctx2_types = Counter()
        for (a, b, _c), n in tri.items():
            self.ctx2[(a, b)] += n
            self.ctx2_types[(a, b)] += 1
        self.ctx1 = Counter()
        self.ctx1_types = Counter()
        for (b, _c), n in self.bi_cont.items():
            self.ctx1[b] += n
            self.ctx1_types[b] += 1
        del bi, uni

    def _p_uni(self, w: str) -> float:
        # continuation probability, with a floor for unseen words
        return (self.uni_cont.get(w, 0) + 0.5) / (self.n_bigram_types + 0.5 * len(self.vocab))

    def _p_bi(self, b: str, w: str) -> float:
        n = self.ctx1.get(b, 0)
        if n == 0:
            return self._p_uni(w)
        c = self.bi_cont.get((b, w), 0)
        lam = self.d * self.ctx1_types[b] / n
        return max(c - self.d, 0) / n + lam * self._p_uni(w)

    def prob(self, a: str, b: str, w: str) -> float:
        n = self.ctx2.get((a, b), 0)
        if n == 0:
            return self._p_bi(b, w)
        c = self.tri.get((a, b, w), 0)
        lam = self.d * self.ctx2_types[(a, b)] / n
        return max(c - self.d, 0) / n + lam * self._p_bi(b, w)

    def costs(self, sent: Sequence[str]) -> list[float]:
        """Negative log-probability (nats) of each word of a sentence and of its end, in order;
        a word the model never saw is scored as ``<unk>``."""
        toks = [BOS, BOS, *[w if w in self.vocab else "<unk>" for w in sent], EOS]
        return [-math.log(self.prob(toks[i - 2], toks[i - 1], toks[i])) for i in range(2, len(toks))]

    def perplexity(self, sents: Iterable[Sequence[str]]) -> float:
        nll, n = 0.0, 0
        for sent in sents:
            c = self.costs(sent)
            nll += sum(c)
            n += len(c)
        return math.exp(nll / n) if n else float("inf")


@lru_cache(maxsize=1)
def fluency_model() -> KneserNeyTrigram:
    """The trigram model fitted on the first 90% of the shipped held-out lines."""
    lines = heldout_lines()
    return KneserNeyTrigram(sentences(lines[: len(lines) * 9 // 10]))


def reference_lines() -> list[str]:
    """The last 10% of the held-out lines: real text the fluency model did not see."""
    lines = heldout_lines()
    return lines[len(lines) * 9 // 10 :]


def perplexity(texts: Iterable[str]) -> float:
    nll, n = 0.0, 0
    for text in texts:
        for s, k in _sentence_costs(text):  # the same sums, in the same order, as the model's perplexity
            nll += s
            n += k
    return math.exp(nll / n) if n else float("inf")


def distinct_n(texts: Iterable[str], n: int) -> float:
    """Unique word n-grams / all word n-grams, over the given texts."""
    unique: set[tuple[str, ...]] = set()
    total = 0
    for text in texts:
        grams = _grams(text, n)
        unique.update(grams)
        total += len(grams)
    return len(unique) / total if total else 0.0


# A bench computes these again on every bootstrap resample of its seeds (the same texts, drawn
# again), so each text's sentence costs and n-grams are kept rather than recomputed.
@lru_cache(maxsize=1 << 16)
def _sentence_costs(text: str) -> tuple[tuple[float, int], ...]:
    m = fluency_model()
    return tuple((sum(c), len(c)) for c in (m.costs(sent) for sent in sentences([text])))


@lru_cache(maxsize=1 << 16)
def _grams(text: str, n: int) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(sent[i : i + n]) for sent in sentences([text]) for i in range(len(sent) - n + 1))


def agreement(a: torch.Tensor, b: torch.Tensor, skip: Sequence[int] | None = None) -> float:
    """Fraction of generated positions where two runs chose the same token (prompts skipped)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    same, total = 0, 0
    for r in range(a.shape[0]):
        s = skip[r] if skip else 0
        same += int((a[r, s:] == b[r, s:]).sum())
        total += a.shape[1] - s
    return same / total if total else 1.0


def text_quality(texts: list[str]) -> dict[str, float]:
    return {"perplexity": perplexity(texts), "distinct_1": distinct_n(texts, 1), "distinct_2": distinct_n(texts, 2)}


@lru_cache(maxsize=1)
def _unigram_table() -> tuple[list[str], torch.Tensor]:
    counts: dict[str, int] = defaultdict(int)
    for sent in sentences(heldout_lines()):
        for w in sent:
            counts[w] += 1
    vocab = list(counts)
    return vocab, torch.tensor([counts[w] for w in vocab], dtype=torch.float64)


def unigram_sample(n_words: int, seed: int) -> str:
    """Text drawn word by word from the held-out unigram distribution (a fluency reference)."""
    vocab, weights = _unigram_table()
    idx = torch.multinomial(weights, n_words, replacement=True, generator=torch.Generator().manual_seed(seed))
    return " ".join(vocab[i] for i in idx.tolist())
