"""cond_check: the held-out sequences it scores, and that it tells a vector that steers from one
that does not."""

from __future__ import annotations

import pytest
import torch

from diffaccel_models.text.training.cond_check import check, sequences
from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer, train_tokenizer

POOL = ["velvet: smooth and soft to touch", "a small red fruit", "the city of boston", "soft apples from the city"] * 5


def tokenizer() -> TextTokenizer:
    return TextTokenizer(train_tokenizer(POOL, 120))


def test_sequences_start_at_the_line_and_mark_its_terms():
    tok = tokenizer()
    ids, line, term = sequences(tok, [POOL[1]], POOL, [("red fruit", "absent word")], 16)
    first = tok.encode(POOL[1]) + [tok.sep_id]
    assert ids.shape == (1, 16) and ids[0, :len(first)].tolist() == first
    assert ids[0, len(first):len(first) + 3].tolist() == tok.encode(POOL[2])[:3]  # then the next line of the pool
    assert line[0].nonzero().flatten().tolist() == list(range(len(first)))
    want = tok.encode(" red fruit")
    at = term[0].nonzero().flatten().tolist()
    assert len(at) == len(want) and ids[0, at].tolist() == want


def test_check_sees_a_vector_that_steers():
    """A tiny model whose condition path alone is fitted to put the line's key term back when the
    line is masked: with the vector the term's cross-entropy falls, and the unconditioned figures
    are the untrained model's (its gating biases, all an unconditioned run uses, stay as they were)."""
    tok = tokenizer()
    torch.manual_seed(0)
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=tok.vocab_size, dim=16, n_layers=1, n_heads=2, max_len=16,
                                                cond_dim=4, mask_id=tok.mask_id)).eval()
    ids, line, term = sequences(tok, [POOL[0]], POOL, [("soft",)], 16)
    vec = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    before = check(model, ids, line, term, vec, mask_rest=0.5)
    assert before["line_cond"] == before["line_uncond"]  # zero gating weights: the vector does nothing yet
    params = [model.cond_proj.weight, model.cond_proj.bias, model.blocks[0].mod.weight]
    opt = torch.optim.Adam(params, lr=0.05)
    x = torch.where(line, torch.full_like(ids, tok.mask_id), ids)
    for _ in range(100):
        loss = torch.nn.functional.cross_entropy(model(x, cond=vec)[term], ids[term])
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = check(model, ids, line, term, vec, mask_rest=0.5)
    assert after["line_uncond"] == before["line_uncond"] and after["terms_uncond"] == before["terms_uncond"]
    assert after["terms_cond"] < after["terms_uncond"] - 1.0


def test_a_conditions_file_round_trips_and_a_damaged_one_is_refused(tmp_path):
    from diffaccel.kit.conditions import load, save

    vectors = torch.randn(3, 4)
    save(tmp_path / "c.safetensors", POOL[:3], [("velvet",), (), ("city", "boston")], vectors, {"seed": 0})
    lines, back, terms = load(tmp_path / "c.safetensors", with_terms=True)
    assert lines == POOL[:3] and torch.equal(back, vectors) and terms == [["velvet"], [], ["city", "boston"]]
    save(tmp_path / "bad.safetensors", POOL[:2], [(), ()], vectors, {})
    with pytest.raises(ValueError, match="2 lines but 3 vectors"):
        load(tmp_path / "bad.safetensors")


def test_the_corpus_writes_the_heldout_lines_that_the_bench_sources_leave(tmp_path):
    from diffaccel.adapters.text.evaluation.metrics import reference_lines
    from diffaccel.adapters.text.loading.corpus import heldout_lines
    from diffaccel.cli.entry import main

    assert main(["text-corpus", "--split", "heldout", "--out", str(tmp_path / "lines.txt")]) == 0
    written = (tmp_path / "lines.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert written + reference_lines() == heldout_lines() and not set(written) & set(reference_lines())
