"""Candidate generation (no model) and the key-term recall metric."""

from __future__ import annotations

import pytest

from diffaccel_bert_cond import always_candidates, candidates, present, presence, recall
from diffaccel_bert_cond.candidates import STOPWORDS


def texts(cands):
    return [c.text for c in cands]


def test_ngrams_stay_in_a_clause_and_do_not_start_or_end_with_stop_words():
    src = "credit: recognition by a college or university; typically measured in semester hours"
    cands = candidates(src, ngram_max=3)
    for c in cands:
        ws = c.text.split()
        assert 1 <= len(ws) <= 3
        assert ws[0].lower() not in STOPWORDS and ws[-1].lower() not in STOPWORDS
        assert ":" not in c.text and ";" not in c.text
        assert src[c.start:c.end] == c.text
    t = texts(cands)
    assert "college or university" in t and "semester hours" in t and "credit" in t
    assert "credit recognition" not in t  # crosses the colon
    assert "university typically" not in t  # crosses the semicolon
    assert all(len(c.text.split()) == 1 for c in candidates(src, ngram_max=1))


def test_each_text_once_at_its_first_occurrence_in_source_order():
    src = "soft velvet and soft touch"
    cands = candidates(src)
    assert texts(cands).count("soft") == 1
    soft = next(c for c in cands if c.text == "soft")
    assert soft.start == 0
    assert [c.start for c in cands] == sorted(c.start for c in cands)


def test_numbers_amounts_and_names_are_always_candidates():
    src = "The fine is $5,000 or 12.5% of turnover, up to 3 million euros, payable to the Bank of America in New York."
    always = {c.text for c in always_candidates(src)}
    assert always == {"$5,000", "12.5%", "3 million euros", "Bank of America", "New York"}
    found = {c.text: c.always for c in candidates(src)}
    assert all(found[t] for t in always)
    assert found["turnover"] is False
    # kept even where the n-gram rules would drop them: a one-character number, a lone name
    assert {"5", "Goliath"} <= set(texts(candidates("a 5 of the Goliath")))
    assert "The" not in texts(candidates("The cat"))  # a capitalised stop word is no name


def test_only_stop_words_give_no_candidates():
    assert candidates("it is of the and") == []


def test_presence_matches_whole_words_in_order_case_insensitively():
    assert present("semester hours", "typically measured in Semester Hours.")
    assert not present("semester hours", "measured in semester hourses")
    assert not present("hours semester", "measured in semester hours")
    assert present("$5,000", "a fine of $5,000 was paid")
    assert not present("organ", "an organism")
    assert presence(["a b", "c"], "x a b y") == [True, False]


def test_recall_counts_every_term_of_every_row():
    assert recall([[True, False], [True, True, True]]) == pytest.approx(4 / 5)
    assert recall([[], []]) == 1.0
