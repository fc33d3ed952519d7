"""pin = "model" (place.py and the strategy): where the model expects each term, forced through
the logits, never re-masked; pin = "none" drives the condition vector alone; bad pin input."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diffaccel
from diffaccel import ConfigValueError, hookimpl
from diffaccel.adapters.text.testing import CharTokenizer, tiny_text_pipeline
from diffaccel_bert_cond import BertCond, BertCondConfig, term_token_ids
from diffaccel_bert_cond.place import RowPlacer, best_spot, fits, force

N = 32
SOURCES = ["velvet soft touch", "mother chinese family"]


def test_fits_needs_a_run_of_free_positions():
    free = torch.tensor([1, 1, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    assert fits(free, 1).tolist() == free.tolist()
    assert fits(free, 2).nonzero().squeeze(1).tolist() == [0, 3, 4]
    assert fits(free, 3).nonzero().squeeze(1).tolist() == [3]
    assert not fits(free, 4).any()


def test_best_spot_takes_the_most_probable_start_where_the_term_fits():
    logp = torch.log(torch.tensor([0.9, 0.1, 0.5, 0.2, 0.3]))
    free = torch.tensor([True, False, True, True, True])
    assert best_spot(logp, free, 1) == (pytest.approx(0.9), 0)
    assert best_spot(logp, free, 2) == (pytest.approx(0.5), 2)  # 0 is free but 1 is not
    assert best_spot(logp, torch.zeros(5, dtype=torch.bool), 1) == (-1.0, -1)


def _logp(n: int, v: int, where: dict[tuple[int, int], float]) -> torch.Tensor:
    p = torch.full((n, v), 1e-3)
    for (pos, tok), prob in where.items():
        p[pos, tok] = prob
    return (p / p.sum(-1, keepdim=True)).log()


def test_a_term_is_placed_when_its_confidence_falls_at_its_best_step_position():
    pl = RowPlacer([[5]])
    masked, reserved = torch.ones(16, dtype=torch.bool), torch.zeros(16, dtype=torch.bool)
    assert pl.step(_logp(16, 8, {(1, 5): 0.4}), masked, reserved, 0, False) == []
    assert pl.step(_logp(16, 8, {(2, 5): 0.7}), masked, reserved, 1, False) == []  # still rising
    assert pl.step(_logp(16, 8, {(4, 5): 0.5}), masked, reserved, 2, False) == [0]  # fell: the peak was step 1
    assert pl.placed == [2] and pl.at_step == [2] and reserved.nonzero().squeeze(1).tolist() == [2]


def test_a_long_term_or_little_room_places_at_once():
    masked, reserved = torch.ones(16, dtype=torch.bool), torch.zeros(16, dtype=torch.bool)
    assert RowPlacer([[5, 6, 7]]).step(_logp(16, 8, {}), masked, reserved, 0, False) == [0]  # 3 * 8 > 16 free

    def room(run: int) -> torch.Tensor:  # a run of free positions, then 16 lone ones
        m = torch.zeros(40, dtype=torch.bool)
        m[:run] = True
        m[run + 1:run + 33:2] = True
        return m

    pl = RowPlacer([[5, 6]])
    assert pl.step(_logp(40, 8, {}), room(6), torch.zeros(40, dtype=torch.bool), 0, False) == []  # 5 starts left
    assert pl.step(_logp(40, 8, {}), room(5), torch.zeros(40, dtype=torch.bool), 1, False) == [0]  # 4 starts left
    assert 0 <= pl.placed[0] <= 3


def test_the_deadline_places_every_term_most_confident_first_without_overlap():
    pl = RowPlacer([[5, 6], [7]])
    masked, reserved = torch.ones(6, dtype=torch.bool), torch.zeros(6, dtype=torch.bool)
    masked[0] = False  # already committed: not free
    # both terms want position 1; term 1 is surer, so term 0 must go elsewhere
    placed = pl.step(_logp(6, 8, {(1, 5): 0.3, (1, 7): 0.6, (0, 5): 0.9}), masked, reserved, 0, True)
    assert placed == [1, 0] and pl.placed[1] == 1
    assert pl.placed[0] not in (0, 1) and reserved.sum() == 3 and pl.done


def test_force_allows_only_the_forced_token_and_leaves_the_input_alone():
    from diffaccel.adapters.text.sampling.logits import TopKLogits

    dense = torch.randn(2, 4, 10)
    keep = dense.clone()
    rows, cols, ids = torch.tensor([0, 1]), torch.tensor([3, 0]), torch.tensor([7, 2])
    out = force(dense, rows, cols, ids)
    assert torch.equal(dense, keep)
    assert out[0, 3].argmax() == 7 and torch.isinf(out[0, 3]).sum() == 9 and out[1, 0].argmax() == 2
    assert torch.equal(out[0, :3], dense[0, :3])
    v, i = dense.topk(3, -1)
    t = force(TopKLogits(v, i, 10), rows, cols, ids)
    assert t.dense()[0, 3].argmax() == 7 and torch.isinf(t.dense()[0, 3]).sum() == 9
    assert torch.equal(t.values[0, 0], v[0, 0]) and torch.equal(i, dense.topk(3, -1).indices)


class Spy:
    name = "spy"

    def __init__(self):
        self.masked = []

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.masked.append((output.tokens.clone(), output.masked.clone()))


def make(tiny_bert, info=None, **kw) -> BertCond:
    s = BertCond(BertCondConfig(**{"source": SOURCES, "bert": tiny_bert, "max_terms": 2, "pin": "model", **kw}))
    s.diffaccel_setup(info or {"adapter": "text", "cond_dim": 0, "kind": "masked"})
    return s


def generate(pipe, strategies=(), **kw):
    kw = {"length": N, "steps": 12, "temperature": 1.0, "progress": False, **kw}
    with diffaccel.apply(pipe, strategies=list(strategies)):
        return pipe(**kw)


@pytest.mark.parametrize("place_by", [0.0, 0.5, 1.0])
def test_pin_model_places_every_term_where_it_stays(tiny_bert, place_by):
    pipe = tiny_text_pipeline("masked", max_len=N)
    for seed in range(3):
        spy = Spy()
        out = generate(pipe, [make(tiny_bert, place_by=place_by, ngram_max=1), spy], seed=seed, batch=2)
        m = out.report["strategies"]["bert-cond"]
        assert m["pin"] == "model" and m["key_term_recall"] == 1.0
        deadline = max(1, math.ceil(place_by * 12)) - 1
        for r in range(2):
            ids = term_token_ids(m["terms"][r], pipe.tokenizer)
            for start, step, i in zip(m["placed"][r], m["placed_at_step"][r], ids):
                assert 0 <= step <= deadline
                assert out.tokens[r, start:start + len(i)].tolist() == i
                # from the step of placement on, each of the term's positions is still masked or
                # holds the term's token: nothing else is ever drawn there
                for tokens, masked in spy.masked[step:]:
                    span, left = tokens[r, start:start + len(i)], masked[r, start:start + len(i)]
                    assert (left | (span == torch.tensor(i))).all()


def test_pin_model_differs_from_even_pinning(tiny_bert):
    pipe = tiny_text_pipeline("masked", max_len=N)
    model = generate(pipe, [make(tiny_bert)], seed=0, batch=2)
    even = generate(pipe, [make(tiny_bert, pin="even")], seed=0, batch=2)
    assert model.report["strategies"]["bert-cond"]["placed"] is not None
    assert even.report["strategies"]["bert-cond"]["placed"] is None
    assert not torch.equal(model.tokens, even.tokens)


def test_pin_model_composes_with_topk_and_swd(tiny_bert):
    swd = pytest.importorskip("diffaccel_swd", reason="the swd plugin (plugins/swd) is not installed")
    from diffaccel_topk import TopK, TopKConfig

    pipe = tiny_text_pipeline("masked", max_len=N)
    for seed in range(3):
        out = generate(pipe, [make(tiny_bert, ngram_max=1), swd.SWD(swd.SWDConfig(R=2)), TopK(TopKConfig(k_keep=16))], seed=seed, steps=24, batch=2)
        m = out.report["strategies"]
        assert m["bert-cond"]["key_term_recall"] == 1.0
        assert m["swd"]["mean_computed"] < 1.0, m["swd"]  # swd did narrow the steps
        assert "topk" in m


def _cond_pipe(tmp_path, tiny_bert_builder, cond_dim):
    from diffaccel.adapters.text.adapter import TextAdapter
    from diffaccel.adapters.text.sampling.denoisers import ReferenceDenoiser
    from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
    from diffaccel.adapters.text.sampling.pipeline import TextDiffusionPipeline

    torch.manual_seed(0)
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, max_len=N, mask_id=2, cond_dim=cond_dim))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    pipe = TextDiffusionPipeline(ReferenceDenoiser(model.eval()), CharTokenizer(64))
    return pipe, TextAdapter.info(pipe)


def test_pin_none_drives_the_vector_only(tmp_path, tiny_bert_builder):
    bert = tiny_bert_builder(tmp_path / "b16", hidden=16)
    pipe, info = _cond_pipe(tmp_path, tiny_bert_builder, 16)
    out = generate(pipe, [make(bert, info, pin="none")], seed=0, batch=2, temperature=0.0)
    m = out.report["strategies"]["bert-cond"]
    assert m["vector_used"] is True and m["pinned_positions"] == 0 and m["placed"] is None
    plain = generate(pipe, [], seed=0, batch=2, temperature=0.0)
    assert not torch.equal(plain.tokens, out.tokens)  # the vector alone changed the text


class Conditions:
    """Records the condition vector the model got at every step (None: no condition)."""

    name = "conditions"

    def __init__(self):
        self.seen = []

    @hookimpl
    def diffaccel_pre_step(self, run):
        self.seen.append(None if run.condition is None else run.condition.clone())


def test_vector_until_placed_drops_each_rows_vector_once_its_terms_are_placed(tmp_path, tiny_bert_builder):
    bert = tiny_bert_builder(tmp_path / "b16", hidden=16)
    pipe, info = _cond_pipe(tmp_path, tiny_bert_builder, 16)
    for seed in range(3):
        rec = Conditions()
        # short terms: a char-tokenized long one would be placed at once (place.LONG)
        strategy = make(bert, info, source=["ox", "gnu"], max_terms=1, vector_until="placed", place_by=0.75)
        out = generate(pipe, [strategy, rec], seed=seed, batch=2, steps=16)
        m = out.report["strategies"]["bert-cond"]
        assert m["key_term_recall"] == 1.0 and m["vector_used"] is True
        for r in range(2):
            given = [c is not None and bool(c[r].ne(0).any()) for c in rec.seen]
            last = max(m["placed_at_step"][r])  # the step that placed the row's last term
            # the vector drove the row up to that step, never after it
            assert given == [s <= last for s in range(16)], (r, given, last)
            assert m["vector_share"][r] == (last + 1) / 16
        assert rec.seen[-1] is None  # every row placed: the batch dropped the vector
        # a row's zeroed vector is no condition: the model adds no projection for it
        cond = torch.stack([rec.seen[0][0], torch.zeros(16)])
        model = pipe.denoiser.model
        torch.testing.assert_close(model.condition(None, 2, cond)[1], model.condition(None, 2)[1])
    end = generate(pipe, [make(bert, info)], seed=0, batch=2, steps=16).report["strategies"]["bert-cond"]
    assert end["vector_share"] == [1.0, 1.0]


@pytest.mark.parametrize("until", ["placed", "end"])
def test_a_row_whose_terms_are_placed_loses_its_vector_alone(until):
    from types import SimpleNamespace

    from diffaccel_bert_cond.strategy import BertCondState

    strategy = BertCond(BertCondConfig(source="velvet", pin="model", vector_until=until))
    st = BertCondState(t0=0.0, vector_steps=[0, 0], placers=[RowPlacer([[5]]), RowPlacer([[6]])])
    run = SimpleNamespace(condition=torch.ones(2, 4))
    st.placers[0].placed = [3]  # row 0 placed its term at this step, row 1 not yet
    strategy._vector_step(run, st)
    if until == "end":
        assert torch.equal(run.condition, torch.ones(2, 4)) and st.vector_steps == [1, 1]
        return
    assert run.condition[0].eq(0).all() and run.condition[1].eq(1).all() and st.vector_steps == [1, 1]
    strategy._vector_step(run, st)
    assert st.vector_steps == [1, 2] and run.condition is not None
    st.placers[1].placed = [7]
    strategy._vector_step(run, st)
    assert run.condition is None and st.vector_steps == [1, 3]


def _cli_one_line_error(tmp_path, checkpoint: str, key_line: str) -> tuple[Path, str]:
    """``diffaccel generate`` on a bert-cond config with ``key_line``: exit 2 and one stderr line
    (returned with the config's path)."""
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{checkpoint}"\nlength = 16\nsteps = 4\n'
                   f'[[strategy]]\nuse = "bert-cond"\nsource = "velvet: smooth and soft"\n{key_line}\n')
    proc = subprocess.run([sys.executable, "-m", "diffaccel.cli.entry", "generate", str(bad), "--no-progress"], capture_output=True,
                          text=True, env={**os.environ, "DIFFACCEL_PLUGINS": "bert-cond"})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return bad, proc.stderr


