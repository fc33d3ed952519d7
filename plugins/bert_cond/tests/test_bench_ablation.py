"""bench_ablation.py's split runs: batches saved by separate commands are scored together, each once."""

from __future__ import annotations

import importlib.util
import json
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
    assert base[2] == even[2] == f"{ppl:.1f}" and even[3] == "1.000"
    assert even[5] == "20.0%"
