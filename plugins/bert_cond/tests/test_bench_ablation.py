"""bench_ablation.py's split runs: batches saved by separate commands are scored together, each once."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench_ablation.py"


def module():
    spec = importlib.util.spec_from_file_location("bench_ablation", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rec(entry, seeds, texts, found, **shares):
    return {"entry": entry, "seeds": seeds, "texts": texts, "found": found, **shares}


def test_aggregate_scores_all_batches_of_an_entry_once(tmp_path, capsys):
    from diffaccel.adapters.text.metrics import perplexity

    m = module()
    a = ["a small part of the body", "a person who acts"]
    b = ["the quality of being soft", "relating to the kidneys"]
    lines = [rec(m.BASELINE, [0], a, [[False, False], [False]]),
             rec(m.BASELINE, [2], b, [[False], [True]]),
             rec('{"pin": "even"}', [0], b, [[True, True], [True]], stage_one_share=[0.1], place_share=[0.0]),
             rec('{"pin": "even"}', [2], a, [[True], [False]], stage_one_share=[0.3], place_share=[0.0])]
    f = tmp_path / "abl.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines + lines[:1]) + "\n")  # one batch saved twice
    m.aggregate([str(f)])
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in capsys.readouterr().out.splitlines()[2:]}
    base, even = rows[m.BASELINE], rows['{"pin": "even"}']
    assert base[0] == "4" and even[0] == "4"  # the batch saved twice counts once
    assert base[1] == "0.200" and even[1] == "0.800"  # recall over every term of every row
    ppl = perplexity(a + b)  # both entries hold the same four texts: the same perplexity, ratio 1
    assert base[2] == even[2] == f"{ppl:.1f}" and even[3].startswith("1.000 (")  # rows differ: an interval around 1
    assert even[5] == "20.0%"


class WordJudge:
    """One nat per word, two for a word of a line that holds "soft"."""
    name = "fake"

    def score(self, lines):
        from diffaccel.adapters.text.judge import Scores

        return Scores([float(len(s.split()) * (2 if "soft" in s else 1)) for s in lines], [len(s.split()) for s in lines])


def test_judge_nll_scores_each_row_on_its_own_lines():
    m = module()
    by = {m.BASELINE: {0: "a small part\nof the body", 1: "soft"}, "variant": {0: "soft and smooth", 1: "a part"}}
    got = m.judge_nll(WordJudge(), by)
    assert got == {m.BASELINE: {0: (6.0, 6), 1: (2.0, 1)}, "variant": {0: (6.0, 3), 1: (2.0, 2)}}
    assert abs(m.ppl(got["variant"]) - math.exp(8 / 5)) < 1e-12
    assert abs(m.ppl(got["variant"], [0, 0]) - math.exp(2)) < 1e-12  # a row drawn twice counts twice


def test_ratio_ci_pairs_rows():
    m = module()
    # row k: 10 tokens at k + 1 nats each in the baseline, one nat more in the entry: paired, every
    # resample's ratio is e exactly; drawn apart (an unpaired bootstrap) it would spread widely
    base = {k: (10.0 * (k + 1), 10) for k in range(20)}
    entry = {k: (10.0 * (k + 2), 10) for k in range(20)}
    lo, hi = m.ratio_ci(entry, base)
    assert abs(lo - math.e) < 1e-9 and abs(hi - math.e) < 1e-9
    entry[3] = (200.0, 10)  # one row much worse: the interval widens upward and still holds e
    lo, hi = m.ratio_ci(entry, base)
    assert lo <= math.e * (1 + 1e-9) and hi > math.e * 1.5


def test_term_costs_split_terms_from_the_rest():
    from diffaccel.adapters.text.metrics import fluency_model, words

    m = module()
    text = "a piece of velvet cloth\nthe physical substance of a thing"
    terms = ["velvet", "physical substance"]
    rec_ = {"texts": [text], "sources": ["velvet: smooth and soft to touch"], "terms": [terms]}
    c = m.term_costs([rec_])
    fm = fluency_model()
    l1, l2 = fm.costs(words("a piece of velvet cloth")), fm.costs(words("the physical substance of a thing"))
    assert c["term_words"] == 3 and c["rest_words"] == len(l1) + len(l2) - 3
    assert abs(c["term_sum"] - (l1[3] + l2[1] + l2[2])) < 1e-9
    own = m.term_costs([rec_], own_lines=True)  # "physical substance" is not in the source line
    assert own["term_words"] == 1 and abs(own["term_sum"] - fm.costs(words("velvet: smooth and soft to touch"))[0]) < 1e-9
    # the own-line ratio adds the own-line term cost to the baseline text's total
    n = len(l1) + len(l2)
    want = math.exp((sum(l1) + sum(l2) + own["term_sum"]) / (n + 1) - (sum(l1) + sum(l2)) / n)
    assert abs(m.own_line_ratio([rec_]) - want) < 1e-9


def test_term_cost_refuses_files_saved_without_terms(tmp_path):
    import pytest

    m = module()
    f = tmp_path / "old.jsonl"
    f.write_text(json.dumps(rec(m.BASELINE, [0], ["a part"], [[False]])) + "\n")
    with pytest.raises(SystemExit, match=r"old\.jsonl: entry 'baseline' was saved without its rows' terms"):
        m.aggregate([str(f)], terms=True)
