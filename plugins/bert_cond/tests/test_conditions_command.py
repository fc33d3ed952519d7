"""``diffaccel bert-cond-conditions`` (the plugin's registered command, issue 58; it was ``python -m
diffaccel_bert_cond.conditions``): conditions of lines on the tiny BERT, shards merged, and a bad
input refused with one line and exit 2 before any model loads."""

from __future__ import annotations

import json

from safetensors import safe_open

from diffaccel.cli.entry import main
from diffaccel.kit.conditions import load

LINES = ["the velvet is smooth and soft to the touch", "the biggest upset since david beat goliath",
         "a serious protest of the government in boston", "too short", "his mother and father were chinese"]


def test_the_command_writes_conditions_and_merges_shards(tmp_path, tiny_bert, capsys):
    source = tmp_path / "lines.txt"
    source.write_text("\n".join(LINES) + "\n")
    shards = [tmp_path / "s0.safetensors", tmp_path / "s1.safetensors"]
    for offset, shard in enumerate(shards):
        argv = ["bert-cond-conditions", "--lines-from", str(source), "--out", str(shard), "--bert", tiny_bert,
                "--lines", "2", "--offset", str(2 * offset)]
        assert main(argv) == 0, capsys.readouterr().err
    assert main(["bert-cond-conditions", "--out", str(tmp_path / "all.safetensors"), "--merge", *map(str, shards)]) == 0
    lines, vectors, terms = load(tmp_path / "all.safetensors", with_terms=True)
    assert len(lines) == 4 and set(lines) < set(LINES) and "too short" not in lines  # 6 to 20 words only
    assert vectors.shape == (4, 32) and all(terms)
    with safe_open(str(shards[0]), "pt") as f:
        recipe = json.loads(f.metadata()["recipe"])
    assert recipe["lines"] == 2 and recipe["eligible"] == 4 and recipe["bert"] == tiny_bert


def test_a_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    for argv, expected in ((["--out", str(tmp_path / "o.safetensors")], "--lines-from: required"),
                           (["--out", str(tmp_path / "o.safetensors"), "--lines-from", str(tmp_path / "none.txt")],
                            "none.txt: no such file"),
                           (["--out", str(tmp_path / "o.safetensors"), "--merge", str(tmp_path / "gone.safetensors")],
                            "--merge: ")):
        assert main(["bert-cond-conditions", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("diffaccel: error: ") and err.count("\n") == 1 and expected in err, err
