"""``diffaccel topk-truncation``: the memory a step holds with and without truncation, through the
sampler's draw the text adapter hands strategies (``run.info.tokens.draw_tokens``)."""

from __future__ import annotations

import pytest
import torch

from diffaccel import load_config
from diffaccel.cli.entry import main
from diffaccel_topk.truncation import one_step, sampler_info

CONFIG = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 4\n'


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    path.write_text(CONFIG)
    return sampler_info(load_config(str(path)))


def test_the_text_sampler_hands_strategies_its_draw(info):
    """At temperature 0 the draw is the argmax with the special tokens banned, on dense logits
    and on their truncated form alike."""
    vocab = info.tokens.vocab_size
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(0))
    logits[:, 0] = 100.0  # a special token ([PAD], [MASK]...) is never drawn, however likely
    conf, tok = info.tokens.draw_tokens(logits, 0.0, torch.Generator())
    banned = logits.clone()
    banned[:, 0] = -float("inf")
    assert torch.equal(tok, banned.argmax(-1))
    vals, idx = logits.topk(8, dim=-1)
    tk = info.tokens.truncated_logits(vals[None], idx[None], vocab)
    _, tok_k = info.tokens.draw_tokens(tk.rows(0, torch.arange(5)), 0.0, torch.Generator())
    assert torch.equal(tok_k, tok)


def test_a_truncated_step_holds_k_keep_values_per_position(info):
    r = one_step(info, vocab=300, positions=10, k_keep=16, repeats=1)
    assert (r["full"], r["held"]) == (10 * 300, 10 * 16)
    assert r["full_bytes"] == 10 * 300 * 4 and r["held_bytes"] == 10 * 16 * (4 + 8)  # float32 values, int64 indices
    assert set(r["seconds"]) == {"full", "truncated"}


def test_bad_options_are_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    assert main(["topk-truncation", str(path), "--positions", "0"]) == 2
    assert "--positions: 0" in capsys.readouterr().err
    assert main(["topk-truncation", str(path), "--k-keep", "500", "--vocab", "300", "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--k-keep 500" in err[0]