def test_cli_refuses_vector_until_placed_without_pin_model_in_one_line(tmp_path):
    bad, err = _cli_one_line_error(tmp_path, "wordnet-masked-cond", 'vector_until = "placed"')
    assert f"{bad}: [[strategy]] #1 (bert-cond): key 'vector_until': \"placed\"" in err and 'pin = "even"' in err


def test_vector_until_placed_needs_pin_model():
    with pytest.raises(ConfigValueError) as err:
        BertCondConfig(source="velvet", pin="even", vector_until="placed")
    assert err.value.key == "vector_until" and 'pin = "even"' in err.value.message
    with pytest.raises(ConfigValueError) as err:
        BertCondConfig(source="velvet", pin="model", vector_until="half")
    assert err.value.key == "vector_until" and "'end', 'placed'" in err.value.message


@pytest.mark.parametrize("cond_dim, extra, words", [(0, {}, "no condition gating (cond_dim 0)"),
                                                    (16, {"vector": False}, "vector = false")])
def test_pin_none_without_a_vector_is_refused(tmp_path, tiny_bert_builder, cond_dim, extra, words):
    bert = tiny_bert_builder(tmp_path / "b16", hidden=16)
    info = _cond_pipe(tmp_path, tiny_bert_builder, cond_dim)[1] if cond_dim else {"adapter": "text", "cond_dim": 0}
    with pytest.raises(ConfigValueError) as err:
        make(bert, info, pin="none", **extra)
    assert err.value.key == "pin" and words in err.value.message and "nothing would enforce them" in err.value.message


def test_pin_model_needs_a_masked_model(tiny_bert):
    with pytest.raises(ConfigValueError) as err:
        make(tiny_bert, {"adapter": "text", "cond_dim": 0, "kind": "continuous"})
    assert err.value.key == "pin" and "continuous" in err.value.message


def test_bad_pin_value_names_the_key():
    with pytest.raises(ConfigValueError) as err:
        BertCondConfig(source="velvet", pin="left")
    assert err.value.key == "pin"


def test_cli_refuses_pin_none_on_a_model_without_gating_in_one_line(tmp_path):
    bad, err = _cli_one_line_error(tmp_path, "wordnet-masked", 'pin = "none"')
    assert f"{bad}: [[strategy]] #1 (bert-cond): key 'pin': pin = \"none\"" in err
    assert "cond_dim 0" in err and "Traceback" not in err
