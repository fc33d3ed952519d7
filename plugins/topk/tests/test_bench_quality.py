"""topk's bench column ``self_similarity`` (what the removed bench_diversity.py printed): how alike
an entry's texts are over all its seeds, 1 when every seed wrote the same text."""

from __future__ import annotations

from types import SimpleNamespace

from diffaccel_topk import TopK


def outs(*texts: str):
    return [SimpleNamespace(texts=[t]) for t in texts]


def test_self_similarity_of_an_entrys_texts_over_its_seeds():
    s = TopK()
    assert s.diffaccel_bench_quality(outputs=outs("a b c d", "a b c d"), seeds=[0, 1]) == {"self_similarity": 1.0}
    q = s.diffaccel_bench_quality(outputs=outs("a b c d", "a b x y", "p q r s"), seeds=[0, 1, 2])["self_similarity"]
    assert 0.0 < q < 0.5  # one bigram of three shared by one pair of three
    assert s.diffaccel_bench_quality(outputs=outs("a b c"), seeds=[0]) == {}
